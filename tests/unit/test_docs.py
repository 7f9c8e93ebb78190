"""The documentation: every repository path it names exists, the README stays short, and every
page under docs/ is in the MkDocs nav (a page left out of it is built but never reachable)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
MAX_README_LINES = 250

# A code span names a repository path when it starts with one of these. studies/ is left out
# because a study creates it at run time, models/ because the set-up builds it.
REPO_PREFIXES = (
    "tuner/",
    "conf/",
    "objectives/",
    "tests/",
    "benchmarks/",
    "scripts/",
    "docs/",
    ".ci/",
    "pyproject.toml",
    "mkdocs.yml",
)
# Fenced blocks hold commands and sample files, whose paths may be ones the reader creates.
FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(?<!`)`([^`]+)`(?!`)")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def doc_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def prose(path: Path) -> str:
    return FENCE.sub("", path.read_text(encoding="utf-8"))


def strip_location(target: str) -> str:
    """A path without what points inside the file: `#anchor`, `:line` or `::test`."""
    return re.split(r"[#:]", target, maxsplit=1)[0]


def span_paths(text: str) -> list[str]:
    """The repository paths named in code spans, relative to the repository root."""
    paths = []
    for span in CODE_SPAN.findall(text):
        words = span.split()
        if not words or any(c in span for c in "*<{"):
            continue  # a glob or a placeholder names no one file
        word = words[0].removeprefix("./")  # a command's first word may be a script
        if word.startswith(REPO_PREFIXES):
            paths.append(strip_location(word))
    return paths


def link_paths(text: str) -> list[str]:
    """The local targets of markdown links, relative to the file that holds them."""
    paths = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL, or an anchor on the same page
        paths.append(strip_location(target))
    return paths


@pytest.mark.parametrize("doc", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_named_exists(doc: Path) -> None:
    text = prose(doc)
    named = [(p, ROOT / p) for p in span_paths(text)]
    named += [(p, doc.parent / p) for p in link_paths(text)]
    missing = sorted({p for p, full in named if not full.exists()})
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"


def test_the_paths_found_include_spans_links_and_commands() -> None:
    # The checks above pass vacuously if the patterns stop matching, so pin them on a sample.
    text = (
        "see `tuner/cli.py:12`, `./scripts/test.sh tests/unit -q`, `conf/*.yaml`, "
        "`studies/<name>/`, `tuner run`, [arch](architecture.md#seams), [web](https://x.org)"
    )
    assert span_paths(text) == ["tuner/cli.py", "scripts/test.sh"]
    assert link_paths(text) == ["architecture.md"]


def test_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_README_LINES, (
        f"README.md has {lines} lines (at most {MAX_README_LINES}): move detail to docs/"
    )


def nav_pages(nav: object) -> list[str]:
    """Every page a MkDocs nav names, however deep its sections nest."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    return []


def test_every_docs_page_is_in_the_nav() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    in_nav = set(nav_pages(config["nav"]))
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert pages - in_nav == set(), "pages missing from mkdocs.yml's nav"
    assert in_nav - pages == set(), "nav entries with no page"
