"""The model names users deploy, mapped offline to an architecture AIConfigurator ships: a hub id
by its family and size, a local folder or a Hugging Face cache snapshot by its config.json's
shape; and the GPU presets planned as shipped. AIConfigurator runs for real (its shipped model
configs and kernel data); nothing is downloaded."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tuner.cli import main
from tuner.errors import ConfigError
from tuner.plan import models

logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
LLAMA_8B, LLAMA_70B = "meta-llama/Meta-Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-70B"


def _shipped_config(name: str) -> dict[str, Any]:
    from aiconfigurator_core.sdk.utils import get_model_config_from_model_path

    return dict(get_model_config_from_model_path(name)["raw_config"])


def _folder(tmp_path: Path, name: str, config: dict[str, Any]) -> Path:
    folder = tmp_path / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    ("deployed", "shipped"),
    [
        ("meta-llama/Llama-3.1-70B-Instruct", LLAMA_70B),
        ("meta-llama/Llama-3.1-8B-Instruct", LLAMA_8B),
        # the format is part of the name: an FP8 checkpoint maps to the shipped FP8 one
        ("neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8", "nvidia/Llama-3.1-70B-Instruct-FP8"),
    ],
)
def test_a_deployed_hub_id_maps_to_the_shipped_config_of_its_family_and_size(
    deployed: str, shipped: str
) -> None:
    found = models.resolve(deployed)
    assert found.target == shipped
    assert f"estimated as AIConfigurator's {shipped}" in found.note
    assert models.shipped()[found.target] is not None


def test_a_shipped_name_is_itself() -> None:
    assert models.resolve(LLAMA_70B) == models.ResolvedModel(LLAMA_70B, LLAMA_70B)


def test_a_folder_is_read_by_its_own_config_and_named_by_its_shape(tmp_path: Path) -> None:
    folder = _folder(tmp_path, "Llama-3.1-70B-Instruct", _shipped_config(LLAMA_70B))
    found = models.resolve(str(folder))
    assert found.target == str(folder.resolve())  # AIConfigurator reads the folder itself
    assert found.note == f"the architecture of {LLAMA_70B}" and found.shown == folder.name


def test_an_architecture_aiconfigurator_lacks_is_mapped_by_shape_not_by_name(
    tmp_path: Path,
) -> None:
    """A llama-shaped model under another class name (as Mistral-style checkpoints declare):
    the shipped config with the same layers, heads, sizes and vocabulary stands for it; one
    layer more and nothing does."""
    config = {**_shipped_config(LLAMA_8B), "architectures": ["AcmeForCausalLM"]}
    found = models.resolve(str(_folder(tmp_path, "acme-8b", config)))
    assert found.target == LLAMA_8B
    assert "AcmeForCausalLM read as meta-llama/Meta-Llama-3.1-8B, the same shape" in found.note
    deeper = {**config, "num_hidden_layers": 33}
    with pytest.raises(ConfigError) as err:
        models.resolve(str(_folder(tmp_path, "acme-8b-deeper", deeper)))
    line = err.value.one_line()
    assert "does not model AcmeForCausalLM" in line and "33 layers" in line
    assert "plan.model=" in line


def test_a_hub_id_in_the_hugging_face_cache_is_read_from_its_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache's own layout (refs/main -> snapshots/<rev>/config.json), looked up by
    huggingface_hub's offline cache API: the model's own config wins over any name mapping."""
    from huggingface_hub import constants

    repo = tmp_path / "models--acme--Llama-3.1-8B-Instruct"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    snapshot = _folder(repo / "snapshots", "abc123", _shipped_config(LLAMA_8B))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    found = models.resolve("acme/Llama-3.1-8B-Instruct")
    assert found.target == str(snapshot)
    assert found.note == f"its config from the Hugging Face cache; the architecture of {LLAMA_8B}"


def test_the_family_key_drops_only_the_words_of_a_tune() -> None:
    assert models.family_key("meta-llama/Llama-3.1-70B-Instruct") == ("llama", "3.1", "70b")
    assert models.family_key(LLAMA_70B) == ("llama", "3.1", "70b")
    assert models.family_key("Qwen/Qwen3-30B-A3B-FP8") == ("qwen3", "30b", "a3b", "fp8")


def test_an_unknown_model_says_what_to_set_and_the_closest_shipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(
        [
            "plan",
            "study=llama70b_8xh200",
            "server.model=acme/Llama-3.3-70B-Instruct",
            "--out",
            str(tmp_path),
        ]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "plan.model=<a shipped name or a local model folder>" in err
    assert f"closest shipped: {LLAMA_70B}" in err
    assert not (tmp_path / "plan.csv").exists()


@pytest.mark.parametrize(
    ("preset", "system", "shipped"),
    [("llama70b_8xh200", "h200_sxm", LLAMA_70B), ("llama8b_h100", "h100_sxm", LLAMA_8B)],
)
def test_a_gpu_preset_plans_as_shipped(
    preset: str, system: str, shipped: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No override: the preset names its system, its model maps, and its baseline fits."""
    rc = main(["plan", f"study={preset}", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    assert f"on {system}" in out and f"estimated as AIConfigurator's {shipped}" in out
    table = pd.read_csv(tmp_path / "plan.csv")
    assert (table.fits != "no").any() and "tok/s/gpu" in out
