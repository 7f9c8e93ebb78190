"""``server.kind=simulated_gpu``: a rehearsal of a GPU study on a host without GPUs.

The simulated host (``python -m tuner.simulation``) is launched, probed, classified and reaped
by the vLLM backend's own code: it takes vLLM's flags and prints vLLM's start-up lines. What
differs is what it is: its GPUs are simulated NVML devices (the host set-up below points the
tuner's telemetry at them), its model is an architecture AIConfigurator knows, not weights on
disk, and its version says "simulated", so a fingerprint, and every review of a study made on it,
can never pass for a measurement of real GPUs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner.config import ServerConfig
from tuner.errors import ConfigError, PreflightError
from tuner.server import backend
from tuner.server.vllm import VllmServer, log_tail

NVML_MODULE_ENV = "TUNER_NVML_MODULE"
SIMULATED_NVML = "tuner.simulation.fake_nvml"
SYSTEM_ENV = "TUNER_SIM_SYSTEM"
COUNT_ENV = "TUNER_SIM_GPUS"
TIME_SCALE_ENV = "TUNER_SIM_TIME_SCALE"  # tuner.simulation.__main__ reads it
NOISE_CV_ENV = "TUNER_SIM_NOISE_CV"  # tuner.simulation.launch_noise reads it
# The simulated host's line "simulated start-up: 37 s on the GPUs ..." (tuner.simulation)
GPU_STARTUP_RE = re.compile(r"simulated start-up: ([\d.]+) s on the GPUs")
# the host's line naming the flags it runs without modelling them (tuner.simulation)
NOT_MODELLED_RE = re.compile(
    r"not modelled \(served at the modelled speed of the other flags\): (.+)"
)
SIMULATED = "simulated"  # the word a simulated host's version and GPU names carry
STAMP = (
    "SIMULATED: a rehearsal on a simulated GPU host (AIConfigurator's estimates served by "
    "tuner.simulation), not a measurement of real GPUs"
)


def noise_cv(env: Mapping[str, Any]) -> str:
    """The host's launch-to-launch noise CV as it is printed ("" without noise). A value that
    is not a number is printed as given: the host refuses it at start-up, and a review of the
    study still says what was asked for rather than failing on it."""
    raw = str(env.get(NOISE_CV_ENV) or "0").strip()
    try:
        return f"{float(raw):g}" if float(raw) != 0 else ""
    except ValueError:
        return raw


def stamp(fingerprint: dict[str, Any]) -> str | None:
    """The line that heads every review of a study whose fingerprint names simulated GPUs,
    with the factor its serving time was stretched by and the noise of its launches, if any."""
    gpus = (fingerprint.get("hardware") or {}).get("gpus") or []
    if not (isinstance(gpus, list) and any(SIMULATED in str(g) for g in gpus)):
        return None
    env = fingerprint.get("fixed_env") or {}
    scale = float(env.get(TIME_SCALE_ENV) or 1)
    cv = noise_cv(env)
    return (
        STAMP
        + (f"; serving time stretched x{scale:g}" if scale != 1 else "")
        + (f"; serving delays noised per launch, CV {cv}" if cv else "")
    )


def system_of(config: ServerConfig) -> str:
    """The GPU system the host simulates (``plan.system`` in conf/server/simulated_gpu.yaml)."""
    system = config.env.get(SYSTEM_ENV, "")
    if not system:
        raise ConfigError(
            "server=simulated_gpu needs the GPU system to simulate",
            hint="set plan.system (e.g. plan.system=h100_sxm)",
        )
    return system


def simulated_host(config: ServerConfig) -> None:
    """Point this process (and the trial processes it starts, which inherit its environment)
    at the simulated host's GPUs, of the declared system and count. Without a system nothing
    is pointed anywhere, and the first launch is refused (:meth:`SimulatedGpuServer.preflight`)."""
    if not config.env.get(SYSTEM_ENV):
        return
    os.environ[NVML_MODULE_ENV] = SIMULATED_NVML
    os.environ[SYSTEM_ENV] = system_of(config)
    os.environ[COUNT_ENV] = config.env.get(COUNT_ENV, "8")


class SimulatedGpuServer(VllmServer):
    """The vLLM backend over a simulated GPU host."""

    def preflight(self) -> None:
        """The model is an architecture, not a folder; the tokenizer the load generator and
        the host count prompts with must be a local folder."""
        system_of(self.config)
        tokenizer = self.config.tokenizer
        if not Path(tokenizer).is_dir():
            raise PreflightError(
                f"the simulated host's tokenizer {tokenizer!r} is not a local folder",
                hint="set server.args.tokenizer to a local model or tokenizer folder",
            )

    def _info(self) -> backend.ServerInfo:
        info = super()._info()
        scale = float(self.config.env.get(TIME_SCALE_ENV) or 1)
        stretched = f" x{scale:g}" if scale != 1 else ""
        cv = noise_cv(self.config.env)
        noisy = f" noise CV {cv}" if cv else ""
        tail = log_tail(self.log_path, lines=200)
        unmodelled = NOT_MODELLED_RE.findall(tail)
        stamp = f" not modelled: {unmodelled[-1]}" if unmodelled else ""
        info.version = (
            f"{SIMULATED}-{system_of(self.config)}{stretched}{noisy}{stamp} ({info.version})"
        )
        modelled = GPU_STARTUP_RE.findall(tail)
        info.gpu_startup_s = float(modelled[-1]) if modelled else None
        return info
