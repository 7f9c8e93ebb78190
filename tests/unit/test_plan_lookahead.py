"""study.prescreen looks one stage ahead: a TP is judged by its best batch (real AIConfigurator
estimates of Llama-3.1-70B FP8 on H200s, 64 users of 8192/1024; the windows here read what the
estimator says, so each anchor is 1 and the expected points follow from the estimates)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import optuna
import pytest

from tuner.composition import compose
from tuner.config import ParamSpec, SloConfig, TunerConfig
from tuner.plan.planner import Planner
from tuner.plan.table import Anchor, Scale
from tuner.schema import Role, TrialAttr, TrialStatus
from tuner.search import space as search_space
from tuner.study.decision.evaluation import Evaluator
from tuner.study.decision.stages import Incumbent, Stage
from tuner.study.loop.prescreen import LOOKAHEAD_TOLERANCE, Prescreen
from tuner.study.state.stored_stage import StoredStage

logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
BATCHES = [4, 8, 16, 32, 64]


def _config(tmp_path: Path, tpot_s: float) -> TunerConfig:
    config = compose(
        [
            "study=llama70b_8xh200",
            "server.model=meta-llama/Meta-Llama-3.1-70B",
            "plan.system=h200_sxm",
            "plan.backend_version=0.24.0",
            "study.prescreen=true",
            "+server.args.quantization=fp8",
            "search_space=[parallelism,batching]",
            "study.stages=[parallelism,batching]",
            "study.trials_per_stage=3",
            "search_space.parallelism.tensor_parallel_size.choices=[1,2,4,8]",
            "search_space.parallelism.pipeline_parallel_size.choices=[1]",
            "workload.concurrency=64",
            "workload.classes=[{prompt_tokens:{mean:8192},output_tokens:{mean:1024}}]",
            "objectives.names=[output_throughput_per_gpu,output_throughput_per_user]",
            "objectives.select_by=output_throughput_per_gpu",
            "slo.p99_ttft_s=100",
            f"slo.p99_tpot_s={tpot_s}",
            "slo.p99_e2e_s=0",
            f"studies_dir={tmp_path}",
        ]
    )
    config.search_space["batching"] = {
        "max_num_seqs": ParamSpec(type="categorical", choices=BATCHES)
    }
    return config


def _point(tp: int, seqs: int) -> dict[str, Any]:
    return {"tensor_parallel_size": tp, "pipeline_parallel_size": 1, "max_num_seqs": seqs}


def _measured(planner: Planner, params: dict[str, Any], slo: SloConfig) -> dict[str, float]:
    """Constraints of a window that read the estimated means (its anchor is 1)."""
    e = planner.estimate(params)
    return {
        "slo_p99_ttft": e.ttft_ms / 1000 / slo.p99_ttft_s - 1,
        "slo_p99_tpot": e.tpot_ms / 1000 / slo.p99_tpot_s - 1,
    }


def _best_batch(planner: Planner, tp: int, tpot_s: float) -> tuple[int, float]:
    """TP ``tp``'s batch with the most tokens per GPU whose estimated TPOT is within the
    look-ahead's tolerance of ``tpot_s``."""
    limit = tpot_s * (1 + LOOKAHEAD_TOLERANCE)
    meets = [
        (planner.estimate(_point(tp, n)).tokens_s_gpu, n)
        for n in BATCHES
        if planner.estimate(_point(tp, n)).tpot_ms / 1000 <= limit
    ]
    rate, batch = max(meets)
    return batch, rate


