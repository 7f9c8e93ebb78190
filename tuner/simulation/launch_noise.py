"""Launch-to-launch noise of a simulated GPU host: one slowdown factor per server process.

Real GPUs do not repeat themselves: the same config's P99 TTFT and TPOT move by ~5 % between
two launches of the same server (clocks, placement, the kernels autotuning picks). Within one
launch the speed holds, so the model is ONE factor drawn when the host starts and applied to
every serving delay it models (prefill and decode steps) until it exits. The draw is lognormal
with mean one, exp(N(-s^2/2, s)), whose coefficient of variation is ~s for small s: a positive
slowdown that neither speeds up nor slows down the host on average.
"""

from __future__ import annotations

import numpy as np

NOISE_CV_ENV = "TUNER_SIM_NOISE_CV"  # s: the spread of the per-launch factor (0: none)
MAX_CV = 1.0  # a spread this wide is no longer "the same GPUs": refused, not modelled


def valid_cv(cv: float) -> bool:
    """A coefficient of variation the host models: from 0 (no noise) up to, not including, 1."""
    return 0.0 <= cv < MAX_CV


def launch_factor(cv: float, rng: np.random.Generator | None = None) -> float:
    """This launch's slowdown: exactly 1 without noise (the noiseless model, untouched), else a
    mean-one lognormal draw from ``rng``, by default a generator seeded from the OS so that
    every launch draws its own."""
    if cv == 0:
        return 1.0
    rng = rng or np.random.default_rng()
    return float(rng.lognormal(mean=-(cv**2) / 2, sigma=cv))
