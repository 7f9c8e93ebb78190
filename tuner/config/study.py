"""The ``study`` group: how a study searches (stage order, budget, acceptance, storage).

Its presets (``conf/study/*.yaml``) are package ``_global_`` and may set any other section too;
this class is the ``study:`` section's schema only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tuner.config.executor import EXECUTORS
from tuner.errors import ConfigError

# Who orders a staged study's groups: the plan, where estimates exist
# (tuner/study/loop/order.py), or study.stages as written.
STAGE_ORDERS = ("plan", "preset")
# How the acceptance rule measures noise: the study's pooled repeats, or each comparison's own.
NOISE_RULES = ("pooled", "pair")


@dataclass
class StudyConfig:
    """How a study searches: stage order, budget, acceptance and storage."""

    strategy: str = "staged"  # staged | joint
    stages: list[str] = field(
        default_factory=lambda: ["parallelism", "quantization", "memory", "runtime", "batching"]
    )
    # plan: where the estimator can estimate the space, the order (and whether a group runs
    # twice) that plays best on its estimates under the study's SLOs; else, and with preset,
    # study.stages as written
    stage_order: str = "plan"
    trials_per_stage: int = 4
    refine_trials: int = 0  # staged only: a last joint stage over every group (0 = none)
    # A repeated proposal gets the stored measurement (no launch) and a stage whose finite space
    # is fully measured ends early; false re-measures repeats (more samples of a noisy point).
    reuse: bool = True
    repeats: int = 2  # interleaved re-measurements of winner and incumbent per stage
    # An SLO counts as met only where the windows bound its P99 under it with this confidence
    # (one-sided, tuner/scoring/confidence.py); a side whose SLO the repeats leave undecided is
    # measured again, up to max_repeats re-measurements in all, before the rule decides.
    slo_confidence: float = 0.9
    max_repeats: int = 6
    # The control is measured this many times (once per fingerprint, stored, reused): its mean
    # is what every stage compares against. One lucky window of the baseline would otherwise
    # hide every candidate that does not beat the luck.
    baseline_measurements: int = 3
    min_gain: float = 0.02  # relative gain of the selection objective needed to accept
    noise: str = "pooled"  # pooled (the study's repeats) | pair (each comparison's own)
    # The stage winner's search window is the best of the stage's draws, so it reads high (the
    # winner's curse); false judges the winner on its fresh confirmation windows only (with
    # repeats: 0 the window is all there is, and counts). Counting it proved more real gains in
    # the replays than it let luck through.
    count_search_window: bool = True
    storage: str | None = None  # SQLAlchemy URL; None = SQLite in studies/<name>/optuna.db
    # One driver per study: how long a driver that stopped renewing its lease keeps the study
    lease_s: float = 60.0
    max_failure_rate: float = 0.6
    max_consecutive_failures: int = 4
    seed: int = 0
    # Where trials run: local (one at a time, here) or ray (in parallel, on a cluster)
    executor: str = "local"
    parallel: str = "1"  # trials at once with executor=ray: a number, or auto (what fits)
    prescreen: bool = False  # tell points the estimator says cannot fit as infeasible, unlaunched

    @property
    def pools_noise(self) -> bool:
        """The acceptance rule's noise is the study's pooled repeats (tuner/noise.py)."""
        return self.noise == "pooled"

    @property
    def keeps_search_window(self) -> bool:
        """The winner's (selected, upward-biased) search window counts among its measurements."""
        return self.count_search_window or self.repeats == 0

    @property
    def candidate_windows(self) -> int:
        """How many selection-objective values the acceptance rule has of a stage's winner."""
        return self.repeats + int(self.keeps_search_window)

    def validate(self, groups: list[str]) -> None:
        if self.strategy not in ("staged", "joint"):
            raise ConfigError(f"study.strategy must be 'staged' or 'joint', got {self.strategy!r}")
        if self.stage_order not in STAGE_ORDERS:
            raise ConfigError(
                f"study.stage_order must be one of {', '.join(STAGE_ORDERS)}, "
                f"got {self.stage_order!r}"
            )
        if self.executor not in EXECUTORS:
            raise ConfigError(
                f"study.executor must be one of {', '.join(EXECUTORS)}, got {self.executor!r}"
            )
        if self.parallel != "auto" and not (self.parallel.isdigit() and int(self.parallel) >= 1):
            raise ConfigError(f"study.parallel must be >= 1 or auto, got {self.parallel!r}")
        if self.trials_per_stage < 1 or self.repeats < 0 or self.min_gain < 0:
            raise ConfigError("study: need trials_per_stage >= 1, repeats >= 0, min_gain >= 0")
        if not 0.5 < self.slo_confidence < 1:
            raise ConfigError(
                f"study.slo_confidence must be in (0.5, 1), got {self.slo_confidence}",
                hint="e.g. study.slo_confidence=0.9: hand over an SLO met with 90 % confidence",
            )
        if self.max_repeats < self.repeats:
            raise ConfigError(
                f"study.max_repeats ({self.max_repeats}) is below study.repeats ({self.repeats})",
                hint=f"set study.max_repeats={self.repeats} or more",
            )
        if self.baseline_measurements < 1:
            raise ConfigError(
                f"study.baseline_measurements must be >= 1, got {self.baseline_measurements}"
            )
        if self.noise not in NOISE_RULES:
            raise ConfigError(
                f"study.noise must be one of {', '.join(NOISE_RULES)}, got {self.noise!r}"
            )
        if self.lease_s < 5:
            raise ConfigError(f"study.lease_s must be >= 5 seconds, got {self.lease_s}")
        if self.refine_trials < 0:
            raise ConfigError(f"study.refine_trials must be >= 0, got {self.refine_trials}")
        if "refine" in self.stages:
            raise ConfigError("study.stages: 'refine' is the joint refinement stage's name")
        if not 0 < self.max_failure_rate <= 1 or self.max_consecutive_failures < 1:
            raise ConfigError(
                "study: need 0 < max_failure_rate <= 1, max_consecutive_failures >= 1"
            )
        missing = [s for s in self.stages if s not in groups]
        if missing:
            raise ConfigError(
                f"study.stages names {', '.join(missing)} but search_space has no such group "
                f"(groups: {', '.join(groups) or 'none'})",
                hint="add e.g. search_space=[batching,memory_cpu] or fix study.stages",
            )
