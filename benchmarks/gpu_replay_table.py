"""The GPU replays against the acceptance bar, in one table.

Gathers every ``replay.json`` that benchmarks.gpu_replay wrote under
``results/search_efficiency/gpu/``: one row per (landscape, SLO level, noise CV) cell, one
column per strategy. A strategy's cell reads, from its summary line:

- seeds whose hand-over reached >= 97 % of the best (``reached_97``),
- median launches as % of the grid's launches (``median_launches`` over the grid's size),
- hand-overs truly infeasible (seeds less ``final_feasible``),
- hand-overs worse than vLLM's defaults (``worse_than_defaults``).

The bar: >= 19/20 seeds reach 97 %, <= 5 % of the grid's launches, 0 infeasible and 0 worse
than the defaults. A cell that misses it says by how much, so a table of misses reads as the
distance left, not only as a fail.

    .venv/bin/python -m benchmarks.gpu_replay_table        # the slo_p<level> folders
    .venv/bin/python -m benchmarks.gpu_replay_table --all  # also the median and prescreen ones

prints the table and writes it to ``results/search_efficiency/gpu/table.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import estimated
from benchmarks.gpu_replay import SLO_FOLDER
from benchmarks.layout import results

REACH_SHARE = 0.95  # 19 of 20 seeds
MAX_LAUNCH_PCT = 5.0  # of the grid's launches
LEGEND = (
    "Each strategy's cell: seeds that reached >= 97 % of the best · median launches as % of "
    "the grid's · hand-overs truly infeasible (of them, those the study claimed met every SLO "
    "with its confidence; the rest it handed over as NOT FEASIBLE or UNDECIDED) · hand-overs "
    "worse than vLLM's defaults; `ok` "
    "where it meets the bar (>= 19/20, <= 5 %, 0, 0), else what it misses by: seeds short of "
    "19/20 (reach -k), points of the grid's launches over 5 % (launches +x pts), infeasible "
    "and worse hand-overs over 0 (infeasible +k, worse +k). "
    "(est.): an estimated landscape (benchmarks.estimated), the others silicon tables."
)


@dataclass(frozen=True)
class Cell:
    """One replay: a landscape (with its variant folder, e.g. prescreen_3) at one SLO and CV."""

    landscape: str
    level: float | None  # the SLO percentile; None: SLOs given by hand (--slo-ttft/--slo-tpot)
    cv: float
    grid_size: int
    summary: list[dict[str, Any]]
    leveled: bool = True  # in a slo_p<level> folder (else the layout before the levels)


@dataclass(frozen=True)
class Verdict:
    """A strategy's four figures in one cell."""

    reached: int
    seeds: int
    launch_pct: float
    infeasible: int
    worse: int
    # of the infeasible hand-overs, those the study claimed met every SLO with its confidence:
    # the others it handed over saying NOT FEASIBLE or UNDECIDED
    claimed: int = 0


# ---- gathering -------------------------------------------------------------------------------
def gather(root: Path, everything: bool = False) -> list[Cell]:
    """Every cell under ``root``, by landscape, SLO level and CV. Without ``everything`` only
    the slo_p<level> folders: the folders of the layout before the levels repeat the median's
    (slo_p50) and the prescreen ones ask another question (a pre-screened staged search)."""
    cells = [c for p in root.rglob("replay.json") if (c := read_cell(root, p, everything))]
    return sorted(cells, key=lambda c: (c.landscape, -1.0 if c.level is None else c.level, c.cv))


def read_cell(root: Path, path: Path, everything: bool) -> Cell | None:
    """``<landscape>[/<variant>]/slo_p<level>/cv_<cv>/replay.json``, or without the level
    folder (the median, or the level the replay recorded) when ``everything``."""
    parts = path.parent.relative_to(root).parts
    if len(parts) < 2 or not parts[-1].startswith("cv_"):
        return None
    leveled = parts[-2].startswith(SLO_FOLDER)
    if not (leveled or everything):
        return None
    data = json.loads(path.read_text())
    ref = data["reference"]
    if leveled:
        level: float | None = float(parts[-2].removeprefix(SLO_FOLDER))
    else:  # replays before the levels recorded none: they ran at the median
        level = ref.get("slo_level", 50.0)
    name = "/".join(parts[:-2] if leveled else parts[:-1])
    return Cell(name, level, float(ref["cv"]), int(ref["grid_size"]), data["summary"], leveled)


