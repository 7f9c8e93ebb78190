"""Worker run in the *server's* interpreter: which flags a vLLM command line sets, and to what.

Run as a script (never imported by tuner), like ``_vllm_argparse.py``, whose parser it reuses:
the flags go through vLLM's own parser (its ``--config`` expansion, its underscore/dash
spelling, its pre-load checks), and every option action that argparse invokes is recorded, so
the reply names exactly the flags the command gave, whatever their values, with the values
vLLM parsed. Request on stdin: ``{"argv": [...]}`` (the flags after ``vllm serve``, model
first). Reply: one stdout line ``MARKER {json}``:
``{"error": str | None, "model_tag": str | None, "flags": {dest: {...}}}``.
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
from pathlib import Path
from typing import Any

# The folder of this file is not on sys.path (see tuner.server.vllm_parser): load by path.
_HELPERS = runpy.run_path(str(Path(__file__).with_name("_vllm_argparse.py")))
MARKER = _HELPERS["MARKER"]


def _record_calls(parser: argparse.ArgumentParser, seen: set[str]) -> None:
    """Make every option action note its dest when argparse invokes it for a given flag."""
    for action in parser._actions:
        base = type(action)

        def call(
            self: Any, p: Any, ns: Any, values: Any, option: Any = None, _b: Any = base
        ) -> None:
            if option is not None:  # None: a positional or a default, not a flag the user gave
                seen.add(self.dest)
            _b.__call__(self, p, ns, values, option)

        action.__class__ = type(f"Recorded{base.__name__}", (base,), {"__call__": call})


def _long_name(action: argparse.Action) -> str:
    """The flag's canonical name (``--max-num-seqs`` -> ``max_num_seqs``)."""
    longs = [o for o in action.option_strings if o.startswith("--") and not o.startswith("--no-")]
    return (longs or action.option_strings)[0].lstrip("-").replace("-", "_")


def _plain(value: Any) -> tuple[Any, bool]:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value), False
    return value, True


def handle(request: dict[str, Any]) -> dict[str, Any]:
    parser, validate = _HELPERS["build_parser"]()
    seen: set[str] = set()
    _record_calls(parser, seen)
    args, error = _HELPERS["parse"](parser, validate, list(request.get("argv", [])))
    if args is None:
        return {"error": error, "model_tag": None, "flags": {}}
    flags: dict[str, Any] = {}
    for action in parser._actions:
        if action.dest in seen:
            value, plain = _plain(getattr(args, action.dest))
            flags[action.dest] = {
                "name": _long_name(action),
                "value": value,
                "plain": plain,
                "switch": action.nargs == 0,  # takes no value: store_true, --x/--no-x, ...
            }
    return {"error": None, "model_tag": getattr(args, "model_tag", None), "flags": flags}


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