@pytest.fixture(scope="module")
def setting(tmp_path_factory: pytest.TempPathFactory) -> tuple[TunerConfig, float]:
    """A TPOT SLO that TP 8 meets up to a larger batch than TP 4, where TP 4 still serves more
    tokens per GPU; at 64 sequences both miss it, TP 4 by more (the silicon 8k/1k table's
    shape). The SLO is 5 % over TP 8's TPOT at 32 sequences."""
    tmp = tmp_path_factory.mktemp("lookahead")
    planner = Planner(_config(tmp, 1.0))
    tpot_s = planner.estimate(_point(8, 32)).tpot_ms / 1000 * 1.05
    config = _config(tmp, tpot_s)
    planner = Planner(config)
    (b4, r4), (b8, r8) = _best_batch(planner, 4, tpot_s), _best_batch(planner, 8, tpot_s)
    over = {tp: _measured(planner, _point(tp, 64), config.slo)["slo_p99_tpot"] for tp in (4, 8)}
    assert b4 < b8 and r4 / r8 - 1 > 0.02 and 0 < over[8] < over[4], (b4, b8, r4, r8, over)
    return config, r4 / r8 - 1


def _screen(config: TunerConfig) -> Prescreen:
    return Prescreen(config, Evaluator(config, "H200"), lambda _: None, None, Planner(config))


def _stages(config: TunerConfig) -> tuple[Stage, Stage]:
    return (
        Stage("parallelism", config.search_space["parallelism"], 3),
        Stage("batching", config.search_space["batching"], 3),
    )


def _incumbent(
    screen: Prescreen, tp: int, constraints: dict[str, float] | None = None
) -> Incumbent:
    params = _point(tp, 64)
    assert screen.planner is not None
    measured = _measured(screen.planner, params, screen.config.slo)
    return Incumbent(params, [1.0, 1.0], constraints or measured, "baseline", [1.0])


def _tell(study: optuna.Study, stage: Stage, screen: Prescreen, params: dict[str, Any]) -> None:
    """A search trial of ``stage`` at ``params`` whose window read the estimate."""
    assert screen.planner is not None
    study.enqueue_trial({p: params[p] for p in stage.specs})
    trial = study.ask()
    search_space.suggest(trial, stage.specs)
    trial.set_user_attr(TrialAttr.ROLE, Role.SEARCH)
    trial.set_user_attr(TrialAttr.STATUS, TrialStatus.OK)
    for key, value in _measured(screen.planner, params, screen.config.slo).items():
        trial.set_constraint(key, value)
    study.tell(trial, [1.0, 1.0])


def test_a_tp_whose_best_batch_beats_the_incumbents_leads_the_batching_stage(
    setting: tuple[TunerConfig, float],
) -> None:
    """TP 8 (the incumbent) misses the SLO at 64 sequences by less than TP 4, so the stage
    keeps it; but TP 4's best batch serves more per GPU than TP 8's: TP 4 leads, at the
    incumbent's batch, and the line names the batch the estimator expects."""
    config, gain = setting
    screen = _screen(config)
    parallelism, batching = _stages(config)
    incumbent = _incumbent(screen, 8)
    study = optuna.create_study(directions=["maximize", "maximize"])
    for tp in (8, 4):
        _tell(study, parallelism, screen, _point(tp, 64))
    found = screen.lead_ahead(StoredStage(study, parallelism), batching, incumbent, 0.02)
    assert found is not None
    lead, line = found
    assert lead.params == _point(4, 64) and lead.source == "parallelism trial 1 (lead)"
    assert screen.planner is not None
    best = _best_batch(screen.planner, 4, config.slo.p99_tpot_s)[0]
    assert f"{{'max_num_seqs': {best}}}" in line and f"+{gain:.1%}" in line
    # a gain the study would not accept is no lead
    assert (
        screen.lead_ahead(StoredStage(study, parallelism), batching, incumbent, gain + 0.01) is None
    )


