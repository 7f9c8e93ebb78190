"""A study session: everything `tuner run` assembles before the first server starts.

It resolves objectives, computes the baseline fingerprint, validates the search space against
the devices and against vLLM's own parser, takes the study's run lock, and formats the final
summary. The CLI only composes the config and calls into here.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from tuner.config import TunerConfig
from tuner.errors import ConfigError, PreflightError
from tuner.executor import Executor, make_executor
from tuner.host.placement import for_trial
from tuner.plan.planner import Planner
from tuner.quality import quality_fingerprint
from tuner.scoring.confidence import SloClaim, SloStatus, shown
from tuner.scoring.objective import class_of_slo
from tuner.search import checks as space_checks
from tuner.search import space as search_space
from tuner.search.resolved import args_to_argv, resolve
from tuner.server import LaunchSpec, make_backend
from tuner.server.vllm_parser import check_argvs, vllm_flags, vllm_version
from tuner.study.decision.evaluation import Evaluator
from tuner.study.decision.stages import StudyResult, spec_text
from tuner.study.loop.budget import BudgetHook
from tuner.study.loop.order import choose_order
from tuner.study.loop.prescreen import Prescreen
from tuner.study.loop.promise import against_the_plan
from tuner.study.loop.runner import Progress, StudyRunner
from tuner.study.state.fingerprint import fingerprint, hardware, public_env
from tuner.study.state.lease import RunLease, take_lease
from tuner.study.state.storage import check_url
from tuner.telemetry import gpu_inventory
from tuner.traffic.replay import check_replay
from tuner.trial.run import run_trial


@dataclass
class Session:
    config: TunerConfig
    runner: StudyRunner
    baseline_argv: list[str]
    device_count: int
    _lease: RunLease | None = None
    _ordered: bool = False  # the plan chose the stage order already (once per session)

    def preflight(self) -> None:
        """Checks that cost seconds, not server starts: devices, flags, model, port."""
        # The lock first: a second run of the same study must not spend a vLLM import (CPU
        # the running study is measuring with) before it learns that it cannot run.
        self._take_lock()
        cfg = self.config
        check_replay(cfg.workload, cfg.server.tokenizer)  # a trace window that replays nothing
        # vLLM's engine-config check of the fixed args and of every candidate before its
        # launch (tuner.study.loop.prescreen); its worker imports vLLM while the checks below run.
        gpus = self.device_count if cfg.server.device == "cuda" else 0
        prescreen = Prescreen.open(cfg, self.runner.evaluator, self.runner.say, gpus)
        prescreen.baseline_fits()  # seconds, where a baseline that cannot load costs minutes
        self.order_stages(prescreen.fit_planner)
        python = cfg.server.python or _sys_python()
        unknown = space_checks.unknown_params(cfg.search_space, vllm_flags(python))
        if unknown:
            raise ConfigError(
                f"search_space has params that vLLM does not accept: {', '.join(unknown)}",
                hint="use vLLM flag names with underscores, e.g. max_num_seqs",
            )
        backend = make_backend(cfg.server, resolve(LaunchSpec(), cfg.server), Path(os.devnull))
        _check_flags(python, _flag_part(backend.argv(), cfg), cfg)
        prescreen.preflight()
        self.runner.prescreen = prescreen
        self.runner.as_run.server_values = prescreen.server_values

    def order_stages(self, planner: Planner | None) -> None:
        """Where the plan can estimate the space and study.stage_order is plan: the stage
        order that plays best on its estimates (tuner.study.loop.order), said in one line."""
        if planner is None or self.config.study.stage_order != "plan" or self._ordered:
            return
        self._ordered = True
        choice = choose_order(planner, self.config, self.runner.evaluator.select_by)
        if choice is None:
            return
        self.runner.say(choice.line())
        self.runner.reorder(list(choice.order))

    def _take_lock(self) -> None:
        """One `tuner run` per study, on any host: a second driver would mark the first's
        trials failed. The lease lives in the study's database (tuner.study.state.lease)."""
        paths = self.runner.paths.ensure()
        self._lease = take_lease(
            self.runner.storage_url,
            self.config.name,
            paths.root.parent.resolve(),
            self.config.study.lease_s,
            on_lost=lambda line: self.runner.say(f"warning: {line}"),
        )

    def save_config(self, config: TunerConfig) -> None:
        """The composed config of the run, without secrets, next to the storage."""
        data = asdict(config)
        data["server"]["env"] = public_env(config.server.env)
        data["server"].pop("api_key", None)
        if config.study.storage:
            from tuner.study.state.storage import redact_url

            data["study"]["storage"] = redact_url(config.study.storage)
        self.runner.paths.config_yaml.write_text(yaml.safe_dump(data, sort_keys=False))

    def summary_text(self, result: StudyResult) -> str:
        ev = self.runner.evaluator
        lines = ["", *outcome_lines(self.config.name, ev.names, ev.select_index, result)]
        lines += self._against_the_plan(result)
        lines.append(f"  params: {result.final.params or '(vLLM defaults + fixed args)'}")
        lines.append(f"  CPUs: {for_trial(self.config).describe()} (placement)")
        lines += ["decisions:"] + [f"  {d.line()}" for d in result.decisions]
        for stage, front in result.pareto.items():
            lines.append(
                f"Pareto set of stage {stage}: "
                + (
                    "; ".join(
                        f"#{p['trial']} ({p['role']}) {_fmt(p['values'])} {p['params']}"
                        for p in front
                    )
                    or "(no feasible trial)"
                )
            )
        lines.append(f"storage: {self.runner.storage_shown()}")
        wall = self.runner.launches.wall_line()
        return "\n".join([*lines, wall] if wall else lines)

    def _against_the_plan(self, result: StudyResult) -> list[str]:
        """Where estimates exist and the study did not hand over a gain the plan promised
        within the SLOs: the measurement that contradicted the estimate."""
        prescreen, runner = self.runner.prescreen, self.runner
        planner = prescreen.fit_planner if prescreen is not None else None
        if planner is None:
            return []
        trials = [t for stored in runner.done for t in stored.launched()]
        ev, cfg = runner.evaluator, self.config
        specs, gain = runner.all_specs, cfg.study.min_gain
        return against_the_plan(
            planner, specs, cfg.slo, ev.select_by, gain, trials, result, ev.names
        )

    def plan_text(self) -> str:
        """What `tuner run --dry-run` prints: the study, its stages and its launch budget."""
        self.order_stages(Planner.available(self.config))
        runner, cfg = self.runner, self.config.study
        launches = cfg.baseline_measurements + sum(
            st.trials + 2 * cfg.repeats for st in runner.stages
        )
        ev = runner.evaluator
        lines = [
            f"study {self.config.name}: strategy {cfg.strategy}, storage {runner.storage_shown()}",
            f"objectives: {', '.join(ev.names)} (select by {ev.select_by})",
            f"constraints: {', '.join(ev.constraint_names)}",
            f"baseline: {shlex.join(self.baseline_argv)}",
        ]
        for st in runner.stages:
            space = ", ".join(f"{p}: {spec_text(s)}" for p, s in st.specs.items())
            lines.append(f"stage {st.name}: {st.trials} trials over {{{space}}}")
        lines.append(f"budget: at most {launches} server launches")
        if runner.executor is not None and runner.executor.name != "local":
            n = runner.executor.slots
            lines.append(f"executor: {runner.executor.name}, {n} trial{'s' * (n > 1)} at once")
        return "\n".join(lines)

    def close(self) -> None:
        self.runner.close()  # the executor: a local Ray instance shuts down
        if self.runner.prescreen is not None and self.runner.prescreen.validator is not None:
            self.runner.prescreen.validator.close()  # the warm vLLM worker ends with the run
        if self._lease is not None:
            self._lease.release()


