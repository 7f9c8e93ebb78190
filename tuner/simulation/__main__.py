"""``python -m tuner.simulation [vLLM's flags]``: a simulated GPU host, started like vLLM.

It reads its flags with vLLM's own parser, its GPU system from ``TUNER_SIM_SYSTEM`` and its
devices from ``CUDA_VISIBLE_DEVICES``; it fails at start-up where vLLM would (more GPUs than it
sees, weights or KV cache that do not fit), with the log lines vLLM writes, so tuner classifies
the failure as it would a real one. ``TUNER_SIM_TIME_SCALE`` stretches every modelled delay of
serving and ``TUNER_SIM_STARTUP_SCALE`` shrinks the modelled start-up; both are printed in the
first line, which also says that this is a simulation and not a measurement. A non-zero
``TUNER_SIM_NOISE_CV`` draws this launch's slowdown (:mod:`~tuner.simulation.launch_noise`),
and the line says the CV and the factor drawn. A setting that is not a number it can use stops
the host at once with one line naming it.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from tuner.simulation import fake_nvml, launch_noise

TIME_SCALE_ENV = "TUNER_SIM_TIME_SCALE"
STARTUP_SCALE_ENV = "TUNER_SIM_STARTUP_SCALE"
BANNER = "SIMULATED GPU HOST (tuner.simulation), not vLLM and not a measurement"


def say(line: str) -> None:
    print(line, flush=True)


# vLLM's flags that change how it serves but that the host does not model: a launch that sets
# one runs at the modelled speed of its other flags, and says so (never an invented effect).
NOT_MODELLED = (
    "scheduling_policy",
    "long_prefill_token_threshold",
    "performance_mode",
    "optimization_level",
    "async_scheduling",
    "compilation_config",
    "max_cudagraph_capture_size",
    "api_server_count",
    "speculative_config",
    "attention_backend",
)
NOT_MODELLED_PREFIX = "not modelled (served at the modelled speed of the other flags): "


def parse(argv: list[str]) -> dict[str, Any]:
    """vLLM's own parser on ``argv``; exits 2 with argparse's words on a flag vLLM rejects.
    A flag of :data:`NOT_MODELLED` set away from vLLM's default is named in one line."""
    from tuner.server._vllm_argparse import ParseRejected, build_parser

    parser, _ = build_parser()
    try:
        values = dict(vars(parser.parse_args(argv)))
    except ParseRejected as exc:
        say(f"api_server.py: error: {exc}")
        sys.exit(2)
    if values.get("model_tag"):  # `serve MODEL`: vLLM's own serve command takes it so
        values["model"] = values["model_tag"]
    unmodelled = not_modelled(values, {d: parser.get_default(d) for d in NOT_MODELLED})
    if unmodelled:
        say(NOT_MODELLED_PREFIX + ", ".join(unmodelled))
    return values


def not_modelled(values: dict[str, Any], defaults: dict[str, Any]) -> list[str]:
    """The flags of :data:`NOT_MODELLED` that ``values`` sets away from vLLM's defaults."""
    return [
        f"{name}={values[name]}"
        for name in NOT_MODELLED
        if values.get(name) is not None and values.get(name) != defaults.get(name)
    ]


def visible_devices() -> list[int]:
    """The device indices this server was given (indices or the simulated UUIDs)."""
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return list(range(fake_nvml.nvmlDeviceGetCount()))
    found = []
    for part in filter(None, (p.strip() for p in raw.split(","))):
        found.append(
            fake_nvml.nvmlDeviceGetHandleByUUID(part) if part.startswith("GPU-") else int(part)
        )
    return found


def token_counter(values: dict[str, Any]) -> Callable[[str], int]:
    """Counts a prompt's tokens with the server's tokenizer when it is a local folder (vLLM's
    ``--tokenizer``, else the model), else by words."""
    folder = values.get("tokenizer") or values["model"]
    if Path(str(folder)).is_dir():
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        return lambda text: len(tokenizer.encode(text))
    return lambda text: max(len(text.split()), 1)


