"""What the hand-over claims of each SLO, shown wherever a user reads it: evidence.json and the
lines heading every exported file, `tuner export`'s output, report.html, the terminal summary
and the dashboard note. On stored studies with known numbers (real SQLite, no server)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
import yaml

from tests.fakes import stored_study as fake
from tests.fakes.kept_study import kept_decision, make_kept_study
from tuner.export.serve import export_choices
from tuner.review.evidence import build_evidence
from tuner.review.render import html_page, note_markdown, summary_text
from tuner.review.report import build_report
from tuner.review.stored import Review, open_review
from tuner.schema import StudyAttr, baseline_study, stage_study
from tuner.scoring.confidence import SloClaim, claims
from tuner.study.decision.acceptance import Decision

E2E = "slo_p99_e2e"
# name, mean violation, bound, confidence, target, windows, spread, df
UNDECIDED = SloClaim(E2E, -0.01, 0.02, 0.7, 0.9, 4, 0.03, 6)  # 1 % under, 70 % sure
MISSED = SloClaim(E2E, 0.05, 0.08, 0.02, 0.9, 5, 0.03, 6)  # 5 % over, 2 % sure it is met
MET = SloClaim(E2E, -0.2, -0.15, 0.999, 0.9, 2, 0.03, 6)
ERRORS_MET = SloClaim("error_rate", -1.0, -1.0, 1.0, 0.9, 4, 0.0, 6)


def _store(url: str, stage: str, decision: Decision) -> None:
    optuna.load_study(study_name=stage, storage=url).set_user_attr(
        StudyAttr.DECISION, decision.to_dict()
    )


@pytest.fixture
def accepted(tmp_path: Path) -> Review:
    """The fake whose batching stage accepted trial 4, its repeats leaving the SLO undecided."""
    study = fake.make_stored_study(tmp_path)
    decision = replace(fake.ACCEPTED, candidate_slos=[UNDECIDED, ERRORS_MET], incumbent_slos=[MET])
    _store(study.url, "demo:batching", decision)
    return open_review("demo", studies_dir=tmp_path)


@pytest.fixture
def kept(tmp_path: Path) -> Review:
    """The fake whose memory stage kept the baseline, which its repeats showed missing the SLO."""
    study = make_kept_study(tmp_path)
    decision = replace(kept_decision(), incumbent_slos=[MISSED], candidate_slos=[MET])
    _store(study.url, "kept:memory", decision)
    return open_review("kept", studies_dir=tmp_path)


def _statuses(block: dict[str, object]) -> dict[str, str]:
    found = block["claims"]
    assert isinstance(found, list)
    return {c["name"]: c["status"] for c in found}


# -- evidence.json and the lines that head every exported file ----------------------------------


def test_an_accepted_hand_over_gives_its_candidate_sides_claims(accepted: Review) -> None:
    ev = build_evidence(accepted, accepted.choice())
    slos = ev.data["slos"]
    assert slos["source"] == "stage batching decision, candidate side"
    assert _statuses(slos) == {E2E: "undecided", "error_rate": "met"}
    assert slos["claims"][0] == UNDECIDED.to_dict() and slos["target"] == 0.9
    (line,) = [x for x in ev.lines if x.startswith("SLO ") and E2E in x]
    assert line.startswith("SLO UNDECIDED: slo_p99_e2e undecided: 1.0% under its limit")
    assert "70% sure it is met (asked 90%)" in line and "more windows would decide it" in line
    assert not any("error_rate" in x for x in ev.lines)  # met: only the SLOs are listed
    # the baseline, exported by number, was that decision's incumbent
    base = build_evidence(accepted, accepted.choice("baseline", 0)).data["slos"]
    assert base["source"] == "stage batching decision, incumbent side"
    assert _statuses(base) == {E2E: "met"}


def test_a_kept_baseline_gives_the_incumbent_side_of_the_decision_that_measured_it(
    kept: Review,
) -> None:
    ev = build_evidence(kept, kept.choice())
    assert ev.data["slos"]["source"] == "stage memory decision, incumbent side"
    assert _statuses(ev.data["slos"]) == {E2E: "missed"}
    assert any(x.startswith("SLO MISSED: slo_p99_e2e missed: 5.0% over") for x in ev.lines)
    winner = build_evidence(kept, kept.choice("memory", 3)).data["slos"]
    assert winner["source"] == "stage memory decision, candidate side"
    assert _statuses(winner) == {E2E: "met"}


def test_claims_no_decision_stored_are_computed_and_hold_no_nan(tmp_path: Path) -> None:
    """The fake's decision predates claims: its one stored window decides, spread unknown."""
    fake.make_stored_study(tmp_path)
    review = open_review("demo", studies_dir=tmp_path)
    slos = build_evidence(review, review.choice()).data["slos"]
    assert slos["source"].startswith("computed from its 1 stored windows")
    (claim,) = slos["claims"]
    assert (claim["status"], claim["confidence"], claim["windows"]) == ("met", None, 1)
    json.dumps(slos, allow_nan=False)  # raises on a NaN


