"""Child processes that are always reaped: own session, group signals, free ports.

Both the inference server and the load generator run as children in their own session (so a
signal to the group reaches every grandchild: vLLM's engine core, Locust's workers) and are
stopped with SIGTERM to the group, a grace period, then SIGKILL. Nothing here knows what the
child is.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from tuner.host.placement import pin


def spawn(
    argv: Sequence[str],
    env: Mapping[str, str],
    log_path: Path,
    cwd: Path | None = None,
    cpus: Sequence[int] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new session with stdout+stderr appended to ``log_path``, on ``cpus``
    (None: any CPU)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log, forked_on(cpus):
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: group signals reach grandchildren
        )
    return proc


@contextlib.contextmanager
def forked_on(cpus: Sequence[int] | None) -> Iterator[None]:
    """The calling thread on ``cpus`` while it forks a child, which inherits the mask from its
    first instruction. Pinning the child after Popen returned raced its start-up: on a busy
    host vLLM started threads before the pin, and a server meant for CPU 0 ran threads on 0-1.
    Only the calling thread's mask changes (Linux keeps one per thread); it is restored after.
    None or empty: any CPU, as the caller has."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    pin(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _signal_group(pgid: int, sig: signal.Signals) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def group_alive(pgid: int) -> bool:
    """True while any process of the group exists (signal 0 probes without killing)."""
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def reap(proc: subprocess.Popen[bytes], grace_s: float) -> int | None:
    """Stop the child's whole process group; returns the child's exit code.

    SIGTERM lets vLLM shut its engine down cleanly; SIGKILL after ``grace_s`` guarantees the
    group is gone even if a worker ignores SIGTERM.
    """
    pgid = proc.pid  # start_new_session=True makes the child the group leader
    if proc.poll() is None or group_alive(pgid):
        _signal_group(pgid, signal.SIGTERM)
        _wait_group(proc, pgid, grace_s)
    if proc.poll() is None or group_alive(pgid):
        _signal_group(pgid, signal.SIGKILL)
        _wait_group(proc, pgid, 10.0)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=1.0)
    return proc.returncode


def _wait_group(proc: subprocess.Popen[bytes], pgid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        proc.poll()  # reaps the leader so it does not linger as a zombie
        if proc.returncode is not None and not group_alive(pgid):
            return
        time.sleep(0.05)


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def wait_port_free(host: str, port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not port_is_free(host, port):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True
