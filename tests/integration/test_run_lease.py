"""One driver per study, on any host: the run lease in the study's database (PostgreSQL here).

Two hosts cannot be had on this machine; a driver "on another host" is a real process that
takes the lease under another host name and is then SIGKILLed, which is all a remote driver's
crash leaves behind: a row nobody renews."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tuner.errors import ConfigError
from tuner.study.state.lease import Holder, RunLease, take_lease

pytestmark = [pytest.mark.integration, pytest.mark.shares_host]
PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"

HOLD = """
import socket, sys, time, uuid, psutil
from tuner.study.state.lease import Holder, RunLease
url, study, host, ttl = sys.argv[1:5]
me = psutil.Process()
name = host or socket.gethostname()
holder = Holder(name, me.pid, me.create_time(), "/elsewhere", uuid.uuid4().hex)
RunLease(url, study, holder, float(ttl)).take()
print("held", flush=True)
time.sleep(600)
"""


def _holding_driver(study: str, host: str, ttl_s: float) -> subprocess.Popen[str]:
    """A process that holds the study's lease (and renews it) until it is killed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, PG, study, host, str(ttl_s)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _sigkill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def _holder_of(study: str) -> Holder | None:
    held = RunLease(PG, study, Holder("probe", 0, 0.0, "", "probe")).current()
    return held[0] if held else None


def _tuner_run(study: str, studies: Path) -> subprocess.Popen[str]:
    args = ["run", f"name={study}", f"studies_dir={studies}", f"study.storage={PG}"]
    return subprocess.Popen(
        [sys.executable, "-m", "tuner.cli", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_a_second_driver_is_refused_naming_the_holder_and_takes_over_after_release(
    tmp_path: Path,
) -> None:
    study = f"lease_{uuid.uuid4().hex[:8]}"
    first = take_lease(PG, study, tmp_path / "a")
    with pytest.raises(ConfigError) as refused:
        take_lease(PG, study, tmp_path / "b")
    line = refused.value.one_line()
    assert f"pid {os.getpid()} on {socket.gethostname()}, studies in {tmp_path / 'a'}" in line
    first.release()
    assert _holder_of(study) is None
    second = take_lease(PG, study, tmp_path / "b")
    assert _holder_of(study) == second.holder
    second.release()


def test_a_driver_killed_on_this_host_is_taken_over_at_once(tmp_path: Path) -> None:
    study = f"lease_{uuid.uuid4().hex[:8]}"
    dead = _holding_driver(study, "", ttl_s=600)
    _sigkill(dead)
    held = _holder_of(study)
    assert held is not None and held.pid == dead.pid
    lease = take_lease(PG, study, tmp_path)  # no wait: its process is gone
    assert _holder_of(study) == lease.holder
    lease.release()


def test_a_killed_remote_driver_is_refused_until_its_lease_expires_then_taken_over(
    tmp_path: Path, no_leftovers: None
) -> None:
    study = f"lease_{uuid.uuid4().hex[:8]}"
    ttl = 8.0
    remote = _holding_driver(study, "gpu-node-7", ttl_s=ttl)
    refused = _tuner_run(study, tmp_path / "here")
    out, _ = refused.communicate(timeout=120)
    assert refused.returncode == 2, out
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    assert f"(pid {remote.pid} on gpu-node-7, studies in /elsewhere)" in lines[0]
    assert lines[0].startswith(f"tuner: error: study {study!r} is already being run")

    _sigkill(remote)  # its last renewal was at most now; the lease expires ttl later
    killed_at = time.time()
    assert _holder_of(study) is not None  # a remote driver's process cannot be seen gone

    time.sleep(max(0.0, killed_at + ttl + 1 - time.time()))
    driver = _tuner_run(study, tmp_path / "here")
    deadline = time.monotonic() + 120
    while (held := _holder_of(study)) is None or held.pid != driver.pid:
        assert driver.poll() is None, driver.communicate()[0]
        assert time.monotonic() < deadline, "the new driver never took the expired lease"
        time.sleep(0.2)
    assert held.host == socket.gethostname()
    driver.send_signal(signal.SIGINT)
    driver.communicate(timeout=120)
    assert _holder_of(study) is None  # released on the way out
