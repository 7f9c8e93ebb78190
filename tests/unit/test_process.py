"""Children are reaped with their whole group, even a grandchild that ignores SIGTERM."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import psutil
import pytest

from tuner.host.children import free_port, group_alive, port_is_free, reap, spawn, wait_port_free

STUBBORN = (
    "import signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "subprocess.Popen([sys.executable, '-c', "
    "'import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'])\n"
    "print('ready', flush=True); time.sleep(60)\n"
)


def test_reap_kills_group_including_sigterm_ignoring_grandchild(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    proc = spawn([sys.executable, "-c", STUBBORN], {"PATH": "/usr/bin:/bin"}, log)
    deadline = time.monotonic() + 10
    while "ready" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    members = [p for p in psutil.process_iter() if _pgid(p) == proc.pid]
    assert len(members) == 2
    t0 = time.monotonic()
    code = reap(proc, grace_s=0.5)
    assert code is not None and code < 0  # killed by a signal
    assert time.monotonic() - t0 < 5
    assert not group_alive(proc.pid)


def _pgid(p: psutil.Process) -> int:
    try:
        import os

        return os.getpgid(p.pid)
    except (ProcessLookupError, psutil.Error):
        return -1


def test_ports() -> None:
    port = free_port()
    assert port_is_free("127.0.0.1", port)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        assert not port_is_free("127.0.0.1", port)
        assert not wait_port_free("127.0.0.1", port, timeout_s=0.3)
    assert wait_port_free("127.0.0.1", port, timeout_s=2)


def test_a_child_runs_on_its_cpus_from_its_first_instruction(tmp_path: Path) -> None:
    """The mask is inherited at the fork, not set after Popen returns: the child's first read
    of its own CPUs is already the pinned one, and the caller's thread keeps its own."""
    before = os.sched_getaffinity(0)
    first = min(before)
    log = tmp_path / "child.log"
    code = "import os; print(sorted(os.sched_getaffinity(0)))"
    proc = spawn([sys.executable, "-c", code], {"PATH": "/usr/bin:/bin"}, log, cpus=[first])
    assert proc.wait(timeout=30) == 0
    assert log.read_text().strip() == f"[{first}]"
    assert os.sched_getaffinity(0) == before


def test_the_mask_is_in_place_when_the_child_is_forked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the previous test cannot catch on an idle host, where the child's interpreter
    starts after a late pin anyway: at the moment Popen forks, the forking thread is on the
    child's CPUs already (a pin after Popen returned lost the race on a busy host)."""
    from tuner.host import children

    before = os.sched_getaffinity(0)
    seen: list[set[int]] = []

    def fork(*args: object, **kwargs: object) -> object:
        seen.append(os.sched_getaffinity(0))
        raise OSError("not forked: only the mask at the fork is looked at")

    monkeypatch.setattr(children.subprocess, "Popen", fork)
    with pytest.raises(OSError, match="not forked"):
        spawn(["true"], {}, tmp_path / "log", cpus=[min(before)])
    assert seen == [{min(before)}] and os.sched_getaffinity(0) == before
