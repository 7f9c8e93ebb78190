"""Start from what runs today: a ``vllm serve ...`` command or a vLLM ``--config`` YAML.

``server.from_command`` / ``server.from_config`` are read by vLLM's own parser (in a worker
subprocess of the server's interpreter, ``_command_worker.py``): the flags the command gives
become the study's fixed args, and so its baseline. An unknown flag, a bad value or an
unparseable command is one ConfigError line (exit 2), in vLLM's words.

What carries over and what does not:

- every flag the command gives, at the value vLLM parsed (``--x`` / ``--no-x`` switches too);
- the model (positional or ``--model``) and ``--served-model-name`` go to their own fields;
- leading ``NAME=value`` assignments go to ``server.env``;
- ``--host``, ``--port`` and ``--api-key`` do not: a trial serves on loopback at a port of its
  own with a key of its own, and a key on a command line is a leaked key (secret-named
  variables are dropped the same way, and the stored command is redacted).

The command's flags replace the presets' ``server.args``; a ``server.args.NAME=...`` (or
``server.model=...``) given on tuner's own command line is an explicit change and wins.
Parses are cached on disk per vLLM version, so a preset that names a command costs the vLLM
import once, not at every composition.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.config import MISSING_MODEL, ServerConfig
from tuner.errors import ConfigError, PreflightError
from tuner.redact import Redactor, is_secret_name
from tuner.server.vllm_parser import MARKER, WORKER_TIMEOUT_S, cache_dir, vllm_version

WORKER = Path(__file__).with_name("_command_worker.py")
# As in tuner.server.vllm_parser: run the worker by path without its folder on sys.path, where
# tuner/server/vllm.py would shadow the vllm package.
_LAUNCH_WORKER = (
    "import runpy, sys\n"
    "sys.path.pop(0)\n"
    "path = sys.argv.pop(1)\n"
    "runpy.run_path(path, run_name='__main__')\n"
)
# Flags a deployment sets for itself: a trial chooses its own (loopback, a free port, a key).
NOT_CARRIED = ("host", "port", "api_key", "config")
_ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_API_SERVER_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server")


@dataclass(frozen=True)
class StartCommand:
    """What a deployment command sets: model, served name, flags (name -> value), environment."""

    model: str | None
    served_model_name: str | None
    args: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)
    not_carried: tuple[str, ...] = ()  # flags and variables left to the study (see above)


def flag_tokens(command: str) -> tuple[dict[str, str], list[str]]:
    """``(env, flags)`` of a shell command line: leading assignments, then what follows the
    launcher (``vllm serve`` or ``python -m vllm.entrypoints.openai.api_server``)."""
    try:
        tokens = shlex.split(command.replace("\\\n", " "))
    except ValueError as exc:
        raise ConfigError(f"server.from_command is not a shell command line: {exc}") from None
    env: dict[str, str] = {}
    while tokens and (_ENV_ASSIGN.match(tokens[0]) or tokens[0] in ("env", "exec")):
        token = tokens.pop(0)
        if "=" in token:
            name, value = token.split("=", 1)
            env[name] = value
    return env, _after_launcher(tokens)


def _after_launcher(tokens: list[str]) -> list[str]:
    if len(tokens) >= 2 and Path(tokens[0]).name == "vllm" and tokens[1] == "serve":
        return tokens[2:]
    if len(tokens) >= 3 and tokens[1] == "-m" and "python" in Path(tokens[0]).name:
        if tokens[2] in _API_SERVER_MODULES:
            return tokens[3:]
        if tokens[2] == "vllm.entrypoints.cli.main" and tokens[3:4] == ["serve"]:
            return tokens[4:]
    shown = " ".join(tokens[:3])
    raise ConfigError(
        f"server.from_command must start with `vllm serve` (or `python -m "
        f"vllm.entrypoints.openai.api_server`), got {shown!r}",
        hint="give the command line your deployment runs, e.g. 'vllm serve MODEL --max-num-seqs 8'",
    )


def _run_worker(python: str, argv: list[str]) -> dict[str, Any]:
    try:
        proc = subprocess.run(
            [python, "-c", _LAUNCH_WORKER, str(WORKER)],
            input=json.dumps({"argv": argv}),
            capture_output=True,
            text=True,
            timeout=WORKER_TIMEOUT_S,
            env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR", "HF_HUB_OFFLINE": "1"},
        )
    except OSError as exc:
        raise ConfigError(f"cannot run server.python {python!r}: {exc.strerror}") from exc
    except subprocess.TimeoutExpired as exc:
        raise PreflightError(
            f"vLLM's argument parser did not answer within {WORKER_TIMEOUT_S:.0f} s"
        ) from exc
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARKER)]
    if not lines:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise PreflightError(f"vLLM's argument parser crashed: {tail or 'no output'}")
    reply: dict[str, Any] = json.loads(lines[-1][len(MARKER) :])
    if "fatal" in reply:
        raise ConfigError(f"cannot build vLLM's argument parser with {python}: {reply['fatal']}")
    return reply


def _cached_parse(python: str, argv: list[str], config_text: str) -> dict[str, Any]:
    """The worker's reply, from the disk cache when this vLLM parsed the same input before."""
    version = vllm_version(python) or ""
    key = hashlib.sha256(json.dumps([version, argv, config_text]).encode()).hexdigest()[:24]
    path = cache_dir() / "commands" / f"{key}.json"
    if version and "dev" not in version:
        try:
            return dict(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            pass
    reply = _run_worker(python, argv)
    if version and "dev" not in version:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(reply), encoding="utf-8")
            os.replace(tmp, path)
        except OSError:
            pass  # the cache only saves a vLLM import; a read-only home must not fail a run
    return reply


