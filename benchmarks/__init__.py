"""Benchmarks of the tuner itself: search efficiency, measurement fidelity, trial cost, noise.

Each script is a module run from the repository root, e.g. ``.venv/bin/python -m
benchmarks.replay --help``; they import tuner only through its public API (``from tuner
import ...``). Findings and the command behind each: benchmarks/README.md.
"""
