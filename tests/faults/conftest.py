"""Fixtures of the fault-injection suite: process watching, fault launchers, study runs, the table.

Every fault test runs under a :class:`ProcessWatch` of its own tmp folder (every process whose
command line or environment names it: tuner, vLLM and its engine core, Locust, the stand-ins),
then checks that none of the PIDs and process groups it saw is still alive.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import psutil
import pytest

from tests.conftest import leftover_processes
from tests.e2e.conftest import start_tuner
from tests.faults.table import DOC, FAULTS, FaultRow, FaultTable, render

LAUNCHER = Path(__file__).with_name("launcher.py")
# A study that a stand-in server runs in seconds: baseline + one stage, no confirmation runs.
FAST = [
    "study.stages=[batching]",
    "study.repeats=0",
    "study.baseline_measurements=1",
    "search_space=[batching_coarse]",
    # The baseline is a point of the space (seeded as trial 0) and every proposal is launched:
    # the fault plans count launches, one step each.
    "server.args.max_num_seqs=64",
    "study.reuse=false",
    "workload.warmup_s=1",
    "workload.window_s=2",
    "workload.concurrency=4",
    "workload.drain_timeout_s=5",
    "server.stop_grace_s=1",
    "quality.enabled=false",  # the quality gate is no part of these faults
]
_TABLE_KEY = pytest.StashKey[FaultTable]()
_DURATIONS: list[float] = []  # set-up + call + tear-down of each test of this suite


# ---------------------------------------------------------------------------- processes
@dataclass(frozen=True)
class Seen:
    pid: int
    pgid: int
    created: float
    cmd: str


def _scope_text(proc: psutil.Process) -> str:
    try:
        cmd = " ".join(proc.cmdline())
        env = " ".join(f"{k}={v}" for k, v in proc.environ().items())
    except psutil.Error:
        return ""
    return cmd + " " + env


def _alive(pid: int, created: float) -> bool:
    try:
        proc = psutil.Process(pid)
        return proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _live_groups() -> set[int]:
    groups = set()
    for proc in psutil.process_iter(["status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        with contextlib.suppress(OSError):
            groups.add(os.getpgid(proc.pid))
    return groups


class ProcessWatch:
    """Samples, on a thread, every process whose command line or environment names ``scope``."""

    def __init__(self, scope: Path, interval_s: float = 0.25) -> None:
        self.scope = str(scope)
        self.interval_s = interval_s
        self.seen: dict[tuple[int, float], Seen] = {}
        self._own_group = os.getpgid(0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="process-watch", daemon=True)

    def _loop(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.interval_s):
                return

    def sample(self) -> None:
        for proc in psutil.process_iter():
            if proc.pid == os.getpid() or self.scope not in _scope_text(proc):
                continue
            with contextlib.suppress(psutil.Error, OSError):
                key = (proc.pid, proc.create_time())
                if key not in self.seen:
                    cmd = " ".join(proc.cmdline())[:160]
                    self.seen[key] = Seen(proc.pid, os.getpgid(proc.pid), key[1], cmd)

    def __enter__(self) -> ProcessWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def groups(self) -> set[int]:
        """Process groups of the children (the test's own group, which `tuner` shares, aside)."""
        return {s.pgid for s in self.seen.values()} - {self._own_group}

    def pids_matching(self, text: str) -> list[Seen]:
        return [s for s in self.seen.values() if text in s.cmd]

    def groups_of(self, text: str) -> list[Seen]:
        """Every process seen in the groups of the processes whose command has ``text`` (e.g.
        a vLLM server's engine core, which renames itself)."""
        groups = {s.pgid for s in self.pids_matching(text)} - {self._own_group}
        return [s for s in self.seen.values() if s.pgid in groups]

    def left(self) -> list[str]:
        """What is still alive: seen PIDs, seen groups, and vLLM/Locust by command line."""
        out = [f"pid {s.pid}: {s.cmd}" for s in self.seen.values() if _alive(s.pid, s.created)]
        out += [f"process group {g}" for g in sorted(self.groups & _live_groups())]
        out += leftover_processes(self.scope)
        return out

    def assert_clean(self, settle_s: float = 10.0) -> str:
        """Fail (after killing them) if anything is left; else the table's leftovers cell."""
        deadline = time.monotonic() + settle_s  # a SIGKILLed process can take a moment to go
        while (left := self.left()) and time.monotonic() < deadline:
            time.sleep(0.2)
        if left:
            _kill(self)
            pytest.fail("processes left running:\n" + "\n".join(left))
        pids, groups = len(self.seen), len(self.groups)
        return f"none: {_n(pids, 'PID')} in {_n(groups, 'process group')} checked gone"


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _kill(watch: ProcessWatch) -> None:
    for group in watch.groups:
        with contextlib.suppress(OSError):
            os.killpg(group, signal.SIGKILL)
    for s in watch.seen.values():
        if _alive(s.pid, s.created):
            with contextlib.suppress(OSError):
                os.kill(s.pid, signal.SIGKILL)


@pytest.fixture
def watch(tmp_path: Path) -> Iterator[ProcessWatch]:
    with ProcessWatch(tmp_path) as w:
        yield w
    if w.left():  # a test that failed before its own check must not leak into the next one
        _kill(w)


def wait_for(predicate: Any, timeout_s: float, what: str, interval_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


# ---------------------------------------------------------------------------- configs
def fault_launcher(tmp_path: Path, steps: Sequence[str], default: str = "fake") -> list[str]:
    """Overrides that run :mod:`tests.faults.launcher` with a plan of per-launch steps."""
    plan = tmp_path / "plan.txt"
    write_plan(plan, steps)
    return [
        f"server.launcher=['{sys.executable}','{LAUNCHER}']",
        f"server.env.FAULT_PLAN={plan}",
        f"server.env.FAULT_DEFAULT={default}",
    ]


def write_plan(plan: Path, steps: Sequence[str]) -> None:
    plan.write_text("".join(f"{s}\n" for s in steps))


def taken(tmp_path: Path) -> list[str]:
    """The launcher steps performed so far (one per server launch)."""
    log = tmp_path / "plan.taken"
    return log.read_text().splitlines() if log.is_file() else []


# ---------------------------------------------------------------------------- tuner runs
class TunerRun:
    """`tuner run` as a child process, its output read on a thread (for markers and the end)."""

    def __init__(self, args: Sequence[str]) -> None:
        self.proc = start_tuner(["run", *args])
        self.lines: list[str] = []
        self.arrived: list[float] = []  # time.monotonic() of each line
        self._new = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._new:
                self.lines.append(line.rstrip("\n"))
                self.arrived.append(time.monotonic())
                self._new.notify_all()
        with self._new:
            self._new.notify_all()

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def wait_line(self, marker: str, timeout_s: float) -> str:
        """The first output line containing ``marker`` (fails on timeout or an early exit)."""
        deadline = time.monotonic() + timeout_s
        with self._new:
            while True:
                found = [ln for ln in self.lines if marker in ln]
                if found:
                    return found[0]
                left = deadline - time.monotonic()
                if left <= 0 or not self._reader.is_alive():
                    raise AssertionError(f"no line with {marker!r}; output:\n{self.text[-4000:]}")
                self._new.wait(min(left, 1.0))

    def arrival(self, marker: str) -> float:
        """When the first line containing ``marker`` was read."""
        return next(t for t, ln in zip(self.arrived, self.lines, strict=True) if marker in ln)

    def wait(self, timeout_s: float) -> int:
        rc = self.proc.wait(timeout=timeout_s)
        self._reader.join(timeout=10)
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# ---------------------------------------------------------------------------- studies
@dataclass
class InProcessRun:
    """A study run in this process: its progress lines and the error that ended it, if any."""

    lines: list[str] = field(default_factory=list)
    error: BaseException | None = None

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def run_study(args: Sequence[str]) -> InProcessRun:
    """`tuner run` without the CLI process: compose, open the session, run (no vLLM parser
    preflight, which costs a vLLM import): for faults about the study loop itself."""
    from tuner.cli import _quiet_libraries, compose
    from tuner.errors import TunerError
    from tuner.study.loop.session import open_session

    run = InProcessRun()
    _quiet_libraries()
    config = compose(list(args))
    session = open_session(config, rebaseline=False, progress=run.lines.append)
    try:
        session.runner.run()
    except TunerError as exc:
        run.error = exc
    return run


@dataclass(frozen=True)
class StoredTrial:
    study: str
    number: int
    state: str
    values: tuple[float, ...] | None
    status: str | None
    reason: str | None
    role: str | None

    @property
    def ok(self) -> bool:
        return self.state == "COMPLETE" and self.status == "ok"


def stored_trials(url: str, name: str | None = None, marker: str = "") -> list[StoredTrial]:
    """Every trial of the storage's studies, as plain comparable values; on a shared database,
    only those of study ``name`` and the baselines whose fingerprint mentions ``marker``."""
    out = []
    storage = optuna.storages.RDBStorage(url)  # one engine, not one per study (tests/e2e/conftest)
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        ours = summary.study_name.startswith(f"{name}:") or (
            summary.study_name.startswith("baseline:")
            and marker in json.dumps(summary.user_attrs, default=str)
        )
        if name is not None and not ours:
            continue
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        for t in study.trials:
            out.append(
                StoredTrial(
                    summary.study_name,
                    t.number,
                    t.state.name,
                    tuple(t.values) if t.values else None,
                    t.user_attrs.get("status"),
                    t.user_attrs.get("failure_reason"),
                    t.user_attrs.get("role"),
                )
            )
    return out


def search_trials(trials: list[StoredTrial], stage: str = "batching") -> list[StoredTrial]:
    return [
        t
        for t in trials
        if t.study.endswith(f":{stage}") and t.role == "search" and t.state == "COMPLETE"
    ]


def completed_ok(trials: list[StoredTrial]) -> set[StoredTrial]:
    return {t for t in trials if t.ok or (t.role == "incumbent" and t.state == "COMPLETE")}


def sqlite_url(studies_dir: Path, name: str) -> str:
    return f"sqlite:///{studies_dir / name / 'optuna.db'}"


# ---------------------------------------------------------------------------- the table
@pytest.fixture(scope="session")
def fault_table(request: pytest.FixtureRequest) -> FaultTable:
    return request.config.stash[_TABLE_KEY]


@pytest.fixture
def record(fault_table: FaultTable, request: pytest.FixtureRequest) -> Any:
    """record(fault, injected, outcome, leftovers, data): one row of the table."""

    tmp = str(request.getfixturevalue("tmp_path"))

    def _record(fault: str, injected: str, outcome: str, leftovers: str, data: str) -> None:
        test = f"{Path(str(request.node.path)).name}::{request.node.name}"
        injected, outcome, leftovers, data = (
            c.replace(tmp, "$TMP") for c in (injected, outcome, leftovers, data)
        )
        fault_table.record(FaultRow(fault, injected, outcome, leftovers, data, test))

    return _record


def pytest_configure(config: pytest.Config) -> None:
    path = Path(str(config.rootpath)) / ".pytest_cache" / "faults-session.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    config.stash[_TABLE_KEY] = FaultTable(path)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """The suite's own time, for the table's header (a whole `pytest tests` run is longer)."""
    if report.nodeid.startswith("tests/faults/"):
        _DURATIONS.append(report.duration)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    table = session.config.stash.get(_TABLE_KEY, None)
    if table is None or not table.rows():
        return
    missing = table.missing()
    if exitstatus != 0 or missing:
        why = f"missing {', '.join(missing)}" if missing else f"exit status {exitstatus}"
        print(f"\nfault table: {DOC} not rewritten ({why}); rows in {table.path}")
        return
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(render(table.rows(), sum(_DURATIONS)), encoding="utf-8")
    print(f"\nfault table: {len(FAULTS)} faults written to {DOC}")
