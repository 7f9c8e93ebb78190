"""Locust, headless, in its own subprocess: the LoadGenerator that trials use.

The parent never imports locust (it monkey-patches the whole process with gevent). It writes the
request plan and a JSON spec into the trial folder, starts ``python -m locust`` in a new session
(so the whole process group can be reaped), and merges the per-process raw records that
``locustfile.py`` writes into one ``requests.jsonl``. Locust's CSV/HTML are kept for people.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from tuner.config.workload import WorkloadConfig
from tuner.errors import ArtifactError, LoadGenError
from tuner.host.children import reap, spawn
from tuner.loadgen.generator import LoadResult, Target, register_load_generator
from tuner.loadgen.request_plan import PlannedRequest, build_plan, write_plan
from tuner.measurement.records import (
    PHASE_MEASURE,
    PHASE_WARMUP,
    RequestRecord,
    read_records,
    write_records,
)

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
RECORDS_PREFIX = "records"  # per process: records-<pid>.jsonl and records-<pid>.run.json
STARTUP_SLACK_S = 30.0  # Locust's own start (imports, forking workers) on a busy machine
EXIT_SLACK_S = 30.0  # writing CSV/HTML and quitting after the drain
KILL_GRACE_S = 5.0
POLL_S = 0.25
LOG_TAIL_LINES = 15

log = logging.getLogger(__name__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _log_tail(path: Path, n: int = LOG_TAIL_LINES) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return "(no locust.log)"
    return "\n".join(lines[-n:])


API_KEY_ENV = "TUNER_LOADGEN_API_KEY"


@register_load_generator("locust")
class LocustLoadGenerator:
    """Runs ``tuner/loadgen/locustfile.py`` with ``python -m locust --headless``."""

    def __init__(
        self,
        python: str | None = None,
        locustfile: Path | None = None,
        slack_s: float = STARTUP_SLACK_S + EXIT_SLACK_S,
        cpus: Sequence[int] | None = None,
    ) -> None:
        self.python = python or sys.executable  # the venv that has locust and tuner
        self.locustfile = locustfile or LOCUSTFILE
        self.slack_s = slack_s  # start-up and exit time allowed on top of the run itself
        self.cpus = cpus  # the client's CPUs (tuner.host.placement); None = any

    # ------------------------------------------------------------------ public
    def run(
        self,
        target: Target,
        workload: WorkloadConfig,
        out_dir: Path,
        on_spawn: Callable[[int], None] | None = None,
    ) -> LoadResult:
        workload.validate()
        spec_path = self._prepare(target, workload, out_dir)
        proc = self._start(self.argv(target, workload, out_dir), out_dir, spec_path, target)
        pids = [proc.pid]
        if on_spawn is not None:
            on_spawn(proc.pid)
        try:
            rc = self._wait(proc, self.deadline_s(workload), out_dir, pids, on_spawn)
        except BaseException:  # timeout, Ctrl-C, anything: never leave the client running
            reap(proc, KILL_GRACE_S)
            with contextlib.suppress(OSError):  # best effort: keep what finished, for a look
                self._merge(out_dir)
            raise
        return self._result(workload, out_dir, pids, rc)

    def _prepare(self, target: Target, workload: WorkloadConfig, out_dir: Path) -> Path:
        """Write the plan and the spec; clear what an earlier run in this folder left."""
        plan = self.plan(target, workload)
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            for old in out_dir.glob(f"{RECORDS_PREFIX}-*"):
                old.unlink()
            write_plan(out_dir / "plan.jsonl", plan)
            spec_path = out_dir / "loadgen_spec.json"
            spec_path.write_text(json.dumps(self.spec(target, workload, out_dir), indent=1))
        except OSError as exc:
            raise ArtifactError(
                f"cannot write the load plan into {out_dir}: {exc}",
                hint="check that the trial folder is writable and the disk is not full",
            ) from exc
        return spec_path

    def plan(self, target: Target, workload: WorkloadConfig) -> list[PlannedRequest]:
        """The requests to send: the workload's plan, with the target's tokenizer; each
        class's priority only where the server schedules by it."""
        plan = build_plan(workload, target.tokenizer)
        if target.by_priority:
            return plan
        return [replace(p, priority=0) if p.priority else p for p in plan]

    def spec(self, target: Target, workload: WorkloadConfig, out_dir: Path) -> dict[str, Any]:
        """The settings the locustfile reads (TUNER_LOADGEN_SPEC)."""
        keys = ["mode", "concurrency", "rate", "burstiness", "seed", "warmup_s", "window_s"]
        keys += ["max_requests", "request_timeout_s", "drain_timeout_s", "processes"]
        return {
            "base_url": target.base_url.rstrip("/"),
            "model": target.model,
            "plan": str((out_dir / "plan.jsonl").resolve()),
            "records_prefix": str((out_dir / RECORDS_PREFIX).resolve()),
            "created_at": time.time(),
            **{k: getattr(workload, k) for k in keys},
        }

    def argv(self, target: Target, workload: WorkloadConfig, out_dir: Path) -> list[str]:
        """The Locust command line (the run ends itself; --run-time is only a backstop)."""
        closed = workload.mode == "closed"
        users = workload.concurrency if closed else workload.processes
        backstop = workload.warmup_s + workload.window_s + workload.drain_timeout_s + 15
        argv = [self.python, "-m", "locust", "-f", str(self.locustfile), "--headless"]
        argv += ["-u", str(users), "-r", str(users), "--run-time", f"{math.ceil(backstop)}s"]
        argv += ["--stop-timeout", "5", "--exit-code-on-error", "0", "--only-summary"]
        out = out_dir.resolve()  # Locust runs with cwd=out_dir: relative paths would nest
        argv += ["--csv", str(out / "locust"), "--html", str(out / "locust.html")]
        argv += ["--host", target.base_url.rstrip("/")]
        if workload.processes > 1:
            port = str(_free_port())  # the default 5557 would clash with another run
            argv += ["--processes", str(workload.processes)]
            argv += ["--master-bind-host", "127.0.0.1", "--master-bind-port", port]
            argv += ["--master-host", "127.0.0.1", "--master-port", port]
        argv.append("ClosedLoopUser" if closed else "OpenLoopUser")
        return argv

    def deadline_s(self, workload: WorkloadConfig) -> float:
        """The longest a healthy run can take, start to exit (each worker adds start-up time)."""
        run = workload.warmup_s + workload.window_s + workload.drain_timeout_s
        return self.slack_s + 5.0 * (workload.processes - 1) + run

    # ------------------------------------------------------------------ process
    def _start(
        self, argv: list[str], out_dir: Path, spec: Path, target: Target
    ) -> subprocess.Popen[bytes]:
        env = dict(os.environ, TUNER_LOADGEN_SPEC=str(spec.resolve()), PYTHONUNBUFFERED="1")
        env.pop(API_KEY_ENV, None)
        if target.api_key:  # by environment, so the key is in no file of the trial folder
            env[API_KEY_ENV] = target.api_key
        root = str(Path(__file__).resolve().parents[2])  # so the locustfile imports this tuner
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        try:
            # cwd=out_dir: Locust must not pick up a locust.conf/pyproject.toml from the caller.
            return spawn(argv, env, out_dir / "locust.log", cwd=out_dir, cpus=self.cpus)
        except OSError as exc:
            raise LoadGenError(
                f"cannot start Locust ({argv[0]}): {exc}",
                hint="check that the tuner venv's python has locust installed",
            ) from exc

    def _wait(
        self,
        proc: subprocess.Popen[bytes],
        deadline_s: float,
        out_dir: Path,
        pids: list[int],
        on_spawn: Callable[[int], None] | None,
    ) -> int:
        end = time.monotonic() + deadline_s
        while True:
            try:
                return proc.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                pass
            self._report_new_pids(out_dir, pids, on_spawn)
            if time.monotonic() > end:
                log = out_dir / "locust.log"
                raise LoadGenError(
                    f"Locust did not finish within {deadline_s:.0f} s and was killed; "
                    f"last lines of {log}:\n{_log_tail(log, 5)}",
                    hint="check that the server answers; raise workload timeouts if it is slow",
                )

    @staticmethod
    def _report_new_pids(
        out_dir: Path, pids: list[int], on_spawn: Callable[[int], None] | None
    ) -> None:
        """Worker processes announce themselves with a run-info file at test start."""
        for info in out_dir.glob(f"{RECORDS_PREFIX}-*.run.json"):
            pid = int(info.name.split("-")[1].split(".")[0])
            if pid not in pids:
                pids.append(pid)
                if on_spawn is not None:
                    on_spawn(pid)

    # ------------------------------------------------------------------ results
    @staticmethod
    def _merge(out_dir: Path) -> list[RequestRecord]:
        """All processes' records, in send order, into requests.jsonl (per-process files go)."""
        parts = sorted(out_dir.glob(f"{RECORDS_PREFIX}-*.jsonl"))
        records = sorted((r for p in parts for r in read_records(p)), key=lambda r: r.sent_at)
        merged = out_dir / "requests.jsonl"
        merged.unlink(missing_ok=True)
        merged.touch()
        write_records(merged, records)
        for part in parts:
            part.unlink()
        return records

    def _result(
        self, workload: WorkloadConfig, out_dir: Path, pids: list[int], rc: int
    ) -> LoadResult:
        self._report_new_pids(out_dir, pids, None)
        records = self._merge(out_dir)
        if rc != 0:  # killed or crashed: whatever it recorded covers part of the window only
            got = f"recorded {len(records)} requests" if records else "recorded no request"
            raise LoadGenError(
                f"Locust exited with code {rc} and {got}; "
                f"last lines of {out_dir / 'locust.log'}:\n{_log_tail(out_dir / 'locust.log')}",
                hint="fix the error shown in locust.log",
            )
        infos = _run_infos(out_dir)
        _warn_prompt_reuse(infos, out_dir)
        start, end = _window(workload, infos, records)
        csv = out_dir / "locust_stats.csv"
        html = out_dir / "locust.html"
        return LoadResult(
            records_path=out_dir / "requests.jsonl",
            window_start=start,
            window_end=end,
            measured_requests=sum(r.phase == PHASE_MEASURE for r in records),
            warmup_requests=sum(r.phase == PHASE_WARMUP for r in records),
            locust_csv_prefix=out_dir / "locust" if csv.exists() else None,
            html_path=html if html.exists() else None,
            client_pids=pids,
            returncode=rc,
        )


