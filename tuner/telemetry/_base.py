"""The periodic sampler every telemetry source is built on.

A sampler runs one daemon thread that calls :meth:`PeriodicSampler._sample` every ``interval_s``
seconds, plus once when started and once when stopped, so even a short run has both end points.
Telemetry must never kill a trial, so an exception inside a sample is recorded as a warning and
sampling goes on; :meth:`stop` always joins the thread.
"""

from __future__ import annotations

import threading
from collections import Counter

import pandas as pd

from tuner.errors import ConfigError

# (start, end) in wall-clock seconds (time.time()), the time base of the request records.
Window = tuple[float, float]


class PeriodicSampler:
    """Base of the telemetry samplers: a daemon thread, started and joined explicitly."""

    def __init__(self, interval_s: float, name: str) -> None:
        if interval_s <= 0:
            raise ConfigError(f"telemetry interval must be > 0 s, got {interval_s}")
        self.interval_s = interval_s
        self.name = name
        self._lock = threading.Lock()
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._problems: Counter[str] = Counter()

    @property
    def running(self) -> bool:
        return self._thread is not None

    @property
    def warnings(self) -> list[str]:
        """Problems met while sampling, each once, with how often it happened."""
        with self._lock:
            items = list(self._problems.items())
        return [f"{self.name}: {msg}" + (f" (x{n})" if n > 1 else "") for msg, n in items]

    def start(self) -> None:
        """Set up and start sampling; a source that cannot work records why and stays idle."""
        if self._thread is not None:
            return
        if not self._setup():
            return
        self._stop_event.clear()
        self._thread = threading.Thread(target=self._loop, name=f"tuner-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (joined), take a last sample and release resources. Idempotent."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop_event.set()
        thread.join()
        self._sample_safely()
        self._teardown()

    def _loop(self) -> None:
        self._sample_safely()
        while not self._stop_event.wait(self.interval_s):
            self._sample_safely()

    def _sample_safely(self) -> None:
        try:
            self._sample()
        except Exception as exc:  # why: a telemetry hiccup must not end sampling or the trial
            self._note(f"sampling failed: {type(exc).__name__}: {exc}")

    def _note(self, problem: str) -> None:
        with self._lock:
            self._problems[problem] += 1

    def _setup(self) -> bool:
        """Acquire what sampling needs; return False (after :meth:`_note`) to stay idle."""
        return True

    def _teardown(self) -> None:
        """Release what :meth:`_setup` acquired."""

    def _sample(self) -> None:
        """Take one sample and store it (under ``self._lock``)."""
        raise NotImplementedError


def in_window(frame: pd.DataFrame, window: Window | None) -> pd.DataFrame:
    """Rows of a samples frame (column ``t``) inside ``[start, end]``; all rows for None."""
    if window is None or frame.empty:
        return frame
    start, end = window
    return frame[(frame["t"] >= start) & (frame["t"] <= end)]


def trapezoid(y: pd.Series, t: pd.Series) -> float:
    """Integral of y over t (trapezoid rule), skipping NaN samples; 0 with fewer than 2 points."""
    mask = y.notna() & t.notna()
    yv, tv = y[mask].to_numpy(dtype=float), t[mask].to_numpy(dtype=float)
    if len(yv) < 2:
        return 0.0
    return float(((yv[1:] + yv[:-1]) / 2.0 * (tv[1:] - tv[:-1])).sum())
