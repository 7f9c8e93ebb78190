"""report.html in a real browser: Debian's headless Chromium screenshots the page of a study whose
decision kept the baseline, and of one whose stage was accepted.

The screenshot must be a real page of the requested size with the figures in it, and the accepted
change's solid green appears only where a decision accepted one. scripts/setup.sh installs the
browser (as root), so a missing /usr/bin/chromium fails this test instead of skipping it.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

from tests.fakes.kept_study import make_kept_study
from tests.fakes.stored_study import make_stored_study
from tuner.review import plots
from tuner.review.render import write_report
from tuner.review.report import build_report
from tuner.review.stored import open_review

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


def screenshot(page: Path, shot: Path, profile: Path) -> bytes:
    cmd = [
        chromium(),
        *FLAGS,
        f"--user-data-dir={profile}",
        f"--screenshot={shot}",
        f"--window-size={WIDTH},{HEIGHT}",
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
