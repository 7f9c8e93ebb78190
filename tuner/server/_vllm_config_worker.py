"""Worker run in the *server's* interpreter: vLLM builds its engine config for each request.

Run as a script, never imported by tuner (it imports vLLM, ~5-15 s, once). It reads one JSON
request per stdin line, ``{"id": N, "argv": [...], "env": {...}}``, and answers each on the
reply channel with ``MARKER {"id": N, "error": null | {...}}``: the server's argument parser,
vLLM's pre-load checks, then ``AsyncEngineArgs.from_cli_args(...).create_engine_config(...)``,
which is how the OpenAI server builds its ``VllmConfig`` before it loads any weight. The model's
``config.json`` is read; no weight, no device memory. It exits at the end of stdin, so it dies
with the process that started it.

A request may also name server params (``"resolve": ["max_num_seqs", ...]``): the answer then
carries ``"values"``, each as the built config holds it. A flag left out is vLLM's default
there, which depends on the device, its memory and the other flags (max_num_seqs is 1024 on
an 80 GB GPU, 128 on this CPU), so only vLLM's own config can say what a launch runs.

The reply channel is the original stdout; fd 1 is pointed at stderr first, because vLLM and its
libraries print to stdout and a stray line must not be taken for an answer.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path
from typing import Any

MARKER = "@@tuner-vllm-config@@"
ENGINE_MODULES = ("vllm.engine.arg_utils",)
USAGE_MODULES = ("vllm.usage.usage_lib",)


def _reply_channel() -> Any:
    """A file on the original stdout; fd 1 then writes to stderr."""
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return reply


def _answer(channel: Any, payload: dict[str, Any]) -> None:
    channel.write(MARKER + " " + json.dumps(payload) + "\n")
    channel.flush()


def _pydantic_error(exc: Exception) -> dict[str, Any] | None:
    """A pydantic ValidationError as {config, errors: [{field, message}]}; None otherwise."""
    errors = getattr(exc, "errors", None)
    title = getattr(exc, "title", None)
    if not callable(errors) or title is None:
        return None
    parts = []
    for err in errors():
        field = ".".join(str(p) for p in err.get("loc") or ())
        message = str(err.get("msg", "")).removeprefix("Value error, ")
        if field:
            message = f"{message} (got {err.get('input')!r})"
        parts.append({"field": field, "message": message})
    return {"config": str(title), "errors": parts}


def _error(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, Exception):
        typed = _pydantic_error(exc)
        if typed is not None:
            return typed
    text = " ".join(str(exc).split()) or type(exc).__name__
    return {"config": type(exc).__name__, "errors": [{"field": "", "message": text}]}


# The parts of a VllmConfig that hold server params, searched in this order, and the params
# whose field there has another name.
SECTIONS = ("scheduler_config", "cache_config", "parallel_config", "model_config", "load_config")
FIELDS = {"kv_cache_dtype": "cache_dtype"}


def resolved(config: Any, names: list[str]) -> dict[str, Any]:
    """Each of ``names`` that a section of ``config`` holds, as JSON gives it (plain values;
    anything else as its string)."""
    out: dict[str, Any] = {}
    for name in names:
        field = FIELDS.get(name, name)
        for section in SECTIONS:
            part = getattr(config, section, None)
            if part is not None and hasattr(part, field):
                value = getattr(part, field)
                plain = value is None or isinstance(value, (bool, int, float, str))
                out[name] = value if plain else str(value)
                break
    return out


def platform_refusal(config: Any) -> dict[str, Any] | None:
    """An attention backend that vLLM's CPU platform would not run: it logs "Cannot use ...
    backend on CPU" at start-up and serves its own in its place, so a trial of it would
    measure another backend under its name. Asked of the platform's own selector
    (``get_attn_backend_cls``), as the model runner asks it; None where it would run it, and
    on every other platform (a GPU's selector refuses a backend it cannot run on its own)."""
    backend = getattr(getattr(config, "attention_config", None), "backend", None)
    if backend is None:
        return None
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return None
    from vllm.v1.attention.selector import AttentionSelectorConfig

    model, cache = config.model_config, config.cache_config
    selector = AttentionSelectorConfig(
        head_size=model.get_head_size(),
        dtype=model.dtype,
        kv_cache_dtype=cache.cache_dtype,
        block_size=cache.block_size,
        use_mla=bool(getattr(model, "use_mla", False)),
    )
    chosen = current_platform.get_attn_backend_cls(backend, selector)
    if chosen == backend.get_path():
        return None
    served = chosen.rsplit(".", 1)[-1]
    message = (
        f"{backend.name} cannot run on vLLM's CPU platform, which would serve {served} in its "
        "place (a trial would measure that under this name); search it on a GPU"
    )
    return {"config": "CpuPlatform", "errors": [{"field": "attention_backend", "message": message}]}


class Checker:
    """vLLM's parser and engine-args classes, imported once."""

    def __init__(self) -> None:
        helpers = runpy.run_path(str(Path(__file__).with_name("_vllm_argparse.py")))
        self.parser, self.validate = helpers["build_parser"]()
        self.parse = helpers["parse"]
        self.version = helpers["_version"]()
        find = helpers["_find"]
        self.engine_args = find(ENGINE_MODULES, "AsyncEngineArgs")
        self.usage = find(USAGE_MODULES, "UsageContext").OPENAI_API_SERVER

    def check(
        self, argv: list[str], env: dict[str, str], names: list[str]
    ) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """(None, the values of ``names``) when vLLM builds its config from ``argv`` under
        ``env``, else (the error, {})."""
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            args, message = self.parse(self.parser, self.validate, argv)
            if args is None:
                return {"config": "argparse", "errors": [{"field": "", "message": message}]}, {}
            engine = self.engine_args.from_cli_args(args)
            config = engine.create_engine_config(usage_context=self.usage)
            refused = platform_refusal(config)
            if refused is not None:
                return refused, {}
        except BaseException as exc:  # vLLM raises pydantic, Value, Type and Assertion errors
            if isinstance(exc, KeyboardInterrupt):
                raise
            return _error(exc), {}
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        return None, resolved(config, names)


def serve(channel: Any) -> int:
    try:
        checker = Checker()
    except Exception as exc:  # vLLM missing or broken: the caller reports it as one line
        _answer(channel, {"fatal": f"{type(exc).__name__}: {exc}"})
        return 1
    _answer(channel, {"ready": True, "version": checker.version})
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        error, values = checker.check(
            list(request.get("argv", [])),
            dict(request.get("env") or {}),
            [str(n) for n in request.get("resolve") or ()],
        )
        _answer(channel, {"id": request.get("id"), "error": error, "values": values})
    return 0


if __name__ == "__main__":
    sys.exit(serve(_reply_channel()))
