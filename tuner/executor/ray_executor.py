"""The ``ray`` executor: ``study.parallel`` trials at once, placed by Ray on a cluster.

Each trial is one Ray task that asks for exactly its needs (:func:`demand_of`): ``num_gpus`` =
TP x PP x DP for a GPU server, and cores for the server and the load generator: at least its
GPUs' share of a node's cores (``ray.cpus_per_gpu``, by default the nodes' CPUs per GPU), so
that vLLM's API server and workers and the load generator each have cores of their own. Its
resources are reserved as one placement-group bundle (all on one node: a server never spans
nodes) and released when the task ends. Ray assigns the GPUs (``CUDA_VISIBLE_DEVICES`` of the
task), the node's ledger the cores (:mod:`tuner.executor.remote`). The task's progress lines
come back through a queue actor; its result and files through the object store.

A task whose node or worker was lost comes back as a ``lost`` result. A TunerError raised by a
trial (a full disk) ends the run as it does on the local executor.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import Any

from tuner.config import TunerConfig
from tuner.errors import ConfigError, TunerError
from tuner.executor.cluster import RayCluster, connect
from tuner.executor.cluster_fit import resolve_slots, study_demands
from tuner.executor.protocol import (
    REASON_EXECUTOR_LOST,
    Demand,
    JobResult,
    Say,
    TrialDevices,
    TrialFn,
    TrialJob,
    at_share,
    check_demands,
    node_share,
    register_executor,
)
from tuner.executor.remote import Shipped, run_remote
from tuner.paths import TrialPaths
from tuner.schema import TrialStatus
from tuner.trial.outcome import TrialOutcome

POLL_S = 0.25  # how often the driver looks at progress lines while it waits
CANCEL_GRACE_S = 30.0  # a cancelled trial stops its server and load first; then killed


@dataclass
class _RayTask:
    job: TrialJob
    group: Any  # the placement group holding its resources


class RayExecutor:
    name = "ray"

    def __init__(self, config: TunerConfig, trial_fn: TrialFn, say: Say) -> None:
        config.ray.validate()
        _check_placement(config)
        self.config, self.trial_fn, self.say = config, trial_fn, say
        self.cluster: RayCluster | None = connect(config.ray)
        self.ray = self.cluster.ray
        # A GPU trial's least cores per GPU; ray.cpus_per_trial sets every trial's instead
        share = config.ray.cpus_per_gpu or node_share(self.cluster.nodes())
        self.share = 0 if config.ray.cpus_per_trial else share
        try:
            demands = study_demands(config, self.share)
            beyond = check_demands(config, demands, self.cluster.largest(), "the Ray cluster")
            placeable = [d for d in demands if d not in beyond]
            self.slots = resolve_slots(config.study.parallel, self.cluster.nodes(), placeable)
            if beyond:
                most = max(d.gpus for d in beyond)
                say(
                    f"ray: candidates of up to {most} GPUs need more than any node has: "
                    "screened without a launch"
                )
        except ConfigError:
            self.close()
            raise
        from ray.util.queue import Queue

        self._task = self.ray.remote(max_retries=0)(run_remote)  # a lost trial is the driver's call
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # On the driver's node: a lost node must not take the progress lines of the others
        here = NodeAffinitySchedulingStrategy(self.ray.get_runtime_context().get_node_id(), True)
        self._queue: Any = Queue(actor_options={"num_cpus": 0, "scheduling_strategy": here})
        self._tasks: dict[Any, _RayTask] = {}
        self._prefixes: dict[str, str] = {}

    # -- placement -------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def _used(self) -> Demand:
        demands = [f.job.demand for f in self._tasks.values()]
        return Demand(sum(d.gpus for d in demands), sum(d.cpus for d in demands))

    def sized(self, demand: Demand) -> Demand:
        """``demand`` with its GPUs' share of a node's cores (see :func:`demand_of`)."""
        return at_share(demand, self.share)

    def fits(self, demand: Demand) -> bool:
        """A free slot and, over the alive nodes, free GPUs and cores for it. Ray decides the
        node; holding a trial that does not fit keeps smaller ones from taking every freed
        device before it (it would wait behind them for as long as they keep coming)."""
        if len(self._tasks) >= self.slots or self.cluster is None:
            return False
        demand = self.sized(demand)
        used, total = self._used(), self.cluster.total()
        return used.gpus + demand.gpus <= total.gpus and used.cpus + demand.cpus <= total.cpus

    def largest_node(self) -> Demand:
        return self.cluster.largest() if self.cluster is not None else Demand(0, 0)

    # -- running ---------------------------------------------------------------------------
    def submit(self, job: TrialJob) -> None:
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        job = replace(job, demand=self.sized(job.demand))
        bundle = {"CPU": float(job.demand.cpus)}
        if job.demand.gpus:
            bundle["GPU"] = float(job.demand.gpus)
        group = placement_group([bundle], strategy="STRICT_PACK")
        strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0)
        ref = self._task.options(
            num_cpus=job.demand.cpus, num_gpus=job.demand.gpus, scheduling_strategy=strategy
        ).remote(job, self.trial_fn, self._queue)
        self._tasks[ref] = _RayTask(job, group)
        self._prefixes[job.key] = job.prefix
        self.say(f"{job.prefix} submitted to Ray: {job.demand.text()}")

    def wait(self) -> JobResult:
        while True:
            self._relay_progress()
            ready, _ = self.ray.wait(list(self._tasks), num_returns=1, timeout=POLL_S)
            if ready:
                result = self._land(ready[0])
                self._relay_progress()
                return result

    def _land(self, ref: Any) -> JobResult:
        from ray.exceptions import RayError, RayTaskError, TaskCancelledError

        task = self._tasks.pop(ref)
        try:
            shipped: Shipped = self.ray.get(ref)
        except TaskCancelledError as exc:
            return _lost(task.job, f"the trial was cancelled ({type(exc).__name__})")
        except RayTaskError as exc:
            raise _cause(exc) from None  # the trial's own error, as on the local executor
        except RayError as exc:
            return _lost(task.job, _first_line(exc))
        finally:
            self._release(task)
        return _unpack(task.job, shipped)

    def _release(self, task: _RayTask) -> None:
        from ray.util.placement_group import remove_placement_group

        with contextlib.suppress(Exception):  # a group on a lost node is gone already
            remove_placement_group(task.group)

    def _relay_progress(self) -> None:
        if self._queue is None:
            return
        try:
            size = self._queue.size()
            lines = self._queue.get_nowait_batch(size) if size else []
        except Exception:  # the queue's actor is gone: the trials still run, only quieter
            self._queue = None
            return
        for key, message in lines:
            self.say(f"{self._prefixes.get(key, '[' + key + ']')} {message}")

    def cancel_all(self) -> None:
        """Cancel every trial (an interrupt inside it: it stops its server and load), then
        kill what has not ended within CANCEL_GRACE_S (its node's guard reaps its processes)."""
        refs = list(self._tasks)
        for ref in refs:
            with contextlib.suppress(Exception):
                self.ray.cancel(ref)
        if refs:
            _, rest = self.ray.wait(refs, num_returns=len(refs), timeout=CANCEL_GRACE_S)
            for ref in rest:
                with contextlib.suppress(Exception):
                    self.ray.cancel(ref, force=True)
        for task in self._tasks.values():
            self._release(task)
        self._tasks.clear()

    def close(self) -> None:
        if self.cluster is None:
            return
        with contextlib.suppress(Exception):
            if getattr(self, "_tasks", None):
                self.cancel_all()
            if getattr(self, "_queue", None) is not None:
                self.ray.kill(self._queue.actor)
        self.cluster.close()
        self.cluster = None


def _check_placement(config: TunerConfig) -> None:
    """Explicit CPU lists name one host's cores; on Ray each trial gets its node's."""
    for side, value in (
        ("server", config.placement.server_cpus),
        ("client", config.placement.client_cpus),
    ):
        if value not in ("auto", "all"):
            raise ConfigError(
                f"placement.{side}_cpus={value!r} names cores of one host; with "
                "study.executor=ray each trial gets its cores on its node",
                hint=f"use placement.{side}_cpus=auto, or ray.cpus_per_trial to size them",
            )


def _unpack(job: TrialJob, shipped: Shipped) -> JobResult:
    """Write the trial's files into the driver's folder and point its outcome there."""
    paths = TrialPaths(job.folder).ensure()
    for rel, data in shipped.files.items():
        target = paths.root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    outcome = shipped.result.outcome
    outcome.folder = str(paths.root)
    if outcome.quality is not None and outcome.quality.outputs:
        outcome.quality.outputs = str(paths.quality)
    if shipped.left_behind:
        outcome.telemetry.warnings.append(
            f"files too large to bring back, left on node {shipped.result.devices.node_ip}: "
            + ", ".join(shipped.left_behind)
        )
    outcome.write(paths.result_json)
    return shipped.result


def _lost(job: TrialJob, why: str) -> JobResult:
    """A job whose node or worker was lost, as a failed outcome in the driver's folder."""
    paths = TrialPaths(job.folder).ensure()
    outcome = TrialOutcome(job.trial_id, TrialStatus.FAILED, [], job.launch.record())
    outcome.fail(REASON_EXECUTOR_LOST, f"the Ray executor lost the trial: {why}")
    outcome.folder = str(paths.root)
    outcome.write(paths.result_json)
    return JobResult(job.key, outcome, TrialDevices("ray"), lost=why)


def _cause(exc: Any) -> BaseException:
    """The exception a task raised, as itself (a TunerError keeps its exit code)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, TunerError | KeyboardInterrupt):
        return cause
    return cause if isinstance(cause, BaseException) else exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:300]


@register_executor("ray")
def _ray(config: TunerConfig, trial_fn: TrialFn, say: Say) -> RayExecutor:
    return RayExecutor(config, trial_fn, say)
