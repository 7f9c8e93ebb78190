"""The LoadGenerator seam: what a trial asks of a load generator, and what it gets back.

A load generator drives one running server with one workload and writes the raw per-request
records (:mod:`tuner.measurement.records`) that every statistic is computed from.
Implementations register themselves by name in :data:`LOAD_GENERATORS`;
:func:`get_load_generator` looks one up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

from tuner.config.workload import WorkloadConfig
from tuner.errors import ConfigError


@dataclass(frozen=True)
class Target:
    """The server under test, as the client sees it."""

    base_url: str  # e.g. http://127.0.0.1:8000 (no /v1)
    api_key: str | None  # sent as `Authorization: Bearer <key>` when set
    model: str  # the served model name, sent in every request body
    tokenizer: str  # local path of a HF tokenizer (or model) dir, for prompt synthesis
    # the server schedules by request priority (--scheduling-policy priority): the classes'
    # priorities are sent; on FCFS vLLM refuses a request with any priority but 0
    by_priority: bool = False


@dataclass
class LoadResult:
    """What one load run produced. Instants are wall-clock seconds (``time.time()``)."""

    records_path: Path  # merged raw records (requests.jsonl)
    window_start: float  # start of the measurement window (end of warm-up)
    window_end: float  # when new requests stopped; started ones were then drained
    measured_requests: int
    warmup_requests: int
    locust_csv_prefix: Path | None = None
    html_path: Path | None = None
    client_pids: list[int] = field(default_factory=list)
    returncode: int = 0

    @property
    def window_s(self) -> float:
        return self.window_end - self.window_start


class LoadGenerator(Protocol):
    """Drive ``target`` with ``workload``; write everything under ``out_dir``."""

    def run(
        self,
        target: Target,
        workload: WorkloadConfig,
        out_dir: Path,
        on_spawn: Callable[[int], None] | None = None,
    ) -> LoadResult:
        """Run one load test to its end (warm-up, window, drain) and return its result.

        ``on_spawn`` is called with the PID of each client process as it appears, so the caller
        can sample the client's own CPU (a saturated client distorts the tail).
        Raises :class:`~tuner.errors.LoadGenError` when the client itself fails.
        """
        ...


LOAD_GENERATORS: dict[str, type] = {}

_T = TypeVar("_T", bound=type)


def register_load_generator(name: str) -> Callable[[_T], _T]:
    """Class decorator: make an implementation available under ``name``."""

    def deco(cls: _T) -> _T:
        LOAD_GENERATORS[name] = cls
        return cls

    return deco


def get_load_generator(name: str) -> type:
    """The implementation registered under ``name``; ConfigError listing the known ones."""
    try:
        return LOAD_GENERATORS[name]
    except KeyError:
        known = ", ".join(sorted(LOAD_GENERATORS)) or "none"
        raise ConfigError(
            f"unknown load generator {name!r}", hint=f"known load generators: {known}"
        ) from None
