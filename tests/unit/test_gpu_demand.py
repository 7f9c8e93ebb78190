"""A candidate's GPUs (TP x PP x DP) against the host's: `tuner plan` marks a point that needs
more as not fitting, and a study screens it as infeasible without a launch. The trials are a
stand-in (there is no GPU here); the screen, the runner and the storage are real."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
import pytest

from tests.unit.test_executor_parallel import table_trial
from tuner.cli import main
from tuner.composition import compose
from tuner.config import TunerConfig
from tuner.plan.demand import host_gpus, over_host
from tuner.schema import Role, TrialAttr
from tuner.scoring.feasibility import meets
from tuner.search.resolved import ResolvedLaunch
from tuner.study.decision.evaluation import Evaluator
from tuner.study.loop.prescreen import Prescreen
from tuner.study.loop.runner import StudyRunner
from tuner.trial.outcome import REASON_SCREENED, TrialOutcome

logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
TP8_PP2 = {"tensor_parallel_size": 8, "pipeline_parallel_size": 2}


def _study(tmp_path: Path) -> TunerConfig:
    return compose(
        [
            "study=llama70b_8xh200",
            "server=simulated_gpu",
            "search_space=[parallelism]",
            "study.stages=[parallelism]",
            "search_space.parallelism.tensor_parallel_size.choices=[4,8]",
            "study.trials_per_stage=4",
            "study.repeats=0",
            "study.baseline_measurements=1",
            "quality.enabled=false",
            "sampler=random",
            f"studies_dir={tmp_path}",
        ]
    )


def test_a_tp8_pp2_candidate_on_an_8_gpu_host_is_screened_without_a_launch(
    tmp_path: Path,
) -> None:
    config = _study(tmp_path)
    launched: list[dict[str, Any]] = []

    def trial_fn(
        cfg: TunerConfig, launch: ResolvedLaunch, paths: Any, trial_id: str, progress: Any = None
    ) -> TrialOutcome:
        launched.append(dict(launch.spec.args))
        return table_trial(cfg, launch, paths, trial_id, progress)

    said: list[str] = []
    evaluator = Evaluator(config, "H200")
    runner = StudyRunner(config, evaluator, {"t": 1}, said.append, trial_fn=trial_fn)
    # as Session.preflight opens it: the host's 8 GPUs (its largest node), no vLLM check for a
    # simulated server, the estimator only for the baseline's fit (study.prescreen is off)
    runner.prescreen = Prescreen.open(config, evaluator, said.append, host_gpus=8)
    runner.prescreen.baseline_fits()  # TP 8 bf16 fits: silent
    assert runner.prescreen.planner is None
    runner.run()
    study = optuna.load_study(
        study_name=f"{config.name}:parallelism", storage=f"sqlite:///{runner.paths.storage_db}"
    )
    search = [t for t in study.trials if t.user_attrs.get(TrialAttr.ROLE) == Role.SEARCH]
    too_big = [t for t in search if t.params == TP8_PP2 and "reused_from" not in t.user_attrs]
    assert len(too_big) == 1, [t.params for t in search]
    attrs = too_big[0].user_attrs
    assert attrs[TrialAttr.FAILURE_REASON] == REASON_SCREENED
    assert attrs[TrialAttr.FAILURE_MESSAGE] == "needs 16 GPUs, the host has 8"
    assert not meets(too_big[0].constraints)  # told to Optuna as infeasible
    assert launched and all(  # the baseline (TP 8) and the points that fit; never 16 GPUs
        int(a.get("tensor_parallel_size") or 1) * int(a.get("pipeline_parallel_size") or 1) <= 8
        for a in launched
    )
    assert any("not launched (screened): needs 16 GPUs, the host has 8" in s for s in said)


def test_the_plan_marks_points_beyond_the_host_as_not_fitting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["plan", "study=llama70b_8xh200", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0 and "host: 8 GPUs" in out
    table = pd.read_csv(tmp_path / "plan.csv")
    sixteen = table[(table.tensor_parallel_size == 8) & (table.pipeline_parallel_size == 2)]
    assert len(sixteen) and set(sixteen.fits) == {"no"}
    assert set(sixteen.note) == {"needs 16 GPUs, the host has 8"}
    assert "tensor_parallel_size=8 pipeline_parallel_size=2" in out
    assert (table[table.gpus <= 8].note != "needs 16 GPUs, the host has 8").all()


def test_the_hosts_gpus_are_the_executors(tmp_path: Path) -> None:
    config = _study(tmp_path)
    assert host_gpus(config) == 8  # server.cuda_visible_devices of the preset
    config.server.cuda_visible_devices = "2,3"
    assert host_gpus(config) == 2
    assert over_host(config, {"tensor_parallel_size": 4}, 2) == "needs 4 GPUs, the host has 2"
    config.study.executor, config.ray.num_gpus = "ray", 4  # a local Ray instance's declared
    assert host_gpus(config) == 4
    config.server.device = "cpu"
    assert host_gpus(config) == 0  # a CPU server's devices are cores: not this check's
    assert over_host(config, TP8_PP2, 0) is None  # unknown: never a reason to refuse
