"""The model a plan estimates: the name a user deploys, mapped to an architecture AIConfigurator
knows, offline.

AIConfigurator reads a model's architecture from its ``config.json``: one it ships (its own
names, e.g. ``meta-llama/Meta-Llama-3.1-70B``) or a local folder. A user deploys other names
(``meta-llama/Llama-3.1-70B-Instruct``), and AIConfigurator would download an unknown hub id,
which fails without a network. So the name is resolved here, in this order:

1. a local folder with a ``config.json`` (or the Hugging Face cache's snapshot of a hub id):
   its own config. Where AIConfigurator does not model the folder's architecture class, the
   shipped config of the same shape (layers, heads, KV heads, hidden and intermediate sizes,
   experts, vocabulary and weight format) stands for it;
2. a name AIConfigurator ships: itself;
3. a hub id with no local config: the shipped config of the same family and size, once the
   words that name a tune of the same weights' shape (Instruct, Chat, the Meta- prefix) are
   dropped. An instruct tune has its base model's architecture, so this reads the right
   shape; the plan says it did, and a local folder reads the model's own config.

Anything else is a ConfigError that names what to set and the closest shipped names.
"""

from __future__ import annotations

import difflib
import json
import logging
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError

# Words of a hub id that name a tune or a publisher, not a shape: the base model's config
# describes the tuned one (same layers, heads and sizes).
TUNE_WORDS = frozenset({"instruct", "chat", "it", "base", "hf", "meta"})


@dataclass(frozen=True)
class Shape:
    """What decides an estimate of a model: its size and layout, and its weights' format."""

    layers: int
    heads: int
    kv_heads: int
    hidden: int
    intermediate: int
    experts: int
    vocab: int
    quant: str  # the checkpoint's quantization method ("" for bf16/fp16 weights)

    def text(self) -> str:
        moe = f", {self.experts} experts" if self.experts else ""
        quant = f", {self.quant} weights" if self.quant else ""
        return (
            f"{self.layers} layers, {self.heads} heads ({self.kv_heads} KV), hidden "
            f"{self.hidden}, intermediate {self.intermediate}{moe}, vocab {self.vocab}{quant}"
        )


@dataclass(frozen=True)
class ResolvedModel:
    """What AIConfigurator reads for a user's model, and how it was found."""

    given: str  # the name or folder the user set
    target: str  # a shipped model id or a local folder: what AIConfigurator reads
    note: str = ""  # how ``given`` became ``target``, for the plan's output ("": the same)

    @property
    def shown(self) -> str:
        """The model as a line names it: a folder by its name."""
        path = Path(self.given).expanduser()
        return path.name if path.is_dir() else self.given


def _first(config: dict[str, Any], *keys: str) -> int:
    return next((int(config[k]) for k in keys if config.get(k)), 0)


def shape_of(config: dict[str, Any]) -> Shape:
    """A config.json's shape (a multimodal model's text config where it nests one)."""
    text = config.get("text_config")
    if isinstance(text, dict) and "num_hidden_layers" in text:
        config = {**text, "quantization_config": config.get("quantization_config")}
    quant = config.get("quantization_config") or {}
    return Shape(
        layers=_first(config, "num_hidden_layers", "n_layer", "num_layers"),
        heads=_first(config, "num_attention_heads", "n_head"),
        kv_heads=_first(config, "num_key_value_heads", "num_attention_heads"),
        hidden=_first(config, "hidden_size", "n_embd"),
        intermediate=_first(config, "intermediate_size", "ffn_hidden_size"),
        experts=_first(config, "num_local_experts", "n_routed_experts", "num_experts"),
        vocab=_first(config, "vocab_size"),
        quant=str(quant.get("quant_method") or "").lower() if isinstance(quant, dict) else "",
    )


def _aiconfigurator_reads(target: str) -> dict[str, Any] | None:
    """AIConfigurator's parse of ``target`` (a shipped id or a folder), None where it does not
    model the architecture. Never called with a hub id it would download."""
    from aiconfigurator_core.sdk.utils import get_model_config_from_model_path

    try:
        parsed = get_model_config_from_model_path(target)
    except (ValueError, KeyError, TypeError):  # an architecture or field it does not know
        return None
    return dict(parsed)


