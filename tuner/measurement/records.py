"""The raw per-request record: written by the load generator, read by measure.

One JSON object per line (``requests.jsonl`` in the trial folder). Instants are wall-clock
seconds (``time.time()``) so records from several client processes share one time base;
durations are measured with a monotonic clock inside the client. Definitions follow vLLM's
``vllm bench serve``, so the numbers compare with it:

- ``ttft_s``: send -> first SSE event that carries generated text
- ``e2e_s``: send -> last token-bearing event (not the usage chunk, not ``[DONE]``)
- ``itl_s``: every gap between consecutive token-bearing events
- ``output_tokens``/``prompt_tokens``: from the final ``usage`` chunk
- ``done_at``: the instant the response was read to its end (after the last token event)
A failed request keeps its timing fields as None and says why in ``error_kind``/``error``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# error_kind values: why a request is not a latency sample.
ERROR_HTTP = "http"  # the server answered 4xx/5xx
ERROR_CONNECTION = "connection"  # connect/reset/disconnect: may be a client artifact (keep-alive)
ERROR_TIMEOUT = "timeout"  # no answer within workload.request_timeout_s
ERROR_STREAM = "stream"  # an error event or a malformed stream after a 200
# The errors of a run, each counted in error_rate and errors_by_kind.
ERROR_KINDS = (ERROR_HTTP, ERROR_CONNECTION, ERROR_TIMEOUT, ERROR_STREAM)
# Not an error of the server: the request does not fit its context (max_model_len), which
# refused it (vLLM's HTTP 400), or served fewer tokens than asked (finish_reason "length"
# short of max_tokens). A deployment that caps the context sends such requests to another
# tier: counted apart (rejected, rejected_rate, slo.max_rejected_rate), never a latency
# sample, and the prompt is never clipped to fit (tuner.loadgen.request.context_refusal).
ERROR_REJECTED = "rejected"

PHASE_WARMUP = "warmup"
PHASE_MEASURE = "measure"


@dataclass
class RequestRecord:
    """One request as the client saw it."""

    request_id: str
    request_class: str
    api: str
    phase: str  # warmup | measure
    scheduled_at: float  # when the arrival process wanted it sent (open loop) or = sent_at
    sent_at: float
    ok: bool
    status: int = 0  # HTTP status; 0 when no response arrived
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    max_tokens: int | None = None
    error_kind: str = ""
    error: str = ""
    # Client-side diagnostics: the closed-loop user that sent it ("" in open loop) and when
    # the whole response (usage chunk, [DONE]) had been read, so the idle time of a user
    # between its requests (done_at -> its next sent_at) can be measured.
    user: str = ""
    done_at: float | None = None
    # A conversation's turn (workload.sessions): 0 for its first request, and for every
    # request of a workload without sessions.
    turn: int = 0

    @property
    def finished_at(self) -> float | None:
        return None if self.e2e_s is None else self.sent_at + self.e2e_s

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RequestRecord:
        return cls(**data)


def write_records(path: Path, records: Iterable[RequestRecord]) -> int:
    """Append records to a JSONL file; returns how many were written."""
    n = 0
    with path.open("a", encoding="utf-8") as fh:
        for rec in records:
            fh.write(rec.to_json() + "\n")
            n += 1
    return n


def read_records(path: Path) -> Iterator[RequestRecord]:
    """Read a JSONL records file. A torn last line (a killed writer) is skipped, not fatal."""
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                continue
            yield RequestRecord.from_dict(data)
