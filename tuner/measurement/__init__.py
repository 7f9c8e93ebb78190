"""What a trial measures: the raw per-request records (records) and the statistics of a
window computed from them (stats)."""