def test_a_stage_is_seeded_with_the_tp_whose_best_batch_is_best(
    setting: tuple[TunerConfig, float],
) -> None:
    """Before a launch of the parallelism stage (the baseline TP 2 at 64 sequences): by its
    miss at 64 sequences the first seed would be TP 8; by each TP's best batch in the batching
    stage that follows, it is TP 4, the one that serves most per GPU where it meets the SLO."""
    config, _ = setting
    screen = _screen(config)
    parallelism, batching = _stages(config)
    incumbent = _incumbent(screen, 2)
    seeds = {}
    for name, following in (("by its miss", None), ("by its best batch", batching)):
        study = optuna.create_study(directions=["maximize", "maximize"])
        assert screen.enqueue_best(StoredStage(study, parallelism), incumbent, 1, following) == 1
        proposal = search_space.suggest(study.ask(), parallelism.specs)  # the stage's first
        seeds[name] = proposal["tensor_parallel_size"]
    assert seeds == {"by its miss": 8, "by its best batch": 4}


def test_without_a_ttft_that_anchors_the_estimates_nothing_is_judged_ahead(
    setting: tuple[TunerConfig, float],
) -> None:
    """An unanchored TTFT is the estimator's mean, often half a measured P99. A window whose
    TTFT reads 20x its estimate (the requests queued) anchors nothing: no lead from TP 4,
    whose window queued as well."""
    config, _ = setting
    screen = _screen(config)
    parallelism, batching = _stages(config)
    queued = {**_measured(Planner(config), _point(2, 64), config.slo)}
    queued["slo_p99_ttft"] = 20 * (1 + queued["slo_p99_ttft"]) - 1
    incumbent = _incumbent(screen, 2, queued)
    assert not screen.anchor(incumbent).covers(config.slo)
    assert screen.anchor(_incumbent(screen, 2)).covers(config.slo)
    study = optuna.create_study(directions=["maximize", "maximize"])
    study.enqueue_trial({"tensor_parallel_size": 4, "pipeline_parallel_size": 1})
    trial = study.ask()
    search_space.suggest(trial, parallelism.specs)
    trial.set_user_attr(TrialAttr.ROLE, Role.SEARCH)
    trial.set_user_attr(TrialAttr.STATUS, TrialStatus.OK)
    trial.set_constraint("slo_p99_ttft", queued["slo_p99_ttft"])
    study.tell(trial, [1.0, 1.0])
    assert screen.lead_ahead(StoredStage(study, parallelism), batching, incumbent, 0.02) is None


def test_a_best_batch_just_over_the_slo_still_counts(tmp_path: Path) -> None:
    """TP 8's 32 sequences read 5 % over the TPOT SLO, as the best point of a study sits on
    it: within the tolerance it is TP 8's best batch, and TP 4 leads by what its best batch
    serves over that one, not over TP 8's far slower 16 sequences."""
    planner = Planner(_config(tmp_path, 1.0))
    config = _config(tmp_path, planner.estimate(_point(8, 32)).tpot_ms / 1000 / 1.05)
    screen = _screen(config)
    assert screen.planner is not None
    tpot_s = config.slo.p99_tpot_s
    (b4, r4), (b8, r8) = (_best_batch(screen.planner, tp, tpot_s) for tp in (4, 8))
    assert b8 == 32 and b4 < b8 and r4 / r8 - 1 > 0.02
    parallelism, batching = _stages(config)
    study = optuna.create_study(directions=["maximize", "maximize"])
    for tp in (8, 4):
        _tell(study, parallelism, screen, _point(tp, 64))
    found = screen.lead_ahead(
        StoredStage(study, parallelism), batching, _incumbent(screen, 8), 0.02
    )
    assert found is not None and f"+{r4 / r8 - 1:.1%} over the incumbent's" in found[1]


def test_an_anchor_covers_the_latencies_the_slos_bound() -> None:
    fitted = Scale.fit([(64, 1.5)])
    slo = SloConfig(p99_e2e_s=0, p99_ttft_s=1.0, p99_tpot_s=0.05)
    assert Anchor(ttft=fitted, tpot=fitted).covers(slo)
    assert not Anchor(ttft=fitted).covers(slo)
    assert Anchor(tpot=fitted).covers(SloConfig(p99_e2e_s=0, p99_ttft_s=0, p99_tpot_s=0.05))
    assert fitted.measured == 1 and Scale().measured == 0
