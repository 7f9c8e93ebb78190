"""A stored study on mixed traffic: two request classes whose latencies sit far apart, in the
layout `tuner run` writes, on a real SQLite storage (modelled on tests.fakes.stored_study).

``chat`` (short answers, an SLO on its TTFT) and ``documents`` (long ones, an SLO on its E2E).
Every measured window's requests.jsonl holds both classes' records, each tagged with its
``request_class``, and the trial holds each class's flat measurements computed from those same
records (P99s, output rate, error rate), as the measurement stores them. A chat request's
latencies never reach a document request's: a series drawn from the wrong class shows.

Layout: ``baseline:mixed`` (two windows), ``mixed:batching`` (the incumbent seed, two search
windows; the decision accepts trial 2) and ``mixed:confirm`` (one round of each side). Every
window also records warm-up requests and failed ones, with latencies no measured request has.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import optuna
import yaml

from tests.fakes.stored_study import (
    FINGERPRINT,
    StoredStudy,
    frozen_trial,
    measured_attrs,
    new_study,
)
from tuner.schema import StudyAttr, TrialAttr, class_metric_attr
from tuner.study.decision.acceptance import Decision

NAME = "mixed"
CHAT, DOCUMENTS = "chat", "documents"
CLASSES = {CHAT: 64, DOCUMENTS: 512}  # class -> output tokens of each of its requests
CLASS_SLOS = {CHAT: {"p99_ttft_s": 0.5}, DOCUMENTS: {"p99_e2e_s": 8.0}}
PER_CLASS = 40  # measured, successful requests of each class in each window
FAILED, WARMUP = 2, 3  # and per class and window: failed ones, warm-up ones (never measured)
WINDOW_S = 5.0
OUTSIDE_S = 99.0  # the latency of a warm-up request: no measured request comes near it
WINNER = {"max_num_seqs": 32, "enable_chunked_prefill": True}
OTHER = {"max_num_seqs": 8, "enable_chunked_prefill": False}


class Window(NamedTuple):
    """A measured window of the fake."""

    role: str
    params: dict[str, Any]
    values: list[float]  # P99 E2E (s), output tok/s, cost per million tokens: every request's
    # class -> (TTFT, E2E) level (s): the class's requests spread over [level / 2, level], so
    # chat's E2E stays under 1.6 s, the documents' TTFT over 0.75 s and their E2E over 3.5 s
    levels: dict[str, tuple[float, float]]


def _window_of(
    role: str,
    params: dict[str, Any],
    values: list[float],
    chat: tuple[float, float],
    docs: tuple[float, float],
) -> Window:
    return Window(role, params, values, {CHAT: chat, DOCUMENTS: docs})


WINDOWS = {
    "baseline-0": _window_of("baseline", {}, [9.0, 1000.0, 0.02], (0.6, 1.5), (1.8, 9.0)),
    "baseline-1": _window_of("baseline", {}, [9.4, 980.0, 0.02], (0.64, 1.6), (2.0, 9.4)),
    "batching-1": _window_of("search", OTHER, [9.9, 900.0, 0.025], (0.7, 1.6), (2.2, 9.9)),
    "batching-2": _window_of("search", WINNER, [7.0, 1500.0, 0.015], (0.3, 1.2), (1.5, 7.0)),
    "batching-confirm-0": _window_of("incumbent", {}, [9.2, 990.0, 0.02], (0.62, 1.55), (1.9, 9.2)),
    "batching-confirm-1": _window_of(
        "candidate", WINNER, [7.2, 1480.0, 0.015], (0.32, 1.25), (1.6, 7.2)
    ),
}

ACCEPTED = Decision(
    stage="batching",
    objective="output_throughput",
    direction="maximize",
    accepted=True,
    reason="gain exceeds the measured noise",
    incumbent_values=[1000.0, 980.0, 990.0],
    candidate_values=[1500.0, 1480.0],
    incumbent_mean=990.0,
    candidate_mean=1490.0,
    gain=500.0,
    noise=40.0,
    threshold=60.0,
    candidate_trial=2,
    candidate_params=WINNER,
    candidate_objectives=WINDOWS["batching-2"].values,
)


def _config(
    name: str, studies_dir: Path, classes: list[str], class_slos: dict[str, Any]
) -> dict[str, Any]:
    return {
        "name": name,
        "studies_dir": str(studies_dir),
        "server": {"model": "/models/tiny-llama", "device": "cpu", "args": {}, "env": {}},
        "workload": {
            "classes": [
                {"name": c, "weight": 1.0, "output_tokens": {"mean": CLASSES[c]}} for c in classes
            ]
        },
        "slo": {"p99_e2e_s": 12.0, "classes": class_slos},
        "study": {"stages": ["batching"]},
        "objectives": {"select_by": "output_throughput"},
        "cost": {"cpus": 2},
        "search_space": {
            "batching": {
                "max_num_seqs": {"type": "int", "low": 4, "high": 256, "log": True},
                "enable_chunked_prefill": {"type": "bool"},
            }
        },
    }


def class_records(label: str, request_class: str) -> list[dict[str, Any]]:
    """One window's records of one class: the measured ones, then failed and warm-up ones."""
    tokens = CLASSES[request_class]
    ttft, e2e = WINDOWS[label].levels[request_class]

    def record(i: int, phase: str, ok: bool, scale: float) -> dict[str, Any]:
        return {
            "request_id": f"{label}-{request_class}-{phase}-{i}",
            "request_class": request_class,
            "api": "chat",
            "phase": phase,
            "ok": ok,
            "ttft_s": ttft * scale if ok else None,
            "e2e_s": e2e * scale if ok else None,
            "output_tokens": tokens if ok else None,
            "error_kind": "" if ok else "http",
        }

    measured = [
        record(i, "measure", True, 0.5 + 0.5 * (i + 1) / PER_CLASS) for i in range(PER_CLASS)
    ]
    failed = [record(i, "measure", False, 1.0) for i in range(FAILED)]
    warmup = [record(i, "warmup", True, OUTSIDE_S / e2e) for i in range(WARMUP)]
    return measured + failed + warmup