def outcome_lines(name: str, names: list[str], select_index: int, result: StudyResult) -> list[str]:
    """What the study hands over, against the baseline. When no stage proved a gain the final
    incumbent *is* the baseline: its values moved only because its repeats re-measured it, so
    they are shown once, with the spread of its windows, not as a change."""
    base, final = result.baseline, result.final
    if final.source != base.source:
        lines = [f"study {name}: baseline vs final incumbent ({final.source})"]
        for i, objective in enumerate(names):
            b, f = base.values[i], final.values[i]
            change = (f - b) / abs(b) if b != 0.0 else float("nan")
            lines.append(f"  {objective:<28} {b:>12.4g} -> {f:>12.4g}  ({change:+.1%})")
        return lines + _misses(result)
    lines = [f"study {name}: the baseline stays: no stage proved a gain beyond the noise"]
    lines += [f"  {o:<28} {v:>12.4g}" for o, v in zip(names, final.values, strict=True)]
    windows = final.samples or [final.values[select_index]]
    if len(windows) > 1:
        lo, hi = min(windows), max(windows)
        lines.append(
            f"  {names[select_index]} over its {len(windows)} windows: {lo:.4g}-{hi:.4g} "
            f"({(hi - lo) / abs(lo):.0%} apart; one configuration: that is the noise)"
        )
    return lines + _misses(result)


