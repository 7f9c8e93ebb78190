"""The Pareto figure plots the study's own objectives, and its labels never overlap.

A CPU study of the default objectives (tests.fakes.stored_study) draws P99 E2E latency against
output tokens/s; a study of the GPU preset's pair (``conf/objectives/gpu_fleet.yaml``, written
here by :func:`make_gpu_study` on a real SQLite storage) draws tokens/s per GPU against tokens/s
per user, its front maximising both. That study's five front windows sit within a few pixels of
one another: labels at the one fixed offset the figure used before land on top of each other,
and the placed ones must not.
"""

from __future__ import annotations

import html
import itertools
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import optuna
import pytest
import yaml
from matplotlib.figure import Figure
from matplotlib.text import Annotation
from matplotlib.transforms import Bbox

from tests.fakes.stored_study import (
    ACCEPTED,
    FINGERPRINT,
    StoredStudy,
    frozen_trial,
    make_stored_study,
    measured_attrs,
)
from tuner.review import pareto, plots
from tuner.review.render import figure_title, html_page
from tuner.review.report import Report, build_report
from tuner.review.stored import nondominated, open_review
from tuner.schema import StudyAttr

GPU = "gpu-fleet"
PER_GPU, PER_USER = "output_throughput_per_gpu", "output_throughput_per_user"
GPU_OBJECTIVES = [PER_GPU, PER_USER]
BASELINE = [300.0, 20.0]  # tok/s per GPU, tok/s per user
# search windows: (values, feasible). 1-5: the front, a few pixels apart (each trades a little
# per-GPU throughput for a little per-user speed); 6: below the baseline on both, the front's
# only point were either objective minimised; 7: best on both but misses an SLO.
WINDOWS = {
    1: ([520.0, 30.0], True),
    2: ([518.0, 30.3], True),
    3: ([516.0, 30.6], True),
    4: ([514.0, 30.9], True),
    5: ([512.0, 31.2], True),
    6: ([200.0, 10.0], True),
    7: ([600.0, 40.0], False),
}
FRONT = {f"batching#{n}" for n in range(1, 6)}
HANDOVER = 3  # the trial the stage's decision accepts


def _gpu_config(name: str, studies_dir: Path) -> dict[str, Any]:
    return {
        "name": name,
        "studies_dir": str(studies_dir),
        "server": {"model": "/models/tiny-llama", "device": "cuda", "args": {}, "env": {}},
        "study": {"stages": ["batching"]},
        "objectives": {"names": GPU_OBJECTIVES, "select_by": PER_GPU},
        "search_space": {"batching": {"max_num_seqs": {"type": "int", "low": 4, "high": 256}}},
    }


def _gpu_study(storage: optuna.storages.RDBStorage, study_name: str) -> optuna.Study:
    created = optuna.create_study(
        storage=storage, study_name=study_name, directions=["maximize", "maximize"]
    )
    with warnings.catch_warnings():  # experimental in Optuna, as `tuner run` uses it
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        created.set_metric_names(GPU_OBJECTIVES)
    return created


def make_gpu_study(studies_dir: Path, name: str = GPU) -> StoredStudy:
    """A study of the GPU preset's objectives: one baseline window, the batching stage's
    incumbent seed and :data:`WINDOWS`, its decision accepting trial :data:`HANDOVER`."""
    study = StoredStudy(name, studies_dir)
    root = study.folder
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.yaml").write_text(yaml.safe_dump(_gpu_config(name, studies_dir)))
    storage = optuna.storages.RDBStorage(study.url)
    baseline = _gpu_study(storage, f"baseline:{name}")
    baseline.set_user_attr(StudyAttr.FINGERPRINT, FINGERPRINT)
    attrs = measured_attrs(root, "baseline-0", "baseline", BASELINE, {})
    baseline.add_trial(frozen_trial(BASELINE, {}, attrs))
    stage = _gpu_study(storage, f"{name}:batching")
    stage.set_user_attr(StudyAttr.BASELINE_STUDY, f"baseline:{name}")
    stage.add_trial(frozen_trial(BASELINE, {}, {"role": "incumbent", "params_all": {}}))
    for number, (values, feasible) in WINDOWS.items():
        params = {"max_num_seqs": 8 * number}
        attrs = measured_attrs(root, f"batching-{number}", "search", values, params)
        stage.add_trial(frozen_trial(values, params, attrs, feasible))
    chosen = WINDOWS[HANDOVER][0]
    decision = replace(
        ACCEPTED,
        objective=PER_GPU,
        incumbent_values=[BASELINE[0]],
        candidate_values=[chosen[0]],
        incumbent_mean=BASELINE[0],
        candidate_mean=chosen[0],
        gain=chosen[0] - BASELINE[0],
        candidate_trial=HANDOVER,
        candidate_params={"max_num_seqs": 8 * HANDOVER},
        candidate_objectives=chosen,
        others=[],
    )
    stage.set_user_attr(StudyAttr.DECISION, decision.to_dict())
    return study


