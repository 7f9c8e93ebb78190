"""Reading a stored study back: trial views, diagnosis, evidence, report, plots, dashboard."""
