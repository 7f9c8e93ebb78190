"""The driver's side of parallel trials, on a virtual clock: the real StudyRunner, samplers,
storage and stage loop (tuner/study/loop/stage_search.py, running_trials.py), with an executor
that runs each trial instantly and finishes them in the order their table durations say.
Ray's own placement is tested for real in tests/integration/test_ray_*.py; here the driver's
decisions are: what it asks when, what it lets start, what it records for a lost or
interrupted trial.
"""

from __future__ import annotations

import heapq
from pathlib import Path
from typing import Any

import optuna
import pytest

from tuner.config import ParamSpec, SamplerConfig, TunerConfig
from tuner.errors import StudyFailedError
from tuner.executor import REASON_EXECUTOR_LOST, Demand, JobResult, TrialDevices, TrialJob
from tuner.measurement.stats import Measurements, MetricStats
from tuner.paths import TrialPaths
from tuner.schema import Role, TrialAttr, TrialStatus, confirm_study
from tuner.search.resolved import ResolvedLaunch
from tuner.study.decision.evaluation import Evaluator
from tuner.study.loop.runner import StudyRunner
from tuner.trial.outcome import TrialOutcome

GPUS = 8


def table_trial(
    config: TunerConfig, launch: ResolvedLaunch, paths: Any, trial_id: str, progress: Any = None
) -> TrialOutcome:
    tp = int(launch.spec.args.get("tensor_parallel_size") or 1)
    stats = MetricStats(n=10, p50=1.0, p99=2.0)
    m = Measurements(
        ttft=stats,
        tpot=stats,
        itl=MetricStats(),
        e2e=stats,
        window_s=10.0,
        requests_started=10,
        completed=10,
        failed=0,
        errors_by_kind={},
        error_rate=0.0,
        request_throughput=1.0,
        output_throughput=100.0 * tp,
        total_throughput=100.0 * tp,
        goodput=1.0,
        mean_prompt_tokens=None,
        mean_output_tokens=None,
        dispatch_lag_p99_s=None,
    )
    outcome = TrialOutcome(trial_id, TrialStatus.OK, ["table"], launch.record(), measurements=m)
    outcome.write(paths.ensure().result_json)
    return outcome


class VirtualExecutor:
    """8 GPUs, ``slots`` at once; a trial of TP t lasts 100 + 10 t virtual seconds."""

    name = "virtual"

    def __init__(
        self,
        slots: int = GPUS,
        lose: set[int] = frozenset(),  # type: ignore[assignment]
        interrupt_at: int = 0,
    ) -> None:
        self.slots, self.lose, self.interrupt_at = slots, set(lose), interrupt_at
        self.now = 0.0
        self.running: list[tuple[float, int, TrialJob]] = []
        self.started: list[tuple[float, TrialJob]] = []
        self.waits = 0

    @property
    def in_flight(self) -> int:
        return len(self.running)

    def _used(self) -> int:
        return sum(job.demand.gpus for _, _, job in self.running)

    def fits(self, demand: Demand) -> bool:
        return len(self.running) < self.slots and self._used() + demand.gpus <= GPUS

    def largest_node(self) -> Demand:
        return Demand(GPUS, 64)

    def submit(self, job: TrialJob) -> None:
        assert len(self.running) < self.slots
        self.started.append((self.now, job))
        end = self.now + 100.0 + 10.0 * job.demand.gpus
        heapq.heappush(self.running, (end, len(self.started), job))

    def wait(self) -> JobResult:
        self.waits += 1
        if self.waits == self.interrupt_at:
            raise KeyboardInterrupt
        end, n, job = heapq.heappop(self.running)
        self.now = end
        outcome = table_trial(job.config, job.launch, TrialPaths(job.folder), job.trial_id)
        result = JobResult(job.key, outcome, TrialDevices("virtual"))
        if n in self.lose:
            outcome.fail(REASON_EXECUTOR_LOST, "the node died")
            result.lost = "the node died"
        return result

    def cancel_all(self) -> None:
        self.running.clear()

    def close(self) -> None:
        self.running.clear()


