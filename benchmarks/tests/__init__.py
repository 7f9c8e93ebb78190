"""Tests of the benchmarks' own code (their harnesses, analyses and grids), on small synthetic
inputs. They may import ``benchmarks`` and ``tuner`` (``tuner.testing`` included), never ``tests``:
what both test trees need lives in tuner.testing."""
