"""report.html in a real browser: Debian's headless Chromium screenshots the page of a study whose
decision kept the baseline, and of one whose stage was accepted; and reads the page of a study on
two request classes as the browser built it (its DOM).

The screenshot must be a real page of the requested size with the figures in it, and the accepted
change's solid green appears only where a decision accepted one. On mixed traffic the "Request
classes" table holds, per class and side, the numbers the stored trials hold, and the per-class
latency CDFs are on the page, their SLO lines in view. The Pareto figure is in view, its alt
text and caption naming the study's own objectives (a GPU preset's tokens/s per GPU against
tokens/s per user; that its labels never overlap is tests/unit/test_report_pareto.py's check on
the same figure code). scripts/setup.sh installs the browser (as root), so a missing
/usr/bin/chromium fails these tests instead of skipping them.
"""

from __future__ import annotations

import base64
import shutil
import struct
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

from tests.fakes.classes_study import NAME, make_classes_study
from tests.fakes.kept_study import make_kept_study
from tests.fakes.stored_study import make_stored_study
from tests.unit.test_report_pareto import GPU, PER_GPU, PER_USER, make_gpu_study
from tuner.review import class_plots, plots
from tuner.review.classes import COLUMNS, MEASURED, class_names
from tuner.review.render import write_report
from tuner.review.report import FIGURES, build_report
from tuner.review.stored import Review, TrialView, open_review
from tuner.schema import TrialAttr, class_metric_attr

pytestmark = [pytest.mark.integration, pytest.mark.shares_host]

