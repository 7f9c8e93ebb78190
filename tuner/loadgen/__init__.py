"""Load generation: drive a server with a workload and record every request.

``get_load_generator("locust")`` is the implementation trials use: Locust, headless, in its own
subprocess (see :mod:`tuner.loadgen.locust`), replaying a seeded plan from
:mod:`tuner.loadgen.workload` and writing raw :class:`~tuner.records.RequestRecord` lines.
"""

from tuner.loadgen.base import (
    LOAD_GENERATORS,
    LoadGenerator,
    LoadResult,
    Target,
    get_load_generator,
    register_load_generator,
)
from tuner.loadgen.locust import LocustLoadGenerator
from tuner.loadgen.workload import PlannedRequest, arrival_gaps, build_plan

__all__ = [
    "LOAD_GENERATORS",
    "LoadGenerator",
    "LoadResult",
    "LocustLoadGenerator",
    "PlannedRequest",
    "Target",
    "arrival_gaps",
    "build_plan",
    "get_load_generator",
    "register_load_generator",
]