def _misses(result: StudyResult) -> list[str]:
    """What the hand-over claims of each SLO, and how sure its windows are: met, missed (it is
    the closest the study came, not a configuration that meets the SLOs) or undecided (not
    handed over as meeting it; what would decide it). Beside it, a stage winner that beat it
    but whose SLOs its repeats left undecided."""
    found = result.final_claims()
    missed = [c.name for c in found if c.status == SloStatus.MISSED]
    open_ = [c.name for c in found if c.status == SloStatus.UNDECIDED]
    if missed:
        head = f"  NOT FEASIBLE: it misses {', '.join(missed)} (the closest the study came)"
    elif open_:
        head = f"  UNDECIDED: {', '.join(open_)} not shown met with the confidence asked"
    else:
        head = f"  every SLO met with {result.slo_confidence:.0%} confidence"
    lines = [head] + [f"    {_claim_line(c)}" for c in shown(found)]
    slos = [c for c in shown(found) if c.name.startswith("slo_")]
    if len(slos) > 1:  # with several SLOs (a class's own among them), which one binds
        binding = min(slos, key=lambda c: c.margin)
        where = "under" if binding.margin >= 0 else "over"
        room = f"{abs(binding.margin):.1%} {where} its limit"
        lines.append(
            f"  binding SLO: {binding.name} ({_whose(binding.name)}{room}, the least room of any)"
        )
    for d in result.undecided_beside():
        why = "; ".join(c.text() for c in d.candidate_slos if c.status == SloStatus.UNDECIDED)
        lines.append(
            f"  beside it: {d.stage} trial {d.candidate_trial} {d.candidate_params} beat it by "
            f"{d.gain:+.4g} {d.objective}, but its repeats left an SLO undecided ({why})"
        )
    return lines


def _whose(name: str) -> str:
    """Which request class an SLO binds, in words ("" for one over every request)."""
    found = class_of_slo(name)
    return f"the {found[0]} class's P99 {found[1].upper()}: " if found else ""


def _claim_line(c: SloClaim) -> str:
    more = c.more_windows()
    if c.status != SloStatus.UNDECIDED:
        return c.text()
    if more is None:
        return f"{c.text()}; no number of windows decides it at this mean"
    return f"{c.text()}; ~{more} more windows would decide it (study.max_repeats)"


def _fmt(values: list[float]) -> str:
    return "(" + ", ".join(f"{v:.4g}" for v in values) + ")"


def _sys_python() -> str:
    import sys

    return sys.executable


def _check_flags(python: str, flags: list[str], config: TunerConfig) -> None:
    """The fixed args, then every value a categorical param of the space may take on top of
    them, read by vLLM's parser in one worker (one vLLM import for all): a refusal is one line
    and exit 2 before the baseline, not a trial refused mid-study."""
    specs = search_space.flatten(config.search_space)
    tried = [
        (p, v)
        for p, s in specs.items()
        if s.target == "arg"
        for v in search_space.choices_of(s) or []
        if v is not None
    ]
    # each value's own flag after the fixed ones, not merged: vLLM's parser reads the last
    argvs = [[*flags, *args_to_argv(search_space.to_launch({p: v}, specs).args)] for p, v in tried]
    fixed, *errors = check_argvs(python, [flags, *argvs])
    if fixed:
        raise PreflightError(f"vLLM rejects the fixed server args: {fixed}")
    for (param, value), error in zip(tried, errors, strict=True):
        if error:
            raise PreflightError(
                f"search_space: vLLM's parser refuses {param}={value!r}: {error}",
                hint=f"remove {value!r} from {param}'s choices",
            )


def _flag_part(argv: list[str], config: TunerConfig) -> list[str]:
    """The flags after the launcher (vLLM's parser does not know `python -m ...`)."""
    return argv[len(config.server.launcher) :]


def open_session(
    config: TunerConfig,
    rebaseline: bool,
    progress: Progress,
    on_launch: BudgetHook | None = None,
) -> Session:
    """Everything a run or a dry run needs; cheap checks (search space, devices) happen here."""
    search_space.validate_space(config.search_space)
    # Where trials run, checked now (exit 2): Ray's cluster reached, the study's trials against
    # its nodes. Devices are per node: the GPUs a server may see (server.cuda_visible_devices,
    # else all) and the CPUs this process may use (a container or taskset allows fewer).
    executor = make_executor(config, run_trial, progress)
    try:
        return _open(config, rebaseline, progress, on_launch, executor)
    except BaseException:
        executor.close()
        raise


def _open(
    config: TunerConfig,
    rebaseline: bool,
    progress: Progress,
    on_launch: BudgetHook | None,
    executor: Executor,
) -> Session:
    largest = executor.largest_node()
    device_count = largest.gpus if config.server.device == "cuda" else largest.cpus
    space_checks.validate_against_devices(
        config.search_space, config.server.device, device_count, fixed_args=config.server.args
    )
    gpus = gpu_inventory() if config.server.device == "cuda" else []
    gpu_model = config.cost.gpu_model or (gpus[0]["name"] if gpus else "")
    evaluator = Evaluator(config, gpu_model)
    python = config.server.python or _sys_python()
    fp: dict[str, Any] = fingerprint(
        config, vllm_version(python), hardware(config.server.device, gpus)
    )
    fp["quality"] = quality_fingerprint(config.quality)  # the gate's reference outputs
    runner = StudyRunner(
        config, evaluator, fp, progress, rebaseline, on_launch=on_launch, executor=executor
    )
    check_url(runner.storage_url)
    baseline = resolve(LaunchSpec(), config.server)
    backend = make_backend(config.server, baseline, Path(os.devnull))
    backend.preflight()  # model folder, port: milliseconds, so even --dry-run checks them
    baseline_argv = backend.argv()
    return Session(config, runner, baseline_argv, device_count)