CHROMIUM = Path("/usr/bin/chromium")
WIDTH, HEIGHT = 1400, 2400
PNG = b"\x89PNG\r\n\x1a\n"
FLAGS = [
    "--headless",
    "--no-sandbox",  # root in containers and CI
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def chromium() -> str:
    found = str(CHROMIUM) if CHROMIUM.is_file() else shutil.which("chromium")
    if found is None:
        pytest.fail(
            "Debian's chromium is missing: scripts/setup.sh installs it when run as root "
            "(or: apt-get install -y chromium)"
        )
    return found


def screenshot(page: Path, shot: Path, profile: Path, height: int = HEIGHT) -> bytes:
    cmd = [
        chromium(),
        *FLAGS,
        f"--user-data-dir={profile}",
        f"--screenshot={shot}",
        f"--window-size={WIDTH},{height}",
        page.as_uri(),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    return shot.read_bytes()


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from the PNG's IHDR chunk."""
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


def green_pixels(shot: Path) -> int:
    """Pixels of the accepted change's solid green (the improvement figure's accepted bar)."""
    rgb = (matplotlib.image.imread(shot)[..., :3] * 255).astype(int)
    target = np.array([int(plots.ACCEPTED_GREEN[i : i + 2], 16) for i in (1, 3, 5)])
    return int((np.abs(rgb - target).max(axis=2) <= 8).sum())


def rendered(studies: Path, name: str, out: Path) -> Path:
    """report.html of study ``name`` and its screenshot (checked to be a real page)."""
    report = build_report(open_review(name, studies_dir=studies))
    page = write_report(report, out)[-1]
    shot = out / "report-screenshot.png"
    data = screenshot(page, shot, out / "chromium-profile")
    assert data.startswith(PNG) and png_size(data) == (WIDTH, HEIGHT)
    grey = matplotlib.image.imread(shot)[..., :3].mean(axis=2)
    assert (grey < 0.9).mean() > 0.03, "the page is (nearly) blank"
    assert len(np.unique((grey * 64).astype(int))) > 20, "no figure was drawn"
    return shot


def test_the_browser_shows_a_kept_baseline_as_kept_and_an_accepted_stage_as_accepted(
    tmp_path: Path,
) -> None:
    studies = tmp_path / "studies"
    make_kept_study(studies)
    make_stored_study(studies)
    kept = rendered(studies, "kept", tmp_path / "kept")
    accepted = rendered(studies, "demo", tmp_path / "demo")
    assert green_pixels(kept) == 0  # no improvement drawn where the decision kept the baseline
    assert green_pixels(accepted) > 2000  # the accepted stage's confirmed gain, solid


# -- mixed traffic: the "Request classes" table and the per-class latency CDFs ---------------

TALL = 7000  # a window the whole page of the two-class study fits in, figures and all


def dump_dom(page: Path, profile: Path) -> str:
    """The page's DOM as Chromium built it (after parsing, as a reader's browser shows it)."""
    cmd = [chromium(), *FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.as_uri()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0 and "</html>" in done.stdout, done.stderr[-2000:]
    return done.stdout


class PageParts(HTMLParser):
    """The first table under each heading (by its h2 id), cell by cell, and each figure's images."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.images: dict[str, list[str]] = {}  # figure id -> its <img> sources
        self._section = self._figure = ""
        self._rows: list[list[str]] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "h2":
            self._section = found.get("id") or ""
        elif tag == "figure":
            self._figure = found.get("id") or ""
        elif tag == "img" and self._figure:
            self.images.setdefault(self._figure, []).append(found.get("src") or "")
        elif tag == "table" and self._section not in self.tables:
            self._rows = self.tables.setdefault(self._section, [])
        elif tag == "tr" and self._rows is not None:
            self._rows.append([])
        elif tag in ("td", "th") and self._rows is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._rows is not None and self._cell is not None:
            self._rows[-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "table":
            self._rows = None
        elif tag == "figure":
            self._figure = ""

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def _shown(values: list[float]) -> str:
    """A mean as the page writes it (.4g), blank where no window measured it."""
    return f"{sum(values) / len(values):.4g}" if values else ""


def expected_rows(review: Review) -> dict[tuple[str, str], list[str]]:
    """Per class and side, what the stored trials hold: the mean of each window's measurement
    of that class, over the baseline's windows and over the hand-over's own ones."""
    chosen = review.choice().params
    handover = [
        v for v in [*review.search_trials(), *review.confirm_trials()] if v.params == chosen
    ]
    sides: dict[str, list[TrialView]] = {"baseline": review.baseline_windows, "hand-over": handover}
    rows = {}
    for name in class_names(review):
        for side, views in sides.items():
            own = [v for v in views if v.measured and TrialAttr.REUSED_FROM not in v.attrs]
            means = [
                _shown(
                    [
                        float(v.attrs[a])
                        for v in own
                        if (a := class_metric_attr(name, key)) in v.attrs
                    ]
                )
                for _, key in MEASURED
            ]
            rows[name, side] = [str(len(own)), *means]
    return rows


def slo_red_pixels(shot: Path) -> int:
    """Pixels of a class SLO's limit line (the per-class CDFs' dashed red)."""
    rgb = (matplotlib.image.imread(shot)[..., :3] * 255).astype(int)
    target = np.array([int(class_plots.SLO_RED[i : i + 2], 16) for i in (1, 3, 5)])
    return int((np.abs(rgb - target).max(axis=2) <= 8).sum())


def test_the_browser_shows_each_class_s_rows_and_its_latency_cdfs(tmp_path: Path) -> None:
    studies = tmp_path / "studies"
    make_classes_study(studies)
    make_stored_study(studies)  # one class: no per-class figure
    out = tmp_path / "mixed"
    rendered(studies, NAME, out)  # a real page of the requested size, figures drawn
    page = out / "report.html"
    parts = PageParts()
    parts.feed(dump_dom(page, tmp_path / "dom-profile"))

    # (a) the table: a row per class and side with the stored numbers
    header, *body = parts.tables["classes"]
    assert header == COLUMNS
    rows = {(r[0], r[1]): r[2:-1] for r in body}
    expected = expected_rows(open_review(NAME, studies_dir=studies))
    assert set(rows) == {(c, s) for c in ("chat", "documents") for s in ("baseline", "hand-over")}
    assert rows == expected
    slos = {r[0]: r[-1] for r in body}
    assert slos == {"chat": "p99_ttft_s <= 0.5", "documents": "p99_e2e_s <= 8"}

    # (b) the figure: its <img> is in the DOM, the PNG written beside the page
    (src,) = parts.images["class_latency_cdf"]
    prefix = "data:image/png;base64,"
    assert src.startswith(prefix)
    assert base64.b64decode(src[len(prefix) :]) == (out / "class_latency_cdf.png").read_bytes()
    assert list(parts.images) == [n for n in FIGURES if n in parts.images]  # the page's order
    # and in view: the whole page in a tall window shows the classes' SLO lines, solid
    tall = out / "report-tall.png"
    screenshot(page, tall, tmp_path / "tall-profile", TALL)
    assert slo_red_pixels(tall) > 300
    single = build_report(open_review("demo", studies_dir=studies))
    assert "class_latency_cdf" not in single.figures
    one = write_report(single, tmp_path / "demo")[-1]
    screenshot(one, tmp_path / "demo-tall.png", tmp_path / "demo-profile", TALL)
    assert slo_red_pixels(tmp_path / "demo-tall.png") == 0  # that red is the class figure's


# -- the Pareto figure names the study's own objectives ----------------------------------------


class FigureWords(HTMLParser):
    """Each figure's <img> alt text and its caption's text, by figure id."""

    def __init__(self) -> None:
        super().__init__()
        self.alts: dict[str, str] = {}
        self.captions: dict[str, str] = {}
        self._figure = ""
        self._caption: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "figure":
            self._figure = found.get("id") or ""
        elif tag == "img" and self._figure:
            self.alts[self._figure] = found.get("alt") or ""
        elif tag == "figcaption" and self._figure:
            self._caption = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "figcaption" and self._caption is not None:
            self.captions[self._figure] = "".join(self._caption).strip()
            self._caption = None
        elif tag == "figure":
            self._figure = ""

    def handle_data(self, data: str) -> None:
        if self._caption is not None:
            self._caption.append(data)


def front_pixels(shot: Path) -> int:
    """Pixels of the Pareto front's crimson line and rings (no other figure draws crimson)."""
    rgb = (matplotlib.image.imread(shot)[..., :3] * 255).astype(int)
    target = np.array([0xDC, 0x14, 0x3C])  # matplotlib's "crimson", pareto.FRONT_STYLE
    return int((np.abs(rgb - target).max(axis=2) <= 8).sum())


def test_the_browser_shows_the_pareto_figure_of_the_study_s_own_objectives(
    tmp_path: Path,
) -> None:
    studies = tmp_path / "studies"
    make_gpu_study(studies)
    make_stored_study(studies)
    pages = {
        GPU: (PER_GPU, PER_USER),  # tokens/s per GPU against tokens/s per user
        "demo": ("p99_e2e_latency", "output_throughput"),  # the CPU default's pair
    }
    for name, (up, across) in pages.items():
        out = tmp_path / name
        shot = rendered(studies, name, out)  # a real page of the requested size
        assert front_pixels(shot) > 100, f"{name}: the Pareto front is not in view"
        dom = dump_dom(out / "report.html", tmp_path / f"{name}-profile")
        parts, words = PageParts(), FigureWords()
        parts.feed(dom)
        words.feed(dom)
        (src,) = parts.images["pareto"]  # the figure the page embeds is pareto.png
        prefix = "data:image/png;base64,"
        assert base64.b64decode(src[len(prefix) :]) == (out / "pareto.png").read_bytes()
        for shown in (words.alts["pareto"], words.captions["pareto"]):
            assert shown.startswith(f"Pareto front: {up} (")
            assert f" against {across} (" in shown
        assert words.captions["pareto"].endswith("(pareto.png)")
    # the GPU preset's caption names no objective the study does not optimise
    gpu_words = FigureWords()
    gpu_words.feed((tmp_path / GPU / "report.html").read_text(encoding="utf-8"))
    assert "p99_e2e_latency" not in gpu_words.captions["pareto"]
    assert "cost" not in gpu_words.captions["pareto"]
