"""tuner: tune a vLLM server for your model, hardware and traffic with real launches and real load.

This module is the public API: what ``objectives/`` plugins, ``benchmarks/`` and users import.
So is :mod:`tuner.testing`, the test doubles and replay harness that tests/ and benchmarks/
share (as ``optuna.testing``). Everything else in the package is internal and may move. Names
load on first use, so that ``import tuner`` stays cheap: the load generator's Locust subprocess
imports tuner's record types under gevent and must not pull in Optuna, pandas or Hydra on the
way.

- config:       :class:`TunerConfig` and its parts, :func:`compose` (Hydra, as the CLI does)
- measurement:  :class:`Measurements` from raw per-request records (:func:`measure`)
- scoring:      the :class:`Objective` / :class:`Constraint` seam and their registries
- trials:       :func:`run_trial` (launch, load, measure, stop) and its :class:`TrialOutcome`
- studies:      :class:`StudyRunner`, :class:`Evaluator`, the acceptance rule :func:`decide`
- plan:         :class:`Estimator` of a :class:`PlanPoint` on a GPU system (AIConfigurator, the
                ``plan`` extra), :func:`estimate_vs_measured`, the closed-loop queue
                (:func:`serve`) and the stage order played on the estimates (:func:`choose_order`)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> the internal module that owns it
_OWNERS: dict[str, str] = {
    # configuration
    "TunerConfig": "tuner.config",
    "ParamSpec": "tuner.config",
    "SloConfig": "tuner.config",
    "SamplerConfig": "tuner.config",
    "NOISE_RULES": "tuner.config",
    "WorkloadConfig": "tuner.config.workload",
    "RequestClass": "tuner.config.workload",
    "LengthDist": "tuner.config.workload",
    "compose": "tuner.composition",
    # errors
    "TunerError": "tuner.errors",
    "ConfigError": "tuner.errors",
    # measurement
    "Measurements": "tuner.measurement.measurements",
    "MetricStats": "tuner.measurement.measurements",
    "measure": "tuner.measurement.stats",
    "token_rate": "tuner.measurement.stats",
    "window_slices": "tuner.measurement.stats",
    "RequestRecord": "tuner.measurement.records",
    "read_records": "tuner.measurement.records",
    # scoring
    "Objective": "tuner.scoring.objective",
    "Constraint": "tuner.scoring.objective",
    "ObjectiveContext": "tuner.scoring.objective",
    "register_objective": "tuner.scoring.objective",
    "register_constraint": "tuner.scoring.objective",
    "MAXIMIZE": "tuner.scoring.objective",
    "MINIMIZE": "tuner.scoring.objective",
    "NO_DATA_VIOLATION": "tuner.scoring.objective",
    "UNSET_SLO": "tuner.scoring.objective",
    "has_traffic": "tuner.scoring.objective",
    "stat_or_nan": "tuner.scoring.objective",
    "relative_violation": "tuner.scoring.objective",
    "meets": "tuner.scoring.feasibility",
    # one trial and what it runs
    "run_trial": "tuner.trial.run",
    "TrialOutcome": "tuner.trial.outcome",
    "LaunchSpec": "tuner.search.launch",
    "ResolvedLaunch": "tuner.search.resolved",
    "resolve": "tuner.search.resolved",
    "make_backend": "tuner.server",
    "StudyPaths": "tuner.paths",
    "LocustLoadGenerator": "tuner.loadgen",
    "Target": "tuner.loadgen",
    "build_plan": "tuner.loadgen.request_plan",
    "CheckEndpoint": "tuner.deployment.check.endpoint",
    "measure_window": "tuner.deployment.check.endpoint",
    "read_reference": "tuner.deployment.check.evidence_file",
    "ProbeRun": "tuner.loadgen.probe",
    "run_probe": "tuner.loadgen.probe",
    "pin": "tuner.host.placement",
    "tree_cpus": "tuner.host.placement",
    "read_cpuinfo": "tuner.host.cpu",
    "scrape": "tuner.telemetry.metrics",
    "counter_deltas": "tuner.telemetry.metrics",
    "histogram_means": "tuner.telemetry.metrics",
    "over_server": "tuner.telemetry.metrics",
    # studies
    "StudyRunner": "tuner.study.loop.runner",
    "TrialFn": "tuner.study.loop.runner",
    "Evaluator": "tuner.study.decision.evaluation",
    "Comparison": "tuner.study.decision.acceptance",
    "Decision": "tuner.study.decision.acceptance",
    "decide": "tuner.study.decision.acceptance",
    "NoiseEstimate": "tuner.study.decision.noise",
    "NoiseSplit": "tuner.study.decision.noise",
    "Role": "tuner.schema",
    "StudyAttr": "tuner.schema",
    "TrialAttr": "tuner.schema",
    "TrialStatus": "tuner.schema",
    # estimates before launching (the plan extra)
    "Estimator": "tuner.plan.estimate",
    "PlanPoint": "tuner.plan.estimate",
    "Fit": "tuner.plan.estimate",
    "Agreement": "tuner.plan.fidelity",
    "estimate_vs_measured": "tuner.plan.fidelity",
    "Planner": "tuner.plan.planner",
    "Prescreen": "tuner.study.loop.prescreen",
    "choose_order": "tuner.study.loop.order",
    "OrderChoice": "tuner.study.loop.order",
    # the closed-loop queue the plan and the replays' landscapes share
    "Load": "tuner.plan.queueing",
    "Served": "tuner.plan.queueing",
    "serve": "tuner.plan.queueing",
    "running": "tuner.plan.queueing",
    # comparing two endpoints
    "Ratio": "tuner.deployment.compare",
    "Verdict": "tuner.deployment.compare",
    "ratio_of": "tuner.deployment.compare",
    "window_order": "tuner.deployment.compare",
}

__all__ = [
    "MAXIMIZE",
    "MINIMIZE",
    "NOISE_RULES",
    "NO_DATA_VIOLATION",
    "UNSET_SLO",
    "Agreement",
    "CheckEndpoint",
    "Comparison",
    "ConfigError",
    "Constraint",
    "Decision",
    "Estimator",
    "Evaluator",
    "Fit",
    "LaunchSpec",
    "LengthDist",
    "Load",
    "LocustLoadGenerator",
    "Measurements",
    "MetricStats",
    "NoiseEstimate",
    "NoiseSplit",
    "Objective",
    "ObjectiveContext",
    "OrderChoice",
    "ParamSpec",
    "PlanPoint",
    "Planner",
    "Prescreen",
    "ProbeRun",
    "Ratio",
    "RequestClass",
    "RequestRecord",
    "ResolvedLaunch",
    "Role",
    "SamplerConfig",
    "Served",
    "SloConfig",
    "StudyAttr",
    "StudyPaths",
    "StudyRunner",
    "Target",
    "TrialAttr",
    "TrialFn",
    "TrialOutcome",
    "TrialStatus",
    "TunerConfig",
    "TunerError",
    "Verdict",
    "WorkloadConfig",
    "build_plan",
    "choose_order",
    "compose",
    "counter_deltas",
    "decide",
    "estimate_vs_measured",
    "has_traffic",
    "histogram_means",
    "make_backend",
    "measure",
    "measure_window",
    "meets",
    "over_server",
    "pin",
    "ratio_of",
    "read_cpuinfo",
    "read_records",
    "read_reference",
    "register_constraint",
    "register_objective",
    "relative_violation",
    "resolve",
    "run_probe",
    "run_trial",
    "running",
    "scrape",
    "serve",
    "stat_or_nan",
    "token_rate",
    "tree_cpus",
    "window_order",
    "window_slices",
]


def __getattr__(name: str) -> Any:
    owner = _OWNERS.get(name)
    if owner is None:
        raise AttributeError(f"module 'tuner' has no attribute {name!r}")
    value = getattr(importlib.import_module(owner), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


if TYPE_CHECKING:  # the same names, eagerly, for type checkers and IDEs
    from tuner.composition import compose
    from tuner.config import NOISE_RULES, ParamSpec, SamplerConfig, SloConfig, TunerConfig
    from tuner.config.workload import LengthDist, RequestClass, WorkloadConfig
    from tuner.deployment.check.endpoint import CheckEndpoint, measure_window
    from tuner.deployment.check.evidence_file import read_reference
    from tuner.deployment.compare import Ratio, Verdict, ratio_of, window_order
    from tuner.errors import ConfigError, TunerError
    from tuner.host.cpu import read_cpuinfo
    from tuner.host.placement import pin, tree_cpus
    from tuner.loadgen import LocustLoadGenerator, Target
    from tuner.loadgen.probe import ProbeRun, run_probe
    from tuner.loadgen.request_plan import build_plan
    from tuner.measurement.measurements import Measurements, MetricStats
    from tuner.measurement.records import RequestRecord, read_records
    from tuner.measurement.stats import measure, token_rate, window_slices
    from tuner.paths import StudyPaths
    from tuner.plan.estimate import Estimator, Fit, PlanPoint
    from tuner.plan.fidelity import Agreement, estimate_vs_measured
    from tuner.plan.planner import Planner
    from tuner.plan.queueing import Load, Served, running, serve
    from tuner.schema import Role, StudyAttr, TrialAttr, TrialStatus
    from tuner.scoring.feasibility import meets
    from tuner.scoring.objective import (
        MAXIMIZE,
        MINIMIZE,
        NO_DATA_VIOLATION,
        UNSET_SLO,
        Constraint,
        Objective,
        ObjectiveContext,
        has_traffic,
        register_constraint,
        register_objective,
        relative_violation,
        stat_or_nan,
    )
    from tuner.search.launch import LaunchSpec
    from tuner.search.resolved import ResolvedLaunch, resolve
    from tuner.server import make_backend
    from tuner.study.decision.acceptance import Comparison, Decision, decide
    from tuner.study.decision.evaluation import Evaluator
    from tuner.study.decision.noise import NoiseEstimate, NoiseSplit
    from tuner.study.loop.order import OrderChoice, choose_order
    from tuner.study.loop.prescreen import Prescreen
    from tuner.study.loop.runner import StudyRunner, TrialFn
    from tuner.telemetry.metrics import counter_deltas, histogram_means, over_server, scrape
    from tuner.trial.outcome import TrialOutcome
    from tuner.trial.run import run_trial
