"""Faults inside a study that tuner must turn into failed trials, or into a clean stop.

These are about tuner's own handling, so the server is a fast real stand-in
(:mod:`tests.faults.launcher`): a known-delay OpenAI-compatible server, a server that never
answers, a launcher that prints vLLM's out-of-memory error. The processes, signals, timeouts,
Locust runs and the SQLite storage are all real.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import overrides
from tests.faults.conftest import (
    FAST,
    ProcessWatch,
    completed_ok,
    fault_launcher,
    run_study,
    search_trials,
    sqlite_url,
    stored_trials,
    taken,
    wait_for,
    write_plan,
)
from tuner.errors import TunerError

# Failure classes, budgets and reaped processes, not speeds: shares the host with other tests.
pytestmark = [pytest.mark.integration, pytest.mark.shares_host]
STARTUP_TIMEOUT_S = 5


def _study(tmp_path: Path, name: str, steps: list[str], default: str, *extra: str) -> list[str]:
    return overrides(
        FAST,
        f"name={name}",
        f"studies_dir={tmp_path}",
        *fault_launcher(tmp_path, steps, default),
        *extra,
    )


def _result(tmp_path: Path, name: str, trial_id: str) -> dict[str, object]:
    path = tmp_path / name / "trials" / trial_id / "result.json"
    data: dict[str, object] = json.loads(path.read_text())
    return data


def _head(message: str) -> str:
    """A Locust failure message without the log tail it carries (the table has no room)."""
    return message.split("; last lines of")[0] + " (+ the tail of locust.log)"


def _kill_locust_when_loaded(trial_dir: Path, killed: list[int]) -> None:
    """SIGKILL Locust's process group once it has written records (a client that crashes)."""
    loadgen = trial_dir / "loadgen"

    def records_written() -> bool:
        return any(p.stat().st_size > 0 for p in loadgen.glob("records-*.jsonl"))

    wait_for(records_written, 120, f"Locust records in {loadgen}")
    time.sleep(1.5)  # past the 1 s warm-up: the crash cuts the measurement window
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if "locustfile.py" in cmd and str(trial_dir) in cmd:
            os.killpg(proc.info["pid"], signal.SIGKILL)
            killed.append(proc.info["pid"])
            return


def test_startup_timeout_and_loadgen_crash_fail_their_trials_and_the_study_goes_on(
    tmp_path: Path, tiny_model: Path, watch: ProcessWatch, record: object
) -> None:
    name = "trialfaults"
    args = _study(
        tmp_path,
        name,
        ["fake", "hang", "fake", "fake"],  # baseline, #1 never healthy, #2 Locust killed, #3
        "fake",
        f"server.startup_timeout_s={STARTUP_TIMEOUT_S}",
        "study.trials_per_stage=3",
        "study.max_failure_rate=0.9",  # two failures of four trials must not stop this study
    )
    killed: list[int] = []
    trial_dir = tmp_path / name / "trials" / "batching-2"
    killer = threading.Thread(target=_kill_locust_when_loaded, args=(trial_dir, killed))
    killer.start()
    run = run_study(args)
    killer.join(timeout=10)
    assert run.error is None, run.text
    assert taken(tmp_path) == ["fake", "hang", "fake", "fake"]
    leftovers = watch.assert_clean()

    hung = _result(tmp_path, name, "batching-1")
    assert hung["reason"] == "startup_timeout", hung
    assert f"did not become ready within {STARTUP_TIMEOUT_S} s" in str(hung["message"])
    timings = hung["timings"]
    assert isinstance(timings, dict) and timings["startup"] < STARTUP_TIMEOUT_S + 5, timings
    assert watch.pids_matching("time.sleep(600)"), "the hung server's child was not seen"
    assert timings["teardown"] >= 1.0, timings  # SIGTERM ignored: SIGKILL after stop_grace_s

    crashed = _result(tmp_path, name, "batching-2")
    assert killed, "Locust was not found to be killed"
    assert crashed["reason"] == "load_generator_failed", crashed
    assert "Locust exited with code -9 and recorded" in str(crashed["message"]), crashed["message"]

    trials = stored_trials(sqlite_url(tmp_path, name))
    search = search_trials(trials)
    reasons = [t.reason or "ok" for t in sorted(search, key=lambda t: t.number)]
    assert reasons == ["startup_timeout", "load_generator_failed", "ok"]  # the budget: 3
    assert not [t for t in trials if t.state == "RUNNING"]
    record(  # type: ignore[operator]
        "startup_timeout",
        "stand-in: a launcher that never answers /health, ignores SIGTERM and has a child "
        f"that does too; server.startup_timeout_s={STARTUP_TIMEOUT_S}",
        f"trial failed `{hung['reason']}` after {timings['startup']:.1f} s: {hung['message']}; "
        f"SIGTERM ignored, the group SIGKILLed (stop took {timings['teardown']:.1f} s); "
        "the study went on",
        leftovers + " (the hung launcher and its SIGTERM-ignoring child included)",
        f"yes: the budget of {len(search)} search trials completed in the same run",
    )
    record(  # type: ignore[operator]
        "loadgen_crash",
        "Locust's process group SIGKILLed once it had written records (stand-in server)",
        f"trial failed `{crashed['reason']}`: {_head(str(crashed['message']))}; the study went on",
        leftovers,
        f"yes: the budget of {len(search)} search trials completed; the next trial measured ok",
    )


