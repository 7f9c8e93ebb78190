"""study.prescreen: a GPU study whose trials are a stand-in (there is no GPU here), screened and
ordered by the real estimator; and estimate_vs_measured on values with a known answer."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import optuna
import pytest

from tuner.composition import compose
from tuner.config import ParamSpec, TunerConfig
from tuner.measurement.stats import Measurements, MetricStats
from tuner.plan.estimate import PLAN_ATTRS
from tuner.plan.fidelity import estimate_vs_measured, spearman, trials_agreement
from tuner.plan.planner import Planner
from tuner.plan.table import MAX_SLOPE, TTFT_SLOPE, Scale
from tuner.review.render import html_page, summary_text
from tuner.review.report import build_report
from tuner.review.stored import open_review
from tuner.schema import Role, TrialAttr, TrialStatus
from tuner.scoring.feasibility import meets
from tuner.search import space as search_space
from tuner.search.launch import LaunchSpec
from tuner.search.resolved import ResolvedLaunch
from tuner.study.decision.evaluation import Evaluator
from tuner.study.decision.stages import Incumbent, Stage
from tuner.study.loop.prescreen import Prescreen, seeds_for
from tuner.study.loop.runner import StudyRunner
from tuner.study.state.stored_stage import StoredStage
from tuner.trial.outcome import REASON_SCREENED, TrialOutcome

logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)


def _outcome(launch: LaunchSpec, trial_id: str) -> TrialOutcome:
    """A measured window whose throughput grows with TP (what a GPU would roughly show)."""
    tp = int(launch.args.get("tensor_parallel_size") or 1)
    n = 100
    m = Measurements(
        ttft=MetricStats.of([0.2] * n),
        tpot=MetricStats.of([0.03 / tp] * n),
        itl=MetricStats(),
        e2e=MetricStats.of([1.0 / tp] * n),
        window_s=10.0,
        requests_started=n,
        completed=n,
        failed=0,
        errors_by_kind={},
        error_rate=0.0,
        request_throughput=10.0 * tp,
        output_throughput=640.0 * tp,
        total_throughput=1000.0 * tp,
        goodput=10.0 * tp,
        mean_prompt_tokens=336.0,
        mean_output_tokens=64.0,
        dispatch_lag_p99_s=None,
    )
    return TrialOutcome(trial_id, TrialStatus.OK, [], launch, measurements=m)


def _config(tmp_path: Path) -> TunerConfig:
    return compose(
        [
            "study=llama70b_8xh200",
            "server.model=meta-llama/Meta-Llama-3.1-70B",
            "plan.system=h200_sxm",
            "study.prescreen=true",
            # the whole server's throughput selects, and the baseline is vLLM's TP 1: the
            # estimator's first point is then the most GPUs (the preset's own choices differ)
            "objectives=default",
            "~server.args.tensor_parallel_size",
            "search_space=[parallelism]",
            "search_space.parallelism.tensor_parallel_size.choices=[1,2,4,8]",
            "search_space.parallelism.pipeline_parallel_size.choices=[1]",
            "study.stages=[parallelism]",
            # a budget of 4 launches for 4 points, one of which cannot fit: the stage proposes
            # every point, and ends when all are measured or screened
            "study.trials_per_stage=4",
            "study.repeats=0",
            "study.baseline_measurements=1",
            "quality.enabled=false",
            "sampler=random",
            f"studies_dir={tmp_path}",
        ]
    )


def test_a_point_that_cannot_fit_is_screened_unlaunched_and_the_best_go_first(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    launched: list[dict[str, Any]] = []

    def trial_fn(
        cfg: TunerConfig, launch: ResolvedLaunch, paths: Any, trial_id: str, progress: Any = None
    ) -> TrialOutcome:
        launched.append(dict(launch.spec.args))
        return _outcome(launch.spec, trial_id)

    said: list[str] = []
    evaluator = Evaluator(config, "H200")
    runner = StudyRunner(config, evaluator, {"t": 1}, said.append, trial_fn=trial_fn)
    runner.prescreen = Prescreen(config, evaluator, said.append, None, Planner(config))
    runner.run()
    study = optuna.load_study(
        study_name="llama70b_8xh200:parallelism", storage=f"sqlite:///{runner.paths.storage_db}"
    )
    search = [t for t in study.trials if t.user_attrs.get("role") == Role.SEARCH]
    screened = [  # a re-proposal of it is answered from the storage (reused_from), not again
        t
        for t in search
        if t.user_attrs.get("failure_reason") == REASON_SCREENED
        and "reused_from" not in t.user_attrs
    ]
    # bf16 70B weights do not fit one H200: TP 1 is told as infeasible and never launched
    assert [t.params["tensor_parallel_size"] for t in screened] == [1]
    assert not meets(screened[0].constraints)
    assert "estimated not to fit on h200_sxm" in screened[0].user_attrs["failure_message"]
    assert all(a.get("tensor_parallel_size") != 1 for a in launched[1:])  # [0]: the baseline
    assert len(launched) == 1 + 3  # the baseline, then the three points that fit
    # the first trial is the estimator's best point for throughput (the selection objective)
    assert search[0].params == {"tensor_parallel_size": 8, "pipeline_parallel_size": 1}
    assert any("next trial(s) from the estimator" in line for line in said)
    assert any("all 4 points of its space are measured" in line for line in said)
    for t in search:  # the estimate sits beside the measurement of every launched trial
        assert set(PLAN_ATTRS) <= set(t.user_attrs)
    # ... and the report sets them side by side: the stand-in's TPOT falls with TP as the
    # estimator's does (the same order); its TTFT is constant, so it has no order to agree with
    report = build_report(open_review(config.name, studies_dir=tmp_path), figures=False)
    assert report.estimates is not None
    own = [t for t in search if "reused_from" not in t.user_attrs]
    assert sorted(report.estimates.points["trial"]) == sorted(
        f"parallelism#{t.number}" for t in own if t.user_attrs.get("status") == "ok"
    )
    tpot, ttft = report.estimates.agreement["tpot"], report.estimates.agreement["ttft"]
    assert tpot.n == 3 and tpot.spearman == pytest.approx(1.0) and ttft.spearman is None
    assert "id='estimates'" in html_page(report) and "Spearman rho 1.00" in summary_text(report)


def test_spearman_and_ratios_on_known_values() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2], [1, 2]) is None and spearman([1, 1, 1], [1, 2, 3]) is None
    got = estimate_vs_measured(
        [1.0, 2.0, 4.0, None, float("nan")], [2.0, 4.0, 8.0, 3.0, 1.0], "tpot"
    )
    assert got.n == 3 and got.spearman == pytest.approx(1.0)
    assert got.ratio_median == pytest.approx(2.0) and got.abs_error_median == pytest.approx(0.5)
    attrs = [
        {"plan_tpot_ms": 10.0 * i, "m_tpot_mean_s": 0.012 * i, "plan_ttft_ms": None}
        for i in range(1, 5)
    ]
    agreement = trials_agreement(attrs)
    assert agreement["tpot"].ratio_median == pytest.approx(1.2) and agreement["ttft"].n == 0


def _fp8_70b(tmp_path: Path, *overrides: str) -> TunerConfig:
    """Llama-3.1-70B FP8 on H200s at 64 users of 1024/1024 tokens, TP the only knob, per-GPU
    throughput the selection objective (the fleet objectives of a GPU study)."""
    return compose(
        [
            "study=llama70b_8xh200",
            "server.model=meta-llama/Meta-Llama-3.1-70B",
            "plan.system=h200_sxm",
            "plan.backend_version=0.24.0",
            "study.prescreen=true",
            "+server.args.quantization=fp8",
            "+server.args.max_num_seqs=64",
            "search_space=[parallelism]",
            "study.stages=[parallelism]",
            "search_space.parallelism.tensor_parallel_size.choices=[1,2,4,8]",
            "search_space.parallelism.pipeline_parallel_size.choices=[1]",
            "study.trials_per_stage=3",
            "workload.concurrency=64",
            "workload.classes=[{prompt_tokens:{mean:1024},output_tokens:{mean:1024}}]",
            "objectives.names=[output_throughput_per_gpu,output_throughput_per_user]",
            "objectives.select_by=output_throughput_per_gpu",
            f"studies_dir={tmp_path}",
            *overrides,
        ]
    )


def _first_enqueued(config: TunerConfig) -> dict[str, Any]:
    planner = Planner(config)
    screen = Prescreen(config, Evaluator(config, "H200"), lambda _: None, None, planner)
    study = optuna.create_study(directions=["maximize", "maximize"])
    stage = Stage("parallelism", config.search_space["parallelism"], config.study.trials_per_stage)
    assert screen.enqueue_best(StoredStage(study, stage), Incumbent({}, [], {}, "baseline")) == 1
    return search_space.suggest(study.ask(), stage.specs)  # the stage's first proposal


def test_the_estimators_first_point_follows_the_per_gpu_objective(tmp_path: Path) -> None:
    """With loose SLOs every TP meets them; per GPU, TP 1 makes the most tokens (the whole
    server's rate would have picked TP 8, the most GPUs)."""
    config = _fp8_70b(tmp_path, "slo.p99_ttft_s=10", "slo.p99_tpot_s=1", "slo.p99_e2e_s=100")
    points, _, _ = Planner(config).space(config.search_space["parallelism"])
    per_gpu = {p.params["tensor_parallel_size"]: p.estimate.tokens_s_gpu for p in points}
    total = {p.params["tensor_parallel_size"]: p.estimate.tokens_s for p in points}
    assert max(per_gpu, key=per_gpu.__getitem__) == 1 and max(total, key=total.__getitem__) == 8
    assert _first_enqueued(config)["tensor_parallel_size"] == 1


def test_when_no_estimate_meets_the_slos_the_nearest_goes_first(tmp_path: Path) -> None:
    """A TTFT SLO under every TP's estimate: the point that misses it by least (TP 8, whose
    estimated TTFT is the lowest) goes first, not the one with the most tokens per GPU."""
    config = _fp8_70b(tmp_path, "slo.p99_ttft_s=0.15", "slo.p99_tpot_s=1", "slo.p99_e2e_s=100")
    points, _, _ = Planner(config).space(config.search_space["parallelism"])
    slo = config.slo
    assert not any(p.meets(slo) for p in points)
    over = {p.params["tensor_parallel_size"]: p.overshoot(slo) for p in points}
    ttft = {p.params["tensor_parallel_size"]: p.estimate.ttft_ms for p in points}
    assert over[8] == pytest.approx(ttft[8] / 150 - 1) and over[8] < over[4] < over[2] < over[1]
    assert _first_enqueued(config)["tensor_parallel_size"] == 8


def test_estimates_are_anchored_on_the_incumbents_measured_p99(tmp_path: Path) -> None:
    """The incumbent (TP 8) measured a P99 TTFT 0.7x its estimated mean: scaled so, TP 8's
    neighbours read as they would measure; a failed measurement (1e6 overshoot) anchors nothing."""
    config = _fp8_70b(tmp_path, "slo.p99_ttft_s=0.15", "slo.p99_tpot_s=1", "slo.p99_e2e_s=100")
    planner = Planner(config)
    screen = Prescreen(config, Evaluator(config, "H200"), lambda _: None, None, planner)
    at = {"tensor_parallel_size": 8, "pipeline_parallel_size": 1}
    estimated_s = planner.estimate(at).ttft_ms / 1000
    measured_s = 0.7 * estimated_s
    incumbent = Incumbent(at, [1.0], {"slo_p99_ttft": measured_s / 0.15 - 1}, "baseline")
    anchor = screen.anchor(incumbent)
    assert anchor.ttft.factor == pytest.approx(0.7) and anchor.tpot.factor == 1.0  # no TPOT SLO set
    point = planner.planned(at)
    assert point.overshoot(config.slo) > 0 and point.overshoot(config.slo, anchor) == 0
    failed = Incumbent(at, [1.0], {"slo_p99_ttft": 1e6}, "baseline")
    assert screen.anchor(failed).ttft.factor == 1.0


def test_a_scale_runs_through_two_batches_and_is_flat_at_one() -> None:
    """Hand-computed: factors 0.5 at batch 4 and 1.0 at 64 are a slope of ln 2 / ln 16."""
    scale = Scale.fit([(4, 0.5), (64, 1.0)])
    assert scale.slope == pytest.approx(0.25)
    assert scale(4) == pytest.approx(0.5) and scale(64) == pytest.approx(1.0)
    assert scale(16) == pytest.approx(0.5 * 4**0.25)
    flat = Scale.fit([(64, 0.8), (64, 0.2)])  # one batch: the geometric mean, everywhere
    assert flat.slope == 0 and flat(4) == pytest.approx(0.4)
    known = Scale.fit([(64, 0.4)], prior=0.5)  # ... or along a slope known beforehand
    assert known(64) == pytest.approx(0.4) and known(16) == pytest.approx(0.2)
    assert Scale.fit([(1, 0.1), (2, 10.0)]).slope == MAX_SLOPE  # two noisy windows, bounded
    assert Scale.fit([])(16) == 1.0


def _batching_70b(tmp_path: Path, slo_ttft_s: float) -> TunerConfig:
    """The 70B FP8 at TP 8 on H200s, max_num_seqs the only knob, 64 users of 1024/1024."""
    config = compose(
        [
            "study=llama70b_8xh200",
            "server.model=meta-llama/Meta-Llama-3.1-70B",
            "plan.system=h200_sxm",
            "plan.backend_version=0.24.0",
            "study.prescreen=true",
            "+server.args.quantization=fp8",
            "server.args.tensor_parallel_size=8",
            "search_space=[batching]",
            "study.stages=[batching]",
            "study.trials_per_stage=4",
            "workload.concurrency=64",
            "workload.classes=[{prompt_tokens:{mean:1024},output_tokens:{mean:1024}}]",
            "objectives.names=[output_throughput_per_gpu,output_throughput_per_user]",
            "objectives.select_by=output_throughput_per_gpu",
            f"slo.p99_ttft_s={slo_ttft_s}",
            "slo.p99_tpot_s=1",
            "slo.p99_e2e_s=1000",
            f"studies_dir={tmp_path}",
        ]
    )
    seqs = ParamSpec(type="categorical", choices=[4, 8, 16, 32, 64])
    config.search_space = {"batching": {"max_num_seqs": seqs}}
    return config


def test_each_seed_is_chosen_knowing_how_the_last_one_measured(tmp_path: Path) -> None:
    """The incumbent (64 sequences) measured its estimated TTFT. Before any launch of the
    stage the known slope scales the estimates of smaller batches down, and the SLO is set so
    that 8 sequences is the largest that meets it (its bare estimate misses): 8 goes first. It
    measures at 0.3 of its estimate, under what that slope said: the factor is steeper than
    assumed, and the next seed is the larger batch (more tokens per GPU) that the fitted slope
    says meets the SLO, one the known slope alone said would miss."""
    batches = [4, 8, 16, 32, 64]
    planner = Planner(_batching_70b(tmp_path, 1.0))
    est = {n: planner.estimate({"max_num_seqs": n}).ttft_ms / 1000 for n in batches}
    known = Scale(1.0, TTFT_SLOPE, 64)
    slo = est[8] * known(8) * 1.01
    assert est[8] > slo and est[16] * known(16) > slo
    config = _batching_70b(tmp_path, slo)
    screen = Prescreen(config, Evaluator(config, "H200"), lambda _: None, None, Planner(config))
    stage = Stage("batching", config.search_space["batching"], config.study.trials_per_stage)
    incumbent = Incumbent({}, [1.0], {"slo_p99_ttft": est[64] / slo - 1}, "baseline")
    study = optuna.create_study(directions=["maximize", "maximize"])

    def next_seed() -> optuna.Trial:
        assert screen.enqueue_best(StoredStage(study, stage), incumbent) == 1
        assert (
            screen.enqueue_best(StoredStage(study, stage), incumbent) == 0
        )  # the queued one goes first
        trial = study.ask()
        search_space.suggest(trial, stage.specs)
        assert trial.user_attrs[TrialAttr.SEEDED]
        return trial

    first = next_seed()
    assert first.params["max_num_seqs"] == 8
    first.set_user_attr(TrialAttr.ROLE, Role.SEARCH)
    first.set_user_attr(TrialAttr.STATUS, TrialStatus.OK)
    first.set_constraint("slo_p99_ttft", 0.3 * est[8] / slo - 1)
    study.tell(first, [1.0, 1.0])
    fitted = Scale.fit([(8, 0.3), (64, 1.0)])
    meeting = [n for n in batches if n > 8 and est[n] * fitted(n) <= slo]
    assert meeting and all(est[n] * known(n) > slo for n in meeting)
    assert next_seed().params["max_num_seqs"] == max(meeting)
    next_seed()  # the third of 4 trials: the estimator chooses all but the sampler's one
    assert screen.enqueue_best(StoredStage(study, stage), incumbent) == 0 and seeds_for(stage) == 3


def test_trials_side_by_side_start_from_seeds_chosen_at_once(tmp_path: Path) -> None:
    """With four slots nothing is measured before the stage's trials start together, so the
    estimator queues all its seeds (2 of a 3-trial stage) at the stage's start, in one line."""
    from tests.unit.test_executor_parallel import VirtualExecutor, table_trial

    config = _fp8_70b(
        tmp_path,
        "slo.p99_ttft_s=10",
        "slo.p99_tpot_s=1",
        "slo.p99_e2e_s=100",
        "quality.enabled=false",
        "study.repeats=0",
    )
    said: list[str] = []
    evaluator = Evaluator(config, "H200")
    runner = StudyRunner(
        config,
        evaluator,
        {"t": 1},
        said.append,
        trial_fn=table_trial,
        executor=VirtualExecutor(slots=4),
    )
    runner.prescreen = Prescreen(config, evaluator, said.append, None, Planner(config))
    runner.run()
    seeded = [line for line in said if "from the estimator" in line]
    assert len(seeded) == 1 and seeded[0].count("tensor_parallel_size") == 2, seeded
    study = optuna.load_study(
        study_name=f"{config.name}:parallelism", storage=f"sqlite:///{runner.paths.storage_db}"
    )
    assert sum(bool(t.user_attrs.get(TrialAttr.SEEDED)) for t in study.trials) == 2


def test_a_point_measured_under_another_unmodelled_flag_is_not_seeded_again(
    tmp_path: Path,
) -> None:
    """The estimator cannot tell chunked prefill on from off: a batch measured with either is
    measured, and the next seed is another batch."""
    config = _batching_70b(tmp_path, 1.0)
    specs = {**config.search_space["batching"], "enable_chunked_prefill": ParamSpec(type="bool")}
    config.search_space = {"batching": specs}
    screen = Prescreen(config, Evaluator(config, "H200"), lambda _: None, None, Planner(config))
    stage = Stage("batching", specs, 4)
    incumbent = Incumbent({}, [1.0], {}, "baseline")
    study = optuna.create_study(directions=["maximize", "maximize"])
    assert screen.enqueue_best(StoredStage(study, stage), incumbent) == 1
    first = study.ask()
    point = search_space.suggest(first, stage.specs)
    study.tell(first, [1.0, 1.0])
    assert screen.enqueue_best(StoredStage(study, stage), incumbent) == 1
    assert len(study.get_trials(states=(optuna.trial.TrialState.WAITING,))) == 1
    again = search_space.suggest(study.ask(), stage.specs)
    assert again["max_num_seqs"] != point["max_num_seqs"]
