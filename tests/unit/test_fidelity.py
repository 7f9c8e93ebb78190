"""benchmarks/fidelity.py's core pinning: what it reads back must be what the kernel applied."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from benchmarks import fidelity

# A parent that starts a child and a thread of its own, then waits: a small process tree.
TREE = (
    "import subprocess, threading, time\n"
    "subprocess.Popen(['sleep', '30'])\n"
    "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
    "time.sleep(30)\n"
)


def test_tree_affinity_reads_every_thread_of_a_pinned_process_tree() -> None:
    first = min(os.sched_getaffinity(0))
    proc = subprocess.Popen(
        [sys.executable, "-c", TREE], preexec_fn=lambda: os.sched_setaffinity(0, {first})
    )
    try:
        deadline = time.monotonic() + 20
        tree = psutil.Process(proc.pid)
        while not (tree.children() and tree.num_threads() >= 2):
            assert time.monotonic() < deadline, "the process tree did not start"
            time.sleep(0.05)
        assert fidelity.tree_affinity(proc.pid) == [first]  # children and threads inherit it
        assert fidelity.tree_affinity(None) == []
    finally:
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        proc.wait()


def test_pin_with_no_cpus_leaves_the_affinity_alone() -> None:
    before = os.sched_getaffinity(0)
    fidelity.pin(None)
    fidelity.pin([])
    assert os.sched_getaffinity(0) == before
