"""A trial's guard on a remote node: stops the trial's processes if its worker dies.

A trial starts its server and its load generator in sessions of their own (so that it can reap
each whole group); a Ray worker that is killed (a cancelled task, a driver gone, its raylet
lost) therefore cannot take them along, and they would go on using the node's GPUs and cores.
The guard watches the worker; when it is gone, it stops every process whose environment names
the trial's folder (``TUNER_TRIAL_DIR``: the server has it, the load generator inherits it from
the worker) with SIGTERM to its group, then SIGKILL.

    python tuner/executor/guard.py <worker pid> <trial folder>

It runs as a script, importing nothing of tuner: a guard starts with every remote trial.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import psutil

POLL_S = 0.5
GRACE_S = 5.0
TRIAL_DIR_ENV = "TUNER_TRIAL_DIR"
SCRATCH_PREFIX = "tuner-trial-"  # a remote trial's scratch folder (tuner.executor.remote)


def trial_processes(folder: str) -> list[psutil.Process]:
    """Running processes (not zombies) of the trial in ``folder``."""
    found = []
    for proc in psutil.process_iter(["pid", "status"]):
        if proc.pid == os.getpid() or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(TRIAL_DIR_ENV) == folder:
                found.append(proc)
    return found


def stop_trial(folder: str, grace_s: float = GRACE_S) -> int:
    """SIGTERM the trial's process groups, SIGKILL what is left after ``grace_s``; how many."""
    procs = trial_processes(folder)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in procs:
            with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
                os.killpg(os.getpgid(proc.pid), sig)
        _, procs = psutil.wait_procs(procs, timeout=grace_s)
        if not procs:
            break
    return len(procs)


def wait_gone(pid: int) -> None:
    """Return once ``pid`` has exited (a zombie counts as gone)."""
    with contextlib.suppress(psutil.Error):
        proc = psutil.Process(pid)
        while proc.status() != psutil.STATUS_ZOMBIE:
            time.sleep(POLL_S)


def main(argv: list[str]) -> int:
    worker, folder = int(argv[0]), argv[1]
    wait_gone(worker)  # the worker ends this guard with SIGTERM when the trial ends normally
    stop_trial(folder)
    scratch = Path(folder).parent  # the worker's scratch folder, which it can no longer remove
    if scratch.name.startswith(SCRATCH_PREFIX):
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
