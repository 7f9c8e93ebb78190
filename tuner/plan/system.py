"""Which GPU system and model an estimate is for: AIConfigurator's names, resolved offline.

The system comes from ``plan.system`` or from the GPUs NVML sees; the model from a local folder
with a ``config.json``, the Hugging Face cache, or the model configs AIConfigurator ships
(:mod:`tuner.plan.models`). Nothing is downloaded: AIConfigurator would fetch an unknown hub id,
so an unknown one stops here.
"""

from __future__ import annotations

import functools
import logging
from types import ModuleType

from tuner.config.plan import PlanConfig
from tuner.errors import ConfigError
from tuner.plan.models import ResolvedModel, resolve
from tuner.telemetry import gpu_inventory

BACKEND = "vllm"  # AIConfigurator's name for the serving framework it models
INSTALL_HINT = "pip install 'tuner[plan]' (it pins aiconfigurator-core)"

# NVML's device names -> AIConfigurator's system names; the first whose words all appear wins,
# so the PCIe variants come before the SXM ones that share their first word.
NVML_SYSTEMS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("H100", "PCIE"), "h100_pcie"),
    (("H100",), "h100_sxm"),
    (("H200",), "h200_sxm"),
    (("GH200",), "h200_sxm"),
    (("A100", "PCIE"), "a100_pcie"),
    (("A100",), "a100_sxm"),
    (("GB200",), "gb200"),
    (("GB300",), "gb300"),
    (("B200",), "b200_sxm"),
    (("B300",), "b300_sxm"),
    (("L40S",), "l40s"),
    (("L4",), "l4"),
    (("A30",), "a30"),
    (("RTX", "PRO", "6000"), "rtx_pro_6000_server"),
)


def aiconfigurator() -> ModuleType:
    """The optional estimator package, quiet; ConfigError with the install line if absent."""
    try:
        import aiconfigurator_core
    except ImportError:
        raise ConfigError("tuner plan needs AIConfigurator", hint=INSTALL_HINT) from None
    # Its loaders warn about fallback data rows on every first use: noise in our table.
    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    return aiconfigurator_core


def known_systems() -> dict[str, list[str]]:
    """System -> the vLLM data versions AIConfigurator can query for it."""
    return {system: list(versions) for system, versions in _installed_systems()}


@functools.cache
def _installed_systems() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """What the installed AIConfigurator ships, read once a process: listing it parses every
    system's YAML (~2 s here), and the installed data does not change under a running tuner."""
    aiconfigurator()
    from aiconfigurator_core.sdk.perf_database import get_supported_databases

    found = get_supported_databases()
    return tuple((s, tuple(b[BACKEND])) for s, b in sorted(found.items()) if b.get(BACKEND))


def _words(name: str) -> set[str]:
    return set(name.upper().replace("-", " ").replace("_", " ").split())


def system_of_gpu(nvml_name: str) -> str | None:
    """AIConfigurator's system for an NVML device name ("NVIDIA H100 80GB HBM3" -> h100_sxm)."""
    words = _words(nvml_name)
    return next((system for need, system in NVML_SYSTEMS if set(need) <= words), None)


def resolve_system(plan: PlanConfig) -> str:
    """``plan.system``, else the system of the first GPU NVML sees; checked against the data."""
    name = plan.system
    if not name:
        gpus = gpu_inventory()
        if not gpus:
            raise ConfigError(
                "no GPU is visible to NVML and plan.system is not set",
                hint="name the target, e.g. plan.system=h200_sxm",
            )
        name = system_of_gpu(str(gpus[0]["name"])) or ""
        if not name:
            raise ConfigError(
                f"AIConfigurator has no system for the GPU {gpus[0]['name']!r}",
                hint="set plan.system to the closest one it has",
            )
    systems = known_systems()
    if name not in systems:
        raise ConfigError(
            f"unknown GPU system {name!r} for estimates",
            hint=f"known (with vLLM data): {', '.join(systems)}",
        )
    return name


def backend_version(system: str, requested: str) -> str:
    """``requested``, or the version AIConfigurator maintains as current for the system."""
    from aiconfigurator_core.sdk.perf_database import get_version_slots

    versions = known_systems().get(system, [])
    if requested:
        if requested not in versions:
            raise ConfigError(
                f"plan.backend_version={requested!r} has no vLLM data on {system}",
                hint=f"available: {', '.join(versions)}",
            )
        return requested
    slots = get_version_slots(system, BACKEND) or {}
    return str(slots.get("current") or versions[-1])


def gpu_name(system: str) -> str:
    """The GPU model a price list names (``h200_sxm`` -> ``H200``)."""
    return system.split("_")[0].upper()


def shipped_models() -> set[str]:
    aiconfigurator()
    from tuner.plan.models import shipped

    return set(shipped())


def resolve_model(model: str) -> str:
    """What AIConfigurator reads the architecture from: a local folder with a config.json, a
    cached hub model's folder, one of its shipped model ids, or the shipped config a deployed
    name maps to (:mod:`tuner.plan.models`). Never a download."""
    return resolve_model_source(model).target


def resolve_model_source(model: str) -> ResolvedModel:
    """:func:`resolve_model` with how the name was mapped, for a line that says so."""
    aiconfigurator()
    return resolve(model)