def class_attrs(request_class: str, records: list[dict[str, Any]]) -> dict[str, Any]:
    """The class's flat measurements, from its measured records as the measurement takes them."""
    done = [r for r in records if r["phase"] == "measure" and r["ok"]]
    started = [r for r in records if r["phase"] == "measure"]
    ttft = [r["ttft_s"] for r in done]
    e2e = [r["e2e_s"] for r in done]
    tpot = [(r["e2e_s"] - r["ttft_s"]) / (r["output_tokens"] - 1) for r in done]
    values = {
        "ttft_p99_s": float(np.percentile(ttft, 99)),
        "tpot_p99_s": float(np.percentile(tpot, 99)),
        "e2e_p99_s": float(np.percentile(e2e, 99)),
        "output_throughput_tok_s": sum(r["output_tokens"] for r in done) / WINDOW_S,
        "error_rate": (len(started) - len(done)) / len(started),
        "completed": float(len(done)),
    }
    return {class_metric_attr(request_class, k): v for k, v in values.items()}


def _window(root: Path, label: str) -> tuple[list[float], dict[str, Any], dict[str, Any]]:
    """A measured window: its values, params and attrs; its requests.jsonl tagged by class."""
    window = WINDOWS[label]
    attrs = measured_attrs(root, label, window.role, window.values, window.params)
    lines = []
    for request_class in window.levels:
        records = class_records(label, request_class)
        attrs |= class_attrs(request_class, records)
        lines += [json.dumps(r) + "\n" for r in records]
    (Path(attrs[TrialAttr.FOLDER]) / "requests.jsonl").write_text("".join(lines))
    return window.values, window.params, attrs


def make_classes_study(
    studies_dir: Path,
    name: str = NAME,
    classes: list[str] | None = None,
    class_slos: dict[str, Any] | None = None,
) -> StoredStudy:
    """Write the study; returns where it is. ``classes`` and ``class_slos`` change what its
    config.yaml says of the workload's classes and their SLOs (the records stay both classes')."""
    study = StoredStudy(name, studies_dir)
    root = study.folder
    root.mkdir(parents=True, exist_ok=True)
    config = _config(
        name,
        studies_dir,
        list(CLASSES) if classes is None else classes,
        CLASS_SLOS if class_slos is None else class_slos,
    )
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    storage = optuna.storages.RDBStorage(study.url)
    baseline = new_study(storage, f"baseline:{name}")
    baseline.set_user_attr(StudyAttr.FINGERPRINT, FINGERPRINT)
    for label in ("baseline-0", "baseline-1"):
        values, params, attrs = _window(root, label)
        baseline.add_trial(frozen_trial(values, params, attrs))
    stage = new_study(storage, f"{name}:batching")
    stage.set_user_attr(StudyAttr.BASELINE_STUDY, f"baseline:{name}")
    seed = WINDOWS["baseline-0"].values
    stage.add_trial(frozen_trial(seed, {}, {"role": "incumbent", "params_all": {}}))
    for label in ("batching-1", "batching-2"):
        values, params, attrs = _window(root, label)
        stage.add_trial(frozen_trial(values, params, attrs))
    stage.set_user_attr(StudyAttr.DECISION, ACCEPTED.to_dict())
    confirm = new_study(storage, f"{name}:confirm")
    for label, tag in (("batching-confirm-0", "incumbent"), ("batching-confirm-1", "candidate")):
        values, _, attrs = _window(root, label)
        attrs[TrialAttr.CONFIRM_TAG] = f"batching/0/{tag}"
        confirm.add_trial(frozen_trial(values, {}, attrs))
    return study


def measured_records(label: str, request_class: str) -> list[dict[str, Any]]:
    """The records of window ``label`` that a latency CDF of ``request_class`` draws from."""
    records = class_records(label, request_class)
    return [r for r in records if r["phase"] == "measure" and r["ok"]]