def _start_command(reply: dict[str, Any], env: dict[str, str], where: str) -> StartCommand:
    args: dict[str, Any] = {}
    dropped = [name for name in env if is_secret_name(name)]
    for dest, flag in reply["flags"].items():
        name, value = str(flag["name"]), flag["value"]
        if not flag["plain"]:
            raise ConfigError(
                f"{where}: --{name.replace('_', '-')} parsed to {value}, which tuner cannot "
                "pass on as a fixed arg",
                hint=f"leave it out of the command and set server.args.{name}",
            )
        if flag["switch"] and not isinstance(value, bool):
            raise ConfigError(f"{where}: the switch --{name.replace('_', '-')} is not supported")
        if dest in NOT_CARRIED or name in NOT_CARRIED:
            dropped.append(name)
        elif dest not in ("model", "served_model_name"):
            args[name] = json.dumps(value) if isinstance(value, dict) else value
    flags = reply["flags"]
    served = (flags.get("served_model_name") or {}).get("value")
    if isinstance(served, list) and len(served) > 1:
        raise ConfigError(f"{where}: give one --served-model-name, got {len(served)}")
    model = reply.get("model_tag") or (flags.get("model") or {}).get("value")
    return StartCommand(
        model=str(model) if model else None,
        served_model_name=(served[0] if isinstance(served, list) else served) or None,
        args=args,
        env={k: v for k, v in env.items() if not is_secret_name(k)},
        not_carried=tuple(dropped),
    )


def parse_command(python: str, command: str) -> StartCommand:
    """The flags of a deployment command line, as vLLM's parser reads them."""
    env, argv = flag_tokens(command)
    reply = _cached_parse(python, argv, "")
    if reply.get("error"):
        raise ConfigError(f"server.from_command: vLLM rejects it: {reply['error']}")
    return _start_command(reply, env, "server.from_command")


def parse_config_file(python: str, path: str | Path) -> StartCommand:
    """The flags of a ``vllm serve --config FILE`` YAML, as vLLM's parser expands them."""
    file = Path(path).expanduser()
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"server.from_config: cannot read {path}: {exc.strerror}") from None
    reply = _cached_parse(python, ["--config", str(file.resolve())], text)
    if reply.get("error"):
        raise ConfigError(f"server.from_config: vLLM rejects {path}: {reply['error']}")
    return _start_command(reply, {}, "server.from_config")


def explicit_keys(overrides: Iterable[str]) -> set[str]:
    """The ``server.*`` keys a Hydra override list sets (``server.args.x=1`` -> that key)."""
    keys = {o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o}
    return {k for k in keys if k.startswith("server.")}


def apply_start(server: ServerConfig, start: StartCommand, explicit: set[str]) -> None:
    """Make ``start`` the server's fixed part; keys in ``explicit`` (given on tuner's command
    line) keep their values."""

    def mine(prefix: str, values: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in values.items() if f"server.{prefix}.{k}" in explicit}

    server.args = {**start.args, **mine("args", server.args)}
    server.env = {**server.env, **start.env, **mine("env", server.env)}
    if start.model and "server.model" not in explicit:
        server.model = start.model
    if start.served_model_name and "server.served_model_name" not in explicit:
        server.served_model_name = start.served_model_name
    if server.model == MISSING_MODEL or not server.model:
        raise ConfigError("server.from_command/from_config names no model, nor does server.model")
    if server.from_command:  # stored with the study's config: never with a key in it
        server.from_command = Redactor().text(server.from_command)


def start_from_today(server: ServerConfig, overrides: Iterable[str] = ()) -> StartCommand | None:
    """Apply ``server.from_command`` / ``server.from_config`` if one is set; the parse, or None."""
    python = server.python or sys.executable
    if server.kind == "external":  # measured as it runs: a start command says nothing of it
        return None
    if server.from_command:
        start = parse_command(python, server.from_command)
    elif server.from_config:
        start = parse_config_file(python, server.from_config)
    else:
        return None
    apply_start(server, start, explicit_keys(overrides))
    return start
