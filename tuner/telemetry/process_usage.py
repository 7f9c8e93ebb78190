"""CPU and memory of labelled process trees (the server, the load generator) through psutil.

CPU is reported in cores (1.0 = one core busy), children included: vLLM runs its engine in a
child process and Locust with ``--processes N`` forks workers. Each sample differences the
cumulative CPU time of every process in the tree, so processes that appear between samples are
counted and ones that vanish are skipped without an error.

A Python load-generator process (gevent, one thread) saturates at about one core, so the client is
*saturated* when any one of its processes averaged at least ``threshold`` cores: then the client,
not the server, may be what limits the measured numbers (tail distortion began near 10k SSE
events/s per process).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pandas as pd
import psutil

from tuner.telemetry._base import PeriodicSampler, Window, in_window

COLUMNS = ["t", "label", "cpu_cores", "rss_mib", "nprocs"]
CLIENT = "client"
SERVER = "server"
_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied)
_MIB = 1024 * 1024
# CPU times advance in clock ticks (10 ms on Linux), so a rate over a shorter interval (e.g. the
# sample right after watch()) would be mostly quantisation noise.
_MIN_DT_S = 0.05


@dataclass
class _ProcState:
    create_time: float
    cpu_s: float


@dataclass
class _Tree:
    """One watched root process and what its tree looked like at the previous sample."""

    label: str
    root: psutil.Process
    last_wall: float
    last_mono: float
    procs: dict[int, _ProcState] = field(default_factory=dict)
    gone: bool = False


@dataclass
class _Reading:
    cpu_cores: float
    rss_mib: float
    nprocs: int
    # pid -> (cpu seconds, wall seconds) of this interval, for per-process saturation
    per_proc: dict[int, tuple[float, float]]


def _snapshot(root: psutil.Process) -> tuple[dict[int, _ProcState], float]:
    """CPU state of every live process in the tree, and their total RSS in MiB."""
    procs: dict[int, _ProcState] = {}
    rss = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            with proc.oneshot():
                times = proc.cpu_times()
                state = _ProcState(proc.create_time(), times.user + times.system)
                rss += proc.memory_info().rss / _MIB
        except _GONE:
            continue  # why: a child may exit between listing and reading
        procs[proc.pid] = state
    return procs, rss


def _cpu_delta(prev: _ProcState | None, cur: _ProcState, since_wall: float) -> float:
    if prev is not None and prev.create_time == cur.create_time:
        return max(cur.cpu_s - prev.cpu_s, 0.0)
    # New since the last sample: all of its CPU time falls in this interval. One that existed
    # before but was not readable then has an unknown share, so it only starts counting now.
    return cur.cpu_s if cur.create_time >= since_wall else 0.0


class ProcessSampler(PeriodicSampler):
    """Samples CPU (cores, children included) and RSS of labelled process trees."""

    def __init__(self, interval_s: float = 0.5) -> None:
        super().__init__(interval_s, "process")
        self._trees: list[_Tree] = []
        self._rows: list[dict[str, float | str]] = []
        self._per_proc: dict[tuple[str, int], list[float]] = {}  # -> [cpu_s, wall_s]

    def watch(self, label: str, pid: int) -> None:
        """Sample the process ``pid`` and its descendants under ``label`` (also while running)."""
        try:
            root = psutil.Process(pid)
            procs, _ = _snapshot(root)
        except _GONE as exc:
            self._note(f"cannot watch {label} pid {pid}: {type(exc).__name__}")
            return
        tree = _Tree(label, root, time.time(), time.monotonic(), procs)
        with self._lock:
            self._trees.append(tree)

    def _sample(self) -> None:
        with self._lock:
            trees = [t for t in self._trees if not t.gone]
        now = time.time()
        by_label: dict[str, list[_Reading]] = {}
        for tree in trees:
            reading = self._read(tree)
            if reading is not None:
                by_label.setdefault(tree.label, []).append(reading)
        with self._lock:
            for label, readings in by_label.items():
                self._rows.append(_row(now, label, readings))
                self._accumulate(label, readings)

    def _read(self, tree: _Tree) -> _Reading | None:
        try:
            procs, rss = _snapshot(tree.root)
            alive = tree.root.is_running() and tree.root.status() != psutil.STATUS_ZOMBIE
        except _GONE:
            alive = False
        if not alive:
            tree.gone = True
            self._note(f"{tree.label} process {tree.root.pid} exited")
            return None
        wall, mono = time.time(), time.monotonic()
        dt = mono - tree.last_mono
        if dt < _MIN_DT_S:
            return None  # keep the old baseline: the next reading spans a longer interval
        per_proc = {
            pid: (_cpu_delta(tree.procs.get(pid), state, tree.last_wall), dt)
            for pid, state in procs.items()
        }
        tree.procs, tree.last_wall, tree.last_mono = procs, wall, mono
        cpu = sum(c for c, _ in per_proc.values())
        return _Reading(cpu / dt, rss, len(procs), per_proc)

    def _accumulate(self, label: str, readings: list[_Reading]) -> None:
        for reading in readings:
            for pid, (cpu_s, wall_s) in reading.per_proc.items():
                acc = self._per_proc.setdefault((label, pid), [0.0, 0.0])
                acc[0] += cpu_s
                acc[1] += wall_s

    @property
    def samples(self) -> pd.DataFrame:
        """Columns t, label, cpu_cores, rss_mib, nprocs: one row per label and tick."""
        with self._lock:
            rows = list(self._rows)
        return pd.DataFrame(rows, columns=COLUMNS)

    def busiest_process_cores(self, label: str) -> float:
        """Mean cores of the busiest process under ``label`` over its sampled lifetime (0 if none).

        Processes sampled for less than two intervals are ignored: their mean is mostly noise.
        """
        with self._lock:
            accs = [v for (lab, _), v in self._per_proc.items() if lab == label]
        means = [cpu / wall for cpu, wall in accs if wall >= 2 * self.interval_s]
        return max(means, default=0.0)

    def client_saturated(self, threshold: float = 0.9, label: str = CLIENT) -> bool:
        """Whether any one client process averaged >= ``threshold`` cores (it tops out at ~1)."""
        return self.busiest_process_cores(label) >= threshold

    def summary(self, window: Window | None = None) -> dict[str, float]:
        """Per label: ``<label>_cpu_mean_cores``, ``_cpu_max_cores``, ``_rss_max_mib``, ..."""
        frame = in_window(self.samples, window)
        out: dict[str, float] = {}
        for label, group in frame.groupby("label"):
            out.update(
                {
                    f"{label}_cpu_mean_cores": float(group["cpu_cores"].mean()),
                    f"{label}_cpu_max_cores": float(group["cpu_cores"].max()),
                    f"{label}_rss_max_mib": float(group["rss_mib"].max()),
                    f"{label}_procs_max": float(group["nprocs"].max()),
                    f"{label}_busiest_proc_cores": self.busiest_process_cores(str(label)),
                }
            )
        return out


def _row(now: float, label: str, readings: list[_Reading]) -> dict[str, float | str]:
    return {
        "t": now,
        "label": label,
        "cpu_cores": sum(r.cpu_cores for r in readings),
        "rss_mib": sum(r.rss_mib for r in readings),
        "nprocs": float(sum(r.nprocs for r in readings)),
    }
