"""The fault table: each fault test records what it observed; the session renders docs/faults.md.

A test calls :meth:`FaultTable.record` once its assertions passed, with values it measured (exit
codes, reasons, messages, process counts, trial counts), never with text written in advance. The
rows go to a JSON file of the test session; ``pytest_sessionfinish`` (tests/faults/conftest.py)
renders the Markdown table only when every fault of :data:`FAULTS` was recorded and the session
passed, so a partial or failing run never rewrites the document.

A row that points the reader at another test names it as ``file.py::test_name`` (written with
:func:`cite` from the function itself), and every such citation must name a test function that
exists: a row once sent readers to a real-vLLM SIGINT test that was never written.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import platform
import re
from collections.abc import Callable
from dataclasses import asdict, astuple, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "faults.md"
# A test file, bare (this suite's) or under tests/, optionally followed by ::test_name.
_CITATION = re.compile(r"\b((?:tests/[\w/]+/)?test_\w+\.py)(?:::(\w+))?")

# The faults of issue #5 in the order of the table: key -> the fault as a reader knows it.
FAULTS: dict[str, str] = {
    "fp8_startup": "a config that fails at start-up (`--quantization fp8` on CPU)",
    "sigkill_mid_load": "the vLLM server SIGKILLed mid-load",
    "startup_timeout": "a server that never becomes healthy (start-up timeout)",
    "port_preflight": "the port already taken, before the run",
    "port_race": "the port taken after the preflight (a race)",
    "loadgen_crash": "the load generator crashing mid-run (Locust's group SIGKILLed)",
    "sigterm": "SIGTERM to `tuner run` mid-trial",
    "sigint": "SIGINT (Ctrl-C) to `tuner run` mid-trial",
    "two_runs": "two `tuner run` processes on the same study",
    "pg_restart": "the PostgreSQL server restarted mid-study (during a trial)",
    "artifact_write": "a failure to write trial artifacts (disk full on `result.json`)",
    "budget_consecutive": "systematic failures: `study.max_consecutive_failures`",
    "budget_rate": "systematic failures: `study.max_failure_rate`",
}


@dataclass
class FaultRow:
    fault: str  # a key of FAULTS
    injected: str  # how the test made it happen (real, or which stand-in)
    outcome: str  # exit code / trial outcome and the message the user saw
    leftovers: str  # processes left, and how many PIDs and groups were checked
    data: str  # completed trials intact? did a resume complete the budget?
    test: str  # the test that observed it


class FaultTable:
    """Rows of one test session, kept in a JSON file (one list of rows)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def rows(self) -> list[FaultRow]:
        if not self.path.is_file():
            return []
        return [FaultRow(**row) for row in json.loads(self.path.read_text(encoding="utf-8"))]

    def record(self, row: FaultRow) -> None:
        if row.fault not in FAULTS:
            raise KeyError(f"unknown fault {row.fault!r}; known: {', '.join(FAULTS)}")
        check_citations(row)  # fail the recording test now, not a reader later
        rows = [r for r in self.rows() if r.fault != row.fault] + [row]
        self.path.write_text(json.dumps([asdict(r) for r in rows], indent=1), encoding="utf-8")

    def missing(self) -> list[str]:
        seen = {r.fault for r in self.rows()}
        return [key for key in FAULTS if key not in seen]


def cite(test: Callable[..., object]) -> str:
    """How a row names another test: ``file.py::name``, taken from the function, so a renamed
    or removed test breaks the citing test instead of leaving a dangling reference."""
    return f"`{Path(inspect.getfile(test)).name}::{test.__name__}`"


def _defines(path: Path, name: str) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef)
    return any(isinstance(node, kinds) and node.name == name for node in ast.walk(tree))


def citation_problems(text: str) -> list[str]:
    """What is wrong with the tests ``text`` cites: a file alone (which test?), a file or a
    test function that does not exist."""
    problems = []
    for match in _CITATION.finditer(text):
        file, name = match.group(1), match.group(2)
        path = ROOT / file if "/" in file else Path(__file__).with_name(file)
        if name is None:
            problems.append(f"{file}: cite the test itself, as file.py::test_name")
        elif not path.is_file():
            problems.append(f"{file}::{name}: no such file")
        elif not _defines(path, name):
            problems.append(f"{file}::{name}: no such test in {file}")
    return problems


def check_citations(row: FaultRow) -> None:
    problems = [p for cell in astuple(row) for p in citation_problems(cell)]
    if problems:
        raise ValueError(
            f"fault {row.fault!r} cites tests that do not exist: {'; '.join(problems)}"
        )


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render(rows: list[FaultRow], duration_s: float) -> str:
    """The Markdown document: a header saying how it was made, then one row per fault."""
    by_key = {r.fault: r for r in rows}
    for row in rows:
        check_citations(row)
    lines = [
        "# Fault injection: what tuner does when things break",
        "",
        "Generated by the fault-injection suite (`pytest tests/faults`, issue #5); do not edit by",
        "hand. Each row is what a test observed and asserted: the exit code or trial outcome and",
        "the message, the processes left (every PID and process group the test saw under the",
        "test's folder, plus vLLM/Locust processes by command line), and whether the completed",
        "trials were unchanged and a resume completed the budget. Real vLLM-CPU runs wherever",
        "the fault can be real; stand-ins are named in the second column.",
        "",
        f"Last run: {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; the fault suite took {duration_s:.0f} s.",
        "",
        "| fault | injected by | outcome | leftovers | data intact / resume | test |",
        "|---|---|---|---|---|---|",
    ]
    for key, name in FAULTS.items():
        row = by_key[key]
        cells = [name, row.injected, row.outcome, row.leftovers, row.data, f"`{row.test}`"]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def parse(doc: str) -> list[FaultRow]:
    """The rows of a rendered document, back as :class:`FaultRow` (to check the committed
    docs/faults.md against what :func:`render` writes)."""
    keys = {name: key for key, name in FAULTS.items()}
    rows = []
    for line in doc.splitlines():
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 6 and cells[0] in keys:
            name, injected, outcome, leftovers, data, test = cells
            rows.append(FaultRow(keys[name], injected, outcome, leftovers, data, test.strip("`")))
    return rows
