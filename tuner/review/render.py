"""The words of a report: terminal summary, report.html and the dashboard's study note.

All three render a :class:`~tuner.review.report.Report` (tables + PNG figures); none reads storage.
"""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path
from typing import Any

import pandas as pd

from tuner.errors import ArtifactError
from tuner.redact import Redactor
from tuner.review.diagnosis import RULE_MEANINGS
from tuner.review.report import Report, build_report
from tuner.review.report_tables import SearchWindow, StageOutcome, slos_frame
from tuner.review.slos import COLUMNS, HandoverSlos
from tuner.review.stored import open_review, study_redactor

FIGURE_TITLES = {
    # where no pair of objectives is drawn; a drawn figure's caption names the study's own
    # objectives on its axes (ParetoData.caption, figure_title)
    "pareto": "Pareto front of the study's first two objectives: the search windows (one each, "
    "not confirmed) against the baseline's mean (grey = infeasible); a study of one objective "
    "has no front to draw",
    "improvement": "Per stage: the decision on the confirmation rounds' means with its noise "
    "band (solid = accepted), and the winner's search window against the baseline's mean "
    "(hollow = not confirmed)",
    "latency_cdf": "Latency CDFs: the baseline over all its windows vs the chosen configuration "
    "over its search window and confirmation rounds (with no stage accepted: the best search "
    "window, not confirmed)",
    "class_latency_cdf": "Latency CDFs per request class: the same two sides on each class's "
    "own requests, of the metric the class's SLO bounds (no class SLO: end-to-end latency and "
    "TTFT); dashed red: the class's SLO limit, dotted: the P99 level",
    "importances": "Parameter importances",
}
SUMMARY_COLS = ["label", "role", "status", "feasible", "pareto", "bottleneck"]
HIT_RATE = "prefix_cache_hit_rate"
SPEC_RATE = "spec_decode_acceptance_rate"


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _pct(value: Any) -> str:
    return "" if value is None or pd.isna(value) else f" ({value:+.1f}%)"


def _baseline_line(report: Report) -> str:
    r = report.review
    windows = r.baseline_windows
    if not windows:
        return "baseline not found"
    means = ", ".join(f"{n} {_fmt(r.baseline_mean(n))}" for n in r.objectives)
    labels = ", ".join(v.label for v in windows)
    return f"baseline: mean of {len(windows)} window(s) ({labels}): {means}"


def _search_text(window: SearchWindow | None, objectives: list[str]) -> str:
    if window is None:
        return "no feasible search window"
    values = ", ".join(
        f"{n} {_fmt(window.values.get(n))}{_pct(window.vs_baseline_pct.get(n))}" for n in objectives
    )
    return f"search window {window.label} (one window, not confirmed) vs baseline mean: {values}"


def stage_line(outcome: StageOutcome, objectives: list[str]) -> str:
    """The stage's decision (confirmation means, needed gain, verdict), then its search window."""
    d = outcome.decision
    decided = d.line() if d is not None else f"stage {outcome.stage}: not decided yet"
    return f"{decided}; {_search_text(outcome.winner, objectives)}"


def headline(report: Report) -> list[str]:
    """Baseline mean, per-stage decisions and the best config, in a few lines."""
    r = report.review
    lines = [r.simulated] if r.simulated else []
    lines.append(f"study {r.name} (storage {r.storage_shown}), selection by {r.select_by}")
    lines.append(_baseline_line(report))
    lines += [stage_line(o, r.objectives) for o in report.outcomes]
    choice = r.choice()
    lines.append(f"best config: {choice.label}: {choice.params or '(fixed args only)'}")
    lines.append(report.slos.line())
    return lines