def setting(name: str, default: str, usable: Callable[[float], bool], meaning: str) -> float:
    """The number in environment variable ``name``; one line and exit 1 where it is not a
    finite number or not ``usable``: the line tuner reports as the failure's cause, and a
    "ValueError:" that it classifies as an invalid argument, as it would vLLM's."""
    raw = os.environ.get(name, default)
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and usable(value)):
        say(f"ValueError: {name}={raw!r} is not {meaning}")
        sys.exit(1)
    return value


def settings() -> tuple[float, float, float]:
    """The host's own settings, checked before anything is printed or estimated: its time
    scale, its start-up scale and its noise CV."""
    scale = "a factor of 0 or more"
    cv = "a CV from 0 (no noise) up to, not including, 1"
    return (
        setting(TIME_SCALE_ENV, "1", lambda v: v >= 0, scale),
        setting(STARTUP_SCALE_ENV, "1", lambda v: v >= 0, scale),
        setting(launch_noise.NOISE_CV_ENV, "0", launch_noise.valid_cv, cv),
    )


def fail(lines: list[str]) -> None:
    for line in lines:
        say(line)
    say("RuntimeError: Engine core initialization failed. See root cause above.")
    sys.exit(1)


def main(argv: list[str]) -> None:
    system = fake_nvml.system()
    time_scale, startup_scale, cv = settings()
    factor = launch_noise.launch_factor(cv)
    devices = visible_devices()
    say(
        f"{BANNER}: system {system}, {len(devices)} GPUs visible, time scale {time_scale:g}, "
        f"start-up scale {startup_scale:g}" + noisy(cv, factor)
    )
    values = parse(argv)
    from tuner.simulation.physics import CannotEstimate, DoesNotFit, Launch, estimate

    launch = Launch.from_parsed(values)
    if launch.gpus > len(devices):
        fail(
            [
                f"ValueError: The number of required GPUs ({launch.gpus}: TP {launch.tp} x PP "
                f"{launch.pp}) exceeds the {len(devices)} GPUs this server was given"
            ]
        )
    try:
        physics = replace(estimate(system, launch), launch_factor=factor)
    except DoesNotFit as exc:
        fail([f"ValueError: No available memory for the cache blocks (simulated: {exc})"])
        return
    except CannotEstimate as exc:
        fail(
            [
                f"NotImplementedError: AIConfigurator cannot estimate {launch.model} on {system} "
                f"with these flags (simulated): {exc}"
            ]
        )
        return
    load_s = physics.startup_s * startup_scale
    say(
        f"simulated start-up: {physics.startup_s:.0f} s on the GPUs "
        f"({physics.weights_gib:.0f} GiB of weights), slept {load_s:.1f} s"
    )
    time.sleep(load_s)
    length = launch.max_model_len or 8192
    say(f"GPU KV cache size: {physics.kv_tokens:,} tokens")
    say(f"Maximum concurrency for {length:,} tokens per request: {physics.kv_tokens / length:.2f}x")
    serve(physics, values, devices, time_scale)


def noisy(cv: float, factor: float) -> str:
    """The first line's words for this launch's noise; none without noise, so that a noiseless
    host's log reads as it always did."""
    return f", noise CV {cv:g} (this launch's serving delays x{factor:.4f})" if cv else ""


def serve(physics: Any, values: dict[str, Any], devices: list[int], time_scale: float) -> None:
    from aiohttp import web

    from tuner.simulation.openai_api import SimServer, make_app

    names = values.get("served_model_name") or [values["model"]]
    sim = SimServer(
        physics=physics,
        model=str(names[0]),
        devices=devices[: physics.launch.gpus],
        count_tokens=token_counter(values),
        time_scale=time_scale,
        api_key=os.environ.get("VLLM_API_KEY") or values.get("api_key"),
    )
    host, port = values.get("host") or "127.0.0.1", int(values.get("port") or 8000)
    say(f"Starting simulated vLLM API server on http://{host}:{port}")
    web.run_app(make_app(sim), host=host, port=port, print=None, access_log=None)


if __name__ == "__main__":
    main(sys.argv[1:])