def test_failure_budget_stops_a_systematically_failing_study_naming_the_top_reason(
    tmp_path: Path, tiny_model: Path, watch: ProcessWatch, record: object
) -> None:
    name = "budget"
    base = ["study.trials_per_stage=12"]
    # Run 1: the consecutive-failures rule (the rate rule out of the way).
    args = _study(
        tmp_path,
        name,
        ["fake", "oom", "crash", "oom", "oom"],
        "oom",
        *base,
        "study.max_consecutive_failures=4",
        "study.max_failure_rate=1.0",
    )
    first = run_study(args)
    assert isinstance(first.error, TunerError), first.text
    consecutive = first.error.one_line()
    assert first.error.exit_code == 1
    assert "stopping: 4 trials failed, most often out_of_memory (3x)" in consecutive
    assert "can be resumed" in consecutive
    assert taken(tmp_path) == ["fake", "oom", "crash", "oom", "oom"]
    trials = stored_trials(sqlite_url(tmp_path, name))
    baseline = [t for t in trials if t.study.startswith("baseline:")]
    assert [t.ok for t in baseline] == [True]
    failed = search_trials(trials)
    assert [t.reason for t in failed] == [
        "out_of_memory",
        "exited_during_startup",
        "out_of_memory",
        "out_of_memory",
    ]
    assert not [t for t in trials if t.state == "RUNNING"], trials  # the 4th was told too

    # Run 2 (a resume): the failure-rate rule, with a success among the failures.
    write_plan(tmp_path / "plan.txt", ["oom", "fake", "oom", "oom"])
    args = overrides(args, "study.max_consecutive_failures=10", "study.max_failure_rate=0.5")
    second = run_study(args)
    assert isinstance(second.error, TunerError), second.text
    rate = second.error.one_line()
    assert "stopping: 3 trials failed, most often out_of_memory (3x)" in rate
    assert "reusing trial 0 (same fingerprint)" in second.text
    after = stored_trials(sqlite_url(tmp_path, name))
    assert completed_ok(trials) <= set(after)  # baseline and incumbent unchanged
    assert len(search_trials(after)) == 8
    assert not [t for t in after if t.state == "RUNNING"]
    leftovers = watch.assert_clean()
    record(  # type: ignore[operator]
        "budget_consecutive",
        "stand-in launchers: vLLM's CUDA out-of-memory line and exit 1 (3x), another crash (1x)",
        f"study stopped after 4 consecutive failed trials, exit 1: {consecutive}",
        leftovers,
        "yes: baseline kept; every failed trial stored as a finished, infeasible trial",
    )
    record(  # type: ignore[operator]
        "budget_rate",
        "the same, resumed with max_failure_rate=0.5: fail, ok, fail, fail",
        f"study stopped at 3 failures of 4 trials (75% > 50%), exit 1: {rate}",
        leftovers,
        "yes: baseline reused (not re-measured), earlier trials unchanged",
    )
