"""A running endpoint as a :class:`~tuner.server.backend.ServerBackend` (``server=external``).

`tuner trial server=external server.url=...` measures a server that tuner does not own, through
the same trial as a vLLM it launches: same load generator, same measurement. Nothing is started,
and nothing is ever stopped or signalled: ``start`` and ``stop`` only mark time, and
``check_alive`` asks ``/health``. Flags cannot be applied to a server someone else runs, so a
launch that carries any is refused before a request is sent.

The API key comes from ``server.api_key`` when set (``""``: none), else from the
``VLLM_API_KEY`` environment variable, the one vLLM itself and the exported scripts read; it is
sent as a header, never written anywhere.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import requests

from tuner.config import ServerConfig, check_http_url
from tuner.errors import PreflightError, ServerDiedError, ServerStartError
from tuner.search.resolved import ResolvedLaunch
from tuner.server import backend
from tuner.server.backend import ServerInfo

API_KEY_ENV = "VLLM_API_KEY"
REASON_UNAUTHORIZED = "unauthorized"
HEALTH_EVERY_S = 5.0  # the trial's watchdog asks every 0.5 s: a remote server needs less
PROBE_TIMEOUT_S = 5.0


def base_url(url: str) -> str:
    """``http://h:p`` from ``http://h:p/``, ``http://h:p/v1`` or ``http://h:p/v1/``."""
    trimmed = url.rstrip("/")
    return trimmed[: -len("/v1")] if trimmed.endswith("/v1") else trimmed


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def served_models(url: str, api_key: str | None) -> list[dict[str, Any]]:
    """``/v1/models``'s entries; raises requests' errors, and PermissionError on 401/403."""
    resp = requests.get(
        base_url(url) + "/v1/models", headers=auth_headers(api_key), timeout=PROBE_TIMEOUT_S
    )
    if resp.status_code in (401, 403):
        raise PermissionError(f"HTTP {resp.status_code}")
    resp.raise_for_status()
    data = resp.json().get("data") or []
    return [d for d in data if isinstance(d, dict) and d.get("id")]


def completion_status(url: str, api_key: str | None, model: str) -> int:
    """The HTTP status of a one-token completion: what every request of a load run meets
    (``/v1/models`` may be open where completions need the key)."""
    body = {"model": model, "prompt": "hello", "max_tokens": 1}
    resp = requests.post(
        base_url(url) + "/v1/completions", json=body, headers=auth_headers(api_key), timeout=60
    )
    return resp.status_code


class ExternalServer:
    """An endpoint that someone else runs: measured, never started, stopped or signalled."""

    def __init__(self, config: ServerConfig, launch: ResolvedLaunch, log_path: Path) -> None:
        self.config = config
        self.launch = launch
        self.log_path = log_path
        self._started_at = 0.0
        self._last_health = 0.0

    @property
    def base_url(self) -> str:
        return base_url(self.config.url or "")

    @property
    def api_key(self) -> str | None:
        if self.config.api_key is not None:
            return self.config.api_key or None
        return os.environ.get(API_KEY_ENV) or None

    @property
    def pid(self) -> int | None:
        return None  # not ours: no process to watch, pin or signal

    @property
    def model_name(self) -> str:
        return self.config.served_model_name or self.config.model

    def argv(self) -> list[str]:
        return []  # nothing is run

    def preflight(self) -> None:
        check_http_url(self.config.url or "", "server.url")
        flags = [*self.launch.flags, *self.launch.env]
        if flags:
            raise PreflightError(
                "server=external measures a running endpoint as it is: it cannot apply "
                f"{', '.join(flags)}",
                hint="tune with server=vllm; use server=external for `tuner trial` or checks",
            )

    def start(self) -> None:
        self.preflight()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.write_text(f"external endpoint {self.base_url} (not started by tuner)\n")
        self._started_at = time.monotonic()

    def wait_ready(self, deadline: float) -> ServerInfo:
        """Ready = the model is listed and a one-token completion with the key succeeds."""
        while True:
            names, status, last = self._probe()
            if status in (401, 403):
                raise ServerStartError(
                    f"{self.base_url} refused the API key ({last})",
                    reason=REASON_UNAUTHORIZED,
                    hint=f"set {API_KEY_ENV} to the endpoint's key",
                )
            if 200 <= status < 500:  # an answer: ready, or another model (final either way)
                return self._ready(names, status)
            if time.monotonic() >= deadline:
                raise ServerStartError(
                    f"{self.base_url} did not answer within {self.config.startup_timeout_s:.0f} s "
                    f"({last})",
                    reason=backend.REASON_STARTUP_TIMEOUT,
                    hint="check server.url and that the endpoint is up",
                )
            time.sleep(1.0)

    def _probe(self) -> tuple[list[str], int, str]:
        """(served names, completion status or 0 for no answer, what happened)."""
        try:
            names = [str(d["id"]) for d in served_models(self.base_url, self.api_key)]
        except PermissionError as exc:
            return [], 401, str(exc)
        except (requests.RequestException, ValueError) as exc:
            return [], 0, type(exc).__name__
        if self.model_name not in names:
            return names, 404, "model not listed"
        try:
            status = completion_status(self.base_url, self.api_key, self.model_name)
        except requests.RequestException as exc:
            return names, 0, type(exc).__name__
        return names, status, f"HTTP {status}"

    def _ready(self, names: list[str], status: int) -> ServerInfo:
        if status != 200:
            raise ServerStartError(
                f"{self.base_url} serves {', '.join(names) or 'no model'}; a one-token "
                f"completion of {self.model_name!r} got HTTP {status}",
                reason=backend.REASON_INVALID_ARGUMENT,
                hint="set server.served_model_name to the name it serves "
                "(server.model stays the local folder of its tokenizer)",
            )
        return ServerInfo(
            base_url=self.base_url,
            pid=0,  # no process of ours: telemetry and placement find nothing to read
            startup_s=time.monotonic() - self._started_at,
            version=self._version(),
        )

    def _version(self) -> str | None:
        try:
            resp = requests.get(self.base_url + "/version", timeout=PROBE_TIMEOUT_S)
            return f"vllm-{resp.json()['version']}" if resp.ok else None
        except (requests.RequestException, ValueError, KeyError, TypeError):
            return None

    def check_alive(self) -> None:
        """``/health``, at most every few seconds; a refused connection means it is gone."""
        now = time.monotonic()
        if now - self._last_health < HEALTH_EVERY_S:
            return
        self._last_health = now
        try:
            requests.get(self.base_url + "/health", timeout=PROBE_TIMEOUT_S)
        except requests.ConnectionError as exc:
            raise ServerDiedError(
                f"{self.base_url} stopped answering ({type(exc).__name__})",
                reason=backend.REASON_DIED_DURING_LOAD,
            ) from None
        except requests.RequestException:
            return  # slow under load is not gone

    def stop(self) -> None:
        return  # never: this process did not start it

    def __enter__(self) -> ExternalServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
