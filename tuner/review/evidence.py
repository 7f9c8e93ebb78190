"""The evidence behind an exported configuration: what was measured, against what, where, when.

Every export carries it: in full as ``evidence.json``, and as a few summary lines at the top of
each file (comments, or annotations in Kubernetes). Everything comes from the storage: the
trial's flat measurements (``m_*`` user attrs), the baseline, the stage decision, and the
baseline study's fingerprint (SLO, workload, hardware, vLLM version). Its ``slos`` block is what
the configuration claims of each SLO and how sure its windows are (tuner/review/slos.py): a
hand-over met only on the mean of a few windows may well miss the SLO in production.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from tuner.config import CheckConfig, ServerConfig
from tuner.review.diagnosis import diagnose
from tuner.review.slos import HandoverSlos, handover_slos, summary_line
from tuner.review.stored import Choice, Review, TrialView
from tuner.schema import Role
from tuner.search.launch import LaunchSpec
from tuner.search.resolved import resolve
from tuner.study.decision.noise import NoiseEstimate

LATENCIES = ("ttft", "tpot", "itl", "e2e")
STATS = ("p50", "p90", "p95", "p99", "mean", "max", "n")
SCALARS = {
    "output_throughput_tok_s": "output tokens/s",
    "request_throughput_req_s": "requests/s",
    "goodput_req_s": "goodput requests/s",
    "error_rate": "error rate",
    "completed": "completed requests",
    "window_s": "measurement window (s)",
}
_LATENCY_RE = re.compile(rf"^m_({'|'.join(LATENCIES)})_({'|'.join(STATS)})(?:_s)?$")


@dataclass
class Evidence:
    """``data`` is evidence.json; ``lines`` the short summary that heads every exported file."""

    data: dict[str, Any]
    lines: list[str] = field(default_factory=list)


def latency_table(view: TrialView) -> dict[str, dict[str, float]]:
    """{"e2e": {"p50": s, ..., "n": samples}, ...} from a trial's flat measurements."""
    table: dict[str, dict[str, float]] = {}
    for key in view.attrs:
        match = _LATENCY_RE.match(key)
        number = view.metric(key[2:]) if match else None
        if match and number is not None:
            table.setdefault(match.group(1), {})[match.group(2)] = number
    return {k: dict(sorted(v.items(), key=lambda kv: STATS.index(kv[0]))) for k, v in table.items()}


def measurements(view: TrialView | None) -> dict[str, Any]:
    if view is None:
        return {}
    scalars = {k: view.metric(k) for k in SCALARS if view.metric(k) is not None}
    return {"latency_s": latency_table(view), **scalars}


def objective_values(review: Review, view: TrialView | None) -> dict[str, float | None]:
    return {n: review.value(view, n) for n in review.objectives} if view else {}


def deltas(review: Review, chosen: TrialView | None) -> dict[str, dict[str, Any]]:
    """Objective values and P50/P99 latencies of the choice against the baseline."""
    base = review.baseline
    pairs: dict[str, tuple[float | None, float | None]] = {
        n: (review.value(base, n) if base else None, review.value(chosen, n) if chosen else None)
        for n in review.objectives
    }
    for kind in ("e2e", "ttft", "tpot"):
        for stat in ("p50", "p99"):
            key = f"{kind}_{stat}_s"
            pairs[key] = (
                base.metric(key) if base else None,
                chosen.metric(key) if chosen else None,
            )
    return {k: _delta(b, c) for k, (b, c) in pairs.items()}


def _delta(base: float | None, chosen: float | None) -> dict[str, Any]:
    change = None
    if base is not None and chosen is not None and base != 0:
        change = round(100.0 * (chosen - base) / abs(base), 2)
    return {"baseline": base, "chosen": chosen, "change_pct": change}


def _confirmation(decision: dict[str, Any] | None) -> dict[str, Any] | None:
    if not decision:
        return None
    keys = (
        "objective",
        "accepted",
        "reason",
        "incumbent_values",
        "candidate_values",
        "gain",
        "noise",
        "threshold",
    )
    return {k: decision.get(k) for k in keys}


