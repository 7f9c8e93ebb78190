"""What a trial measures: the raw per-request records (records), the statistics of a window
computed from them (stats) and the summary they make (measurements)."""