def _config(tmp_path: Path, tps: list[int], trials: int) -> TunerConfig:
    config = TunerConfig(name="virtual", studies_dir=str(tmp_path))
    config.server.device, config.server.model = "cuda", "table"
    seqs = ParamSpec(type="categorical", choices=[16 * (i + 1) for i in range(16)])
    tp = ParamSpec(type="categorical", choices=tps)
    config.search_space = {"p": {"tensor_parallel_size": tp, "max_num_seqs": seqs}}
    config.study.stages, config.study.trials_per_stage = ["p"], trials
    config.study.repeats, config.study.baseline_measurements = 0, 2
    config.study.reuse = False
    config.sampler = SamplerConfig("random")
    config.objectives.names = ["output_throughput"]
    config.objectives.select_by = "output_throughput"
    config.quality.enabled = False
    return config


def _runner(config: TunerConfig, executor: VirtualExecutor, said: list[str]) -> StudyRunner:
    return StudyRunner(
        config, Evaluator(config), {"v": 1}, said.append, trial_fn=table_trial, executor=executor
    )


def _run(config: TunerConfig, executor: VirtualExecutor) -> tuple[StudyRunner, list[str]]:
    said: list[str] = []
    runner = _runner(config, executor, said)
    runner.run()
    return runner, said


def _stage(config: TunerConfig) -> optuna.Study:
    url = f"sqlite:///{config.studies_dir}/{config.name}/optuna.db"
    return optuna.load_study(study_name=f"{config.name}:p", storage=url)


def test_small_trials_pack_around_a_large_one_that_is_not_starved(tmp_path: Path) -> None:
    config = _config(tmp_path, [1, 2, 8], trials=32)
    executor = VirtualExecutor()
    _run(config, executor)
    stage = [(t, job) for t, job in executor.started if job.trial_id.startswith("p-")]
    assert len(stage) == 32
    numbers = [int(job.trial_id.split("-")[1]) for _, job in stage]
    for i, (_, job) in enumerate(stage):
        # asked before it, started after it: the times a large proposal was passed over
        passed = sum(1 for n in numbers[:i] if n > numbers[i])
        assert passed <= executor.slots, job.trial_id
    used = [0.0] * len(stage)  # never more GPUs at once than the node has
    for i, (start, job) in enumerate(stage):
        end = start + 100.0 + 10.0 * job.demand.gpus
        used[i] = sum(j.demand.gpus for s, j in stage if s <= start < s + 100 + 10 * j.demand.gpus)
        assert used[i] <= GPUS and end > start
    assert any(n > numbers[i] for i in range(len(numbers)) for n in numbers[:i])  # some packing


def test_parallel_baselines_and_proposals_run_side_by_side(tmp_path: Path) -> None:
    config = _config(tmp_path, [1, 2], trials=8)
    executor = VirtualExecutor()
    runner, said = _run(config, executor)
    starts = [t for t, _ in executor.started]
    assert starts[:2] == [0.0, 0.0]  # both baselines at once
    assert starts[2:].count(starts[2]) >= 4  # the stage's first proposals together
    assert runner.parallel and any("trial 8/8" in line for line in said)
    assert len(_stage(config).trials) == 8


def test_a_lost_trial_is_failed_and_measured_again(tmp_path: Path) -> None:
    config = _config(tmp_path, [1, 2], trials=6)
    executor = VirtualExecutor(slots=3, lose={4})  # the second stage trial submitted
    _, said = _run(config, executor)
    trials = _stage(config).trials
    lost = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    assert len(lost) == 1 and lost[0].user_attrs[TrialAttr.FAILURE_REASON] == REASON_EXECUTOR_LOST
    done = [
        t
        for t in trials
        if t.state == optuna.trial.TrialState.COMPLETE
        and t.user_attrs[TrialAttr.ROLE] == Role.SEARCH
    ]
    assert len(done) == 6  # the budget is met
    assert any("FAILED (executor_lost): the node died; measured again" in line for line in said)


