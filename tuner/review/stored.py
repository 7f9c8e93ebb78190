"""A stored study, read back for review: `tuner report`, `tuner export` and `tuner dashboard`.

Reading needs only the storage and the study folder (never Hydra, never a server). The storage
layout is named by :mod:`tuner.schema`: a baseline study, a study per stage (the incumbent as
first trial, search trials, the acceptance decision in its attrs) and one of confirmations.
``studies/<name>/config.yaml`` gives the fixed server args and the search
space specs (for export); without it, report and dashboard still work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import yaml
from optuna.trial import FrozenTrial

from tuner.errors import ConfigError
from tuner.host.placement import ALL, parse_cpus
from tuner.paths import StudyPaths
from tuner.redact import Redactor
from tuner.review.trial_view import TrialView, nondominated
from tuner.schema import (
    CONFIRM,
    Role,
    StudyAttr,
    TrialAttr,
    confirm_label,
    confirm_study,
    is_baseline_study,
    owns,
    stage_of,
    stage_study,
    study_of,
)
from tuner.server.simulated import stamp
from tuner.study.decision.acceptance import Decision
from tuner.study.state.storage import open_storage, redact_url

__all__ = ["Choice", "Review", "TrialView", "nondominated", "open_review"]


@dataclass
class Choice:
    """The configuration to export: full params plus the measurement that supports it."""

    label: str
    params: dict[str, Any]
    trial: TrialView | None
    decision: dict[str, Any] | None = None

    @property
    def slug(self) -> str:
        return "baseline" if self.trial is None else self.trial.label.replace("#", "-")


@dataclass
class Review:
    """Everything stored about study ``name``."""

    name: str
    storage_url: str
    paths: StudyPaths
    storage: optuna.storages.RDBStorage
    stages: dict[str, optuna.Study]
    confirm: optuna.Study | None
    baseline_study: optuna.Study | None
    config: dict[str, Any] = field(default_factory=dict)

    # -- what the studies say ------------------------------------------------------------
    @property
    def storage_shown(self) -> str:
        return redact_url(self.storage_url)

    @property
    def reference(self) -> optuna.Study | None:
        return next(iter(self.stages.values()), None) or self.baseline_study

    @property
    def objectives(self) -> list[str]:
        ref = self.reference
        if ref is None:
            return []
        return list(ref.metric_names or [f"objective_{i}" for i in range(len(ref.directions))])

    @property
    def directions(self) -> list[str]:
        ref = self.reference
        return [d.name.lower() for d in ref.directions] if ref is not None else []

    @property
    def select_by(self) -> str:
        configured = (self.config.get("objectives") or {}).get("select_by")
        if configured in self.objectives:
            return str(configured)
        pairs = zip(self.objectives, self.directions, strict=True)
        maximised = [n for n, d in pairs if d == "maximize"]
        return (maximised or self.objectives or [""])[0]

    @property
    def fingerprint(self) -> dict[str, Any]:
        if self.baseline_study is None:
            return {}
        return dict(self.baseline_study.user_attrs.get(StudyAttr.FINGERPRINT) or {})

    @property
    def simulated(self) -> str | None:
        """The stamp of a study rehearsed on a simulated GPU host (None for a measured one)."""
        return stamp(self.fingerprint)

    @property
    def decisions(self) -> dict[str, dict[str, Any]]:
        return {
            stage: dict(study.user_attrs[StudyAttr.DECISION])
            for stage, study in self.stages.items()
            if StudyAttr.DECISION in study.user_attrs
        }

    def decision(self, stage: str) -> Decision | None:
        """The stage's stored acceptance decision, typed (None while the stage is undecided)."""
        stored = self.decisions.get(stage)
        return Decision.from_dict(stored) if stored is not None else None

    @property
    def device(self) -> str:
        hw = self.fingerprint.get("hardware") or {}
        return str(hw.get("device") or (self.config.get("server") or {}).get("device") or "cpu")

    @property
    def cores(self) -> float:
        """CPU cores the server may use (the CPU utilisation signal of the diagnosis)."""
        cost = self.config.get("cost") or {}
        hw = self.fingerprint.get("hardware") or {}
        server = (self.fingerprint.get("placement") or {}).get("server", ALL)
        pinned = 0 if server == ALL else len(parse_cpus(server, "fingerprint placement.server"))
        return float(cost.get("cpus") or pinned or hw.get("cores") or 0)

    def studies(self) -> dict[str, optuna.Study]:
        """Every Optuna study this study uses, by name (baseline, stages, confirmation)."""
        found = [self.baseline_study, *self.stages.values(), self.confirm]
        return {s.study_name: s for s in found if s is not None}

    # -- trials ----------------------------------------------------------------------------
    @cached_property
    def baseline(self) -> TrialView | None:
        if self.baseline_study is None:
            return None
        views = [_view(self.baseline_study, Role.BASELINE, t) for t in self.baseline_study.trials]
        ok = [v for v in views if v.measured]
        linked = [v for v in ok if v.trial.number == self._linked_baseline_trial()]
        if linked:
            return linked[0]
        seeded = self._seeded_baseline_values()
        same = [v for v in ok if seeded is not None and v.trial.values == seeded]
        found = same or ok
        return found[-1] if found else None

    @cached_property
    def baseline_windows(self) -> list[TrialView]:
        """Every measured window of the baseline (its study's ok trials). Comparisons use
        their mean: one window of a shared machine can sit 20-40 % off the configuration's
        level, and the acceptance rule judges the baseline on all of them."""
        if self.baseline_study is None:
            return []
        views = [_view(self.baseline_study, Role.BASELINE, t) for t in self.baseline_study.trials]
        return [v for v in views if v.measured]

    def baseline_mean(self, objective: str) -> float | None:
        """The mean of ``objective`` over the baseline's windows (None without a value)."""
        values = [self.value(v, objective) for v in self.baseline_windows]
        finite = [x for x in values if x is not None]
        return float(np.mean(finite)) if finite else None

    def _linked_baseline_trial(self) -> int | None:
        first = next(iter(self.stages.values()), None)
        number = first.user_attrs.get(StudyAttr.BASELINE_TRIAL) if first else None
        return int(number) if number is not None else None

    def _seeded_baseline_values(self) -> list[float] | None:
        # Studies stored before the baseline link: the first stage's seeded incumbent.
        first = next(iter(self.stages.values()), None)
        seeds = [t for t in (first.trials if first else []) if _role(t) == Role.INCUMBENT]
        return list(seeds[0].values) if seeds and seeds[0].values else None

    def stage_trials(self, stage: str) -> list[TrialView]:
        return [_view(self.stages[stage], stage, t) for t in self.stages[stage].trials]

    def confirm_trials(self) -> list[TrialView]:
        if self.confirm is None:
            return []
        return [_view(self.confirm, _confirm_stage(t), t) for t in self.confirm.trials]

    def trials(self) -> list[TrialView]:
        """Every trial with its own measurement or failure: baseline, search, confirmation."""
        out = [self.baseline] if self.baseline else []
        for stage in self.stages:
            out += [v for v in self.stage_trials(stage) if v.role != Role.INCUMBENT]
        return out + self.confirm_trials()

    def search_trials(self) -> list[TrialView]:
        return [v for st in self.stages for v in self.stage_trials(st) if v.role == Role.SEARCH]

    def value(self, view: TrialView, objective: str) -> float | None:
        """An objective value of a trial (None when failed or not finite)."""
        if not view.ok or objective not in self.objectives or not view.trial.values:
            return None
        number = view.trial.values[self.objectives.index(objective)]
        return number if math.isfinite(number) else None

    def best(self, stage: str | None = None) -> TrialView | None:
        """The best feasible search trial (of ``stage``, or of all) by the selection objective."""
        idx = self.objectives.index(self.select_by) if self.select_by in self.objectives else -1
        if idx < 0:
            return None
        sign = 1.0 if self.directions[idx] == "maximize" else -1.0
        pool = self.stage_trials(stage) if stage is not None else self.search_trials()
        scored = [(self.value(v, self.select_by), v) for v in pool]
        valid = [(sign * s, v) for s, v in scored if s is not None and v.feasible]
        valid = [(s, v) for s, v in valid if v.role == Role.SEARCH]
        return max(valid, key=lambda sv: sv[0])[1] if valid else None

    def pareto(self) -> list[TrialView]:
        """Pareto-optimal feasible measured trials over every stage (and the baseline)."""
        pool = [v for v in self.search_trials() if v.feasible and v.measured]
        pool += [self.baseline] if self.baseline and self.baseline.feasible else []
        if not pool:
            return []
        values = np.array([v.trial.values for v in pool], dtype=float)
        return [pool[i] for i in nondominated(values, self.directions)]

    # -- the configuration to export ---------------------------------------------------------
    def choice(self, stage: str | None = None, number: int | None = None) -> Choice:
        """``number`` of ``stage`` if given, else the final incumbent (last accepted stage)."""
        if number is not None:
            return self._trial_choice(self._stage_for(stage), number)
        accepted = [(s, d) for s, d in self.decisions.items() if d.get("accepted")]
        if not accepted:
            return Choice("baseline (no stage was accepted)", {}, self.baseline)
        stage_name, decision = accepted[-1]
        trial = self._find(stage_name, decision.get("candidate_trial"))
        params = dict(decision.get("candidate_params") or (trial.params if trial else {}))
        return Choice(
            f"final incumbent ({stage_name} trial {trial and trial.number})",
            params,
            trial,
            decision,
        )

    def _stage_for(self, stage: str | None) -> str:
        if stage is None and len(self.stages) == 1:
            return next(iter(self.stages))
        if stage == Role.BASELINE or stage in self.stages:
            return str(stage)
        raise ConfigError(
            f"--stage {stage!r} is not a stage of study {self.name!r}"
            if stage
            else f"study {self.name!r} has several stages: say which with --stage",
            hint=f"stages: {', '.join([Role.BASELINE, *self.stages])}",
        )

    def _find(self, stage: str, number: Any) -> TrialView | None:
        if stage == Role.BASELINE:
            return self.baseline
        return next((v for v in self.stage_trials(stage) if v.number == number), None)

    def _trial_choice(self, stage: str, number: int) -> Choice:
        view = self._find(stage, number) if stage != Role.BASELINE else self.baseline
        if view is None or (stage == Role.BASELINE and view.number != number):
            raise ConfigError(
                f"study {self.name!r} has no trial {number} in stage {stage}",
                hint="see `tuner report` for the trial numbers",
            )
        if not view.measured:
            raise ConfigError(
                f"trial {view.label} has no measurement of its own "
                f"({view.attrs.get(TrialAttr.FAILURE_REASON) or view.role})",
                hint="export a measured trial (see `tuner report`)",
            )
        return Choice(f"trial {view.label}", view.params, view)