@pytest.fixture(scope="module")
def cpu(tmp_path_factory: pytest.TempPathFactory) -> Report:
    studies = tmp_path_factory.mktemp("cpu")
    make_stored_study(studies)
    return build_report(open_review("demo", studies_dir=studies))


@pytest.fixture(scope="module")
def gpu(tmp_path_factory: pytest.TempPathFactory) -> Report:
    studies = tmp_path_factory.mktemp("gpu")
    make_gpu_study(studies)
    return build_report(open_review(GPU, studies_dir=studies))


def _pareto(report: Report) -> plots.ParetoData:
    assert report.data is not None
    return report.data.pareto


def _drawn(data: plots.ParetoData, dpi: float | None = None) -> tuple[Figure, plt.Axes]:
    fig = plots.pareto_figure(data)
    if dpi is not None:
        fig.set_dpi(dpi)
    fig.canvas.draw()
    return fig, fig.axes[0]


def _boxes(ax: plt.Axes) -> list[Bbox]:
    return [t.get_window_extent() for t in ax.texts]


def _overlapping(boxes: list[Bbox]) -> list[tuple[int, int]]:
    """Pairs of boxes that share area (edges that only touch do not count)."""
    return [
        (i, j)
        for (i, a), (j, b) in itertools.combinations(enumerate(boxes), 2)
        if a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1
    ]


# -- the axes are the study's objectives -----------------------------------------------------


def test_the_cpu_default_plots_p99_e2e_against_output_throughput(cpu: Report) -> None:
    data = _pareto(cpu)
    assert data.x == pareto.Axis("output_throughput", "maximize", "tok/s")
    assert data.y == pareto.Axis("p99_e2e_latency", "minimize", "s")
    assert data.colour == pareto.Axis("cost_per_million_tokens", "minimize", "$")
    points = {p.label: p for p in data.points}
    # each point holds the stored objective values, the baseline's mean over its windows
    assert points["batching#4"].values == {
        "p99_e2e_latency": 1.2,
        "output_throughput": 1500.0,
        "cost_per_million_tokens": 0.015,
    }
    assert (points["baseline (mean)"].throughput, points["baseline (mean)"].p99) == (1000.0, 1.0)
    # the front is the trials table's own (all three objectives, the stored directions)
    table = cpu.trials.set_index("label")["pareto"]
    assert {p.label for p in data.points if p.pareto} == {
        "baseline (mean)",
        "batching#3",
        "batching#4",
    }
    assert all(bool(table[p.label]) for p in data.of(plots.PointKind.SEARCH) if p.pareto)
    assert [p.label for p in data.points if p.handover] == ["batching#4"]  # the accepted one
    _, ax = _drawn(data)
    assert ax.get_xlabel() == "output_throughput (tok/s) \u2192 better"
    assert ax.get_ylabel() == "p99_e2e_latency (s) \u2193 better"
    caption = figure_title(cpu, "pareto")
    assert "p99_e2e_latency (lower is better) against output_throughput" in caption
    assert "colour = cost_per_million_tokens" in caption
    plt.close("all")


