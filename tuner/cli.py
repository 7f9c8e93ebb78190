"""The `tuner` command: subcommands and the error policy.

Each subcommand composes its configuration through :func:`tuner.composition.compose` (the one place
that sees Hydra's DictConfig) and works on the typed TunerConfig. Every TunerError ends the
process with one line on stderr and its exit code (2 for bad input); ``TUNER_FULL_ERROR=1``
shows the traceback too.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from tuner.cli_deployment import add_deployment
from tuner.composition import compose
from tuner.config import TunerConfig
from tuner.console import RunDisplay, say
from tuner.errors import ConfigError, TunerError
from tuner.host.placement import for_trial

EXIT_INTERRUPTED = 130


def _quiet_libraries() -> None:
    """Our progress lines are the user's view; Optuna's INFO logs and API warnings are noise."""
    import warnings

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    # We drive the heartbeat ourselves around ask/tell (tuner.study.state.storage.Heartbeat).
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")


def cmd_trial(args: argparse.Namespace) -> int:
    """Run one trial with the composed config; print its results table."""
    from tuner.paths import StudyPaths
    from tuner.search.resolved import resolve
    from tuner.server import LaunchSpec, make_backend
    from tuner.trial.run import run_trial

    config = compose(args.overrides, args.config_dir)
    study = StudyPaths.for_study(config.studies_dir, config.name)
    trial_id = args.trial_id or time.strftime("trial-%Y%m%d-%H%M%S")
    paths = study.trial(trial_id)
    launch = resolve(LaunchSpec(), config.server)  # the baseline: the fixed args alone
    backend = make_backend(config.server, launch, paths.server_log)
    backend.preflight()
    if args.dry_run:
        return _print_plan(config, backend.argv())
    from tuner.plan.validate import ConfigValidator, validates
    from tuner.traffic.replay import check_replay

    # vLLM builds its engine config from these flags here, in milliseconds once warm: a bad
    # flag is one line and exit 2, before a server start that would end in its usage text.
    check_replay(config.workload, config.server.tokenizer)  # milliseconds: before vLLM's
    if validates(config.server):
        ConfigValidator(config.server).preflight(LaunchSpec())
    study.ensure()
    outcome = run_trial(config, launch, paths, trial_id, progress=say)
    _print_outcome(outcome)
    return 0 if outcome.ok else 1


def _print_plan(config: TunerConfig, argv: list[str]) -> int:
    from dataclasses import asdict

    import yaml

    print("vLLM command:\n  " + shlex.join(argv))
    print(f"CPUs: {for_trial(config).describe()}")
    env = {**config.server.env}
    if env:
        print("environment:\n  " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()))
    print("workload:")
    print(yaml.safe_dump(asdict(config.workload), sort_keys=False).rstrip())
    return 0


def _print_outcome(outcome: object) -> None:
    from tuner.trial.outcome import TrialOutcome

    assert isinstance(outcome, TrialOutcome)
    if not outcome.ok:
        # The message holds vLLM's root cause and the log's path; the log's tail would be
        # its 40-line usage text when a flag was refused.
        print(f"FAILED: {outcome.reason}: {outcome.message}")
        print(f"result: {outcome.folder}/result.json")
        return
    m = outcome.metrics()
    assert m is not None
    print(m.table().to_string(float_format=lambda v: f"{v:.4f}"))
    print(
        f"\nrequests {m.completed}/{m.requests_started} ok, error rate {m.error_rate:.2%}, "
        + (f"{m.rejected} rejected over max_model_len, " if m.rejected else "")
        + f"{m.request_throughput:.2f} req/s, {m.output_throughput:.0f} output tok/s, "
        f"goodput {m.goodput:.2f} req/s over {m.window_s:.1f} s"
    )
    if m.window_slices:  # a trend here (warm-up too short, throttling) is not noise
        rates = " ".join(f"{r:.0f}" for r in m.window_slices)
        print(f"output tok/s by {len(m.window_slices)} parts of the window: {rates}")
    for warning in m.warnings:
        print(f"warning: {warning}")
    print(f"result: {outcome.folder}/result.json")


def cmd_run(args: argparse.Namespace) -> int:
    """Run (or resume) a study: baseline, stages, acceptance; print the summary."""
    from tuner.study.loop.session import open_session

    config = compose(args.overrides, args.config_dir)
    _quiet_libraries()
    with RunDisplay() as display:
        session = open_session(config, args.rebaseline, display.say, display.launches)
        if args.dry_run:
            print(session.plan_text())
            return 0
        try:
            session.preflight()
            session.save_config(config)
            result = session.runner.run()
        finally:
            session.close()
    print(session.summary_text(result))
    from tuner.review.dashboard import refresh_notes

    refresh_notes(config.name, config.study.storage, config.studies_dir)
    print(f"review: tuner report {config.name} | tuner dashboard {config.name}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Terminal summary + report.html, PNGs, trials.csv/.parquet under studies/<name>/report/."""
    from tuner.review.render import report_command

    _quiet_libraries()
    return report_command(args.study, args.storage, args.studies_dir, args.out)