@cache
def shipped() -> dict[str, Shape]:
    """Each model id AIConfigurator ships a config for, with its shape."""
    from aiconfigurator_core.sdk import common

    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    shapes = {}
    for name in sorted(common.DefaultHFModels):
        parsed = _aiconfigurator_reads(name)
        if parsed is not None:
            shapes[name] = shape_of(parsed["raw_config"])
    return shapes


def family_key(name: str) -> tuple[str, ...]:
    """A hub id's family, version, size and format, without the words of a tune:
    ``meta-llama/Llama-3.1-70B-Instruct`` and ``meta-llama/Meta-Llama-3.1-70B`` are both
    ``(llama, 3.1, 70b)``; ``...-Instruct-FP8`` keeps ``fp8``."""
    words = name.rsplit("/", 1)[-1].lower().replace("_", "-").split("-")
    return tuple(w for w in words if w and w not in TUNE_WORDS)


def same_shape(shape: Shape) -> list[str]:
    """The shipped ids of exactly ``shape`` (weights' format included)."""
    return [name for name, s in shipped().items() if s == shape]


def close_names(model: str) -> list[str]:
    """Up to three shipped ids nearest to ``model`` by family words."""
    keys = {"-".join(family_key(n)): n for n in shipped()}
    near = difflib.get_close_matches("-".join(family_key(model)), list(keys), n=3, cutoff=0.5)
    return [keys[k] for k in near]


def _read_config(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {folder / 'config.json'}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{folder / 'config.json'} is not a JSON object")
    return data


def from_folder(given: str, folder: Path, where: str) -> ResolvedModel:
    """A local config: AIConfigurator's reading of it, else a shipped config of its shape."""
    if _aiconfigurator_reads(str(folder)) is not None:
        twins = same_shape(shape_of(_read_config(folder)))
        said = [where, f"the architecture of {twins[0]}" if twins else ""]
        return ResolvedModel(given, str(folder), "; ".join(s for s in said if s))
    config = _read_config(folder)
    shape = shape_of(config)
    twins = same_shape(shape)
    kind = (config.get("architectures") or ["(none)"])[0]
    if not twins:
        raise ConfigError(
            f"model {given!r}: AIConfigurator does not model {kind}, and no config it ships "
            f"has its shape ({shape.text()})",
            hint=f"set plan.model= to a shipped model of that architecture, e.g. "
            f"{', '.join(close_names(given) or sorted(shipped())[:3])}",
        )
    said = [where, f"{kind} read as {twins[0]}, the same shape ({shape.text()})"]
    return ResolvedModel(given, twins[0], "; ".join(s for s in said if s))


def _cached_snapshot(model: str) -> Path | None:
    """The Hugging Face cache's snapshot folder of ``model`` (no network: a cache lookup)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = try_to_load_from_cache(model, "config.json")
    return Path(found).parent if isinstance(found, str) else None


def resolve(model: str) -> ResolvedModel:
    """``model`` as AIConfigurator can read it offline; see the module's docstring."""
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(
                f"model folder {path} has no config.json",
                hint="the plan reads the model's architecture from it",
            )
        return from_folder(model, path.resolve(), "")
    names = shipped()
    if model in names:
        return ResolvedModel(model, model)
    cached = _cached_snapshot(model) if model.count("/") == 1 else None
    if cached is not None:
        return from_folder(model, cached, "its config from the Hugging Face cache")
    key = family_key(model)
    same = [n for n in names if family_key(n) == key]
    if len(same) == 1:
        note = (
            f"no local config: estimated as AIConfigurator's {same[0]} (the same family and "
            f"size; a tune has its base's architecture); plan.model=<folder> reads the model's "
            "own config.json"
        )
        return ResolvedModel(model, same[0], note)
    close = close_names(model)
    hint = f"closest shipped: {', '.join(close)}; " if close else ""
    raise ConfigError(
        f"model {model!r} is neither a local folder with config.json nor a model "
        "AIConfigurator ships a config for (no hub download)",
        hint=f"{hint}set plan.model=<a shipped name or a local model folder>",
    )