# ---- one strategy's cell ---------------------------------------------------------------------
def count(fraction: str) -> tuple[int, int]:
    """ "k/n" (the summary's counts) as (k, n)."""
    k, n = fraction.split("/")
    return int(k), int(n)


def verdict(line: dict[str, Any], grid_size: int) -> Verdict:
    reached, seeds = count(line["reached_97"])
    feasible, _ = count(line["final_feasible"])
    worse, _ = count(line["worse_than_defaults"])
    pct = 100.0 * float(line["median_launches"]) / grid_size
    return Verdict(reached, seeds, pct, seeds - feasible, worse, false_claims(line))


def false_claims(line: dict[str, Any]) -> int:
    """Hand-overs claimed met but truly infeasible, from benchmarks.gpu_scoring.edge_flags
    ("a/b infeasible, c/d feasible": b of them); 0 for an arm that claims nothing."""
    flags = str(line.get("edge_flags") or "-")
    if flags == "-":
        return 0
    return count(flags.split(" infeasible", 1)[0])[1]


def shortfalls(v: Verdict) -> list[str]:
    """What the strategy misses the bar by; empty when it meets it."""
    need = math.ceil(REACH_SHARE * v.seeds - 1e-9)  # 19 of 20; of fewer seeds, as many in %
    out = []
    if v.reached < need:
        out.append(f"reach -{need - v.reached}")
    if v.launch_pct > MAX_LAUNCH_PCT + 1e-9:
        out.append(f"launches +{v.launch_pct - MAX_LAUNCH_PCT:.1f} pts")
    if v.infeasible:
        out.append(f"infeasible +{v.infeasible}")
    if v.worse:
        out.append(f"worse +{v.worse}")
    return out


def cell_text(v: Verdict) -> str:
    n = v.seeds
    claimed = f" ({v.claimed} claimed met)" if v.claimed else ""
    infeasible = f"{v.infeasible}/{n}{claimed}"
    figures = f"{v.reached}/{n} · {v.launch_pct:.1f} % · {infeasible} · {v.worse}/{n}"
    misses = shortfalls(v)
    return f"{figures} ok" if not misses else f"{figures} **misses** {', '.join(misses)}"


# ---- the table -------------------------------------------------------------------------------
def strategies_of(cells: Sequence[Cell]) -> list[str]:
    """Every strategy of any cell, in the order the replays ran them."""
    return list(dict.fromkeys(line["strategy"] for c in cells for line in c.summary))


def label(landscape: str) -> str:
    return f"{landscape} (est.)" if landscape.split("/")[0] in estimated.SYSTEMS else landscape


def level_text(c: Cell) -> str:
    """p<level>; a folder of the layout before the levels: "median" (or "given"), so that it
    reads apart from the slo_p50 beside it."""
    if c.level is None:
        return "given"
    return f"p{c.level:g}" if c.leveled else f"median (p{c.level:g})"


def table(cells: Sequence[Cell]) -> str:
    """One row per cell, one column per strategy ("-": the replay did not run that arm)."""
    names = strategies_of(cells)
    lines = [
        "| " + " | ".join(["landscape", "SLO", "CV", *names]) + " |",
        "|" + "---|" * (3 + len(names)),
    ]
    for c in cells:
        by_name = {line["strategy"]: verdict(line, c.grid_size) for line in c.summary}
        row = [label(c.landscape), level_text(c), f"{c.cv:g}"]
        row += [cell_text(by_name[n]) if n in by_name else "-" for n in names]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    root = results("search_efficiency", "gpu")
    p.add_argument("--root", type=Path, default=root, help="where gpu_replay wrote")
    p.add_argument("--out", type=Path, default=None, help="default: <root>/table.md")
    p.add_argument(
        "--all",
        action="store_true",
        help="also the folders without an SLO level (the median's, the prescreen replays')",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    cells = gather(args.root, args.all)
    if not cells:
        raise SystemExit(f"no replay.json under {args.root} (--slo-levels folders; --all: any)")
    text = LEGEND + "\n\n" + table(cells) + "\n"
    out = args.out or args.root / "table.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