def cmd_export(args: argparse.Namespace) -> int:
    """The chosen config as vllm-serve.sh, vllm-config.yaml, docker-run.sh, k8s.yaml + evidence."""
    from tuner.export.serve import export_command

    _quiet_libraries()
    if args.measure:
        from tuner.deployment.more_windows import measure_for_check

        if args.pareto:
            raise ConfigError("--measure measures one config: pass --trial, or neither")
        measure_for_check(
            args.study,
            args.storage,
            args.studies_dir,
            args.trial,
            args.stage,
            args.max_windows,
            say,
        )
    return export_command(
        args.study,
        args.storage,
        args.studies_dir,
        args.format,
        args.trial,
        args.stage,
        args.pareto,
        args.out,
    )


def cmd_dashboard(args: argparse.Namespace) -> int:
    """optuna-dashboard on 127.0.0.1 for the study's storage and artifacts, until Ctrl-C."""
    from tuner.review.dashboard import dashboard_command

    _quiet_libraries()
    return dashboard_command(args.study, args.storage, args.studies_dir, args.port)


def _add_study(p: argparse.ArgumentParser) -> None:
    p.add_argument("study", help="the study name (name= of `tuner run`)")
    p.add_argument("--storage", default=None, help="SQLAlchemy URL (default: its SQLite file)")
    p.add_argument("--studies-dir", type=Path, default=Path("studies"), help="default: studies")


