"""The report's "Request classes" table: per class, the baseline against the hand-over, each the
mean over the windows that measured it, beside the class's own SLOs; none for one class."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import optuna
import pytest

from tuner.review.classes import classes_frame
from tuner.review.render import _classes_html, _classes_markdown
from tuner.review.trial_view import TrialView
from tuner.schema import TrialAttr, class_metric_attr

HANDOVER = {"scheduling_policy": "priority"}


def _window(
    params: dict[str, Any], chat_ttft: float, docs_e2e: float, reused: bool = False
) -> TrialView:
    attrs: dict[str, Any] = {
        TrialAttr.STATUS: "ok",
        TrialAttr.PARAMS_ALL: params,
        "m_completed": 100.0,
        class_metric_attr("chat", "ttft_p99_s"): chat_ttft,
        class_metric_attr("chat", "error_rate"): 0.0,
        class_metric_attr("documents", "e2e_p99_s"): docs_e2e,
        class_metric_attr("documents", "error_rate"): 0.0,
    }
    if reused:
        attrs[TrialAttr.REUSED_FROM] = "somewhere"
    trial = optuna.trial.create_trial(values=[1.0], params={}, distributions={}, user_attrs=attrs)
    return TrialView("demo", "stage", trial)


@dataclass
class _Review:
    """What classes_frame reads of a stored study (tuner.review.stored.Review)."""

    config: dict[str, Any]
    baseline_windows: list[TrialView]
    search: list[TrialView] = field(default_factory=list)
    confirm: list[TrialView] = field(default_factory=list)

    def search_trials(self) -> list[TrialView]:
        return self.search

    def confirm_trials(self) -> list[TrialView]:
        return self.confirm


def _config(classes: list[str], slos: dict[str, Any]) -> dict[str, Any]:
    return {"workload": {"classes": [{"name": c} for c in classes]}, "slo": {"classes": slos}}


def test_each_class_reads_the_baseline_against_the_hand_over() -> None:
    review = _Review(
        _config(["chat", "documents"], {"chat": {"p99_ttft_s": 0.3}}),
        [_window({}, 0.6, 0.8), _window({}, 0.5, 0.7)],
        search=[_window(HANDOVER, 0.2, 2.0), _window({"scheduling_policy": "fcfs"}, 9.0, 9.0)],
        confirm=[_window(HANDOVER, 0.1, 2.2), _window(HANDOVER, 5.0, 5.0, reused=True)],
    )
    frame = classes_frame(review, HANDOVER)  # type: ignore[arg-type]
    rows = {(r["class"], r["configuration"]): r for r in frame.to_dict("records")}
    assert set(rows) == {(c, s) for c in ("chat", "documents") for s in ("baseline", "hand-over")}
    assert rows["chat", "baseline"]["p99_ttft_s"] == pytest.approx(0.55)
    # the hand-over's own two windows; a reused window repeats one and is not counted again
    assert rows["chat", "hand-over"]["p99_ttft_s"] == pytest.approx(0.15)
    assert rows["chat", "hand-over"]["windows"] == 2
    assert rows["documents", "hand-over"]["p99_e2e_s"] == pytest.approx(2.1)
    assert rows["chat", "baseline"]["class SLOs"] == "p99_ttft_s <= 0.3"
    assert rows["documents", "baseline"]["class SLOs"] == ""
    assert math.isnan(rows["documents", "baseline"]["p99_ttft_s"])  # not measured: no number
    page, note = _classes_html(frame), "\n".join(_classes_markdown(frame))
    assert "Request classes" in page and "hand-over" in page
    assert "| chat | hand-over | 2 |" in note


def test_a_kept_baseline_has_only_its_rows() -> None:
    review = _Review(_config(["chat", "documents"], {}), [_window({}, 0.6, 0.8)])
    frame = classes_frame(review, {})  # type: ignore[arg-type]
    assert list(frame["configuration"]) == ["baseline", "baseline"]


def test_one_class_without_class_slos_has_no_table() -> None:
    review = _Review(_config(["default"], {}), [_window({}, 0.6, 0.8)])
    frame = classes_frame(review, HANDOVER)  # type: ignore[arg-type]
    assert frame.empty and _classes_html(frame) == "" and _classes_markdown(frame) == []
