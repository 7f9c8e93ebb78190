"""JUnit XML, the test-report format CI systems read (Jenkins, GitLab, GitHub Actions...).

One ``<testsuite>`` with one ``<testcase>`` per verdict row; a failed row carries a
``<failure>`` whose message says what regressed, an unresolved one a ``<skipped>`` whose
message says what it would need (a CI system shows it as neither passed nor failed). Text
goes through the caller's redactor before it is written, like every other output.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import ArtifactError


@dataclass(frozen=True)
class Case:
    """One verdict as a test case."""

    name: str
    message: str  # what was compared, and how it came out
    failed: bool
    skipped: bool = False  # could not be decided (an unresolved verdict)


def junit_xml(
    suite: str,
    cases: Sequence[Case],
    seconds: float,
    redact: Callable[[str], str] = lambda s: s,
) -> str:
    failures = sum(c.failed for c in cases)
    skipped = sum(c.skipped and not c.failed for c in cases)
    root = ET.Element(
        "testsuites", name="tuner", tests=str(len(cases)), failures=str(failures), errors="0"
    )
    node = ET.SubElement(
        root,
        "testsuite",
        name=redact(suite),
        tests=str(len(cases)),
        failures=str(failures),
        errors="0",
        skipped=str(skipped),
        time=f"{seconds:.1f}",
    )
    for case in cases:
        element = ET.SubElement(node, "testcase", classname=redact(suite), name=redact(case.name))
        if case.failed:
            failure = ET.SubElement(element, "failure", message=redact(case.message))
            failure.text = redact(case.message)
        elif case.skipped:
            ET.SubElement(element, "skipped", message=redact(case.message))
        else:
            ET.SubElement(element, "system-out").text = redact(case.message)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_text(path: Path, text: str) -> Path:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ArtifactError(f"cannot write {path}: {exc.strerror}") from exc
    return path