def build_evidence(review: Review, choice: Choice, now: dt.datetime | None = None) -> Evidence:
    """The evidence of ``choice`` (its own trial, or the baseline when it has none)."""
    view = choice.trial
    fp = review.fingerprint
    diagnosis = diagnose(view.telemetry, view.ok, review.cores) if view else None
    data: dict[str, Any] = {"simulated": review.simulated} if review.simulated else {}
    data |= {
        "study": review.name,
        "storage": review.storage_shown,
        "choice": choice.label,
        "params": choice.params,
        "trial": _trial_ids(view),
        "exported_at": (now or dt.datetime.now(dt.UTC)).isoformat(timespec="seconds"),
        "objectives": objective_values(review, view),
        "measurements": measurements(view),
        "baseline": {
            "trial": _trial_ids(review.baseline),
            "measurements": measurements(review.baseline),
        },
        "delta_vs_baseline": deltas(review, view),
        "confirmation": _confirmation(choice.decision),
        "bottleneck": diagnosis.line() if diagnosis else None,
        "slo": fp.get("slo"),
        "slos": handover_slos(review, choice.params).to_dict(),
        "workload": fp.get("workload"),
        "hardware": fp.get("hardware"),
        "vllm": fp.get("vllm") or (view.result.get("server", {}).get("version") if view else None),
        "check": check_reference(review, choice),
    }
    return Evidence(data, summary_lines(data))


def check_reference(review: Review, choice: Choice) -> dict[str, Any]:
    """What `tuner check` compares a deployment with: the model, how values are scored, every
    objective over the choice's own windows, and the study's pooled noise of each objective
    (the variance of log(value) within every configuration it measured more than once)."""
    groups = _windows_by_config(review)
    own = groups.get(_config_key(choice.params), [])
    # A stage winner's search window was picked as the best of several draws: it reads high.
    fresh = [v for v in own if v.role != Role.SEARCH] or own

    def values(views: list[TrialView], name: str) -> list[float]:
        return [x for x in (review.value(v, name) for v in views) if x is not None]

    noise = {
        n: NoiseEstimate.of(*(values(g, n) for g in groups.values())) for n in review.objectives
    }
    server, config = review.config.get("server") or {}, review.config
    return {
        "model": review.fingerprint.get("model") or {"model": server.get("model")},
        "served_model_name": server.get("served_model_name"),
        "objectives": dict(zip(review.objectives, review.directions, strict=True)),
        "constraints": (config.get("objectives") or {}).get("constraints") or [],
        "cost": config.get("cost") or {},
        "cpus": review.cores,
        "device": review.device,
        # what a GPU deployment's cost is billed on: one server's GPUs and their model
        "gpus": resolve(
            LaunchSpec(args=dict(choice.params)), ServerConfig(args=dict(server.get("args") or {}))
        ).devices,
        "gpu_model": next(iter((review.fingerprint.get("hardware") or {}).get("gpus") or []), ""),
        "min_gain": (config.get("study") or {}).get("min_gain", 0.0),
        "samples": {n: values(fresh, n) for n in review.objectives},
        "noise": {n: {"rel_sd": e.rel_sd, "df": e.df} for n, e in noise.items()},
        "resolve": {n: _check_config(config).target(n) for n in review.objectives},
        "windows": {
            n: windows_plan(noise[n], len(values(fresh, n)), _check_config(config), n)
            for n in review.objectives
        },
    }


def _check_config(config: dict[str, Any]) -> CheckConfig:
    """The study's check block (its defaults where the study predates it)."""
    return CheckConfig(**(config.get("check") or {}))


def windows_plan(
    noise: NoiseEstimate, recorded: int, check: CheckConfig, name: str
) -> dict[str, Any]:
    """Whether ``recorded`` windows of the exported configuration let a check of
    ``check.max_windows`` windows resolve ``check.resolve`` of objective ``name``, and how many
    more of them would (None: no number would, or the noise is unknown)."""
    target, budget = check.target(name), check.max_windows
    grown = NoiseEstimate(noise.rel_sd, noise.df + budget - 1)  # the check's windows pool in
    resolution = grown.resolution(recorded, budget) if recorded else math.inf
    more = grown.more_windows(budget, recorded, target) if recorded else None
    return {
        "recorded": recorded,
        "check_windows": budget,
        "resolves": resolution if math.isfinite(resolution) else None,
        "asked": target,
        "more_needed": more,
    }


