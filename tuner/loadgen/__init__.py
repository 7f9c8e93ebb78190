"""Load generation: drive a server with a workload and record every request.

``get_load_generator("locust")`` is the implementation trials use: Locust, headless, in its own
subprocess (see :mod:`tuner.loadgen.locust`), replaying a seeded plan from
:mod:`tuner.loadgen.request_plan` and writing raw
:class:`~tuner.measurement.records.RequestRecord` lines.
"""

from tuner.loadgen.generator import (
    LOAD_GENERATORS,
    LoadGenerator,
    LoadResult,
    Target,
    get_load_generator,
    register_load_generator,
)
from tuner.loadgen.locust import LocustLoadGenerator
from tuner.loadgen.request_plan import PlannedRequest, arrival_gaps, build_plan

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
