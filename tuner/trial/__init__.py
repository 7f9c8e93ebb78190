"""One trial: its run (launch, load, measure, stop) and its outcome."""
