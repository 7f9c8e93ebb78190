"""What a study searches: parameter specs as Optuna distributions, their checks, samplers."""
