"""Report tables, figures and pages from a stored study with known numbers."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.fakes.kept_study import make_kept_study
from tests.fakes.stored_study import ACCEPTED, PLANTED, make_stored_study
from tuner.review import plots
from tuner.review.render import _parquet_ready, html_page, note_markdown, summary_text
from tuner.review.report import Report, build_report
from tuner.review.stored import Review, nondominated, open_review
from tuner.schema import StudyAttr

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def review(tmp_path_factory: pytest.TempPathFactory) -> Review:
    studies = tmp_path_factory.mktemp("studies")
    make_stored_study(studies)
    return open_review("demo", studies_dir=studies)


@pytest.fixture(scope="module")
def report(review: Review) -> Report:
    return build_report(review)


def test_nondominated_respects_each_direction() -> None:
    values = np.array([[1.0, 100.0], [2.0, 200.0], [2.0, 150.0], [0.5, 50.0]])
    assert nondominated(values, ["minimize", "maximize"]) == [0, 1, 3]
    assert nondominated(values, ["maximize", "minimize"]) == [0, 2, 3]  # 2 beats 1


def test_trials_frame_has_one_row_per_trial_with_its_verdicts(report: Report) -> None:
    t = report.trials.set_index("label")
    assert list(t.index) == [
        "baseline#0",
        "batching#1",
        "batching#2",
        "batching#3",
        "batching#4",
        "batching-confirm#0",
        "batching-confirm#1",
    ]
    assert (
        t.loc["batching#1", "status"] == "failed" and t.loc["batching#1", "bottleneck"] == "failed"
    )
    assert t.loc["batching#2", "bottleneck"] == "kv_cache_pressure"
    assert not t.loc["batching#2", "feasible"]  # the SLO constraint is violated
    assert set(t.index[t["pareto"]]) == {"baseline#0", "batching#3", "batching#4"}
    assert t.loc["batching#4", "param_max_num_seqs"] == 32
    assert t.loc["batching#4", "m_e2e_p99_s"] == pytest.approx(1.2)
    assert pd.isna(t.loc["batching#1", "output_throughput"])  # no number for a failure


def test_stages_frame_shows_the_search_window_and_the_decision(report: Report) -> None:
    st = report.stages.iloc[0]
    assert st["winner"] == "batching#4" and bool(st["accepted"])
    assert st["output_throughput_search_vs_baseline_pct"] == pytest.approx(50.0)
    assert st["p99_e2e_latency_search_vs_baseline_pct"] == pytest.approx(20.0)
    assert (st["trials"], st["reused"], st["failed"]) == (4, 0, 1)
    decision = ACCEPTED
    assert (st["incumbent_mean"], st["candidate_mean"]) == (1000.0, 1490.0)
    assert (st["gain"], st["needed_gain"], st["windows"]) == (decision.gain, 60.0, "2+2")
    # the objectives beside the one that decided, each with its change and resolution
    assert st["other_objectives"] == "p99_e2e_latency +20.0% (resolves 15%: worse)"


def test_an_accepted_stage_is_drawn_as_an_accepted_improvement(report: Report) -> None:
    assert report.data is not None
    (column,) = report.data.improvement.stages
    assert column.accepted and column.decision == ACCEPTED
    assert column.improvement_pct == pytest.approx(49.0)  # 1000 -> 1490, the confirmed means
    assert column.noise_pct == pytest.approx(6.0)
    assert column.search_gain_pct["p99_e2e_latency"] == pytest.approx(-20.0)  # > 0 = better


def test_failures_table_keeps_reason_and_message(report: Report) -> None:
    f = report.failures
    assert list(f["label"]) == ["batching#1"]
    assert f.iloc[0]["failure_reason"] == "oom" and "out of memory" in f.iloc[0]["failure_message"]


def test_importances_rank_the_stage_params(report: Report) -> None:
    imp = report.importances["batching"]
    assert set(imp) == {"max_num_seqs", "enable_chunked_prefill"}
    assert sum(imp.values()) == pytest.approx(1.0)


def test_every_figure_is_a_png_even_without_data(report: Report) -> None:
    assert set(report.figures) == {"pareto", "improvement", "latency_cdf", "importances"}
    assert all(data.startswith(PNG) for data in report.figures.values())
    empty = plots.FigureData(
        plots.ParetoData([]),
        plots.ImprovementData(["a"], []),
        [],
        plots.ImportanceData("x", {}),
    )
    assert all(png.startswith(PNG) for png in plots.render(empty).values())


def test_summary_note_and_page_tell_the_decision_and_the_best_config(report: Report) -> None:
    text = summary_text(report)
    assert (
        "stage batching: ACCEPTED, output_throughput 1000 → 1490 (+49%; a gain must exceed 6% "
        "to count) - gain exceeds the measured noise" in text
    )
    assert "search window batching#4 (one window, not confirmed)" in text
    assert "best config: final incumbent (batching trial 4)" in text
    assert "failed batching#1: oom" in text
    note = note_markdown(report)
    assert note.startswith("## tuner study `demo`") and "| batching#2 | search | ok |" in note
    page = html_page(report)
    assert page.count("data:image/png;base64,") == 4
    assert "kv_cache_pressure" in page and "CUDA out of memory" in page
    for secret in PLANTED.values():
        assert secret not in page + note + text


def test_parquet_gets_one_type_per_column() -> None:
    mixed = pd.DataFrame({"param_quant": ["fp8", 0, None], "x": [1.0, 2.0, 3.0]})
    fixed = _parquet_ready(mixed)
    assert list(fixed["param_quant"][:2]) == ["fp8", "0"] and pd.isna(fixed["param_quant"][2])
    assert fixed["x"].dtype == float


def test_report_files_are_written(report: Report, tmp_path: Path) -> None:
    from tuner.review.render import write_report

    written = write_report(report, tmp_path)
    names = {p.name for p in written}
    assert names == {
        "pareto.png",
        "improvement.png",
        "latency_cdf.png",
        "importances.png",
        "trials.csv",
        "trials.parquet",
        "report.html",
    }
    assert len(pd.read_parquet(tmp_path / "trials.parquet")) == len(report.trials)
    assert pd.read_csv(tmp_path / "trials.csv")["label"].iloc[0] == "baseline#0"


# -- a study whose decision kept the baseline although a search window looked better ---------


@pytest.fixture(scope="module")
def kept(tmp_path_factory: pytest.TempPathFactory) -> Report:
    studies = tmp_path_factory.mktemp("kept")
    make_kept_study(studies)
    return build_report(open_review("kept", studies_dir=studies))


def test_the_kept_fake_is_the_issue(kept: Report) -> None:
    """The stage links the slow baseline window, against which the winner looks 38 % faster."""
    review = kept.review
    assert review.baseline is not None and review.baseline.label == "baseline#2"
    assert review.value(review.baseline, "output_throughput") == 2195.0
    assert not review.decisions["memory"]["accepted"]


def test_a_kept_baseline_shows_no_improvement_the_decision_does_not_state(kept: Report) -> None:
    assert kept.data is not None
    stored = kept.review.stages["memory"].user_attrs[StudyAttr.DECISION]
    (column,) = kept.data.improvement.stages
    assert column.decision is not None and column.decision.to_dict() == stored
    assert (column.accepted, column.verdict, column.improvement_pct) == (False, "kept incumbent", 0)
    d = column.decision
    assert (d.incumbent_mean, d.candidate_mean) == (
        stored["incumbent_mean"],
        stored["candidate_mean"],
    )
    assert (d.gain, d.threshold) == (stored["gain"], stored["threshold"]) == (86.0, 695.0)
    assert column.gain_pct == pytest.approx(100 * 86 / 2487)
    assert column.noise_pct == pytest.approx(100 * 695 / 2487)
    # every improvement a figure states is an accepted decision's
    assert all(c.improvement_pct == 0 or c.accepted for c in kept.data.improvement.stages)
    # the search window, unconfirmed, against the baseline's mean: not +17 % and -38 %
    assert column.search_gain_pct["output_throughput"] == pytest.approx(100 * 143 / 2425)
    assert column.search_gain_pct["p99_e2e_latency"] == pytest.approx(100 * 0.124 / 0.562)


def test_the_pareto_and_cdf_figures_use_the_baseline_mean(kept: Report) -> None:
    assert kept.data is not None
    pareto = kept.data.pareto
    (mean,) = pareto.of(plots.PointKind.BASELINE_MEAN)
    assert (mean.throughput, mean.p99) == (pytest.approx(2425.0), pytest.approx(0.562))
    assert len(pareto.of(plots.PointKind.BASELINE_WINDOW)) == 3
    assert not any(p.pareto for p in pareto.of(plots.PointKind.BASELINE_WINDOW))
    labels = [p.label for p in pareto.points]
    assert len(labels) == len(set(labels)) and "memory#4" not in labels
    cdf = {s.label: len(s.e2e_s) for s in kept.data.latency_cdf}
    assert cdf == {"baseline, all 3 window(s)": 150, f"memory#3 ({plots.UNCONFIRMED})": 50}


def test_the_accepted_cdf_pools_the_chosen_config_with_its_rounds(report: Report) -> None:
    assert report.data is not None
    cdf = {s.label: len(s.e2e_s) for s in report.data.latency_cdf}
    assert cdf == {
        "baseline, all 1 window(s)": 50,
        "chosen batching#4 + 1 confirmation windows": 100,
    }


def test_kept_headline_note_and_tables_state_the_decision(kept: Report) -> None:
    text, note = summary_text(kept), note_markdown(kept)
    for shown in (text, note):
        assert (
            "baseline: mean of 3 window(s) (baseline#0, baseline#1, baseline#2): "
            "p99_e2e_latency 0.562, output_throughput 2425" in shown
        )
        assert (
            "stage memory: kept the incumbent, output_throughput 2487 → 2573 "
            "(+3%; a gain must exceed 28% to count) - gain within the measured noise" in shown
        )
        assert "search window memory#3 (one window, not confirmed)" in shown
        assert "output_throughput 2568 (+5.9%)" in shown and "0.438 (-22.1%)" in shown
        for wrong in ("+17.0%", "-38.0%", "ACCEPTED"):
            assert wrong not in shown
    st = kept.stages.iloc[0]
    assert (st["incumbent_mean"], st["candidate_mean"], st["needed_gain"]) == (2487, 2573, 695)
    assert not st["accepted"] and st["windows"] == "5+3"
    base = kept.baseline.set_index("objective")
    assert base.loc["output_throughput", "mean"] == pytest.approx(2425.0)
    assert base.loc["output_throughput", "windows"] == 3


def test_a_reused_measurement_is_listed_once(kept: Report) -> None:
    t = kept.trials.set_index("label")
    assert "memory#4" not in t.index and t.loc["memory#1", "reused_by"] == "memory#4"
    assert list(t.index[t["role"] == "baseline"]) == ["baseline#0", "baseline#1", "baseline#2"]
    st = kept.stages.iloc[0]
    assert (st["trials"], st["reused"], st["failed"]) == (3, 1, 1)


def test_the_page_shows_the_prefix_cache_hit_rate_where_a_server_looked_prefixes_up(
    report: Report,
) -> None:
    assert "prefix_cache_hit_rate" not in html_page(report)  # no trial's server looked any up
    trials = report.trials.copy()
    trials["prefix_cache_hit_rate"] = [0.73] + [None] * (len(trials) - 1)
    page = html_page(replace(report, trials=trials))
    table = page.split("<h2>Trials and bottlenecks</h2>", 1)[1].split("</table>", 1)[0]
    assert "prefix_cache_hit_rate" in table and "0.73" in table
