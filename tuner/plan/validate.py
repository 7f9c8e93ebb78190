"""vLLM's own config validation of a launch, before anything starts.

The server's flags go to a warm worker in the server's interpreter
(:class:`tuner.server.vllm_engine_config.ConfigWorker`), which builds vLLM's engine config
the way the OpenAI server does before it loads weights. A launch it refuses would have cost a
server start (seconds on a CPU, minutes on a GPU) to learn the same thing; here it costs
milliseconds, and the answer names the flag and gives vLLM's reason in one line.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.config import ServerConfig
from tuner.errors import PreflightError, TunerError
from tuner.search.launch import LaunchSpec
from tuner.search.resolved import resolve
from tuner.server import make_backend
from tuner.server.vllm_engine_config import (
    ConfigProblem,
    ConfigRejection,
    ConfigWorker,
    config_worker,
)
from tuner.server.vllm_parser import parsed_args

_FLAG_RE = re.compile(r"^--[a-z0-9][a-z0-9-]*$")


@dataclass(frozen=True)
class Rejection:
    """A launch vLLM refuses: the flags its reason names, and the reason in vLLM's words."""

    flags: tuple[str, ...]  # e.g. ("--max-num-seqs -4",); empty when it names none of ours
    reason: str  # e.g. "SchedulerConfig: max_num_seqs: Input should be ... (got -4)"

    def line(self) -> str:
        named = ", ".join(self.flags) if self.flags else "the server flags"
        return f"vLLM rejects {named}: {self.reason}"


def flag_values(argv: list[str]) -> dict[str, str]:
    """``--flag -> value`` of a flag list ("" for a switch); a negative number is a value."""
    out: dict[str, str] = {}
    for i, token in enumerate(argv):
        if _FLAG_RE.match(token):
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            out[token] = "" if _FLAG_RE.match(nxt) else nxt
    return out


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _named(problem: ConfigProblem, flags: dict[str, str]) -> list[str]:
    """The flags of ``flags`` one problem is about: its field, else those its words name."""
    if problem.field:
        return [f for f in flags if _dest(f) == problem.field.split(".")[-1]]
    words = set(re.findall(r"[a-z_]+", problem.message))
    mentioned = [f for f in flags if _dest(f) in words or f in problem.message]
    return [f for f in mentioned if f != "--model"]


def explain(rejection: ConfigRejection, argv: list[str]) -> Rejection:
    """Name the flags of ``argv`` that vLLM's reason is about, keeping only the problems with
    our flags in them when some are (a bad --max-num-seqs also derives a bad token budget)."""
    flags = flag_values(argv)
    about = [(p, _named(p, flags)) for p in rejection.problems]
    ours = [(p, named) for p, named in about if named]
    kept = ours or about
    named = list(dict.fromkeys(f for _, fs in kept for f in fs))
    shown = tuple(f"{f} {flags[f]}".rstrip() for f in named)
    words = "; ".join(f"{p.field}: {p.message}" if p.field else p.message for p, _ in kept)
    prefix = "" if rejection.config == "argparse" else f"{rejection.config}: "
    return Rejection(shown, prefix + words)


VALIDATED_KINDS = ("vllm",)  # servers tuner launches with vLLM's flags (not an external URL)


def validates(server: ServerConfig) -> bool:
    """Whether launches of ``server`` go through vLLM's config check."""
    return server.kind in VALIDATED_KINDS


@functools.cache
def parser_defaults(python: str) -> dict[str, Any]:
    """vLLM's parser's own default of every flag that has one, for a server whose launches
    vLLM's config worker cannot build (the simulated GPU host's are not this CPU's platform):
    what a flag left out runs there. A flag whose value vLLM picks at start-up from the
    platform (``max_num_seqs``) has no default here and stays unknown. {} where the parser
    does not answer."""
    try:
        values = parsed_args(python, [])
    except TunerError:
        return {}
    return {name: value for name, value in values.items() if value is not None}


class ConfigValidator:
    """Checks launches of one server config with vLLM's own code (a warm worker per process)."""

    def __init__(self, server: ServerConfig) -> None:
        self.server = server
        self.worker: ConfigWorker = config_worker(server.python or sys.executable)

    def request(self, launch: LaunchSpec) -> tuple[list[str], dict[str, str]]:
        """The flags (with --model) and environment the server would get for ``launch``."""
        argv = make_backend(self.server, resolve(launch, self.server), Path(os.devnull)).argv()
        flags = argv[len(self.server.launcher) :]
        if "--model" not in flags:  # a positional launcher (`vllm serve {model}`)
            flags = ["--model", self.server.model, *flags]
        env = {**self.server.env, **launch.env}
        if self.server.cuda_visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.server.cuda_visible_devices
        return flags, env

    def warm(self) -> None:
        """Start the worker now, so vLLM is imported while other checks run."""
        self.worker.spawn()

    def check(self, launch: LaunchSpec) -> Rejection | None:
        """None when vLLM builds its engine config for ``launch``, else why not."""
        flags, env = self.request(launch)
        refused = self.worker.check(flags, env)
        return None if refused is None else explain(refused, flags)

    def values(self, launch: LaunchSpec, names: list[str]) -> dict[str, Any]:
        """What vLLM's engine config for ``launch`` holds for the server params ``names`` (a
        flag left out: vLLM's default for this launch on this device); {} when it refuses."""
        flags, env = self.request(launch)
        return self.worker.build(flags, env, names)[1]

    def preflight(self, launch: LaunchSpec) -> None:
        """Raise PreflightError (one line, exit 2) when vLLM would refuse ``launch``."""
        rejected = self.check(launch)
        if rejected is not None:
            raise PreflightError(rejected.line(), hint="fix the flag; nothing was started")

    def close(self) -> None:
        self.worker.close()
