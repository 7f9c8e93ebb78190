"""Report tables, figures and pages from a stored study with known numbers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.fakes.stored_study import PLANTED, make_stored_study
from tuner.review import plots
from tuner.review.render import _parquet_ready, html_page, note_markdown, summary_text
from tuner.review.report import Report, build_report
from tuner.review.stored import Review, nondominated, open_review

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


def test_stages_frame_compares_the_best_feasible_trial_with_the_baseline(report: Report) -> None:
    st = report.stages.iloc[0]
    assert st["best"] == "batching#4" and bool(st["accepted"])
    assert st["output_throughput_change_pct"] == pytest.approx(50.0)
    assert st["p99_e2e_latency_change_pct"] == pytest.approx(20.0)
    assert (st["trials"], st["failed"]) == (4, 1)


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
    empty = pd.DataFrame(columns=["role", "measured", plots.X_COL, plots.Y_COL, "feasible"])
    for fig in (
        plots.pareto_figure(empty, None),
        plots.cdf_figure({}),
        plots.importance_figure({}, "x"),
        plots.improvement_figure(pd.DataFrame(), ["a"], ["maximize"]),
    ):
        assert plots.png(fig).startswith(PNG)


def test_summary_note_and_page_tell_the_decision_and_the_best_config(report: Report) -> None:
    text = summary_text(report)
    assert "stage batching: ACCEPTED (gain 480 > threshold 60)" in text
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
