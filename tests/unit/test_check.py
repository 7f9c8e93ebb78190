"""`tuner check`'s judgement, on known numbers: the acceptance rule turned round, the SLO rows,
evidence.json read back, the JUnit report, and bad input as one line with exit 2.

The real measurement paths are tested in tests/integration/test_check_endpoint.py (real Locust
against the fake SSE server) and tests/e2e/test_deployment_vllm.py (a real vLLM deployment).
"""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TINY_MODEL
from tests.fakes.check_evidence import evidence
from tuner.cli import main
from tuner.deployment.check import (
    BETTER,
    PASS,
    REGRESSION,
    CheckResult,
    evidence_slo_target,
    objective_row,
    table,
    verdict_rows,
    write_outputs,
)
from tuner.deployment.check.endpoint import pooled_with
from tuner.deployment.check.evidence_file import read_reference, tokenizer_for
from tuner.errors import ConfigError
from tuner.measurement.stats import Measurements, MetricStats
from tuner.redact import Redactor
from tuner.scoring.confidence import claims
from tuner.study.decision.noise import NoiseEstimate

NOISE = NoiseEstimate(0.05, 6)  # 5 % between repeats, known from 6 degrees of freedom


@pytest.mark.parametrize(
    ("measured", "verdict"),
    [
        ([1000.0, 990.0, 1010.0], PASS),  # the same level
        ([940.0, 950.0, 945.0], PASS),  # 5.5 % lower: within this noise
        ([700.0, 690.0, 710.0], REGRESSION),  # 30 % lower
        ([1400.0, 1390.0, 1410.0], BETTER),
    ],
)
def test_a_throughput_regression_is_what_the_acceptance_rule_proves(
    measured: list[float], verdict: str
) -> None:
    row = objective_row("output_throughput", "maximize", [1000.0, 1005.0], measured, NOISE, 0.03)
    assert row.verdict == verdict
    assert row.reference == pytest.approx(1002.5)
    # t(8 df) * 5 % * sqrt(1/2 + 1/3): the check's three windows count, and join the noise
    assert row.allowed is not None and 0.05 < row.allowed < 0.25


def test_a_latency_regression_is_a_rise() -> None:
    up = objective_row("p99_e2e_latency", "minimize", [1.0, 1.02], [1.6, 1.7], NOISE, 0.03)
    down = objective_row("p99_e2e_latency", "minimize", [1.0, 1.02], [0.6, 0.62], NOISE, 0.03)
    assert (up.verdict, down.verdict) == (REGRESSION, BETTER)
    assert up.change is not None and up.change > 0.5


@pytest.mark.parametrize(("direction", "worse"), [("maximize", -1.0), ("minimize", 1.0)])
def test_allowed_is_where_a_regression_begins(direction: str, worse: float) -> None:
    ref = [1000.0, 1005.0]
    allowed = objective_row("t", direction, ref, [1002.5], NOISE, 0.03).allowed
    assert allowed is not None
    edge = 1002.5 * (1 + worse * allowed)
    within, beyond = edge * (1 - worse * 0.01), edge * (1 + worse * 0.01)
    # one window against two resolves 21 % here: ask for 30 % so that the edge is all that counts
    assert objective_row("t", direction, ref, [within], NOISE, 0.03, 0.3).verdict == PASS
    assert objective_row("t", direction, ref, [beyond], NOISE, 0.03, 0.3).verdict == REGRESSION


def test_min_gain_tolerates_small_changes_even_without_noise() -> None:
    quiet = NoiseEstimate(0.001, 20)
    assert objective_row("t", "maximize", [100.0], [98.0], quiet, 0.03).verdict == PASS
    assert objective_row("t", "maximize", [100.0], [95.0], quiet, 0.03).verdict == REGRESSION


def test_nothing_measured_is_a_regression_and_nothing_in_the_evidence_is_unresolved() -> None:
    dead = objective_row("t", "maximize", [100.0], [math.nan, 90.0], NOISE, 0.03)
    assert dead.verdict == REGRESSION and dead.failed
    blind = objective_row("t", "maximize", [], [90.0], NOISE, 0.03)
    assert blind.unresolved and not blind.failed and "export the study again" in blind.detail


def test_the_check_windows_join_the_studys_noise() -> None:
    pooled = pooled_with(NoiseEstimate(0.05, 4), [100.0, 110.0, 90.0])
    assert pooled.df == 6 and 0.05 < pooled.rel_sd < 0.1
    assert pooled_with(NoiseEstimate(math.nan, 0), [100.0]).df == 0  # nothing known at all


def measurements(tput: float, p99: float, errors: float = 0.0) -> Measurements:
    stats = MetricStats(n=100, mean=p99 / 2, p50=p99 / 2, p90=p99, p95=p99, p99=p99, max=p99)
    none = MetricStats(n=0)
    return Measurements(
        ttft=stats,
        tpot=none,
        itl=none,
        e2e=stats,
        window_s=10.0,
        requests_started=100,
        completed=100,
        failed=0,
        errors_by_kind={},
        error_rate=errors,
        request_throughput=10.0,
        output_throughput=tput,
        total_throughput=tput,
        goodput=10.0,
        mean_prompt_tokens=200.0,
        mean_output_tokens=64.0,
        dispatch_lag_p99_s=0.0,
    )


