"""A configuration as the server runs it, so that two ways of writing one launch are one point.

A lead that leaves ``--max-num-seqs`` out runs vLLM's default, 1024 on an 80 GB GPU and 128 on
a CPU. A batching stage whose space holds 1024 would otherwise take that point for a new one,
launch the lead again and judge it by one more window, which a lucky reading can make the
stage's winner over its own incumbent. Completed with the server's own values, both read the
same: the stage reuses the lead's measurement, and the sampler starts from the lead's point.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from tuner.config import ServerConfig
from tuner.search import space as search_space

# (params, the specs of every param) -> each param's value as the server runs that launch
# (tuner.study.loop.prescreen.Prescreen.server_values asks vLLM's own config builder).
ServerValues = Callable[[dict[str, Any], dict[str, Any]], Mapping[str, Any]]


class ParamsAsRun:
    """Explicit params completed with the fixed args, the omit values and the server's values."""

    def __init__(self, specs: dict[str, Any], server: ServerConfig) -> None:
        self.specs = specs
        self.server = server
        # Attached by Session.preflight (vLLM's config worker) or a replay (its table); None
        # leaves a param the server picks unknown, and only identical params match.
        self.server_values: ServerValues | None = None
        self._known: dict[str, dict[str, Any]] = {}

    def defaults(self, params: dict[str, Any]) -> Mapping[str, Any]:
        """What the server runs for each param of the space when launched with ``params``."""
        return self.server_values(params, self.specs) if self.server_values else {}

    def __call__(self, params: dict[str, Any]) -> dict[str, Any]:
        """Every param of the space as a launch of ``params`` runs it; ``params`` itself when
        one is unknown. Each launch is asked once (a study asks again for every stored trial)."""
        key = json.dumps(params, sort_keys=True, default=str)
        if key not in self._known:
            full = search_space.as_run(params, self.specs, self.server, self.defaults(params))
            self._known[key] = full or params
        return self._known[key]
