"""One trial inside a Ray worker, on the devices Ray gave it; its files travel back as bytes.

Ray sets ``CUDA_VISIBLE_DEVICES`` of the task to the GPUs it assigned; the trial's server gets
exactly that value (and its telemetry samples exactly those GPUs, by UUID). The worker pins
itself to the cores the node's ledger gave the trial (:mod:`tuner.executor.cores`), and the
trial's placement pins its server and its load generator to their own shares of them: one core
per load-generator process, the rest to vLLM (its API server and workers), as on a local host
(:func:`tuner.host.placement.split`). The trial runs in a scratch folder on the node; what it
wrote comes back in the result, never as a path on the node's disk.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tuner.config import PlacementConfig, TunerConfig
from tuner.executor.cores import CoreLedger, TrialCores, rebind
from tuner.executor.guard import SCRATCH_PREFIX, TRIAL_DIR_ENV
from tuner.executor.protocol import JobResult, TrialDevices, TrialFn, TrialJob
from tuner.host.placement import AUTO, OMP_BIND_ENV, Placement
from tuner.paths import TrialPaths
from tuner.search.resolved import ResolvedLaunch

MAX_FILE_BYTES = 256 * 1024 * 1024  # a larger file stays behind (named in the outcome)
# Run as a script: it needs psutil only, and tuner's package imports would cost it a second
GUARD = str(Path(__file__).with_name("guard.py"))


@dataclass
class Shipped:
    """A remote trial's result and its folder's files (relative path -> bytes)."""

    result: JobResult
    files: dict[str, bytes] = field(default_factory=dict)
    left_behind: list[str] = field(default_factory=list)


class Progress:
    """The trial's progress lines, into the driver's queue (best effort: a line is not worth
    failing a trial for)."""

    def __init__(self, queue: Any, key: str) -> None:
        self.queue, self.key = queue, key

    def __call__(self, message: str) -> None:
        with contextlib.suppress(Exception):
            self.queue.put_nowait((self.key, message))


def run_remote(job: TrialJob, trial_fn: TrialFn, queue: Any) -> Shipped:
    """Run ``job`` here (a Ray task); see the module docstring."""
    import ray

    context = ray.get_runtime_context()
    node = context.get_node_id()
    devices = TrialDevices("ray", node, ray.util.get_node_ip_address())
    if job.demand.gpus:
        devices.gpu_ids = [str(g) for g in ray.get_gpu_ids()]
        devices.cuda_visible_devices = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    ledger = CoreLedger.for_node(node, _node_cores(), _node_cpus(ray, node))
    scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))
    paths = TrialPaths(scratch / job.folder.name)
    try:
        with _on_cores(ledger, job.key, job.demand.cpus) as slots, _guarded(paths.root):
            cores = TrialCores.of(ledger, slots, job.config.workload.processes)
            devices.cpus = list(cores.cores)
            devices.server_slots = list(cores.server_slots)
            devices.client_slots = list(cores.client_slots)
            config, launch = on_devices(job.config, job.launch, devices, cores.sides)
            devices.started_at = time.time()
            outcome = trial_fn(
                config, launch, paths, job.trial_id, progress=Progress(queue, job.key)
            )
            devices.ended_at = time.time()
        devices.gpus_sampled = list(outcome.telemetry.gpu_devices)
        shipped = Shipped(JobResult(job.key, outcome, devices))
        _collect(paths.root, shipped)
        return shipped
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def on_devices(
    config: TunerConfig,
    launch: ResolvedLaunch,
    devices: TrialDevices,
    sides: Placement | None = None,
) -> tuple[TunerConfig, ResolvedLaunch]:
    """The trial's config and launch on its devices: the server sees the assigned GPUs, the
    server and the load generator run on their ``sides`` of the trial's cores (a side set to
    ``all`` stays unpinned), and a CPU server's explicit thread binding moves onto the
    server's cores."""
    if devices.cuda_visible_devices is not None and config.server.device == "cuda":
        server = replace(config.server, cuda_visible_devices=devices.cuda_visible_devices)
        config = replace(config, server=server)
    sides = sides or Placement(None, None)
    if sides.server is not None and sides.client is not None:
        config = replace(config, placement=_pinned(config.placement, sides))
    bound = launch.env.get(OMP_BIND_ENV) or config.server.env.get(OMP_BIND_ENV)
    cores = sides.server or devices.cpus
    if config.server.device == "cpu" and bound and cores:
        launch = replace(launch, env={**launch.env, OMP_BIND_ENV: rebind(bound, cores)})
    return config, launch


def _pinned(placement: PlacementConfig, sides: Placement) -> PlacementConfig:
    """``placement`` with its ``auto`` sides set to ``sides`` (CPU lists, as a user writes
    them; the trial's placement then pins each side's processes there)."""
    server, client = sides.as_text()["server"], sides.as_text()["client"]
    return replace(
        placement,
        server_cpus=server if placement.server_cpus == AUTO else placement.server_cpus,
        client_cpus=client if placement.client_cpus == AUTO else placement.client_cpus,
    )


def _node_cores() -> list[int]:
    """The node's cores: those its raylet (this worker's parent) may run on."""
    try:
        return sorted(os.sched_getaffinity(os.getppid()))
    except OSError:
        return sorted(os.sched_getaffinity(0))


def _node_cpus(ray: Any, node: str) -> int:
    """The CPUs Ray declared for this node (its slots)."""
    for entry in ray.nodes():
        if entry.get("NodeID") == node:
            return int(entry.get("Resources", {}).get("CPU", 0)) or len(_node_cores())
    return len(_node_cores())


@contextlib.contextmanager
def _on_cores(ledger: CoreLedger, key: str, count: int) -> Iterator[tuple[int, ...]]:
    """Claim ``count`` slots and pin this worker (and so every process it starts) to their
    cores; the worker runs other tasks later, so its own affinity is restored after."""
    before = os.sched_getaffinity(0)
    slots = ledger.acquire_slots(key, os.getpid(), count)
    try:
        os.sched_setaffinity(0, ledger.cores_of(slots))
        yield slots
    finally:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, before)
        ledger.release(key)


@contextlib.contextmanager
def _guarded(folder: Path) -> Iterator[None]:
    """The trial's processes carry its folder in their environment, watched by a guard process
    that stops them should this worker die (tuner.executor.guard)."""
    env = {k: v for k, v in os.environ.items() if k != TRIAL_DIR_ENV}
    guard = subprocess.Popen(
        [sys.executable, GUARD, str(os.getpid()), str(folder)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a signal to the worker's group must not reach it
    )
    os.environ[TRIAL_DIR_ENV] = str(folder)
    try:
        yield
    finally:
        os.environ.pop(TRIAL_DIR_ENV, None)
        guard.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            guard.wait(timeout=5)


def _collect(root: Path, shipped: Shipped) -> None:
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = str(path.relative_to(root))
        if path.stat().st_size > MAX_FILE_BYTES:
            shipped.left_behind.append(rel)
            continue
        shipped.files[rel] = path.read_bytes()