def summary_text(report: Report) -> str:
    """The terminal summary of `tuner report`."""
    t = report.trials
    lines = headline(report)
    if not t.empty:
        objectives = [n for n in report.review.objectives if n in t]
        table = t[SUMMARY_COLS + objectives]
        lines += ["", table.to_string(index=False, float_format=lambda v: f"{v:.4g}")]
        counts = t["bottleneck"].value_counts()
        lines.append("bottlenecks: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    if not report.classes.empty:
        lines += ["", "request classes (baseline against the hand-over):"]
        lines.append(report.classes.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    for _, f in report.failures.iterrows():
        lines.append(f"failed {f['label']}: {f['failure_reason']}: {f['failure_message'][:160]}")
    if report.estimates is not None:
        lines += ["", *report.estimates.lines()]
    return "\n".join(lines)


def note_markdown(report: Report) -> str:
    """The study note shown in optuna-dashboard: baseline, decisions, best config, bottlenecks."""
    r = report.review
    out = [f"## tuner study `{r.name}`", ""]
    out += [f"- {line}" for line in headline(report)]
    out += _slos_markdown(report.slos)
    out += _classes_markdown(report.classes)
    t = report.trials
    if not t.empty:
        out += [
            "",
            "### Trials",
            "",
            "| trial | role | status | bottleneck | evidence |",
            "|---|---|---|---|---|",
        ]
        out += [
            f"| {row.label} | {row.role} | {row.status} | {row.bottleneck} | "
            f"{row.bottleneck_evidence or row.failure_reason} |"
            for row in t.itertuples()
        ]
    out += [
        "",
        "Artifacts (server log, requests, Locust HTML/CSV, telemetry) are attached to "
        "each measured trial. `tuner report` and `tuner export` give the rest.",
    ]
    return "\n".join(out) + "\n"


def _slos_markdown(slos: HandoverSlos) -> list[str]:
    """The note's table "SLOs of the hand-over", its verdict in words above it."""
    verdict = slos.verdict() if slos.all_met else f"**{slos.verdict()}**"
    out = ["", "### SLOs of the hand-over", "", verdict]
    frame = slos_frame(slos)
    if frame.empty:
        return out
    out += ["", f"| {' | '.join(COLUMNS)} |", "|" + "---|" * len(COLUMNS)]
    out += [f"| {' | '.join(str(cell) for cell in r)} |" for r in frame.itertuples(index=False)]
    return out


def _classes_markdown(frame: pd.DataFrame) -> list[str]:
    """The note's table "Request classes" (none for a one-class workload)."""
    if frame.empty:
        return []
    out = ["", "### Request classes", "", CLASSES_TEXT, ""]
    out += [f"| {' | '.join(frame.columns)} |", "|" + "---|" * len(frame.columns)]
    out += [f"| {' | '.join(_cell(x) for x in r)} |" for r in frame.itertuples(index=False)]
    return out


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):  # None or NaN
        return ""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


CLASSES_TEXT = (
    "Each class's own P99s, output rate and errors, the mean over the windows that measured "
    "that configuration, beside the class's own SLOs: a gain in the totals may be one class's "
    "latency traded for another's throughput."
)


def _classes_html(frame: pd.DataFrame) -> str:
    if frame.empty:
        return ""
    return (
        f"<h2 id='classes'>Request classes</h2><p>{html.escape(CLASSES_TEXT)}</p>"
        f"<div class='scroll'>{_table(frame)}</div>"
    )


def _table(frame: pd.DataFrame) -> str:
    if frame.empty:
        return "<p class='muted'>none</p>"
    return frame.to_html(
        index=False, na_rep="", float_format=lambda v: f"{v:.4g}", classes="grid", border=0
    )


def figure_title(report: Report, name: str) -> str:
    """A figure's caption: the Pareto figure's names the objectives on its axes."""
    drawn = report.data.pareto.caption if report.data is not None and name == "pareto" else None
    return drawn or FIGURE_TITLES.get(name, name)


def _figure(name: str, data: bytes, caption: str) -> str:
    encoded = base64.b64encode(data).decode("ascii")
    title = html.escape(caption)
    return (
        f"<figure id='{name}'><img alt='{title}' src='data:image/png;base64,{encoded}'>"
        f"<figcaption>{title} ({name}.png)</figcaption></figure>"
    )


def _legend() -> str:
    items = "".join(
        f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>" for k, v in RULE_MEANINGS.items()
    )
    return f"<ul class='legend'>{items}</ul>"


STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
h1{font-size:1.5em} h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table.grid{border-collapse:collapse;font-size:12px} .grid td,.grid th{border:1px solid #ddd;
padding:3px 6px;text-align:right} .grid th{background:#f4f4f4} .muted{color:#888}
figure{margin:1em 0} img{max-width:100%;border:1px solid #eee} .scroll{overflow-x:auto}
ul.summary li{margin:.2em 0} ul.legend{font-size:13px}
"""


SLOS_NOTE = (
    "<p>Each SLO as the study judged it: <b>margin</b>, how far under its limit the mean of "
    "the windows is (negative: over it); <b>confidence</b>, how sure those windows are that it "
    "is met, their spread pooled over every configuration measured more than once. "
    "<b>met</b>: at the confidence asked (study.slo_confidence); <b>MISSED</b>: over it at that "
    "confidence; <b>UNDECIDED</b>: the windows cannot tell, and the configuration is not handed "
    "over as meeting it until more windows decide.</p>"
)
BASELINE_NOTE = (
    "<p>Every comparison with the baseline uses its mean over all its measured windows: one "
    "window can sit far from the configuration's level on a shared machine.</p>"
)
STAGES_NOTE = (
    "<p><b>accepted</b>, <b>decision</b>: the stage's verdict. <b>incumbent_mean</b>, "
    "<b>candidate_mean</b>, <b>gain</b>: the confirmation rounds' means it compared "
    "(<b>windows</b>: incumbent+candidate); <b>needed_gain</b>: its noise band, the gain it had "
    "to exceed. <b>*_search</b> columns: the stage winner's one search window against the "
    "baseline's mean (<i>not confirmed</i>). A repeated proposal answered with a stored "
    "measurement counts as <b>reused</b>, not as a trial.</p>"
)


def html_page(report: Report) -> str:
    """report.html: summary, figures (embedded PNGs) and tables."""
    t = report.trials
    objectives = [n for n in report.review.objectives if n in t]
    # vLLM's prefix-cache hit rate, where any trial's server looked a prefix up: what the
    # memory stage's prefix caching is judged on, beside its objectives
    # and, where any trial decoded speculatively, the share of proposed tokens vLLM accepted
    hits = [c for c in (HIT_RATE, SPEC_RATE) if c in t and t[c].notna().any()]
    overview = t[[*SUMMARY_COLS, *objectives, *hits, "bottleneck_evidence"]] if not t.empty else t
    summary = "".join(f"<li>{html.escape(line)}</li>" for line in headline(report))
    figures = "".join(_figure(n, d, figure_title(report, n)) for n, d in report.figures.items())
    stamp = report.review.simulated
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>tuner report: {html.escape(report.review.name)}</title>"
        f"<style>{STYLE}</style></head><body>"
        + (f"<p class='simulated'><b>{html.escape(stamp)}</b></p>" if stamp else "")
        + f"<h1>tuner report: {html.escape(report.review.name)}</h1>"
        f"<ul class='summary'>{summary}</ul>"
        f"{_slos_html(report.slos)}"
        f"{_classes_html(report.classes)}"
        f"<h2>Figures</h2>{figures}"
        f"<h2>Baseline: mean of its windows</h2>{BASELINE_NOTE}"
        f"<div class='scroll'>{_table(report.baseline)}</div>"
        f"<h2>Stages</h2>{STAGES_NOTE}<div class='scroll'>{_table(report.stages)}</div>"
        f"<h2>Trials and bottlenecks</h2><div class='scroll'>{_table(overview)}</div>"
        f"{_legend()}"
        f"<h2 id='failures'>Failures</h2><div class='scroll'>{_table(report.failures)}</div>"
        f"{_estimates(report)}"
        "<h2>All trials</h2><p>Every column of every trial: trials.csv, trials.parquet.</p>"
        "</body></html>\n"
    )


def _slos_html(slos: HandoverSlos) -> str:
    """The page's table "SLOs of the hand-over", its verdict in words (bold unless all met)."""
    verdict = html.escape(slos.verdict())
    shown = verdict if slos.all_met else f"<b>{verdict}</b>"
    return (
        f"<h2 id='slos'>SLOs of the hand-over</h2><p>{shown}</p>{SLOS_NOTE}"
        f"<div class='scroll'>{_table(slos_frame(slos))}</div>"
    )


ESTIMATES_NOTE = (
    "<p>The plan's estimate (study.prescreen) beside the measurement of every launched point: "
    "Spearman's rho says whether the estimator orders configurations as this hardware does, "
    "the measured/estimated ratio how far off its absolute values are. Estimates order and "
    "screen candidates; only measurements decide.</p>"
)


def _estimates(report: Report) -> str:
    """The estimate-vs-measurement section; nothing for a study run without the plan."""
    check = report.estimates
    if check is None:
        return ""
    lines = "".join(f"<li>{html.escape(line)}</li>" for line in check.lines())
    return (
        f"<h2 id='estimates'>Estimate vs measurement</h2>{ESTIMATES_NOTE}"
        f"<ul class='summary'>{lines}</ul><div class='scroll'>{_table(check.points)}</div>"
    )


def _redacted(frame: pd.DataFrame, redactor: Redactor) -> pd.DataFrame:
    out = frame.copy()
    for col in out.columns:
        if out[col].dtype == object:
            out[col] = out[col].map(lambda v: redactor.text(v) if isinstance(v, str) else v)
    return out


def _parquet_ready(frame: pd.DataFrame) -> pd.DataFrame:
    """Mixed-type object columns (a categorical param of str and int) as strings for Arrow."""
    out = frame.copy()
    for col in out.columns:
        if out[col].dtype == object:
            kinds = {type(v) for v in out[col].dropna()}
            if len(kinds) > 1:
                out[col] = out[col].map(lambda v: None if v is None else str(v))
    return out


def write_report(report: Report, out_dir: Path | None = None) -> list[Path]:
    """report.html, <figure>.png, trials.csv and trials.parquet under ``out_dir``."""
    folder = out_dir or report.review.paths.report_dir
    redactor = study_redactor(report.review)
    report.trials = _redacted(report.trials, redactor)
    report.failures = _redacted(report.failures, redactor)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        written = []
        for name, data in report.figures.items():
            written.append(folder / f"{name}.png")
            written[-1].write_bytes(data)
        written.append(folder / "trials.csv")
        report.trials.to_csv(written[-1], index=False)
        written.append(folder / "trials.parquet")
        _parquet_ready(report.trials).to_parquet(written[-1], index=False)
        written.append(folder / "report.html")
        written[-1].write_text(redactor.text(html_page(report)), encoding="utf-8")
    except OSError as exc:
        raise ArtifactError(f"cannot write the report to {folder}: {exc.strerror}") from exc
    return written


def report_command(
    name: str, storage: str | None, studies_dir: Path, out_dir: Path | None = None
) -> int:
    """`tuner report`: print the summary, write report.html, PNGs, CSV and Parquet."""
    review = open_review(name, storage, studies_dir)
    report = build_report(review)
    written = write_report(report, out_dir)
    print(study_redactor(review).text(summary_text(report)))
    print(f"\nreport: {written[-1]}\nfigures and tables: {written[0].parent}")
    return 0
