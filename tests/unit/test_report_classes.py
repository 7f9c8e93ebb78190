"""The report's "Request classes" table: per class, the baseline against the hand-over, each the
mean over the windows that measured it, beside the class's own SLOs; none for one class. And its
per-class latency CDFs: each class's own requests, of the metric its SLO bounds."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import pytest

from tests.fakes.classes_study import (
    CHAT,
    DOCUMENTS,
    NAME,
    OUTSIDE_S,
    PER_CLASS,
    make_classes_study,
    measured_records,
)
from tuner.review.classes import classes_frame
from tuner.review.render import FIGURE_TITLES, _classes_html, _classes_markdown, html_page
from tuner.review.report import FIGURES, Report, build_report, cdf_sides, class_cdf_data
from tuner.review.stored import open_review
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


# -- the per-class latency CDFs, on a stored study of two classes (tests.fakes.classes_study) ---


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Report:
    studies = tmp_path_factory.mktemp("mixed")
    make_classes_study(studies)
    return build_report(open_review(NAME, studies_dir=studies))


def _expected(views: list[TrialView], request_class: str, metric: str) -> list[float]:
    """What a side's CDF of one class must hold: that class's measured records of its windows
    (each window's folder is named by its label in the fake)."""
    return sorted(
        r[f"{metric}_s"]
        for view in views
        for r in measured_records(view.folder.name if view.folder else "", request_class)
    )


def test_each_class_cdf_is_drawn_from_that_class_s_requests_only(mixed: Report) -> None:
    assert mixed.data is not None
    sides = cdf_sides(mixed.review)
    labels = [label for label, _ in sides]
    assert labels == ["baseline, all 2 window(s)", "chosen batching#2 + 1 confirmation windows"]
    cdfs = {c.name: c for c in mixed.data.class_latency_cdf}
    assert list(cdfs) == [CHAT, DOCUMENTS]
    # one series per class and side, in the all-requests figure's order
    assert [(c.name, s.label) for c in cdfs.values() for s in c.series] == [
        (name, label) for name in (CHAT, DOCUMENTS) for label in labels
    ]
    # the metric each class's SLO bounds, and its limit
    assert (cdfs[CHAT].metrics, cdfs[CHAT].limits) == (["ttft"], {"ttft": 0.5})
    assert (cdfs[DOCUMENTS].metrics, cdfs[DOCUMENTS].limits) == (["e2e"], {"e2e": 8.0})
    for cdf in cdfs.values():
        (metric,) = cdf.metrics
        for series, (_, views) in zip(cdf.series, sides, strict=True):
            values = sorted(series.values[metric])
            assert len(values) == PER_CLASS * len(views) == series.n(metric)
            assert values == pytest.approx(_expected(views, cdf.name, metric))
            assert max(values) < OUTSIDE_S  # no warm-up request
    # far apart: no chat request in the documents' series, none of theirs in chat's
    chat = [x for s in cdfs[CHAT].series for x in s.values["ttft"]]
    docs = [x for s in cdfs[DOCUMENTS].series for x in s.values["e2e"]]
    assert max(chat) < 0.75 and min(docs) > 3.5
    # the all-requests CDF pools both classes over the very same windows
    pooled = {s.label: len(s.ttft_s) for s in mixed.data.latency_cdf}
    assert pooled == {label: 2 * PER_CLASS * len(views) for label, views in sides}


def test_the_class_cdf_figure_is_a_png_on_the_page_after_the_all_requests_one(
    mixed: Report,
) -> None:
    assert list(mixed.figures) == [n for n in FIGURES if n in mixed.figures]
    assert list(mixed.figures).index("class_latency_cdf") == 3
    assert mixed.figures["class_latency_cdf"].startswith(b"\x89PNG")
    page = html_page(mixed)
    assert "<figure id='class_latency_cdf'>" in page and "(class_latency_cdf.png)" in page
    assert FIGURE_TITLES["class_latency_cdf"].startswith("Latency CDFs per request class")


def test_a_class_without_an_slo_shows_e2e_and_ttft_and_a_tpot_slo_shows_tpot(
    tmp_path: Path,
) -> None:
    make_classes_study(tmp_path, class_slos={DOCUMENTS: {"p99_tpot_s": 0.02}})
    review = open_review(NAME, studies_dir=tmp_path)
    cdfs = {c.name: c for c in class_cdf_data(review)}
    assert (cdfs[CHAT].metrics, cdfs[CHAT].limits) == (["e2e", "ttft"], {})
    assert (cdfs[DOCUMENTS].metrics, cdfs[DOCUMENTS].limits) == (["tpot"], {"tpot": 0.02})
    (_, views), *_ = cdf_sides(review)
    records = [
        r for v in views for r in measured_records(v.folder.name if v.folder else "", DOCUMENTS)
    ]
    tpots = sorted((r["e2e_s"] - r["ttft_s"]) / (r["output_tokens"] - 1) for r in records)
    assert sorted(cdfs[DOCUMENTS].series[0].values["tpot"]) == pytest.approx(tpots)
    assert sorted(cdfs[CHAT].series[0].values["e2e"]) == pytest.approx(
        _expected(views, CHAT, "e2e")
    )


def test_a_one_class_study_gets_no_class_cdf(tmp_path: Path) -> None:
    make_classes_study(tmp_path, classes=[CHAT], class_slos={})  # its records still two classes'
    report = build_report(open_review(NAME, studies_dir=tmp_path))
    assert report.data is not None and report.data.class_latency_cdf == []
    assert "class_latency_cdf" not in report.figures and report.classes.empty
    assert set(report.figures) == {"pareto", "improvement", "latency_cdf", "importances"}
    assert "class_latency_cdf" not in html_page(report)