def windows_line(plan: dict[str, dict[str, Any]]) -> str:
    """What the evidence lets a check resolve, and what it would need (one summary line)."""
    recorded = max((p["recorded"] for p in plan.values()), default=0)
    budget = max((p["check_windows"] for p in plan.values()), default=0)
    parts, short = [], False
    for name, p in plan.items():
        resolves, more = p["resolves"], p["more_needed"]
        if resolves is not None and resolves <= p["asked"]:
            parts.append(f"{name} ±{resolves:.0%}")
            continue
        short = True
        seen = "nothing" if resolves is None else f"±{resolves:.0%}"
        need = "no number of windows would" if more is None else f"needs {more} more windows"
        parts.append(f"{name} {seen} ({need} for {p['asked']:.0%})")
    text = f"check: {recorded} windows of this config; a {budget}-window check resolves "
    hint = (
        "; `tuner export --measure` measures the windows it needs (or raise study.repeats, "
        "study.baseline_measurements for the baseline, and run the study again)"
    )
    return text + ", ".join(parts) + (hint if short else "")


def _config_key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def _windows_by_config(review: Review) -> dict[str, list[TrialView]]:
    """Every measured window of the study, grouped by the configuration (full params) it ran."""
    groups: dict[str, list[TrialView]] = {}
    for view in [*review.baseline_windows, *review.search_trials(), *review.confirm_trials()]:
        if view.measured:
            groups.setdefault(_config_key(view.params), []).append(view)
    return groups


def _trial_ids(view: TrialView | None) -> dict[str, Any] | None:
    if view is None:
        return None
    t = view.trial
    return {
        "optuna_study": view.study,
        "number": t.number,
        "label": view.label,
        "measured_at": t.datetime_complete.isoformat(timespec="seconds")
        if t.datetime_complete
        else None,
    }


def _fmt(value: Any, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:.4g}{unit}"


def summary_lines(data: dict[str, Any]) -> list[str]:
    """A few lines a reviewer reads first (they head every exported file)."""
    lat = data["measurements"].get("latency_s", {})
    e2e, ttft = lat.get("e2e", {}), lat.get("ttft", {})
    m = data["measurements"]
    trial = data["trial"] or {}
    lines = [data["simulated"]] if data.get("simulated") else []
    lines += [
        f"tuner export of study {data['study']}: {data['choice']} "
        f"(Optuna study {trial.get('optuna_study')}, trial {trial.get('number')}), "
        f"exported {data['exported_at']}",
        f"measured: P50/P99 E2E {_fmt(e2e.get('p50'), ' s')}/{_fmt(e2e.get('p99'), ' s')} "
        f"(n={int(e2e.get('n', 0))}), P99 TTFT {_fmt(ttft.get('p99'), ' s')}, "
        f"{_fmt(m.get('output_throughput_tok_s'))} output tok/s, "
        f"error rate {_fmt(m.get('error_rate'))}",
        "vs baseline: "
        + ", ".join(
            f"{k} {v['change_pct']:+.1f}%"
            for k, v in data["delta_vs_baseline"].items()
            if v["change_pct"] is not None and k in data["objectives"]
        ),
        f"SLO: {_slo_text(data.get('slo') or {})}; workload: {_workload_text(data)}",
        *_claim_lines(data.get("slos")),
        f"hardware: {_hardware_text(data.get('hardware') or {})}; vLLM: {data.get('vllm')}",
        f"bottleneck: {data.get('bottleneck')}; full evidence: evidence.json",
    ]
    if (data.get("check") or {}).get("windows"):
        lines.append(windows_line(data["check"]["windows"]))
    return lines


def _claim_lines(block: dict[str, Any] | None) -> list[str]:
    """One line per SLO: what the windows claim of it and how sure they are (none for
    evidence written before the claims were)."""
    return [summary_line(c) for c in HandoverSlos.from_dict(block).shown()] if block else []


def _slo_text(slo: dict[str, Any]) -> str:
    set_ = [f"{k}={v:g}" for k, v in slo.items() if isinstance(v, int | float) and v]
    return ", ".join(set_) or "none"


def _workload_text(data: dict[str, Any]) -> str:
    wl = data.get("workload") or {}
    if not wl:
        return "unknown"
    shape = (
        f"open loop {wl.get('rate')} req/s"
        if wl.get("mode") == "open"
        else f"closed loop {wl.get('concurrency')} users"
    )
    classes = ", ".join(str(c.get("name")) for c in wl.get("classes") or [])
    return f"{shape}, window {wl.get('window_s')} s, classes {classes}"


def _hardware_text(hw: dict[str, Any]) -> str:
    if hw.get("device") == "cuda":
        return f"{len(hw.get('gpus') or [])} x {', '.join(sorted(set(hw.get('gpus') or [])))}"
    return f"CPU {hw.get('cpu', '?')}, {hw.get('cores', '?')} cores"