def _add_review(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    report = sub.add_parser("report", help="summary, report.html, PNGs, CSV/Parquet of a study")
    _add_study(report)
    report.add_argument("--out", type=Path, default=None, help="default: studies/<name>/report")
    report.set_defaults(func=cmd_report)
    export = sub.add_parser("export", help="the chosen config as vLLM CLI/YAML, docker, k8s")
    _add_study(export)
    export.add_argument("--format", default="all", help="cli, yaml, docker, k8s or all")
    pick = export.add_mutually_exclusive_group()
    pick.add_argument("--trial", type=int, default=None, help="this trial number of --stage")
    pick.add_argument("--pareto", action="store_true", help="every Pareto-optimal trial")
    export.add_argument("--stage", default=None, help="the stage of --trial (or baseline)")
    export.add_argument("--out", type=Path, default=None, help="default: studies/<name>/export")
    export.add_argument(
        "--measure",
        action="store_true",
        help="first measure the windows a check needs to resolve check.resolve (starts its server)",
    )
    export.add_argument(
        "--max-windows", type=int, default=None, help="--measure's budget (check.max_windows)"
    )
    export.set_defaults(func=cmd_export)
    dash = sub.add_parser("dashboard", help="optuna-dashboard on 127.0.0.1 for a study")
    _add_study(dash)
    dash.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    dash.set_defaults(func=cmd_dashboard)


def cmd_plan(args: argparse.Namespace) -> int:
    """Estimate the study's search space on a GPU system (AIConfigurator, offline)."""
    from tuner.plan.planner import plan_command

    return plan_command(compose(args.overrides, args.config_dir), args.target_rps, args.out)


def cmd_capacity(args: argparse.Namespace) -> int:
    """The highest rate the chosen config sustains within the SLOs; replicas for a target."""
    from tuner.deployment.capacity import CapacityRequest, capacity_command

    _quiet_libraries()
    request = CapacityRequest(
        args.study,
        args.storage,
        args.studies_dir,
        args.trial,
        args.stage,
        args.target_rps,
        args.headroom,
        args.start_rps,
        args.window_s,
        args.max_steps,
    )
    return capacity_command(request, progress=say)


def _add_planning(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    plan = sub.add_parser("plan", help="estimate the search space on a GPU system, no launch")
    plan.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. plan.system=h200_sxm")
    plan.add_argument("--config-dir", type=Path, default=None, help="instead of conf/")
    plan.add_argument("--target-rps", type=float, default=None, help="size replicas for this")
    plan.add_argument("--out", type=Path, default=None, help="default: studies/<name>/plan")
    plan.set_defaults(func=cmd_plan)
    cap = sub.add_parser("capacity", help="the highest rate within the SLOs, on the real server")
    _add_study(cap)
    cap.add_argument("--trial", type=int, default=None, help="this trial of --stage")
    cap.add_argument("--stage", default=None, help="the stage of --trial (or baseline)")
    cap.add_argument("--target-rps", type=float, default=None, help="size replicas for this")
    cap.add_argument("--headroom", type=float, default=0.3, help="spare fraction, in [0, 1)")
    cap.add_argument("--start-rps", type=float, default=None, help="first rate of the sweep")
    cap.add_argument("--window-s", type=float, default=None, help="each rate's window")
    cap.add_argument("--max-steps", type=int, default=10, help="rates to measure at most")
    cap.set_defaults(func=cmd_capacity)


def cmd_workload_fit(args: argparse.Namespace) -> int:
    """Write a workload YAML fitted to a trace or a running vLLM's metrics; print its fidelity."""
    from tuner.traffic.fit_command import FitRequest, fit_command

    keys: tuple[str, ...] = ("layout", "start_s", "duration_s", "rate_scale", "window_s")
    keys += ("max_model_len", "class_by_prompt", "class_column")
    options = {k: getattr(args, k) for k in keys}
    request = FitRequest(args.out, args.from_trace, args.from_metrics, **options)
    return fit_command(request, say=say)


def _fit_error(message: str) -> None:
    raise ConfigError(f"workload fit: {message}", hint="see `tuner workload fit --help`")


def _add_workload(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    workload = sub.add_parser("workload", help="workloads from real traffic")
    fit = workload.add_subparsers(dest="workload_command", required=True).add_parser(
        "fit", help="a workload YAML fitted to a trace or a running vLLM's metrics"
    )
    fit.error = _fit_error  # type: ignore[method-assign,assignment]
    source = fit.add_mutually_exclusive_group(required=True)
    source.add_argument("--from-trace", type=Path, default=None, help="CSV or JSONL trace")
    source.add_argument("--from-metrics", default=None, help="a vLLM server, http://host:8000")
    fit.add_argument("--out", type=Path, default=Path("fitted_workload.yaml"), help="the YAML")
    fit.add_argument("--layout", default=None, help="azure|burstgpt|mooncake|plain")
    fit.add_argument("--start-s", type=float, default=0.0, help="trace window start")
    fit.add_argument("--duration-s", type=float, default=None, help="trace window length")
    fit.add_argument("--rate-scale", type=float, default=1.0, help="2 = twice as fast")
    fit.add_argument("--window-s", type=float, default=60.0, help="between the two scrapes")
    fit.add_argument("--max-model-len", type=int, default=None, help="cap lengths to this")
    fit.add_argument(
        "--class-by-prompt",
        default=None,
        metavar="RULE",
        help="fit each class: chat:512,documents (prompt <= 512 tokens is chat, else documents)",
    )
    fit.add_argument(
        "--class-column",
        default=None,
        help="fit each class named in this column (default: the layout's, plain: request_class)",
    )
    fit.set_defaults(func=cmd_workload_fit)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. workload.concurrency=8")
    p.add_argument("--dry-run", action="store_true", help="print the plan, start nothing")
    p.add_argument("--config-dir", type=Path, default=None, help="instead of conf/")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tuner", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run or resume a study (baseline + staged search)")
    _add_common(run)
    run.add_argument("--rebaseline", action="store_true", help="measure a new baseline")
    run.set_defaults(func=cmd_run)
    trial = sub.add_parser("trial", help="run one trial (launch, load, measure, stop)")
    _add_common(trial)
    trial.add_argument("--trial-id", default=None, help="folder name under trials/")
    trial.set_defaults(func=cmd_trial)
    _add_review(sub)
    _add_planning(sub)
    add_deployment(sub)
    _add_workload(sub)
    cap = sub.add_parser("client-capacity", help="SSE events/s one load-generator process carries")
    cap.add_argument("--again", action="store_true", help="measure anew, replacing the stored one")
    cap.set_defaults(func=cmd_client_capacity)
    return parser


def cmd_client_capacity(args: argparse.Namespace) -> int:
    """Measure (or show the stored) client capacity of this host."""
    from tuner.loadgen import client_capacity

    return client_capacity.command(again=args.again, say=say)


class _ArgumentParserError(ConfigError):
    pass


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = build_parser()

    def error(message: str) -> None:  # one line and exit 2, like every other bad input
        raise _ArgumentParserError(message, hint="see `tuner --help`")

    parser.error = error  # type: ignore[method-assign,assignment]
    for action in parser._subparsers._group_actions if parser._subparsers else []:
        for subparser in getattr(action, "choices", {}).values():
            subparser.error = error
    return parser.parse_args(argv)


def _sigterm_as_interrupt(_signum: int, _frame: object) -> None:
    """SIGTERM takes the same path as Ctrl-C: children reaped, trial marked, exit 130."""
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt) if in_main else None
    try:
        return _main(argv)
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)


def _main(argv: Sequence[str] | None) -> int:
    try:
        args = _parse(argv)
        func: Callable[[argparse.Namespace], int] = args.func
        return func(args)
    except TunerError as exc:
        if os.environ.get("TUNER_FULL_ERROR") == "1":
            traceback.print_exc()
        print(f"tuner: error: {exc.one_line()}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # `tuner ... | head`: the reader left; not an error of ours
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("tuner: interrupted; every server and load generator was stopped", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