def _role(trial: FrozenTrial) -> str:
    return str(trial.user_attrs.get(TrialAttr.ROLE, ""))


def _view(study: optuna.Study, stage: str, trial: FrozenTrial) -> TrialView:
    return TrialView(study.study_name, stage, trial)


def _confirm_stage(trial: FrozenTrial) -> str:
    tag = str(trial.user_attrs.get(TrialAttr.CONFIRM_TAG, ""))
    if tag:
        return confirm_label(tag.split("/")[0])
    return str(trial.user_attrs.get(TrialAttr.STAGE, CONFIRM))


# -- loading -----------------------------------------------------------------------------------


def open_review(
    name: str, storage: str | None = None, studies_dir: str | Path = "studies"
) -> Review:
    """Study ``name`` from ``storage`` (default: SQLite in ``<studies_dir>/<name>/optuna.db``).

    Raises ConfigError (exit 2) when the study does not exist there.
    """
    paths = StudyPaths.for_study(studies_dir, name)
    if storage is None and not paths.storage_db.is_file():
        raise ConfigError(
            f"no study {name!r}: {paths.storage_db} does not exist",
            hint="check the name and --studies-dir, or pass --storage URL",
        )
    url = storage or paths.default_storage_url
    rdb = open_storage(url)
    names = [s.study_name for s in optuna.get_all_study_summaries(rdb, include_best_trial=False)]
    own = [n for n in names if owns(name, n)]
    if not own:
        known = sorted({study_of(n) for n in names if not is_baseline_study(n)})
        raise ConfigError(
            f"storage {redact_url(url)} has no study named {name!r}",
            hint=f"known studies: {', '.join(known) or 'none'}",
        )
    config = _read_config(paths)
    stages = _stages(rdb, name, own, config)
    confirm = _load(rdb, confirm_study(name)) if confirm_study(name) in own else None
    baseline = _baseline_study(rdb, names, stages, config)
    return Review(name, url, paths, rdb, stages, confirm, baseline, config)


