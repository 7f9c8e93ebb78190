"""A request too long for the server's context (a tier cap's max_model_len) is *rejected*:
classified from vLLM's answer, never a latency sample nor a server error, counted in total and
per class, and bounded by ``slo.max_rejected_rate`` and a class's own bound."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import requests

from tests.unit.test_measure_classes import T0, T1, _rec
from tuner.cli import main
from tuner.composition import compose
from tuner.config import SloConfig
from tuner.errors import ConfigError
from tuner.loadgen.request import consume
from tuner.measurement.records import ERROR_HTTP, ERROR_REJECTED, RequestRecord
from tuner.measurement.stats import measure
from tuner.scoring import objective as obj
from tuner.study.state.fingerprint import fingerprint

# vLLM 0.32's answer to a prompt longer than --max-model-len (HTTP 400)
TOO_LONG = {
    "error": {
        "message": "This model's maximum context length is 1024 tokens. However, your request "
        "has 2080 input tokens. Please reduce the length of the input messages.",
        "type": "BadRequestError",
        "code": 400,
    }
}


def _response(status: int, body: bytes) -> requests.Response:
    resp = requests.Response()
    resp.status_code = status
    resp.raw = io.BytesIO(body)
    return resp


def _stream(tokens: int, finish: str) -> bytes:
    events = [{"choices": [{"text": "x", "finish_reason": None}]} for _ in range(tokens - 1)]
    events.append({"choices": [{"text": "x", "finish_reason": finish}]})
    events.append({"choices": [], "usage": {"prompt_tokens": 1000, "completion_tokens": tokens}})
    lines = [b"data: " + json.dumps(e).encode() for e in events] + [b"data: [DONE]"]
    return b"\n\n".join(lines) + b"\n\n"


def _sent(max_tokens: int = 32) -> RequestRecord:
    rec = RequestRecord("r", "documents", "completions", "measure", 0.0, 0.0, ok=True)
    rec.max_tokens = max_tokens
    return rec


def test_vllms_context_refusal_is_rejected_and_another_400_is_an_error() -> None:
    rec = _sent()
    consume(_response(400, json.dumps(TOO_LONG).encode()), rec, 0.0, chat=False)
    assert not rec.ok and rec.error_kind == ERROR_REJECTED and rec.e2e_s is None
    assert "maximum context length" in rec.error
    other = _sent()
    bad = {"error": {"message": "temperature must be non-negative", "code": 400}}
    consume(_response(400, json.dumps(bad).encode()), other, 0.0, chat=False)
    assert other.error_kind == ERROR_HTTP


def test_an_answer_the_context_cut_short_is_rejected_a_full_one_is_not() -> None:
    """vLLM lowers max_tokens to what the context leaves and ends with finish_reason "length":
    with ignore_eos, fewer tokens than asked can only be the context's doing."""
    short = _sent(max_tokens=32)
    consume(_response(200, _stream(5, "length")), short, 0.0, chat=False)
    assert short.error_kind == ERROR_REJECTED and "5 of 32" in short.error
    full = _sent(max_tokens=5)
    consume(_response(200, _stream(5, "length")), full, 0.0, chat=False)
    assert full.ok and full.e2e_s is not None and full.output_tokens == 5


def _rejected(i: int, cls: str) -> RequestRecord:
    rec = _rec(i, cls, None)
    rec.error_kind = ERROR_REJECTED
    return rec


def _window() -> list[RequestRecord]:
    """10 chat turns served, 5 documents served, 5 documents rejected, 1 chat timeout."""
    chat = [_rec(i, "chat", 0.2) for i in range(10)] + [_rec(10, "chat", None)]
    documents = [_rec(i, "documents", 2.0) for i in range(5)]
    return chat + documents + [_rejected(5 + i, "documents") for i in range(5)]


def test_rejected_requests_are_neither_samples_nor_errors() -> None:
    m = measure(_window(), T0, T1, SloConfig())
    assert m.requests_started == 21 and m.completed == 15 and m.failed == 1
    assert m.rejected == 5 and m.rejected_rate == pytest.approx(5 / 21)
    assert m.error_rate == pytest.approx(1 / 16)  # of the 16 requests the server accepted
    assert sum(m.errors_by_kind.values()) == 1 and "rejected" not in m.errors_by_kind
    docs = m.by_class["documents"]
    assert docs.rejected == 5 and docs.rejected_rate == 0.5 and docs.error_rate == 0.0
    assert m.by_class["chat"].rejected == 0
    assert any("5 of 21 requests rejected" in w and "documents 5" in w for w in m.warnings)
    assert m.flat()["rejected_rate"] == pytest.approx(5 / 21)


def test_the_bounds_on_rejected_requests_in_total_and_per_class() -> None:
    m = measure(_window(), T0, T1, SloConfig())
    total = obj.get_constraint("rejected_rate")
    # the default allows none; a quarter is allowed when a share may go to another tier
    assert total.violation(m, obj.ObjectiveContext()) == pytest.approx(5 / 21)
    lifted = SloConfig(max_rejected_rate=0.25, classes={"chat": {"max_rejected_rate": 0.0}})
    assert total.violation(m, obj.ObjectiveContext(slo=lifted)) < 0
    made = {c.name: c for c in obj.class_slos(lifted)}
    assert list(made) == ["rejected_rate_chat"]
    assert made["rejected_rate_chat"].violation(m, obj.ObjectiveContext(slo=lifted)) == 0.0
    strict = SloConfig(max_rejected_rate=1.0, classes={"documents": {"max_rejected_rate": 0.1}})
    docs = obj.class_slos(strict)[0]
    assert docs.violation(m, obj.ObjectiveContext(slo=strict)) == pytest.approx(0.4)


def test_a_class_whose_every_request_is_rejected_has_no_latency_slo_on_this_tier() -> None:
    records = [_rec(i, "chat", 0.2) for i in range(5)]
    records += [_rejected(i, "documents") for i in range(5)]
    slo = SloConfig(max_rejected_rate=1.0, classes={"documents": {"p99_e2e_s": 4.0}})
    m = measure(records, T0, T1, slo)
    (latency,) = obj.class_slos(slo)
    assert latency.violation(m, obj.ObjectiveContext(slo=slo)) == obj.UNSET_SLO


def test_a_rejected_rate_bound_outside_zero_one_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError, match=r"slo.classes.chat.max_rejected_rate=2"):
        SloConfig(classes={"chat": {"max_rejected_rate": 2}}).validate(["chat"])
    argv = ["run", "slo.max_rejected_rate=1.5", f"studies_dir={tmp_path}", "--dry-run"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "slo.max_rejected_rate=1.5" in err


def test_the_default_bound_keeps_a_stored_baselines_fingerprint() -> None:
    assert "max_rejected_rate" not in fingerprint(compose([]), "0.32.0", {"device": "cpu"})["slo"]
    lifted = compose(["slo.max_rejected_rate=0.25"])
    assert fingerprint(lifted, "0.32.0", {"device": "cpu"})["slo"]["max_rejected_rate"] == 0.25


def test_the_tier_cap_preset_composes_with_its_bounds() -> None:
    config = compose(["study=chat_and_documents_tier_cap"])
    assert config.slo.max_rejected_rate == 1.0
    assert config.slo.class_rejected_limits() == [("chat", 0.0)]
    assert config.search_space["scheduling"]["max_model_len"].choices == [4096, 1024]