def _run_infos(out_dir: Path) -> list[dict[str, Any]]:
    """What each client process said about its run (t0, stop time, prompts reused)."""
    return [json.loads(p.read_text()) for p in out_dir.glob(f"{RECORDS_PREFIX}-*.run.json")]


def _warn_prompt_reuse(infos: list[dict[str, Any]], out_dir: Path) -> None:
    if reused := sum(i.get("prompts_reused", 0) for i in infos):
        with (out_dir / "plan.jsonl").open(encoding="utf-8") as fh:
            size = sum(1 for _ in fh)
        log.warning(
            "%d requests reused a prompt of the %d-prompt plan: the server's prefix cache "
            "may flatter TTFT (shorten the window or lower the load)",
            reused,
            size,
        )


def _window(
    workload: WorkloadConfig, infos: list[dict[str, Any]], records: list[RequestRecord]
) -> tuple[float, float]:
    """The measurement window from the processes' run-info (records as a fallback)."""
    if infos:
        start = min(i["t0"] for i in infos) + workload.warmup_s
        stops = [i["stopped_at"] for i in infos if i.get("stopped_at") is not None]
        # A process that never reached its stop (killed) ran at most to the planned end.
        end = max(stops) if len(stops) == len(infos) else start + workload.window_s
        return start, end
    sent = [r.sent_at for r in records if r.phase == PHASE_MEASURE]
    return (min(sent), max(sent)) if sent else (0.0, 0.0)
