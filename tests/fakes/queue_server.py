"""The known-delay streaming server of :mod:`tuner.testing.sse_server` with a known capacity:
at most ``slots`` requests are served at once, the others wait in a queue (as vLLM's scheduler
holds requests beyond ``max_num_seqs``), so the server completes at most ``slots / service
time`` requests per second and its latencies grow without bound beyond that rate.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from tuner.testing.sse_server import FakeConfig, FakeServer, _Handler


class _QueuedHandler(_Handler):
    def _complete(self, body: dict[str, Any], arrival: float, drop: bool, chat: bool) -> None:
        fake = self.server.fake
        assert isinstance(fake, QueueServer)
        with fake.slots:  # waiting here is the queue: no header, no token until served
            super()._complete(body, time.perf_counter(), drop, chat)


class QueueServer(FakeServer):
    """A :class:`FakeServer` that serves ``slots`` requests at a time."""

    def __init__(self, config: FakeConfig, slots: int) -> None:
        super().__init__(config)
        self.slots = threading.BoundedSemaphore(slots)
        self.slot_count = slots
        self._httpd.RequestHandlerClass = _QueuedHandler

    def capacity(self, output_tokens: int) -> float:
        """Requests per second it can complete: slots over one request's service time."""
        service = self.config.ttft_s + (output_tokens - 1) * self.config.itl_s
        return self.slot_count / service
