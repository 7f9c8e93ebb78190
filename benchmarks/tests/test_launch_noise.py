"""benchmarks/launch_noise.py: its analysis of launches cut into sub-windows, per arm."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks.launch_noise import analyse


def test_twin_ratio_is_of_geometric_means_and_arms_are_kept_apart() -> None:
    rows = [
        {"arm": "defaults", "rates": [100, 100]},
        {"arm": "s64", "rates": [120, 130]},
        {"arm": "defaults", "rates": [110, 90]},
        {"arm": "s64", "rates": [125, 125]},
    ]
    out = analyse(rows)
    assert out["defaults"]["launches"] == 2 and out["s64"]["slices"] == 2
    a = math.exp(np.log([100, 100, 110, 90]).mean())
    b = math.exp(np.log([120, 130, 125, 125]).mean())
    assert out["twin_ratio"] == pytest.approx(b / a)


def test_window_profile_shows_a_trend_inside_the_window() -> None:
    rows = [{"arm": "a", "rates": [90, 100, 110]}, {"arm": "a", "rates": [180, 200, 220]}]
    profile = analyse(rows)["window_profile"]
    assert profile[0] < 0.95 < 1.05 < profile[2]
    assert math.prod(profile) == pytest.approx(1.0, abs=1e-3)
