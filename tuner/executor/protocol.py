"""The executor seam: where a study's trials run, while the driver (`tuner run`) decides.

The driver asks its samplers, records every trial in the Optuna storage and tells the results;
an executor only runs what it is given. ``submit`` hands it a :class:`TrialJob` (a launch, its
config and the driver's trial folder); ``wait`` blocks until one of the jobs in flight is done
and returns its :class:`JobResult`: the outcome, the devices it ran on and the trial folder's
files, already written back into the driver's folder, so reports, exports and the dashboard
read them locally whatever node the trial ran on. A job the executor lost (its node died, its
worker was killed) comes back as a result too, marked ``lost``: the driver records it as failed
with the reason :data:`REASON_EXECUTOR_LOST` and asks for another trial, since the configuration
is not to blame.

Executors register by name (``study.executor``): ``local`` runs one trial at a time in this
process (the serial path), ``ray`` runs ``study.parallel`` trials at once on a Ray cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tuner.config import TunerConfig
from tuner.errors import ConfigError
from tuner.paths import TrialPaths
from tuner.schema import TrialAttr
from tuner.search.resolved import ResolvedLaunch
from tuner.trial.outcome import TrialOutcome

REASON_EXECUTOR_LOST = "executor_lost"
DEVICES_ATTR = TrialAttr.DEVICES  # a trial's user attr: where it ran (TrialDevices.to_attr)

Say = Callable[[str], None]


class TrialFn(Protocol):
    """How a study measures one configuration: :func:`tuner.trial.run.run_trial` (a real server and
    real load), or a table lookup in the benchmarks' replays. It always returns an outcome: only
    an interrupt or a TunerError (a full disk) raises."""

    def __call__(
        self,
        config: TunerConfig,
        launch: ResolvedLaunch,
        paths: TrialPaths,
        trial_id: str,
        progress: Say = ...,
    ) -> TrialOutcome: ...


@dataclass(frozen=True)
class Demand:
    """What one trial occupies: GPUs on one node (TP x PP x DP, for a GPU server) and cores
    for its server and its load generator."""

    gpus: int
    cpus: int

    def text(self) -> str:
        gpus = f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}, " if self.gpus else ""
        return f"{gpus}{self.cpus} CPU{'s' if self.cpus != 1 else ''}"


def demand_of(config: TunerConfig, launch: ResolvedLaunch, cpus_per_gpu: int = 0) -> Demand:
    """The devices a trial of ``launch`` needs. Its cores, unless ``ray.cpus_per_trial`` sets
    them: one per load-generator process (``workload.processes``, as the job's config says),
    plus one per rank of a CPU server (vLLM-CPU computes on them), or, for a GPU server, one
    for its API server and one per GPU worker (a rank each), and at least ``ray.cpus_per_gpu``
    (else ``cpus_per_gpu``, the executor's node share) per GPU."""
    ranks = launch.devices
    fixed = config.ray.cpus_per_trial
    if config.server.device != "cuda":
        return Demand(0, fixed or config.workload.processes + ranks)
    if fixed:
        return Demand(ranks, fixed)
    own = Demand(ranks, 1 + ranks + config.workload.processes)
    return at_share(own, config.ray.cpus_per_gpu or cpus_per_gpu)


def at_share(demand: Demand, cpus_per_gpu: int) -> Demand:
    """``demand`` with at least ``cpus_per_gpu`` cores per GPU: trials that fill a node's GPUs
    share out all its cores, and a trial's vLLM is never left short of them by the count of
    its processes alone."""
    return Demand(demand.gpus, max(demand.cpus, demand.gpus * cpus_per_gpu))


def node_share(nodes: Sequence[Demand]) -> int:
    """The cores per GPU of the GPU nodes' least ratio (a trial sized by it fits on any node
    its GPUs fit on); 0 where no node has a GPU."""
    return min((n.cpus // n.gpus for n in nodes if n.gpus), default=0)


@dataclass(frozen=True)
class TrialJob:
    """One trial for an executor to run: everything it needs, nothing of the driver's state."""

    key: str  # unique among the jobs in flight: "<storage study>#<trial number>"
    trial_id: str  # the trial folder's name, "<label>-<number>"
    config: TunerConfig
    launch: ResolvedLaunch  # resolved once by the driver against the job's server
    folder: Path  # the driver's trial folder: results are written back here
    prefix: str  # "[label #n]": how the driver prefixes the trial's progress lines
    demand: Demand


@dataclass
class TrialDevices:
    """Where a trial ran: stored with it (attr ``devices``) so a review can tell trials apart
    that ran side by side."""

    executor: str = "local"
    node: str = ""  # the Ray node id
    node_ip: str = ""
    cuda_visible_devices: str | None = None  # as the server saw it
    gpu_ids: list[str] = field(default_factory=list)  # Ray's assignment
    gpus_sampled: list[str] = field(default_factory=list)  # UUIDs NVML sampled
    cpus: list[int] = field(default_factory=list)  # the cores the trial was given
    # On Ray, the node's CPUs (as Ray counts them: the ledger's slots) that the server and the
    # load generator hold; their cores are these modulo the node's cores (tuner.executor.cores)
    server_slots: list[int] = field(default_factory=list)
    client_slots: list[int] = field(default_factory=list)
    started_at: float = 0.0  # wall clock, on the node
    ended_at: float = 0.0

    def to_attr(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class JobResult:
    """A finished job: its outcome (paths in the driver's folder) and where it ran."""

    key: str
    outcome: TrialOutcome
    devices: TrialDevices = field(default_factory=TrialDevices)
    lost: str = ""  # why the executor lost the job ("" when it ran to an outcome)


class Executor(Protocol):
    """Runs trials; see the module docstring. ``slots``: how many it runs at once."""

    name: str
    slots: int

    @property
    def in_flight(self) -> int:
        """Jobs submitted and not yet returned by :meth:`wait`."""
        ...

    def fits(self, demand: Demand) -> bool:
        """Whether a job of ``demand`` could start now beside the jobs in flight."""
        ...

    def largest_node(self) -> Demand:
        """The most GPUs and cores one node offers (a trial never spans nodes)."""
        ...

    def submit(self, job: TrialJob) -> None: ...

    def wait(self) -> JobResult:
        """The next job to finish (blocks); raises what a trial raised (an interrupt, a
        TunerError) after every process of it is stopped."""
        ...

    def cancel_all(self) -> None:
        """Stop every job in flight and reap its processes (an interrupt, a stopped study)."""
        ...

    def close(self) -> None:
        """Release the executor (idempotent); a local Ray instance it started shuts down."""
        ...


ExecutorFactory = Callable[[TunerConfig, TrialFn, Say], Executor]
EXECUTORS: dict[str, ExecutorFactory] = {}


def register_executor(name: str) -> Callable[[ExecutorFactory], ExecutorFactory]:
    def wrap(factory: ExecutorFactory) -> ExecutorFactory:
        EXECUTORS[name] = factory
        return factory

    return wrap


def make_executor(config: TunerConfig, trial_fn: TrialFn, say: Say) -> Executor:
    """The executor named by ``study.executor``; ConfigError (exit 2) on an unknown name, an
    unreachable cluster or a study it cannot place."""
    try:
        factory = EXECUTORS[config.study.executor]
    except KeyError:
        raise ConfigError(
            f"study.executor={config.study.executor!r} is unknown "
            f"(known: {', '.join(sorted(EXECUTORS))})"
        ) from None
    return factory(config, trial_fn, say)


def check_demands(
    config: TunerConfig, demands: list[Demand], largest: Demand, where: str
) -> list[Demand]:
    """A ConfigError where no node of ``where`` can hold the baseline (``demands[0]``), or a
    trial's cores though its GPUs fit; the demands of more GPUs than any node has, returned,
    are candidates the study screens without a launch (tuner.plan.demand)."""
    beyond = [d for d in demands[1:] if d.gpus > largest.gpus]
    for demand in [d for i, d in enumerate(demands) if i == 0 or d not in beyond]:
        if demand.gpus > largest.gpus or demand.cpus > largest.cpus:
            raise ConfigError(
                f"a trial of this study needs {demand.text()} on one node, and the largest "
                f"node of {where} has {largest.text()}",
                hint="drop the larger tensor/pipeline sizes from the search space, lower "
                "ray.cpus_per_gpu or workload.processes (or set ray.cpus_per_trial), or add a "
                "larger node",
            )
    return beyond