def write_evidence(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(json.dumps(data))
    return path


def test_evidence_reads_back_typed(tmp_path: Path) -> None:
    ref = read_reference(write_evidence(tmp_path / "e.json", evidence()))
    assert ref.workload.classes[0].output_tokens.mean == 16 and ref.workload.concurrency == 4
    assert ref.noise["output_throughput"] == NoiseEstimate(0.04, 4)
    assert ref.slo.p99_e2e_s == 2.0 and ref.scoring.context.cost.cpus == 1
    assert ref.model_names == [str(TINY_MODEL)]


def test_evidence_of_a_conversational_workload_reads_back_typed(tmp_path: Path) -> None:
    data = evidence()
    data["workload"]["sessions"] = {"turns": 3, "think_s": 2.5, "think": "fixed"}
    ref = read_reference(write_evidence(tmp_path / "e.json", data))
    assert (ref.workload.sessions.turns, ref.workload.sessions.think_s) == (3, 2.5)
    data["workload"]["sessions"] = {"turns": 0}
    with pytest.raises(ConfigError, match=r"workload\.sessions"):
        read_reference(write_evidence(tmp_path / "bad.json", data))


def test_the_rows_judge_objectives_and_the_slos_that_are_set(tmp_path: Path) -> None:
    ref = read_reference(write_evidence(tmp_path / "e.json", evidence()))
    rows = {r.name: r for r in verdict_rows(ref, [measurements(600.0, 2.4)] * 2)}
    assert rows["output_throughput"].verdict == REGRESSION
    assert rows["p99_e2e_latency"].verdict == REGRESSION
    assert rows["slo_p99_e2e"].verdict == "violated"  # 2.4 s against 2 s
    assert rows["error_rate"].verdict == "met"
    assert "slo_p99_ttft" not in rows  # not set in the study: nothing to judge
    same = verdict_rows(ref, [measurements(1000.0, 1.0), measurements(1020.0, 1.03)])
    assert not any(r.failed for r in same)


def test_reports_parse_and_never_hold_the_key(tmp_path: Path) -> None:
    ref = read_reference(write_evidence(tmp_path / "e.json", evidence()))
    windows = [measurements(600.0, 1.0)] * 2
    result = CheckResult(ref, "http://u:sk-in-url-999@h:1", windows, verdict_rows(ref, windows), 9)
    paths = write_outputs(result, tmp_path / "out", Redactor(["sk-in-url-999"]))
    suite = ET.parse(paths["junit"]).getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "1"
    failed = [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None]
    assert failed == ["objective output_throughput"]
    data = json.loads(Path(paths["json"]).read_text())
    assert data["verdict"] == "fail" and len(data["measurements"]) == 2
    assert "sk-in-url-999" not in Path(paths["json"]).read_text()
    assert "REGRESSION" in table(result) and "verdict: FAIL: output_throughput" in table(result)


def test_a_tokenizer_of_another_model_is_refused(tmp_path: Path) -> None:
    gone = evidence(model_path=tmp_path / "gone")
    ref = read_reference(write_evidence(tmp_path / "e.json", gone))
    with pytest.raises(ConfigError, match="no model folder"):
        tokenizer_for(ref, None)
    other = evidence(model={"model": "x", "config_sha256": "0" * 16})
    with pytest.raises(ConfigError, match="another model than the evidence's"):
        tokenizer_for(read_reference(write_evidence(tmp_path / "o.json", other)), TINY_MODEL)


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--url", "ftp://h:1"], {}, "is not an http(s) URL"),
        (["--url", "h:8000"], {}, "is not an http(s) URL"),
        (["--api-key-env", "TUNER_TEST_UNSET_KEY"], {}, "TUNER_TEST_UNSET_KEY', which is not set"),
        (["--evidence", "/nope/evidence.json"], {}, "cannot read --evidence"),
        (["--windows", "0"], {}, "--windows must be >= 1"),
        (["--max-windows", "0"], {}, "--max-windows must be >= 1"),
        (["--windows", "5", "--max-windows", "4"], {}, "is more than --max-windows 4"),
        (["--resolve", "0"], {}, "--resolve must be a fraction in (0, 1)"),
        (["--resolve", "1"], {}, "--resolve must be a fraction in (0, 1)"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    env: dict[str, str],
    message: str,
) -> None:
    monkeypatch.delenv("TUNER_TEST_UNSET_KEY", raising=False)
    ev = str(write_evidence(tmp_path / "e.json", evidence()))
    base = {"--url": "http://127.0.0.1:9", "--evidence": ev, "--out": str(tmp_path / "o")}
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    rc = main(["check", *[x for kv in base.items() for x in kv]])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and err.count("\n") == 1, err


def test_evidence_without_a_check_block_says_to_export_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = {k: v for k, v in evidence().items() if k != "check"}
    path = write_evidence(tmp_path / "old.json", old)
    assert main(["check", "--url", "http://127.0.0.1:9", "--evidence", str(path)]) == 2
    assert "export the study again" in capsys.readouterr().err


# -- an SLO's margin and confidence, from the check's own windows -------------------------------


def test_an_slo_row_gives_its_margin_and_confidence_at_the_evidences_target(
    tmp_path: Path,
) -> None:
    data = {**evidence(), "slos": {"target": 0.95, "claims": []}}
    path = write_evidence(tmp_path / "e.json", data)
    assert evidence_slo_target(path) == 0.95
    ref = read_reference(path)
    windows = [measurements(1000.0, p99) for p99 in (1.8, 1.9, 1.7)]  # 5-15 % under 2 s
    rows = {r.name: r for r in verdict_rows(ref, windows, slo_target=0.95)}
    e2e = rows["slo_p99_e2e"]
    per_window = [{"slo_p99_e2e": p99 / 2.0 - 1} for p99 in (1.8, 1.9, 1.7)]
    (claim,) = claims(per_window, [], 0.95)
    assert e2e.verdict == "met" and e2e.margin == pytest.approx(0.1)
    assert e2e.confidence == pytest.approx(claim.confidence) and claim.status == "met"
    assert "margin +10.0%" in e2e.detail and "sure it is met (asked 95%)" in e2e.detail
    assert rows["output_throughput"].margin is None  # an objective has none
    result = CheckResult(ref, "http://h:1", windows, list(rows.values()), 9)
    stored = json.loads(Path(write_outputs(result, tmp_path / "o", Redactor())["json"]).read_text())
    slo = next(r for r in stored["rows"] if r["name"] == "slo_p99_e2e")
    assert slo["margin"] == pytest.approx(0.1) and slo["confidence"] == pytest.approx(
        e2e.confidence
    )
    assert "slo slo_p99_e2e: mean over 3 windows" in table(result)


def test_an_slo_met_on_the_mean_stays_met_and_says_it_is_undecided(tmp_path: Path) -> None:
    ref = read_reference(write_evidence(tmp_path / "e.json", evidence()))
    windows = [measurements(1000.0, p99) for p99 in (1.9, 2.1, 1.96)]  # 0.7 % under on the mean
    e2e = next(r for r in verdict_rows(ref, windows) if r.name == "slo_p99_e2e")
    assert e2e.verdict == "met" and not e2e.failed  # the verdict is the mean's, as before
    assert e2e.confidence is not None and 0.1 < e2e.confidence < 0.9
    assert "UNDECIDED at that confidence" in e2e.detail and "(asked 90%)" in e2e.detail
    one = next(r for r in verdict_rows(ref, windows[:1]) if r.name == "slo_p99_e2e")
    assert one.confidence is None and "confidence unknown" in one.detail


def test_evidence_without_slos_asks_90_percent_and_a_bad_target_is_refused(
    tmp_path: Path,
) -> None:
    assert evidence_slo_target(write_evidence(tmp_path / "old.json", evidence())) == 0.9
    bad = write_evidence(tmp_path / "bad.json", {**evidence(), "slos": {"target": 1.5}})
    with pytest.raises(ConfigError, match=r"slos.target must be in \(0.5, 1\)"):
        evidence_slo_target(bad)


def test_a_class_slo_of_the_evidence_gets_its_own_row(tmp_path: Path) -> None:
    """A study with an SLO per request class hands over evidence whose slo block names it;
    the check judges that class's own windows, in a row of its own beside the totals'."""
    from dataclasses import replace

    from tuner.measurement.measurements import ClassStats

    data = evidence()
    data["slo"] = {**data["slo"], "classes": {"chat": {"p99_ttft_s": 0.5}}}
    ref = read_reference(write_evidence(tmp_path / "e.json", data))

    def with_chat(chat_p99: float) -> Measurements:
        m = measurements(1000.0, 1.0)
        chat = MetricStats(n=50, p50=chat_p99 / 2, p99=chat_p99)
        stats = ClassStats(chat, MetricStats(), chat, 50, 50, 0, 0.0, 500.0, 5.0)
        return replace(m, by_class={"chat": stats})

    rows = {r.name: r for r in verdict_rows(ref, [with_chat(0.6), with_chat(0.62)])}
    assert rows["slo_chat_p99_ttft"].verdict == "violated"  # 0.61 s against 0.5 s
    assert rows["slo_chat_p99_ttft"].measured == pytest.approx(0.61 / 0.5 - 1)
    assert rows["slo_p99_e2e"].verdict == "met"  # the totals' row is still there
    met = {r.name: r for r in verdict_rows(ref, [with_chat(0.3), with_chat(0.32)])}
    assert met["slo_chat_p99_ttft"].verdict == "met"
