"""An SLO per request class (``slo.classes.<class>.p99_<metric>_s``): a constraint of its own
that the sampler sees and the confidence rule judges, a class the workload does not have
refused in one line, and the summary naming the SLO that binds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_measure_classes import T0, T1, _records
from tests.unit.test_study import Scripted
from tuner.cli import main
from tuner.composition import compose
from tuner.config import SloConfig
from tuner.errors import ConfigError
from tuner.measurement.stats import ClassStats, MetricStats, measure
from tuner.scoring import objective as obj
from tuner.study.loop.session import outcome_lines
from tuner.study.state.fingerprint import fingerprint


def _ctx(slo: SloConfig) -> obj.ObjectiveContext:
    return obj.ObjectiveContext(slo=slo)


def test_a_class_slo_is_a_constraint_on_that_class_alone() -> None:
    """chat's E2E is 0.10-0.49 s and batch's 2.0-3.9 s (tests/unit/test_measure_classes.py):
    an SLO of 1 s on chat is met, the same on batch is missed, and the total's P99 (batch's)
    would have missed it for chat too."""
    slo = SloConfig(classes={"chat": {"p99_e2e_s": 1.0}, "batch": {"p99_e2e_s": 1.0}})
    m = measure(_records(), T0, T1, slo)
    made = {c.name: c for c in obj.class_slos(slo)}
    assert sorted(made) == ["slo_batch_p99_e2e", "slo_chat_p99_e2e"]
    chat = made["slo_chat_p99_e2e"].violation(m, _ctx(slo))
    batch = made["slo_batch_p99_e2e"].violation(m, _ctx(slo))
    assert chat == pytest.approx(m.by_class["chat"].e2e.p99 / 1.0 - 1) and chat < 0
    assert batch > 0 and m.e2e.p99 is not None and m.e2e.p99 > 1.0
    # a class with no request in the window has nothing to show: not met
    absent = obj.class_slos(SloConfig(classes={"docs": {"p99_ttft_s": 2.0}}))[0]
    docs_slo = SloConfig(classes={"docs": {"p99_ttft_s": 2.0}})
    assert absent.violation(m, _ctx(docs_slo)) == obj.NO_DATA_VIOLATION


def test_the_study_resolves_them_beside_its_named_constraints_and_check_finds_them() -> None:
    slo = SloConfig(p99_e2e_s=5.0, classes={"chat": {"p99_ttft_s": 0.5, "p99_tpot_s": 0.05}})
    config = compose([])
    selection = obj.resolve(config.objectives, _ctx(slo))
    names = [c.name for c in selection.constraints]
    assert names[: len(config.objectives.constraints)] == config.objectives.constraints
    assert names[len(config.objectives.constraints) :] == ["slo_chat_p99_ttft", "slo_chat_p99_tpot"]
    assert obj.get_constraint("slo_chat_p99_ttft", slo).name == "slo_chat_p99_ttft"
    with pytest.raises(ConfigError, match="unknown"):
        obj.get_constraint("slo_chat_p99_ttft")  # without the SLOs that make it


def test_a_class_the_workload_does_not_have_is_refused() -> None:
    SloConfig(classes={"chat": {"p99_ttft_s": 0.5}}).check_classes(["chat", "docs"])
    with pytest.raises(ConfigError, match=r"slo.classes.nochat names a request class"):
        SloConfig(classes={"nochat": {"p99_ttft_s": 0.5}}).check_classes(["chat"])
    with pytest.raises(ConfigError, match=">= 0 seconds"):
        SloConfig(classes={"chat": {"p99_ttft_s": -1}}).check_classes(["chat"])
    with pytest.raises(ConfigError, match=r"slo\.classes\.chat: .*p99_ttfb_s"):
        SloConfig(classes={"chat": {"p99_ttfb_s": 1}}).check_classes(["chat"])


def test_bad_class_slo_on_the_command_line_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", "+slo.classes.nochat.p99_ttft_s=0.5", f"studies_dir={tmp_path}", "--dry-run"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "slo.classes.nochat names a request class" in err


def test_a_study_without_class_slos_keeps_its_baselines_fingerprint() -> None:
    """Stored baselines are found by fingerprint: no class SLO, no new key in it."""
    plain = fingerprint(compose([]), "0.32.0", {"device": "cpu"})
    assert "classes" not in plain["slo"]
    with_class = compose(["+slo.classes.short.p99_ttft_s=0.5"])  # a class of the workload
    assert fingerprint(with_class, "0.32.0", {"device": "cpu"})["slo"]["classes"] == {
        "short": {"p99_ttft_s": 0.5}
    }


class ClassScripted(Scripted):
    """Scripted, with a chat class whose own P99 TTFT each window scripts: (tok/s, P99 E2E s,
    chat's P99 TTFT s). The total P99 E2E meets its SLO of 2.6 s in every window."""

    def __init__(self, folder: Path, script: dict[Any, list[Any]]) -> None:
        self.chat_ttft: dict[Any, list[float]] = {k: [v[2] for v in vs] for k, vs in script.items()}
        plain = {k: [(v[0], v[1]) for v in vs] for k, vs in script.items()}
        super().__init__(folder, plain, max_repeats=4)

    def run(self) -> Any:
        self.config.slo.classes = {"chat": {"p99_ttft_s": 0.5}}
        return super().run()

    def trial(
        self, config: Any, launch: Any, paths: Any, trial_id: str, progress: Any = None
    ) -> Any:
        outcome = super().trial(config, launch, paths, trial_id, progress)
        ttft = self.chat_ttft[launch.spec.args.get("max_num_seqs")].pop(0)
        chat = MetricStats(n=100, p50=ttft / 2, p99=ttft)
        outcome.measurements.by_class = {
            "chat": ClassStats(chat, MetricStats(), MetricStats(), 100, 100, 0, 0.0, 50.0, 10.0)
        }
        return outcome


def test_a_study_decides_by_the_binding_class_and_the_summary_names_it(tmp_path: Path) -> None:
    """64 sequences give the most tokens/s and meet the SLO over every request, but cost the
    chat class its TTFT SLO (0.9 s against 0.5 s): the study takes 16, which keeps chat within
    it, and the summary names chat's TTFT as the SLO that binds."""
    n = 8  # windows enough for every launch a study of two points may make
    run = ClassScripted(
        tmp_path,
        {
            None: [(1000, 2.0, 0.30)] * n,
            16: [(1400, 2.0, 0.40)] * n,
            64: [(1900, 2.0, 0.90)] * n,
        },
    )
    assert run.result.final.params == {"max_num_seqs": 16}
    assert run.result.final.constraints["slo_chat_p99_ttft"] < 0
    names = run.config.objectives.names
    lines = outcome_lines("t", names, names.index(run.config.objectives.select_by), run.result)
    binding = [line for line in lines if "binding SLO" in line]
    assert binding == [
        "  binding SLO: slo_chat_p99_ttft (the chat class's P99 TTFT: 20.0% under its limit, "
        "the least room of any)"
    ], lines
