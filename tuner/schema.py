"""The one owner of the storage layout: study names, trial roles and attribute keys.

A study lives in one Optuna storage as several Optuna studies, all visible in optuna-dashboard:

- ``baseline:<fingerprint>``  the control, measured once per fingerprint and reused
- ``<name>:<stage>``          one multi-objective study per parameter group; its first trial is
                              the incumbent with known values; the stage's decision in its attrs
- ``<name>:confirm``          interleaved re-measurements of stage winners and incumbents

The writer (:mod:`tuner.study`) and every reader (:mod:`tuner.review`, the dashboard, exports,
benchmarks) name these through this module, as :mod:`tuner.paths` names files, so a change of
layout is a change here and a stored study is read by the same words that wrote it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

BASELINE_PREFIX: Final = "baseline:"
CONFIRM: Final = "confirm"  # the confirmation study's suffix, and its trials' stage label
REFINE: Final = "refine"  # the last joint stage of a staged study
# The confirmation slots of windows `tuner export --measure` adds to a chosen configuration
EXPORT: Final = "export"
_SEPARATOR: Final = ":"


def baseline_study(fingerprint_key: str) -> str:
    return f"{BASELINE_PREFIX}{fingerprint_key}"


def stage_study(study: str, stage: str) -> str:
    return f"{study}{_SEPARATOR}{stage}"


def confirm_study(study: str) -> str:
    return stage_study(study, CONFIRM)


def is_baseline_study(name: str) -> bool:
    return name.startswith(BASELINE_PREFIX)


def owns(study: str, name: str) -> bool:
    """Whether the storage study ``name`` belongs to the tuner study ``study``."""
    return name.startswith(f"{study}{_SEPARATOR}")


def study_of(name: str) -> str:
    """The tuner study a storage study belongs to (``quickstart`` of ``quickstart:memory``)."""
    return name.split(_SEPARATOR)[0]


def stage_of(name: str) -> str:
    """The stage (or ``confirm``) part of a storage study's name."""
    return name.split(_SEPARATOR, 1)[1]


def confirm_label(stage: str) -> str:
    """How a confirmation trial of ``stage`` is labelled in progress lines and trial folders."""
    return f"{stage}-{CONFIRM}"


class Role(StrEnum):
    """What a trial is in its study."""

    BASELINE = "baseline"  # a measurement of the control
    # The configuration to beat: seeded into a stage with known values (no launch), and
    # re-measured as one side of a confirmation.
    INCUMBENT = "incumbent"
    SEARCH = "search"  # a sampler's proposal
    CANDIDATE = "candidate"  # a stage winner, re-measured as the other side of a confirmation


class TrialStatus(StrEnum):
    """Whether a trial's server ran and its load was measured."""

    OK = "ok"
    FAILED = "failed"


class TrialAttr:
    """Keys of a trial's user attrs (optuna-dashboard shows each as a column)."""

    STAGE: Final = "stage"
    ROLE: Final = "role"
    STATUS: Final = "status"
    FAILURE_REASON: Final = "failure_reason"
    FAILURE_MESSAGE: Final = "failure_message"
    VLLM_COMMAND: Final = "vllm_command"
    LAUNCH_ENV: Final = "launch_env"
    PARAMS_ALL: Final = "params_all"  # every param of the configuration, not only the stage's
    OBJECTIVE_VALUES: Final = "objective_values"
    FEASIBLE: Final = "feasible"
    FOLDER: Final = "folder"
    TIMINGS: Final = "timings"
    KV_CACHE_TOKENS: Final = "kv_cache_tokens"
    CPUS: Final = "cpus"
    WINDOW_SLICES: Final = "window_slices"
    SOURCE: Final = "source"  # where a seeded incumbent's values come from
    REUSED_FROM: Final = "reused_from"  # a repeated proposal answered by this trial number
    REUSED_FROM_STAGE: Final = "reused_from_stage"
    SEEDED: Final = "seeded"  # queued by the estimator (study.prescreen), not the sampler
    CONFIRM_TAG: Final = "confirm_tag"  # a confirmation slot: <stage>/<round>/<side>
    INTERRUPTED: Final = "interrupted"  # the run stopped during this trial
    DEVICES: Final = "devices"  # where the trial ran: node, GPUs assigned and sampled, CPUs
    QUALITY_GATED: Final = "quality_gated"
    QUALITY_ERRORS: Final = "quality_errors"
    QUALITY_DROPS: Final = "quality_drops"
    QUALITY_NOTE: Final = "quality_note"
    QUALITY_OUTPUTS: Final = "quality_outputs"  # the trial's own outputs file (for a reader)
    # A baseline trial's quality outputs themselves: the gate's reference travels with the
    # storage, so a study resumed on another host or after studies/ is cleaned still has it.
    QUALITY_REFERENCE: Final = "quality_reference"


class StudyAttr:
    """Keys of a storage study's user attrs."""

    FINGERPRINT: Final = "fingerprint"  # a baseline study's: model, hardware, versions, ...
    DECISION: Final = "decision"  # a finished stage's acceptance decision
    BASELINE_STUDY: Final = "baseline_study"  # which baseline a stage compared against
    BASELINE_TRIAL: Final = "baseline_trial"


METRIC_PREFIX: Final = "m_"  # flat measurements: m_e2e_p99_s, m_output_token_rate, ...
QUALITY_PREFIX: Final = "q_"  # quality scores: q_token_agreement, ...
# One request class's flat measurements: m_class_<class>_ttft_p99_s, m_class_<class>_goodput_req_s
CLASS_METRIC_PREFIX: Final = f"{METRIC_PREFIX}class_"


def metric_attr(name: str) -> str:
    return f"{METRIC_PREFIX}{name}"


def class_metric_attr(request_class: str, name: str) -> str:
    """The attr of the flat measurement ``name`` of one request class of the workload."""
    return f"{CLASS_METRIC_PREFIX}{request_class}_{name}"


def quality_attr(metric: str) -> str:
    return f"{QUALITY_PREFIX}{metric}"
