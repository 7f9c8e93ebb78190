"""Start from today's deployment: the command line around vLLM's parser, and what carries over.

vLLM's own parser is asked in tests/integration/test_command_vllm.py; here the parts around it:
which tokens are the launcher, environment and flags, how the worker's answer becomes fixed args,
and which keys of tuner's own command line win over the deployment's.
"""

from __future__ import annotations

from typing import Any

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from tuner.composition import _verbatim, compose
from tuner.config import ServerConfig
from tuner.errors import ConfigError
from tuner.redact import MASK
from tuner.server.from_command import (
    StartCommand,
    _start_command,
    apply_start,
    explicit_keys,
    flag_tokens,
    start_from_today,
)


@pytest.mark.parametrize(
    ("command", "env", "flags"),
    [
        ("vllm serve m --max-num-seqs 8", {}, ["m", "--max-num-seqs", "8"]),
        ("/opt/bin/vllm serve m -tp 2", {}, ["m", "-tp", "2"]),
        (
            "A=1 B='x y' vllm serve m \\\n  --enforce-eager",
            {"A": "1", "B": "x y"},
            ["m", "--enforce-eager"],
        ),
        ("exec python3 -m vllm.entrypoints.openai.api_server --model m", {}, ["--model", "m"]),
        ("env X=2 python -m vllm.entrypoints.cli.main serve m", {"X": "2"}, ["m"]),
    ],
)
def test_flag_tokens_split_environment_launcher_and_flags(
    command: str, env: dict[str, str], flags: list[str]
) -> None:
    assert flag_tokens(command) == (env, flags)


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ("docker run vllm/vllm-openai --model m", "must start with `vllm serve`"),
        ("vllm chat m", "must start with `vllm serve`"),
        ("vllm serve 'unclosed", "not a shell command line"),
    ],
)
def test_a_command_that_is_not_a_vllm_server_is_one_config_error(
    command: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        flag_tokens(command)
    assert "\n" not in info.value.one_line()


def _flag(name: str, value: Any, switch: bool = False, plain: bool = True) -> dict[str, Any]:
    return {"name": name, "value": value, "plain": plain, "switch": switch}


REPLY = {
    "error": None,
    "model_tag": "models/tiny",
    "flags": {
        "max_num_seqs": _flag("max_num_seqs", 8),
        "enforce_eager": _flag("enforce_eager", True, switch=True),
        "enable_prefix_caching": _flag("enable_prefix_caching", False, switch=True),
        "compilation_config": _flag("compilation_config", {"level": 0}),
        "served_model_name": _flag("served_model_name", ["tiny"]),
        "host": _flag("host", "0.0.0.0"),
        "port": _flag("port", 8000),
        "api_key": _flag("api_key", "sk-secret-1234"),
    },
}


def test_the_worker_reply_becomes_fixed_args_without_deployment_flags_or_secrets() -> None:
    start = _start_command(REPLY, {"VLLM_CPU_KVCACHE_SPACE": "2", "HF_TOKEN": "hf_x"}, "where")
    assert start.model == "models/tiny" and start.served_model_name == "tiny"
    assert start.args == {
        "max_num_seqs": 8,
        "enforce_eager": True,
        "enable_prefix_caching": False,
        "compilation_config": '{"level": 0}',  # passed on as the JSON vLLM reads
    }
    assert start.env == {"VLLM_CPU_KVCACHE_SPACE": "2"}
    assert set(start.not_carried) == {"HF_TOKEN", "host", "port", "api_key"}


def test_a_value_tuner_cannot_pass_on_is_refused_with_the_flag_named() -> None:
    reply = {**REPLY, "flags": {"odd": _flag("odd_thing", "<Obj>", plain=False)}}
    with pytest.raises(ConfigError, match="--odd-thing parsed to <Obj>"):
        _start_command(reply, {}, "server.from_command")
    two = {**REPLY, "flags": {"served_model_name": _flag("served_model_name", ["a", "b"])}}
    with pytest.raises(ConfigError, match="one --served-model-name"):
        _start_command(two, {}, "server.from_command")


def test_the_command_replaces_preset_args_and_explicit_overrides_win() -> None:
    server = ServerConfig(
        model="preset-model",
        args={"max_model_len": 8192, "max_num_seqs": 64, "block_size": 32},
        env={"PRESET": "1", "SHARED": "preset"},
        from_command="VLLM_API_KEY=sk-abcdef12 vllm serve m --api-key sk-abcdef12",
    )
    start = StartCommand(
        "m", None, {"max_num_seqs": 8, "enforce_eager": True}, {"SHARED": "command", "NEW": "2"}
    )
    overrides = ["server.args.block_size=32", "workload.concurrency=4", "+server.env.PRESET=1"]
    apply_start(server, start, explicit_keys(overrides))
    # The preset's max_model_len is gone; the user's block_size stays; the command's flags rule.
    assert server.args == {"max_num_seqs": 8, "enforce_eager": True, "block_size": 32}
    assert server.env == {"PRESET": "1", "SHARED": "command", "NEW": "2"}
    assert server.model == "m"
    assert server.from_command is not None and "sk-abcdef12" not in server.from_command
    assert server.from_command.count(MASK) == 2


def test_an_explicit_model_wins_over_the_commands() -> None:
    server = ServerConfig(model="/mine")
    apply_start(server, StartCommand("theirs", "name", {}), {"server.model"})
    assert (server.model, server.served_model_name) == ("/mine", "name")


def test_without_a_model_anywhere_the_command_is_refused() -> None:
    with pytest.raises(ConfigError, match="names no model"):
        apply_start(ServerConfig(), StartCommand(None, None, {}), set())


def test_an_external_server_ignores_a_preset_command() -> None:
    server = ServerConfig(kind="external", url="http://h:1", from_command="vllm serve m --x 1")
    assert start_from_today(server) is None and server.args == {}


@pytest.mark.parametrize(
    "value",
    [
        "VLLM_CPU_KVCACHE_SPACE=2 vllm serve m --max-num-seqs=8",
        "vllm serve m --compilation-config '{\"level\": 0}' --x [1,2]",
        "it's a\\ b\\",
    ],
)
def test_a_command_passes_hydras_override_grammar_verbatim(value: str) -> None:
    override = OverridesParser.create().parse_override(_verbatim(f"server.from_command={value}"))
    assert override.value() == value


def test_server_sources_are_validated_before_any_parse(tmp_path: Any) -> None:
    both = ServerConfig(model="m", from_command="vllm serve m", from_config=str(tmp_path))
    with pytest.raises(ConfigError, match="exclude each other"):
        both.validate()
    with pytest.raises(ConfigError, match="is not a file"):
        ServerConfig(model="m", from_config=str(tmp_path / "nope.yaml")).validate()
    with pytest.raises(ConfigError, match="is not an http"):
        ServerConfig(kind="external", model="m", url="ftp://h/").validate()
    with pytest.raises(ConfigError, match=r"needs server\.url"):
        ServerConfig(kind="external", model="m").validate()
    ServerConfig(from_command="vllm serve m").validate()  # the model may come from the command


def test_a_source_named_on_the_command_line_replaces_the_presets(tmp_path: Any) -> None:
    """The quickstart preset starts from a command; `server.from_config=...` means start from
    that file instead, not 'both' (which is refused when both are named)."""
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="is not a file"):  # validated as the only source
        compose(["study=quickstart", f"server.from_config={missing}"])
    both = ["study=quickstart", f"server.from_config={missing}", "server.from_command=vllm serve m"]
    with pytest.raises(ConfigError, match="exclude each other"):
        compose(both)
