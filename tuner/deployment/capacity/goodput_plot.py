"""The goodput curve of a capacity search: what the server completed within the SLOs at each
offered rate, with the rate found and its uncertainty band."""

from __future__ import annotations

import math
from pathlib import Path

from tuner.errors import ArtifactError
from tuner.plan.sizing import CapacityRecord


def write_goodput_png(record: CapacityRecord, path: Path, simulated: str | None = None) -> None:
    """The curve; a rehearsal's (``simulated``: its study's stamp) is titled SIMULATED, since a
    figure is quoted without the text around it."""
    import matplotlib

    matplotlib.use("Agg")  # no display: capacity runs on servers
    import matplotlib.pyplot as plt

    steps = sorted(record.steps, key=lambda s: s.offered_rps)
    offered = [s.offered_rps for s in steps]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    top = max(offered, default=1.0)
    ax.plot([0, top], [0, top], color="0.8", lw=1, label="offered = served")
    ax.plot(offered, [s.throughput_rps for s in steps], "o-", color="0.5", ms=4, label="completed")
    ax.plot(offered, [s.goodput_rps for s in steps], "o-", color="tab:blue", label="goodput")
    misses = [s for s in steps if not s.meets]
    ax.scatter(
        [s.offered_rps for s in misses],
        [s.goodput_rps for s in misses],
        marker="x",
        color="tab:red",
        zorder=3,
        s=50,
        label="misses an SLO",
    )
    if record.max_rps > 0:
        upper = record.upper_rps if math.isfinite(record.upper_rps) else record.max_rps
        ax.axvspan(record.max_rps, upper, color="tab:green", alpha=0.15)
        ax.axvline(
            record.max_rps, color="tab:green", lw=1.5, label=f"capacity {record.max_rps:.3g} req/s"
        )
    ax.set_xlabel("offered rate (req/s, open loop)")
    ax.set_ylabel("req/s")
    title = f"{record.study}: {record.choice}"
    ax.set_title(f"SIMULATED rehearsal: {title}" if simulated else title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise ArtifactError(f"cannot write {path}: {exc.strerror or exc}") from exc
    finally:
        plt.close(fig)
