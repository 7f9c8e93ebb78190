"""What makes two baselines comparable: model, hardware, vLLM version, workload, fixed args.

A baseline is measured once per fingerprint and reused (on resume, and by later studies in the
same storage) because it is the control every stage is compared against.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tuner.config import TunerConfig
from tuner.host.cpu import CPUINFO, read_cpuinfo
from tuner.host.placement import for_trial

# Never part of a fingerprint or of anything stored: secrets.
SECRET_ENV_HINTS = ("TOKEN", "KEY", "SECRET", "PASSWORD")


def _model_identity(model: str) -> dict[str, Any]:
    """The model path plus a hash of its config.json, so a rebuilt model is a new baseline."""
    config_json = Path(model) / "config.json"
    digest = ""
    if config_json.is_file():
        digest = hashlib.sha256(config_json.read_bytes()).hexdigest()[:16]
    return {"model": model, "config_sha256": digest}


def hardware(device: str, gpus: list[dict[str, Any]], cpuinfo: Path = CPUINFO) -> dict[str, Any]:
    """The hardware half of a fingerprint: GPU names, or the CPU's model, kernel flags, cores."""
    if device == "cuda":
        return {"device": "cuda", "gpus": [g.get("name", "?") for g in gpus]}
    cpu = read_cpuinfo(cpuinfo)
    return {
        "device": "cpu",
        "cpu": cpu.model or platform.processor() or platform.machine(),
        "isa": cpu.isa,  # same model name, other flags (a hypervisor's mask): other kernels
        "cores": os.cpu_count(),
    }


def public_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not any(h in k.upper() for h in SECRET_ENV_HINTS)}


def fingerprint(
    config: TunerConfig, vllm_version: str | None, hw: dict[str, Any]
) -> dict[str, Any]:
    """The comparable facts of a baseline, as a JSON-ready dict."""
    return {
        "model": _model_identity(config.server.model),
        "hardware": hw,
        "vllm": vllm_version or "unknown",
        "workload": _workload(config),
        "fixed_args": dict(sorted(config.server.args.items())),
        "fixed_env": public_env(dict(sorted(config.server.env.items()))),
        "slo": _slo(config),
        # A server pinned to 1 of 2 cores is other hardware to a baseline than one on both.
        "placement": for_trial(config).as_text(),
    }


def _workload(config: TunerConfig) -> dict[str, Any]:
    """The workload; a class without a priority exactly as before priorities existed, so a
    stored baseline of a study that sets none is still the same baseline."""
    workload = asdict(config.workload)
    for rc in workload["classes"]:
        if not rc["priority"]:
            del rc["priority"]
    return workload


def _slo(config: TunerConfig) -> dict[str, Any]:
    """The SLOs; without class SLOs and with no rejected request allowed (the default) exactly
    as before either existed, so a stored baseline of a study that sets neither is still the
    same baseline."""
    slo = asdict(config.slo)
    if not slo["classes"]:
        del slo["classes"]
    if not slo["max_rejected_rate"]:
        del slo["max_rejected_rate"]
    return slo


def digest(fp: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fp, sort_keys=True, default=str).encode()).hexdigest()[:12]
