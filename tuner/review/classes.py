"""Per request class, the baseline against the hand-over: each class's P99s, output rate and
errors, the mean over the windows that measured that configuration, beside the class's own SLOs.

A study on mixed traffic can trade one class's latency for another's throughput while the totals
look better; this table is where a reader sees it. Shown where the workload has two classes or
more, or where an SLO is set per class.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from tuner.review.stored import Review
from tuner.review.trial_view import TrialView
from tuner.schema import TrialAttr, class_metric_attr

# (column, the class's flat measurement it shows)
MEASURED = (
    ("p99_ttft_s", "ttft_p99_s"),
    ("p99_tpot_s", "tpot_p99_s"),
    ("p99_e2e_s", "e2e_p99_s"),
    ("output_tok_s", "output_throughput_tok_s"),
    ("error_rate", "error_rate"),
)
COLUMNS = ["class", "configuration", "windows", *(c for c, _ in MEASURED), "class SLOs"]
BASELINE, HANDOVER = "baseline", "hand-over"


def class_names(review: Review) -> list[str]:
    """The workload's request classes, in its order, as config.yaml holds them."""
    classes = (review.config.get("workload") or {}).get("classes") or []
    return [str(c.get("name", "default")) for c in classes]


def class_slos(review: Review) -> dict[str, dict[str, float]]:
    return dict((review.config.get("slo") or {}).get("classes") or {})


def shows_classes(review: Review) -> bool:
    return len(class_names(review)) > 1 or bool(class_slos(review))


def classes_frame(review: Review, params: Mapping[str, Any]) -> pd.DataFrame:
    """Per class, the baseline's row and (where the hand-over is another configuration) the
    hand-over's; empty where the workload has one class and no class SLO."""
    if not shows_classes(review):
        return pd.DataFrame(columns=COLUMNS)
    sides = [(BASELINE, _measured(review.baseline_windows))]
    if params:
        sides.append((HANDOVER, _measured(_windows_of(review, params))))
    slos = class_slos(review)
    rows = [
        _row(name, label, views, slos.get(name) or {})
        for name in class_names(review)
        for label, views in sides
    ]
    return pd.DataFrame(rows, columns=COLUMNS)


def _row(name: str, label: str, views: Sequence[TrialView], slos: Mapping[str, Any]) -> list[Any]:
    means = [_mean(views, class_metric_attr(name, key)) for _, key in MEASURED]
    return [name, label, len(views), *means, _limits(slos)]


def _limits(slos: Mapping[str, Any]) -> str:
    """The class's set bounds: a latency SLO of 0 and a rejected-rate bound of None are unset
    (a rejected-rate bound of 0 is set: no request of the class may be rejected)."""
    shown = []
    for key, limit in sorted(slos.items()):
        unset = limit is None or (key.startswith("p99_") and not limit)
        if not unset:
            shown.append(f"{key} <= {float(limit):g}")
    return ", ".join(shown)


def _mean(views: Sequence[TrialView], attr: str) -> float | None:
    found = [float(v.attrs[attr]) for v in views if attr in v.attrs]
    found = [x for x in found if math.isfinite(x)]
    return sum(found) / len(found) if found else None


def _measured(views: Sequence[TrialView]) -> list[TrialView]:
    """Each measured window once (a reused proposal repeats a stored window's numbers)."""
    return [v for v in views if v.measured and TrialAttr.REUSED_FROM not in v.attrs]


def _windows_of(review: Review, params: Mapping[str, Any]) -> list[TrialView]:
    wanted = _key(params)
    views = [*review.search_trials(), *review.confirm_trials()]
    return [v for v in views if _key(v.params) == wanted]


def _key(params: Mapping[str, Any]) -> str:
    return json.dumps(dict(params), sort_keys=True, default=str)