def _load(storage: optuna.storages.RDBStorage, study_name: str) -> optuna.Study:
    return optuna.load_study(study_name=study_name, storage=storage)


def _read_config(paths: StudyPaths) -> dict[str, Any]:
    try:
        data = yaml.safe_load(paths.config_yaml.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _stages(
    storage: optuna.storages.RDBStorage, name: str, own: list[str], config: dict[str, Any]
) -> dict[str, optuna.Study]:
    """Stage studies in the configured order (then any others, by name)."""
    present = [stage_of(n) for n in own if n != confirm_study(name)]
    configured = list((config.get("study") or {}).get("stages") or [])
    order = [s for s in configured if s in present] + sorted(set(present) - set(configured))
    return {stage: _load(storage, stage_study(name, stage)) for stage in order}


def _baseline_study(
    storage: optuna.storages.RDBStorage,
    names: list[str],
    stages: dict[str, optuna.Study],
    config: dict[str, Any],
) -> optuna.Study | None:
    """The baseline this study was compared against (several may share one storage)."""
    candidates = [n for n in names if is_baseline_study(n)]
    linked = [st.user_attrs.get(StudyAttr.BASELINE_STUDY) for st in stages.values()]
    for n in linked:
        if n in candidates:
            return _load(storage, str(n))
    studies = [_load(storage, n) for n in candidates]
    first = next(iter(stages.values()), None)
    seeds = [t.values for t in (first.trials if first else []) if _role(t) == Role.INCUMBENT]
    for study in studies:
        if seeds and any(t.values == seeds[0] for t in study.trials):
            return study
    matching = [
        s for s in studies if _same_setup(s.user_attrs.get(StudyAttr.FINGERPRINT) or {}, config)
    ]
    found = matching or (studies if len(studies) == 1 else [])
    return found[-1] if found else None


def _same_setup(fingerprint: dict[str, Any], config: dict[str, Any]) -> bool:
    server = config.get("server") or {}
    model = (fingerprint.get("model") or {}).get("model")
    return (
        bool(server)
        and model == server.get("model")
        and (fingerprint.get("fixed_args") == dict(sorted((server.get("args") or {}).items())))
    )


def study_redactor(review: Review) -> Redactor:
    """Secrets this study could leak: its server env, storage password, this environment."""
    server = review.config.get("server") or {}
    env = {**(server.get("env") or {}), "api_key": server.get("api_key") or ""}
    return Redactor.for_environment(env, [review.storage_url])
