"""A study: baseline, stages, confirmation and the acceptance rule, recorded in Optuna storage."""
