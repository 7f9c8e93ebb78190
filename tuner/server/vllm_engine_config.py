"""vLLM's engine config (``VllmConfig``), built by a warm worker in the server's interpreter.

:class:`ConfigWorker` (:func:`config_worker`) builds it from a server's flags as the server
would, without loading weights, so a candidate that vLLM would refuse after seconds of start-up
is refused in milliseconds. Like :mod:`tuner.server.vllm_parser`, whose launcher and environment
it shares, the tuner never imports vLLM: :data:`CONFIG_WORKER` runs there and answers in JSON.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import queue
import subprocess
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError, PreflightError
from tuner.host.children import reap
from tuner.server.vllm_parser import LAUNCH_WORKER, WORKER_TIMEOUT_S, worker_env

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
                [self.python, "-c", LAUNCH_WORKER, str(CONFIG_WORKER)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=worker_env(),
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