def _confirm_trials(config: TunerConfig) -> list[optuna.trial.FrozenTrial]:
    url = f"sqlite:///{config.studies_dir}/{config.name}/optuna.db"
    return optuna.load_study(study_name=confirm_study(config.name), storage=url).trials


def test_a_lost_confirmation_trial_is_failed_and_measured_again(tmp_path: Path) -> None:
    """Confirmations go through the same rule as the stage's trials: the 9th job (the first
    after 2 baselines and 6 stage trials) is a confirmation, lost, recorded failed and
    measured again, and the stage still decides."""
    config = _config(tmp_path, [1, 2], trials=6)
    config.study.repeats = 1
    executor = VirtualExecutor(slots=3, lose={9})
    said: list[str] = []
    result = _runner(config, executor, said).run()
    assert executor.started[8][1].trial_id.startswith("p-confirm")
    confirm = _confirm_trials(config)
    lost = [t for t in confirm if t.state == optuna.trial.TrialState.FAIL]
    assert len(lost) == 1 and lost[0].user_attrs[TrialAttr.FAILURE_REASON] == REASON_EXECUTOR_LOST
    assert sum(t.state == optuna.trial.TrialState.COMPLETE for t in confirm) >= 2  # both sides
    assert any("FAILED (executor_lost): the node died; measured again" in line for line in said)
    assert len(result.decisions) == 1


def test_a_confirmation_lost_again_and_again_stops_the_study(tmp_path: Path) -> None:
    config = _config(tmp_path, [1, 2], trials=6)
    config.study.repeats = 1
    executor = VirtualExecutor(slots=1, lose=set(range(9, 40)))  # every job after the stage's
    with pytest.raises(StudyFailedError, match=r"lost the trial .* 3 times"):
        _run(config, executor)
    running = [t for t in _confirm_trials(config) if t.state == optuna.trial.TrialState.RUNNING]
    assert running == []


def test_an_interrupt_leaves_no_trial_running(tmp_path: Path) -> None:
    config = _config(tmp_path, [1, 2], trials=8)
    executor = VirtualExecutor(slots=4, interrupt_at=3)  # during the stage, four in flight
    with pytest.raises(KeyboardInterrupt):
        _run(config, executor)
    trials = _stage(config).trials
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    failed = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    assert failed and all(t.user_attrs[TrialAttr.INTERRUPTED] for t in failed)


def test_a_search_trial_runs_the_launch_resolved_where_its_point_was_suggested(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tuner.study.loop import running_trials, stage_search

    made: dict[int, ResolvedLaunch] = {}
    real = stage_search.resolve

    def resolve_once(spec: Any, server: Any) -> ResolvedLaunch:
        launch = real(spec, server)
        made[id(launch)] = launch
        return launch

    stored: list[dict[str, Any]] = []  # what RunningTrials resolved from stored params itself
    real_of = running_trials.RunningTrials.resolved_of

    def of_params(self: Any, params: dict[str, Any]) -> ResolvedLaunch:
        stored.append(params)
        return real_of(self, params)

    monkeypatch.setattr(stage_search, "resolve", resolve_once)
    monkeypatch.setattr(running_trials.RunningTrials, "resolved_of", of_params)
    config = _config(tmp_path, [1, 2], trials=6)
    executor = VirtualExecutor(slots=2)
    _run(config, executor)
    search = [job for _, job in executor.started if job.trial_id.startswith("p-")]
    assert len(search) == 6
    # each search job carries the very value made at the suggestion: nothing re-derived it
    assert all(made.get(id(job.launch)) is job.launch for job in search)
    for job in search:  # and its command line was rendered from those flags, once
        argv = job.launch.argv
        assert argv[argv.index("--max-num-seqs") + 1] == str(job.launch.flags["max_num_seqs"])
    assert stored == [{}, {}]  # the two baselines, the only measurements by stored params
