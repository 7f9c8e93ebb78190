"""A stored study whose decision KEPT the baseline although a search window looked better: the
quick start of the issue, in the layout `tuner run` writes, on a real SQLite storage.

The baseline has three windows; the last (the one a stage links to) is a slow one: P99 0.706 s,
2,195 tok/s, while the mean is 0.562 s and 2,425 tok/s. The memory stage's winner (trial 3,
0.438 s, 2,568 tok/s) is 38 % faster and 17 % more productive than that one window, 22 % and
6 % against the mean, and its confirmation rounds keep the baseline: 2,487 -> 2,573 tok/s, gain
86 where the noise needed > 695. Trial 4 repeats trial 1's point and reuses its measurement.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import optuna
import yaml

from tests.fakes.stored_study import (
    FINGERPRINT,
    StoredStudy,
    frozen_trial,
    measured_attrs,
    new_study,
)
from tuner.schema import StudyAttr, TrialAttr
from tuner.study.decision.acceptance import Decision

BASELINE_WINDOWS = [  # p99 (s), output tok/s, cost per million tokens
    [0.48, 2560.0, 0.0200],
    [0.50, 2520.0, 0.0203],
    [0.706, 2195.0, 0.0233],
]
WINNER = [0.438, 2568.0, 0.0199]
ROUNDS = {  # the confirmation rounds: (stage round, side) -> values
    (0, "incumbent"): [0.55, 2590.0, 0.0198],
    (0, "candidate"): [0.47, 2580.0, 0.0198],
    (1, "incumbent"): [0.56, 2570.0, 0.0199],
    (1, "candidate"): [0.46, 2571.0, 0.0199],
}


def _side(side: str) -> list[float]:
    return [v[1] for (_, s), v in ROUNDS.items() if s == side]


def kept_decision() -> Decision:
    """What the acceptance rule stored: every window of each side, their means, the noise."""
    inc = [w[1] for w in BASELINE_WINDOWS] + _side("incumbent")
    cand = [WINNER[1], *_side("candidate")]
    inc_mean, cand_mean = float(np.mean(inc)), float(np.mean(cand))
    return Decision(
        stage="memory",
        objective="output_throughput",
        direction="maximize",
        accepted=False,
        reason="gain within the measured noise",
        incumbent_values=inc,
        candidate_values=cand,
        incumbent_mean=inc_mean,
        candidate_mean=cand_mean,
        gain=cand_mean - inc_mean,
        noise=695.0,
        noise_df=6,
        threshold=695.0,
        candidate_trial=3,
        candidate_params={"kv_cache_space_gib": 3, "block_size": 128},
        candidate_objectives=WINNER,
    )


def _config(name: str, studies_dir: Path) -> dict[str, Any]:
    return {
        "name": name,
        "studies_dir": str(studies_dir),
        "server": {
            "model": "/models/tiny-llama",
            "device": "cpu",
            "args": {"max_model_len": 2048, "enforce_eager": True},
            "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
        },
        "study": {"stages": ["memory"]},
        "objectives": {"select_by": "output_throughput"},
        "cost": {"cpus": 2},
        "search_space": {
            "memory": {
                "kv_cache_space_gib": {"type": "int", "low": 1, "high": 4},
                "block_size": {"type": "categorical", "choices": [32, 64, 128]},
            }
        },
    }


def _baseline(storage: optuna.storages.RDBStorage, root: Path) -> None:
    baseline = new_study(storage, "baseline:kept")
    baseline.set_user_attr(StudyAttr.FINGERPRINT, FINGERPRINT)
    for i, vals in enumerate(BASELINE_WINDOWS):
        attrs = measured_attrs(root, f"baseline-{i}", "baseline", vals, {})
        baseline.add_trial(frozen_trial(vals, {}, attrs))


def _search(stage: optuna.Study, root: Path) -> None:
    seed = [float(x) for x in np.mean(BASELINE_WINDOWS, axis=0)]
    first = {"kv_cache_space_gib": 1, "block_size": 128}
    stage.add_trial(frozen_trial(seed, first, {"role": "incumbent", "params_all": {}}))
    one = {"kv_cache_space_gib": 2, "block_size": 64}
    one_vals = [0.52, 2400.0, 0.0213]
    one_attrs = measured_attrs(root, "memory-1", "search", one_vals, one)
    stage.add_trial(frozen_trial(one_vals, one, one_attrs))
    failed = {"kv_cache_space_gib": 4, "block_size": 32}
    attrs = {"role": "search", "stage": "memory", "status": "failed", "params_all": failed}
    attrs |= {"failure_reason": "oom", "failure_message": "not enough memory for the KV cache"}
    worst = [float("inf"), float("-inf"), float("inf")]
    stage.add_trial(frozen_trial(worst, failed, attrs, feasible=False))
    best = {"kv_cache_space_gib": 3, "block_size": 128}
    stage.add_trial(
        frozen_trial(WINNER, best, measured_attrs(root, "memory-3", "search", WINNER, best))
    )
    reused = {**one_attrs, TrialAttr.REUSED_FROM: 1, TrialAttr.REUSED_FROM_STAGE: "memory"}
    stage.add_trial(frozen_trial(one_vals, one, reused))


def _confirmations(storage: optuna.storages.RDBStorage, root: Path, name: str) -> None:
    confirm = new_study(storage, f"{name}:confirm")
    for i, ((rnd, side), vals) in enumerate(ROUNDS.items()):
        attrs = measured_attrs(root, f"memory-confirm-{i}", side, vals, {})
        attrs[TrialAttr.CONFIRM_TAG] = f"memory/{rnd}/{side}"
        confirm.add_trial(frozen_trial(vals, {}, attrs))


def make_kept_study(studies_dir: Path, name: str = "kept") -> StoredStudy:
    """Write the study; returns where it is."""
    study = StoredStudy(name, studies_dir)
    root = study.folder
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.yaml").write_text(yaml.safe_dump(_config(name, studies_dir)))
    storage = optuna.storages.RDBStorage(study.url)
    _baseline(storage, root)
    stage = new_study(storage, f"{name}:memory")
    stage.set_user_attr(StudyAttr.BASELINE_STUDY, "baseline:kept")
    stage.set_user_attr(StudyAttr.BASELINE_TRIAL, len(BASELINE_WINDOWS) - 1)  # the slow window
    _search(stage, root)
    stage.set_user_attr(StudyAttr.DECISION, kept_decision().to_dict())
    _confirmations(storage, root, name)
    return study
