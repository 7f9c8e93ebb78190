"""Where trials run: the executor seam (:mod:`tuner.executor.protocol`) and its implementations.

``local`` (:mod:`tuner.executor.local`) runs one trial at a time in the driver; ``ray``
(:mod:`tuner.executor.ray_executor`) runs several at once on a Ray cluster, each on devices of
its own. Importing this package registers both; Ray itself is imported only by the ``ray``
executor, when it is used.
"""

from tuner.executor import local, ray_executor
from tuner.executor.protocol import (
    DEVICES_ATTR,
    EXECUTORS,
    REASON_EXECUTOR_LOST,
    Demand,
    Executor,
    JobResult,
    TrialDevices,
    TrialFn,
    TrialJob,
    demand_of,
    make_executor,
    register_executor,
)

__all__ = [
    "DEVICES_ATTR",
    "EXECUTORS",
    "REASON_EXECUTOR_LOST",
    "Demand",
    "Executor",
    "JobResult",
    "TrialDevices",
    "TrialFn",
    "TrialJob",
    "demand_of",
    "local",
    "make_executor",
    "ray_executor",
    "register_executor",
]
