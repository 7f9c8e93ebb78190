"""`tuner export --measure`: more windows of the exported configuration, before it is exported.

A check resolves a change only as finely as the windows behind both sides allow; the export's
side is every window the study measured of the chosen configuration. Where they are too few
for ``check.resolve`` on some objective, the configuration's server is started again through
the study's own runner and executor and measured as a trial measures it, as many times as the
evidence needs (at most ``--max-windows``). Each window is a trial of the study's confirmation
study, so the export, a later export and the report all read it back from the storage.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tuner.config import TunerConfig
from tuner.deployment.capacity.stored_config import stored_config
from tuner.errors import ConfigError
from tuner.review.evidence import check_reference
from tuner.review.stored import Choice, open_review

# Two windows make the noise of a configuration measured once known: what a first answer needs.
KNOWN_NOISE = 2


def windows_wanted(plan: Mapping[str, Mapping[str, Any]], budget: int) -> int:
    """How many more windows of the configuration the evidence's plan asks for, at most
    ``budget``: the largest objective's need; two where an objective's noise is unknown."""
    need = 0
    for p in plan.values():
        more = p.get("more_needed")
        if more is not None:
            need = max(need, int(more))
        elif p.get("resolves") is None:  # nothing resolved yet: the noise is still unknown
            need = max(need, KNOWN_NOISE)
    return min(need, budget)


def measure_for_check(
    name: str,
    storage: str | None,
    studies_dir: Path,
    trial: int | None,
    stage: str | None,
    budget: int | None,
    say: Callable[[str], None],
) -> int:
    """Measure the windows the chosen configuration's evidence lacks; how many landed."""
    if budget is not None and budget < 1:
        raise ConfigError(f"--max-windows must be at least 1, got {budget}")
    review = open_review(name, storage, studies_dir)
    choice = review.choice(stage, trial)
    reference = check_reference(review, choice)
    config = stored_config(review.config, review.name)
    limit = budget if budget is not None else config.check.max_windows
    need = windows_wanted(reference["windows"], limit)
    if need == 0:
        hopeless = _hopeless(reference["windows"])
        if hopeless:  # more windows would not do: said so, not called resolved
            say(
                f"export: no number of windows of {choice.label} lets a check resolve "
                f"{', '.join(hopeless)} at this noise: nothing measured (a longer "
                "workload.window_s narrows each window's spread)"
            )
            return 0
        say(f"export: {_recorded(reference)} windows of {choice.label} resolve every objective")
        return 0
    say(f"export: measuring {need} more windows of {choice.label} ({_recorded(reference)} kept)")
    return _measure(config, studies_dir, storage, choice, need, say)


def _hopeless(plan: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The objectives that no number of windows would let a check resolve at this noise."""
    return [
        name
        for name, p in plan.items()
        if p.get("more_needed") is None
        and p.get("resolves") is not None
        and p["resolves"] > p.get("asked", 0.0)
    ]


def _recorded(reference: Mapping[str, Any]) -> int:
    return max((int(p["recorded"]) for p in reference["windows"].values()), default=0)


def _measure(
    config: TunerConfig,
    studies_dir: Path,
    storage: str | None,
    choice: Choice,
    count: int,
    say: Callable[[str], None],
) -> int:
    from tuner.study.loop.session import open_session

    # Where the export reads it (the stored URL hides its password) and without the quality
    # set: the windows are the evidence, and the gate judged this config in its stage.
    study = dataclasses.replace(config.study, storage=storage)
    quality = dataclasses.replace(config.quality, enabled=False)
    config = dataclasses.replace(config, studies_dir=str(studies_dir), study=study, quality=quality)
    session = open_session(config, rebaseline=False, progress=say)
    try:
        session.preflight()
        results = session.runner.measure_more(choice.params, count)
    finally:
        session.close()
    landed = sum(r.outcome.ok for r in results)
    say(f"export: {landed} of {count} new windows measured")
    return landed