def test_a_gpu_preset_plots_tokens_per_gpu_against_tokens_per_user(gpu: Report) -> None:
    data = _pareto(gpu)
    assert data.x == pareto.Axis(PER_USER, "maximize", "tok/s/user")
    assert data.y == pareto.Axis(PER_GPU, "maximize", "tok/s/GPU")
    assert data.colour is None  # two objectives: nothing left to colour by
    points = {p.label: p for p in data.points}
    for number, (values, _) in WINDOWS.items():
        assert points[f"batching#{number}"].values == dict(zip(GPU_OBJECTIVES, values, strict=True))
    assert points["baseline (mean)"].values == dict(zip(GPU_OBJECTIVES, BASELINE, strict=True))
    # the front maximises both: the five trades, not the window below the baseline on both
    # (minimising both would keep that one alone), not the infeasible one, not the baseline
    front = {p.label for p in data.points if p.pareto}
    assert front == FRONT
    feasible = [p for p in data.of(plots.PointKind.SEARCH) if p.feasible]
    table = np.array([[p.value(n) for n in GPU_OBJECTIVES] for p in feasible])
    minimised = {feasible[i].label for i in nondominated(table, ["minimize", "minimize"])}
    assert minimised == {"batching#6"} and not minimised & front
    assert [p.label for p in data.points if p.handover] == [f"batching#{HANDOVER}"]
    _, ax = _drawn(data)
    assert ax.get_xlabel() == f"{PER_USER} (tok/s/user) \u2192 better"
    assert ax.get_ylabel() == f"{PER_GPU} (tok/s/GPU) \u2191 better"
    caption = figure_title(gpu, "pareto")
    assert caption.startswith(f"Pareto front: {PER_GPU} (higher is better) against {PER_USER}")
    assert html.escape(caption) in html_page(gpu)  # the page's alt text and caption
    plt.close("all")


def test_select_by_stays_on_an_axis_and_one_objective_draws_no_front() -> None:
    names = ["p99_e2e_latency", "p99_ttft", "output_throughput"]
    directions = ["minimize", "minimize", "maximize"]
    x, y, colour = pareto.axes_for(names, directions, "output_throughput")
    assert (x and x.name, y and y.name, colour and colour.name) == (
        "output_throughput",
        "p99_e2e_latency",
        "p99_ttft",
    )
    x, y, colour = pareto.axes_for(names, directions, "p99_ttft")
    assert (x and x.name, y and y.name, colour and colour.name) == (
        "p99_ttft",
        "p99_e2e_latency",
        "output_throughput",
    )
    x, y, colour = pareto.axes_for(["goodput"], ["maximize"], "goodput")
    assert x is None and colour is None and y == pareto.Axis("goodput", "maximize", "req/s")
    point = plots.ParetoPoint("s#1", plots.PointKind.SEARCH, {"goodput": 3.0}, True, True)
    _, ax = _drawn(plots.ParetoData([point], x, y, colour))
    assert [t.get_text() for t in ax.texts] == ["one objective (goodput): no trade-off to draw"]
    assert not ax.collections  # no points, no front
    plt.close("all")


# -- the labels ------------------------------------------------------------------------------


def test_the_labels_of_close_points_do_not_overlap(gpu: Report) -> None:
    data = _pareto(gpu)
    for dpi in (None, 110.0):  # the figure's own, and the one report.html's PNG is saved at
        fig, ax = _drawn(data, dpi)
        texts = [t.get_text() for t in ax.texts]
        # the hand-over, the baseline, the front; every other point is a marker only
        assert texts[:2] == [f"batching#{HANDOVER}: hand-over", "baseline (mean)"]
        assert set(texts[2:]) == FRONT - {f"batching#{HANDOVER}"}
        boxes = _boxes(ax)
        assert _overlapping(boxes) == []
        frame = ax.get_window_extent()
        assert all(frame.x0 <= b.x0 and b.x1 <= frame.x1 for b in boxes)
        assert all(frame.y0 <= b.y0 and b.y1 <= frame.y1 for b in boxes)
        shown = ax.get_legend()
        assert shown is not None
        legend = shown.get_window_extent()  # nor does any label sit on the legend
        assert not any(i == 0 for i, _ in _overlapping([legend, *boxes]))
        plt.close(fig)


def test_the_naive_placement_of_the_same_labels_overlaps(gpu: Report) -> None:
    """The test above can fail: the same labels at the figure's former fixed offset (4, 3)
    points up and right of each point) overlap."""
    fig, ax = _drawn(_pareto(gpu))
    for text in ax.texts:
        assert isinstance(text, Annotation)
        text.set_horizontalalignment("left")
        text.set_verticalalignment("baseline")
        text.xyann = (4, 3)
    fig.canvas.draw()
    assert len(_overlapping(_boxes(ax))) >= 3
    plt.close(fig)


def test_the_cpu_figure_s_labels_do_not_overlap_either(cpu: Report) -> None:
    fig, ax = _drawn(_pareto(cpu))
    assert {t.get_text() for t in ax.texts} == {
        "batching#4: hand-over",
        "baseline (mean)",
        "batching#3",
    }
    assert _overlapping(_boxes(ax)) == []
    plt.close(fig)
