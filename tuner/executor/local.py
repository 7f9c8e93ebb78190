"""The ``local`` executor: one trial at a time, in this process (the serial path).

``wait`` runs the submitted trial itself, with its progress lines on the driver's display, so
a study on it behaves exactly as before executors existed.
"""

from __future__ import annotations

import os
from collections import deque

from tuner.config import TunerConfig
from tuner.errors import ConfigError
from tuner.executor.protocol import (
    Demand,
    JobResult,
    Say,
    TrialDevices,
    TrialFn,
    TrialJob,
    register_executor,
)
from tuner.paths import TrialPaths
from tuner.telemetry import gpu_count
from tuner.telemetry.nvml import visible_entries


class LocalExecutor:
    name = "local"
    slots = 1

    def __init__(self, config: TunerConfig, trial_fn: TrialFn, say: Say) -> None:
        if config.study.parallel not in ("1", "auto"):
            raise ConfigError(
                f"study.parallel={config.study.parallel} needs study.executor=ray: the local "
                "executor runs one trial at a time",
                hint="add study.executor=ray (a local Ray instance is started for you)",
            )
        self.config, self.trial_fn, self.say = config, trial_fn, say
        self._queue: deque[TrialJob] = deque()

    @property
    def in_flight(self) -> int:
        return len(self._queue)

    def fits(self, demand: Demand) -> bool:
        return not self._queue

    def largest_node(self) -> Demand:
        """This host: the GPUs its server may see, the cores this process may use."""
        visible = visible_entries(self.config.server.cuda_visible_devices)
        gpus = len(visible) if visible is not None else gpu_count()
        return Demand(gpus, len(os.sched_getaffinity(0)))

    def submit(self, job: TrialJob) -> None:
        self._queue.append(job)

    def wait(self) -> JobResult:
        job = self._queue[0]
        try:
            outcome = self.trial_fn(
                job.config,
                job.launch,
                TrialPaths(job.folder),
                job.trial_id,
                progress=lambda msg: self.say(f"{job.prefix} {msg}"),
            )
        finally:
            self._queue.popleft()
        server = outcome.placement.server
        devices = TrialDevices(
            cuda_visible_devices=job.config.server.cuda_visible_devices,
            gpus_sampled=list(outcome.telemetry.gpu_devices),
            cpus=list(server) if server else [],
        )
        return JobResult(job.key, outcome, devices)

    def cancel_all(self) -> None:
        self._queue.clear()  # nothing runs between calls of wait()

    def close(self) -> None:
        self._queue.clear()


@register_executor("local")
def _local(config: TunerConfig, trial_fn: TrialFn, say: Say) -> LocalExecutor:
    return LocalExecutor(config, trial_fn, say)
