"""What `tuner export` now puts in evidence.json for `tuner check`: the exported configuration's
own windows (never the search window that won it its stage) and the study's pooled noise of
every objective, on a stored study with known numbers (real SQLite, no server)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import optuna
import pytest
import yaml

from tests.fakes import stored_study as fake
from tuner.config import CheckConfig
from tuner.deployment.more_windows import _hopeless, measure_for_check, windows_wanted
from tuner.errors import ConfigError
from tuner.review.evidence import build_evidence, windows_line, windows_plan
from tuner.review.stored import open_review
from tuner.schema import baseline_study, confirm_study, stage_study
from tuner.study.decision.acceptance import Decision
from tuner.study.decision.noise import NoiseEstimate

P = {"max_num_seqs": 32}  # the accepted configuration
BASE = [[1.0, 1000.0, 0.020], [1.1, 900.0, 0.022]]  # two baseline windows
SEARCH = [0.9, 1500.0, 0.013]  # the stage's winning search window: picked as the best, reads high
CONFIRM = {"incumbent": [1.05, 950.0, 0.021], "candidate": [0.95, 1400.0, 0.014]}


def _study(root: Path) -> None:
    (root / "demo").mkdir(parents=True)
    config = {
        "server": {"model": "/models/tiny-llama", "args": {}},
        "study": {"min_gain": 0.05},
        "objectives": {"select_by": "output_throughput", "constraints": ["slo_p99_e2e"]},
        "cost": {"cpus": 2},
    }
    (root / "demo" / "config.yaml").write_text(yaml.safe_dump(config))
    storage = optuna.storages.RDBStorage(f"sqlite:///{root / 'demo' / 'optuna.db'}")
    base = fake.new_study(storage, baseline_study("fake"))
    base.set_user_attr("fingerprint", fake.FINGERPRINT)
    for i, values in enumerate(BASE):
        attrs = fake.measured_attrs(root, f"baseline-{i}", "baseline", values, {})
        base.add_trial(fake.frozen_trial(values, {}, attrs))
    stage = fake.new_study(storage, stage_study("demo", "batching"))
    stage.add_trial(fake.frozen_trial(BASE[0], {}, {"role": "incumbent", "params_all": {}}))
    attrs = fake.measured_attrs(root, "batching-1", "search", SEARCH, P)
    stage.add_trial(fake.frozen_trial(SEARCH, P, attrs))
    decision = Decision(
        "batching",
        "output_throughput",
        "maximize",
        True,
        "gain",
        candidate_trial=1,
        candidate_params=P,
    )
    stage.set_user_attr("decision", decision.to_dict())
    confirm = fake.new_study(storage, confirm_study("demo"))
    for role, params in (("incumbent", {}), ("candidate", P)):
        values = CONFIRM[role]
        attrs = fake.measured_attrs(root, f"batching-confirm-{role}", role, values, params)
        confirm.add_trial(
            fake.frozen_trial(values, {}, {**attrs, "confirm_tag": f"batching/0/{role}"})
        )


def test_the_check_block_holds_the_choices_windows_and_the_pooled_noise(tmp_path: Path) -> None:
    _study(tmp_path)
    review = open_review("demo", None, tmp_path)
    check = build_evidence(review, review.choice()).data["check"]
    assert check["samples"]["output_throughput"] == [1400.0]  # the confirmation, not 1500
    assert check["objectives"]["output_throughput"] == "maximize"
    assert check["model"]["model"] == "/models/tiny-llama" and check["min_gain"] == 0.05
    # Two configurations measured more than once: the baseline's (2 windows + 1 confirmation)
    # and the candidate's (its search window + 1 confirmation): 2 + 1 degrees of freedom.
    control = np.log([1000.0, 900.0, 950.0])
    chosen = np.log([1500.0, 1400.0])
    ss = ((control - control.mean()) ** 2).sum() + ((chosen - chosen.mean()) ** 2).sum()
    noise = check["noise"]["output_throughput"]
    assert noise["df"] == 3 and noise["rel_sd"] == pytest.approx(math.sqrt(ss / 3))
    baseline = build_evidence(review, review.choice("baseline", 0)).data["check"]
    assert baseline["samples"]["output_throughput"] == [1000.0, 900.0, 950.0]


def test_the_evidence_says_how_many_windows_it_holds_and_what_a_check_resolves_with_them(
    tmp_path: Path,
) -> None:
    """One confirmation window of the winner and the study's noise over 3 df: a 12-window
    check resolves 20 % with it; 10 % needs more windows of the winner, from the same rule."""
    _study(tmp_path)
    review = open_review("demo", None, tmp_path)
    evidence = build_evidence(review, review.choice())
    plan = evidence.data["check"]["windows"]["output_throughput"]
    assert plan["recorded"] == 1 and plan["check_windows"] == 12 and plan["asked"] == 0.2
    data = evidence.data["check"]["noise"]["output_throughput"]
    noise = NoiseEstimate(data["rel_sd"], data["df"])
    pooled = NoiseEstimate(noise.rel_sd, noise.df + 11)  # the check's 12 windows pool in
    assert plan["resolves"] == pytest.approx(pooled.resolution(1, 12)) and plan["resolves"] < 0.2
    assert (
        plan["more_needed"] == 0 and evidence.data["check"]["resolve"]["output_throughput"] == 0.2
    )
    assert evidence.lines[-1].startswith("check: 1 windows of this config")
    assert "study.repeats" not in evidence.lines[-1]
    strict = windows_plan(noise, 1, CheckConfig(resolve=0.1), "output_throughput")
    more = strict["more_needed"]
    assert more > 0 and strict["resolves"] > 0.1
    assert NoiseEstimate(noise.rel_sd, noise.df + 11 + more).resolution(1 + more, 12) <= 0.1
    assert NoiseEstimate(noise.rel_sd, noise.df + 10 + more).resolution(more, 12) > 0.1
    line = windows_line({"output_throughput": strict})
    assert f"needs {more} more windows for 10%" in line and "study.repeats" in line


def test_export_measure_asks_the_largest_need_within_its_budget() -> None:
    """`tuner export --measure`: the windows the objective that needs most asks for, capped by
    the budget; two where a noise is still unknown; none where no number of windows would do."""
    noise = NoiseEstimate(0.08, 3)
    strict = windows_plan(noise, 1, CheckConfig(resolve=0.1), "output_throughput")
    loose = windows_plan(noise, 1, CheckConfig(resolve=0.5), "p99_e2e")
    assert strict["more_needed"] > 2 and loose["more_needed"] == 0
    plan = {"output_throughput": strict, "p99_e2e": loose}
    assert windows_wanted(plan, 100) == strict["more_needed"]
    assert windows_wanted(plan, 2) == 2
    assert windows_wanted({"p99_e2e": loose}, 100) == 0
    unknown = windows_plan(NoiseEstimate(math.nan, 0), 1, CheckConfig(), "output_throughput")
    assert unknown["resolves"] is None and windows_wanted({"x": unknown}, 100) == 2
    hopeless = {"more_needed": None, "resolves": 0.6}  # the check's own side alone is wider
    assert windows_wanted({"x": hopeless}, 100) == 0
    # which export --measure names as such, never as resolved
    asked = {**hopeless, "asked": 0.2}
    assert _hopeless({"x": asked, "p99_e2e": {**loose, "asked": 0.5}}) == ["x"]
    assert _hopeless({"p99_e2e": loose}) == [] and _hopeless({"x": unknown}) == []


def test_export_measure_refuses_a_budget_below_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--max-windows must be at least 1"):
        measure_for_check("demo", None, tmp_path, None, None, 0, print)
