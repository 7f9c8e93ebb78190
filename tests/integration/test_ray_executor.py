"""Trials in parallel on a local Ray instance that declares 8 GPUs (the host has none).

Ray's scheduling and its CUDA_VISIBLE_DEVICES assignment are its real ones; only the GPU
hardware is faked: the server is a stand-in that records the devices it saw
(tests/fakes/gpu_server.py, started by the real vLLM backend and loaded by real Locust), and
NVML is the simulated host's in Ray's workers (tuner.simulation.fake_nvml). The instance
listens on 127.0.0.1 only and is shut down at the end of the module, with nothing left running.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import optuna
import psutil
import pytest

from tests.conftest import ROOT
from tests.fakes.ray_study import (
    GPUS,
    STANDIN,
    no_trial_left,
    ray_processes,
    records,
    running,
    server_lines,
    wait_gone,
    worker_env,
)
from tuner.composition import compose
from tuner.executor.cluster import loopback_only
from tuner.schema import Role, TrialAttr
from tuner.simulation.fake_nvml import uuid_of
from tuner.study.decision.evaluation import Evaluator
from tuner.study.loop.runner import StudyRunner

loopback_only()  # before Ray is imported: the instance listens on loopback only
import ray  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.shares_host]
FINGERPRINT = {"driver": "ray_study"}  # what tests/fakes/ray_study.py's driver uses


@dataclass
class Local:
    record: Path  # the stand-in servers' record of what they saw
    address: str


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Local]:
    record = tmp_path_factory.mktemp("ray") / "servers.jsonl"
    ray.init(
        num_cpus=16,
        num_gpus=GPUS,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env=worker_env(record),
    )
    started = ray_processes(psutil.Process())
    try:
        yield Local(record, ray.get_runtime_context().gcs_address)
    finally:
        ray.shutdown()
    assert not wait_gone(started), "Ray processes left running after shutdown"


def _config(tmp_path: Path, name: str, *extra: str) -> list[str]:
    return [*STANDIN, f"name={name}", f"studies_dir={tmp_path}", *extra]


def _tp_study(tmp_path: Path, name: str, *extra: str) -> list[str]:
    return _config(
        tmp_path,
        name,
        "search_space=[parallelism]",
        "study.stages=[parallelism]",
        "sampler=grid",
        "study.trials_per_stage=4",
        *extra,
    )


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_trials_of_tp_1_2_4_8_run_side_by_side_on_their_own_gpus(
    local: Local, tmp_path: Path
) -> None:
    assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}
    config = compose(
        _tp_study(
            tmp_path,
            "tp",
            "study.baseline_measurements=2",
            "study.parallel=auto",
            "study.repeats=1",
        )
    )
    said: list[str] = []
    with no_trial_left():
        result = StudyRunner(config, Evaluator(config), FINGERPRINT, said.append).run()
    storage = f"sqlite:///{tmp_path}/tp/optuna.db"
    stage = optuna.load_study(study_name="tp:parallelism", storage=storage)
    search = [t for t in stage.trials if t.user_attrs.get(TrialAttr.ROLE) == Role.SEARCH]
    assert sorted(t.params["tensor_parallel_size"] for t in search) == [1, 2, 4, 8]
    (baseline,) = [s for s in optuna.get_all_study_names(storage) if s.startswith("baseline:")]
    trials = search + optuna.load_study(study_name=baseline, storage=storage).trials
    runs = []
    for t in trials:
        assert t.user_attrs[TrialAttr.STATUS] == "ok"
        devices = t.user_attrs["devices"]
        gpus = devices["cuda_visible_devices"].split(",")
        assert len(gpus) == t.params.get("tensor_parallel_size", 1) == len(set(gpus))
        assert devices["gpu_ids"] == gpus  # Ray's assignment is what the server got ...
        assert devices["gpus_sampled"] == [uuid_of(int(g)) for g in gpus]  # ... and NVML's
        folder = Path(t.user_attrs[TrialAttr.FOLDER])
        assert folder.parent == tmp_path / "tp" / "trials"  # brought back to the driver
        (seen,) = [r for r in server_lines(folder) if r["event"] == "start"]
        assert seen["cuda_visible_devices"] == devices["cuda_visible_devices"]
        assert seen["tp"] == t.params.get("tensor_parallel_size", 1)
        runs.append(((devices["started_at"], devices["ended_at"]), set(gpus), t))
    side_by_side = [(a, b) for a, b in itertools.combinations(runs, 2) if _overlap(a[0], b[0])]
    assert side_by_side, "no two trials ran at the same time"
    for (_, gpus_a, _), (_, gpus_b, _) in side_by_side:
        assert gpus_a.isdisjoint(gpus_b)
    # The storage's own times show it too: two search trials of the stage overlap
    spans = [(t.datetime_start, t.datetime_complete) for t in search]
    assert any(a[0] < b[1] and b[0] < a[1] for a, b in itertools.combinations(spans, 2))
    assert [d.stage for d in result.decisions] == ["parallelism"]
    assert any("submitted to Ray: 8 GPUs" in line for line in said)
    # TP 2 won (the stand-in's fastest): its confirmation and the incumbent's were in flight at
    # once (the storage's times: both asked before either was told). When each ran is Ray's
    # and the host's: where they ran at the same time, they held GPUs of their own.
    confirm = optuna.load_study(study_name="tp:confirm", storage=storage).trials
    tps = [t.user_attrs[TrialAttr.PARAMS_ALL].get("tensor_parallel_size", 1) for t in confirm]
    assert sorted(tps) == [1, 2]
    (a, b) = [(t.datetime_start, t.datetime_complete) for t in confirm]
    assert a[0] < b[1] and b[0] < a[1], (a, b)
    pair = [t.user_attrs["devices"] for t in confirm]
    if _overlap(*[(d["started_at"], d["ended_at"]) for d in pair]):
        assert set(pair[0]["gpu_ids"]).isdisjoint(pair[1]["gpu_ids"])
    assert not running([r["pid"] for r in records(local.record)])


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["study.parallel=9"],
            "study.parallel=9 is larger than the cluster can place: its 1 "
            "node(s) hold 5 trial(s) of 1 GPU, 3 CPUs at once",
        ),  # API server, worker, Locust
        (
            ["server.args.tensor_parallel_size=16"],
            "a trial of this study needs 16 GPUs, 32 CPUs "
            "on one node, and the largest node of the Ray cluster has 8 GPUs, 16 CPUs",
        ),  # 2/GPU
        (
            ["ray.address=127.0.0.1:9", "ray.connect_timeout_s=5"],
            "ray.address='127.0.0.1:9' is unreachable",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    local: Local, tmp_path: Path, extra: list[str], message: str
) -> None:
    args = _config(tmp_path, "bad", f"ray.address={local.address}", *extra)
    proc = _cli("run", "--dry-run", *args)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and message in lines[0], proc.stderr


def test_an_interrupted_then_killed_driver_is_resumed_with_no_trial_left_running(
    local: Local, tmp_path: Path
) -> None:
    """Ctrl-C mid-stage stops the trials on Ray and marks them failed; SIGKILL leaves them
    RUNNING for the next run to fail; that run completes the stage's budget."""
    args = _tp_study(tmp_path, "kill", "study.parallel=2", f"ray.address={local.address}")
    storage = f"sqlite:///{tmp_path}/kill/optuna.db"
    for n, sig in enumerate((signal.SIGINT, signal.SIGKILL)):
        with no_trial_left(timeout_s=30):
            code = _drive(args, tmp_path / f"driver{n}.log", sig)
        running = _running(storage, "kill:parallelism")
        if sig == signal.SIGINT:  # every trial of the run stopped and marked, no RUNNING one
            assert code != 0 and not running
            assert "interrupted: trial marked failed" in (tmp_path / "driver0.log").read_text()
        else:
            assert code == -signal.SIGKILL and running
    config = compose(args)
    said: list[str] = []
    with no_trial_left():
        StudyRunner(config, Evaluator(config), FINGERPRINT, said.append).run()
    assert any("interrupted trial(s) marked failed; resuming" in line for line in said)
    for name in optuna.get_all_study_names(storage):
        assert not _running(storage, name), name
    stage = optuna.load_study(study_name="kill:parallelism", storage=storage)
    done = stage.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    launched = [
        t
        for t in done
        if t.user_attrs.get(TrialAttr.ROLE) == Role.SEARCH
        and TrialAttr.REUSED_FROM not in t.user_attrs
    ]
    assert sorted(t.params["tensor_parallel_size"] for t in launched) == [1, 2, 4, 8]
    failed = stage.get_trials(states=(optuna.trial.TrialState.FAIL,))
    assert len(failed) >= 2 and all(t.user_attrs.get(TrialAttr.INTERRUPTED) for t in failed)


def _running(storage: str, name: str) -> list[optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name=name, storage=storage)
    return study.get_trials(states=(optuna.trial.TrialState.RUNNING,))


def _drive(args: list[str], log: Path, sig: signal.Signals) -> int:
    """A driver of the study, sent ``sig`` once a stage trial's server is ready."""
    env = {**os.environ, "TUNER_FAKE_GPU_RECORD": str(log.with_suffix(".jsonl"))}
    with log.open("w") as out:
        argv = [sys.executable, "-m", "tests.fakes.ray_study", *args]
        driver = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        _wait_for(log, re.compile(r"\[parallelism #\d+\] server ready"), driver)
        driver.send_signal(sig)
        return driver.wait(timeout=90)


def _wait_for(
    log: Path, text: re.Pattern[str], proc: subprocess.Popen[bytes], timeout_s: float = 120
) -> None:
    deadline = time.monotonic() + timeout_s
    while not text.search(log.read_text()):
        assert proc.poll() is None, f"the driver ended early:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {text.pattern!r} in:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)