# A baseline kept because nothing beat it: no decision re-measured it. Its three windows read
# 2-6 % under the SLO; one search point, measured twice, is far noisier.
BASELINE = [{E2E: -0.06}, {E2E: -0.02}, {E2E: -0.04}]
NOISY = [{E2E: -0.5}, {E2E: -0.3}]
POINT = {"max_num_seqs": 32}


def _kept_unconfirmed(root: Path, confidence: float) -> Review:
    folder = root / "lone"
    folder.mkdir(parents=True)
    config = {
        "server": {"model": "/models/tiny-llama", "args": {}},
        "study": {"stages": ["batching"], "slo_confidence": confidence},
        "objectives": {"select_by": "output_throughput"},
    }
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    storage = optuna.storages.RDBStorage(f"sqlite:///{folder / 'optuna.db'}")
    values = [1.0, 1000.0, 0.02]
    base = fake.new_study(storage, baseline_study("lone"))
    base.set_user_attr(StudyAttr.FINGERPRINT, fake.FINGERPRINT)
    stage = fake.new_study(storage, stage_study("lone", "batching"))
    sides = [(base, "baseline", {}, w) for w in BASELINE]
    sides += [(stage, "search", POINT, w) for w in NOISY]
    for i, (study, role, params, window) in enumerate(sides):
        attrs = fake.measured_attrs(folder, f"{role}-{i}", role, values, params)
        dists = {k: fake.SEARCH[k] for k in params}
        trial = optuna.trial.create_trial(
            values=values, params=params, distributions=dists, user_attrs=attrs, constraints=window
        )
        study.add_trial(trial)
    nothing = Decision("batching", "output_throughput", "maximize", False, "nothing beat it")
    stage.set_user_attr(StudyAttr.DECISION, nothing.to_dict())
    return open_review("lone", studies_dir=root)


@pytest.mark.parametrize("confidence", [0.9, 0.95])
def test_a_baseline_no_decision_measured_is_judged_at_the_studys_confidence(
    tmp_path: Path, confidence: float
) -> None:
    review = _kept_unconfirmed(tmp_path, confidence)
    slos = build_evidence(review, review.choice()).data["slos"]
    assert slos["source"].startswith("computed from its 3 stored windows")
    # its spread pooled with the noisy point's: 4 % under the SLO on the mean, not sure of it
    (expected,) = claims(BASELINE, [NOISY], confidence)
    assert slos["target"] == confidence and slos["claims"] == [expected.to_dict()]
    assert expected.status == "undecided" and expected.target == confidence
    assert claims(BASELINE, [], confidence)[0].status == "met"  # alone, its windows would say


# -- `tuner export`'s output --------------------------------------------------------------------


def test_export_says_an_undecided_slo(
    accepted: Review, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    export_choices(accepted, [accepted.choice()], "cli", tmp_path / "out")
    out = capsys.readouterr().out
    assert "SLOs of the hand-over: UNDECIDED: slo_p99_e2e not shown met with 90% confidence" in out
    script = (tmp_path / "out" / "vllm-serve.sh").read_text()
    assert "SLO UNDECIDED: slo_p99_e2e undecided" in script  # the header of the exported file


# -- report.html, the terminal summary and the dashboard note -----------------------------------


def test_the_note_and_the_page_show_an_undecided_slo_in_words(accepted: Review) -> None:
    report = build_report(accepted, figures=False)
    note, page, text = note_markdown(report), html_page(report), summary_text(report)
    assert "### SLOs of the hand-over" in note
    assert "| SLO | margin | confidence | status | windows |" in note
    assert "| slo_p99_e2e | +1.0% | 70% (asked 90%) | UNDECIDED | 4 |" in note
    assert "**UNDECIDED: slo_p99_e2e not shown met with 90% confidence" in note
    table = page.split("<h2 id='slos'>SLOs of the hand-over</h2>", 1)[1].split("</table>", 1)[0]
    assert "<b>UNDECIDED: slo_p99_e2e" in table
    for cell in ("slo_p99_e2e", "+1.0%", "70% (asked 90%)", "UNDECIDED", "4"):
        assert f"<td>{cell}</td>" in table
    for shown in (note, page, text):
        assert (
            "SLOs of the hand-over: UNDECIDED: slo_p99_e2e not shown met with 90% confidence "
            "(more windows decide it); slo_p99_e2e UNDECIDED: margin +1.0%, "
            "confidence 70% (asked 90%)"
        ) in shown


def test_the_note_says_a_missed_slo_and_a_met_one_plainly(kept: Review, tmp_path: Path) -> None:
    missed = note_markdown(build_report(kept, figures=False))
    assert "| slo_p99_e2e | -5.0% | 2% (asked 90%) | MISSED | 5 |" in missed
    assert "**MISSED: slo_p99_e2e" in missed
    _store(kept.storage_url, "kept:memory", replace(kept_decision(), incumbent_slos=[MET]))
    met = note_markdown(build_report(open_review("kept", studies_dir=tmp_path), figures=False))
    assert "| slo_p99_e2e | +20.0% | 100% (asked 90%) | met | 2 |" in met
    assert "every SLO met with 90% confidence" in met
    assert "UNDECIDED" not in met and "MISSED" not in met
