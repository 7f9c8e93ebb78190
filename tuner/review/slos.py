"""What the hand-over claims of each SLO, and how sure its windows are: the block of
evidence.json, the summary lines at the head of each exported file, and the table of
report.html and the dashboard note.

The study judged each SLO as a claim with a stated confidence (tuner/scoring/confidence.py) and
stored each side's claims in its stage decision. A configuration's claims are those of the last
decision that measured it: the candidate side of the decision that accepted it, or the
incumbent side of a later one that re-measured it (whose windows include the earlier ones, so
its claims are the better informed). Where no decision measured it (a baseline kept because
nothing beat it, a trial exported by number, a study stored before claims were), they are
computed here from its stored windows, their spread pooled over the study's other repeated
configurations, at the study's ``study.slo_confidence``: the rule the study itself applies.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tuner.config.study import StudyConfig
from tuner.review.stored import Review, TrialView
from tuner.schema import TrialAttr
from tuner.scoring.confidence import SloClaim, SloStatus, claims, shown
from tuner.scoring.feasibility import NO_DATA_VIOLATION

Windows = list[dict[str, float]]
SLO_PREFIX = "slo_"  # the latency SLOs' constraint names; others (the error rate) beside them
COLUMNS = ["SLO", "margin", "confidence", "status", "windows"]


@dataclass(frozen=True)
class HandoverSlos:
    """The claims of one configuration, the confidence they were asked for, and where from."""

    claims: list[SloClaim] = field(default_factory=list)
    target: float = StudyConfig.slo_confidence
    source: str = ""

    def shown(self) -> list[SloClaim]:
        """Every SLO; another constraint (the error rate, a failed launch) only where it is not
        met, as the study's summary shows them."""
        return shown(self.claims)

    def verdict(self) -> str:
        """One phrase: which SLOs are missed or undecided, or that every one is met."""
        missed = [c.name for c in self.claims if c.status == SloStatus.MISSED]
        open_ = [c.name for c in self.claims if c.status == SloStatus.UNDECIDED]
        if missed:
            return f"MISSED: {', '.join(missed)} (not a configuration that meets the SLOs)"
        if open_:
            return (
                f"UNDECIDED: {', '.join(open_)} not shown met with {self.target:.0%} confidence "
                "(more windows decide it)"
            )
        if not self.claims:
            return "none judged: no stored window of it"
        return f"every SLO met with {self.target:.0%} confidence"

    def line(self) -> str:
        """What the hand-over claims of its SLOs, in one line: the verdict first (MISSED or
        UNDECIDED in capitals), then each SLO's margin and confidence."""
        found = "; ".join(short(c) for c in self.shown())
        return f"SLOs of the hand-over: {self.verdict()}" + (f"; {found}" if found else "")

    @property
    def all_met(self) -> bool:
        return all(_met(c) for c in self.claims)

    def to_dict(self) -> dict[str, Any]:
        found = [_no_nan(c.to_dict()) for c in self.claims]
        return {"target": self.target, "source": self.source, "claims": found}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HandoverSlos:
        found = [SloClaim.from_dict(c) for c in data.get("claims") or []]
        target = data.get("target")
        return cls(
            found,
            StudyConfig.slo_confidence if target is None else float(target),
            str(data.get("source") or ""),
        )


def _met(c: SloClaim) -> bool:
    return c.status == SloStatus.MET


def _no_nan(data: dict[str, Any]) -> dict[str, Any]:
    # JSON has no NaN and the dashboard cannot read one: an unknown number is null
    return {
        k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in data.items()
    }


# -- which claims ------------------------------------------------------------------------------


def handover_slos(review: Review, params: Mapping[str, Any]) -> HandoverSlos:
    """The claims of the configuration ``params``: a decision's, else computed (module doc)."""
    decided = decided_claims(review, params)
    if decided is not None:
        found, source = decided
        return HandoverSlos(found, found[0].target, source)
    target = study_target(review)
    own, others = stored_windows(review, params)
    source = f"computed from its {len(own)} stored windows (no decision re-measured it)"
    return HandoverSlos(claims(own, others, target) if own else [], target, source)


def study_target(review: Review) -> float:
    """The study's ``study.slo_confidence`` (its default where config.yaml predates it)."""
    value = (review.config.get("study") or {}).get("slo_confidence")
    return StudyConfig.slo_confidence if value is None else float(value)


def decided_claims(review: Review, params: Mapping[str, Any]) -> tuple[list[SloClaim], str] | None:
    """The claims of the last stage decision that measured ``params`` with claims, and which
    side of which stage; None where none did. The incumbent a decision compared against is
    followed from the baseline ({}) through every accepted candidate."""
    wanted, incumbent = _key(params), _key({})
    found = None
    for stage in review.stages:
        d = review.decision(stage)
        if d is None:
            continue
        if _key(d.candidate_params) == wanted and d.candidate_slos:
            found = (d.candidate_slos, f"stage {stage} decision, candidate side")
        elif incumbent == wanted and d.incumbent_slos:
            found = (d.incumbent_slos, f"stage {stage} decision, incumbent side")
        if d.accepted:
            incumbent = _key(d.candidate_params)
    return found


def stored_windows(review: Review, params: Mapping[str, Any]) -> tuple[Windows, list[Windows]]:
    """The constraint sets of every stored window of ``params``, and those of each other
    configuration (the groups the spread is pooled over)."""
    groups: dict[str, Windows] = {}
    for view in _windows(review):
        groups.setdefault(_key(view.params), []).append(dict(view.trial.constraints))
    own = groups.pop(_key(params), [])
    return own, list(groups.values())


def _windows(review: Review) -> Iterable[TrialView]:
    """Each measured window once: a repeated proposal answered with a stored measurement
    carries that window's numbers again, and counted twice it would shrink the spread."""
    views = [*review.baseline_windows, *review.search_trials(), *review.confirm_trials()]
    return (v for v in views if v.measured and TrialAttr.REUSED_FROM not in v.attrs)


def _key(params: Mapping[str, Any]) -> str:
    return json.dumps(dict(params), sort_keys=True, default=str)


# -- words -------------------------------------------------------------------------------------


def status_word(c: SloClaim) -> str:
    """met, or UNDECIDED / MISSED in capitals: a reader sees them without the colour."""
    return "met" if _met(c) else c.status.value.upper()


def margin_text(c: SloClaim) -> str:
    if c.mean >= NO_DATA_VIOLATION:
        return "no data (it failed)"
    return f"{c.margin:+.1%}"


def confidence_text(c: SloClaim) -> str:
    if c.confidence is None:
        return "unknown (no spread yet: the mean decides)"
    return f"{c.confidence:.0%} (asked {c.target:.0%})"


def row(c: SloClaim) -> dict[str, str | int]:
    """One row of the table "SLOs of the hand-over"."""
    cells = (c.name, margin_text(c), confidence_text(c), status_word(c), c.windows)
    return dict(zip(COLUMNS, cells, strict=True))


def short(c: SloClaim) -> str:
    """One claim in a few words, for a line that lists them all."""
    return f"{c.name} {status_word(c)}: margin {margin_text(c)}, confidence {confidence_text(c)}"


def summary_line(c: SloClaim) -> str:
    """One exported file's header line: the claim's own text, its status first in capitals."""
    line = f"SLO {status_word(c)}: {c.text()}"
    more = c.more_windows() if c.status == SloStatus.UNDECIDED else 0
    return f"{line}; ~{more} more windows would decide it" if more else line
