"""The fault table itself (fast, no faults injected): docs/faults.md is what the generator writes,
and every test a row cites exists."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults import table
from tests.faults.table import DOC, FAULTS, FaultRow, FaultTable, cite, parse, render

_RUN_LINE = "Last run: "  # the host and duration of the last real run: the one line a host sets


def _row(**kw: str) -> FaultRow:
    cells = {"injected": "x", "outcome": "x", "leftovers": "none", "data": "yes"}
    return FaultRow(
        **{"fault": "sigint", "test": "test_table.py::test_cite_names_the_function", **cells, **kw}
    )


def _without_run_line(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith(_RUN_LINE)]


def test_the_document_is_what_the_generator_writes() -> None:
    doc = DOC.read_text(encoding="utf-8")
    rows = parse(doc)
    assert [r.fault for r in rows] == list(FAULTS)  # one row per fault, in the table's order
    assert _without_run_line(render(rows, 0.0)) == _without_run_line(doc)


def test_every_row_cites_tests_that_exist() -> None:
    for row in parse(DOC.read_text(encoding="utf-8")):
        table.check_citations(row)  # the injected/outcome/data cells and the test column
        assert "::" in row.test, row.fault  # the test column names a test, checked above


def test_cite_names_the_function() -> None:
    assert cite(test_cite_names_the_function) == "`test_table.py::test_cite_names_the_function`"


@pytest.mark.parametrize(
    ("injected", "needle"),
    [
        ("with real vLLM-CPU: tests/e2e/test_study_vllm.py", "cite the test itself"),
        ("see tests/e2e/test_study_vllm.py::test_sigint_on_real_vllm", "no such test"),
        ("see test_run_faults.py::test_nothing_like_this", "no such test"),
        ("see tests/e2e/test_gone.py::test_x", "no such file"),
    ],
)
def test_a_row_citing_a_missing_test_is_refused(tmp_path: Path, injected: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        FaultTable(tmp_path / "rows.json").record(_row(injected=injected))
    with pytest.raises(ValueError, match=needle):
        render([_row(injected=injected)], 0.0)
    assert not (tmp_path / "rows.json").exists()


def test_a_row_citing_an_existing_test_is_recorded(tmp_path: Path) -> None:
    store = FaultTable(tmp_path / "rows.json")
    row = _row(
        injected="see tests/e2e/test_study_vllm.py::"
        "test_study_on_postgresql_completes_with_stored_decision"
    )
    store.record(row)
    assert store.rows() == [row]
