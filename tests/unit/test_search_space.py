"""Search-space specs → Optuna distributions, validation messages, launches, device checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from tuner.errors import ConfigError
from tuner.search import checks
from tuner.search import space as ss

CONF = Path(__file__).resolve().parents[2] / "conf"
BATCHING: dict[str, Any] = {
    "max_num_batched_tokens": {"type": "int", "low": 256, "high": 8192, "log": True},
    "max_num_seqs": {"type": "int", "low": 4, "high": 256, "log": True},
    "enable_chunked_prefill": {"type": "bool"},
}


def test_distributions_follow_the_spec_types() -> None:
    specs = {
        **BATCHING,
        "util": {"type": "float", "low": 0.7, "high": 0.95, "step": 0.05},
        "block_size": {"type": "categorical", "choices": [32, 64, 128]},
        "tp": {"type": "int", "low": 1, "high": 7, "step": 2},
    }
    dists = ss.distributions(specs)
    assert dists["max_num_batched_tokens"] == IntDistribution(256, 8192, log=True)
    assert dists["util"] == FloatDistribution(0.7, 0.95, step=0.05)
    assert dists["block_size"] == CategoricalDistribution([32, 64, 128])
    assert dists["enable_chunked_prefill"] == CategoricalDistribution([False, True])
    assert dists["tp"] == IntDistribution(1, 7, step=2)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"type": "integer", "low": 1, "high": 2}, "type 'integer' is unknown"),
        ({"type": "int", "low": 8, "high": 8}, "low (8) must be < high (8)"),
        ({"type": "int", "low": 0, "high": 8, "log": True}, "log scale needs low > 0"),
        ({"type": "int", "low": 1, "high": 8, "log": True, "step": 1}, "log and step"),
        ({"type": "int", "low": 1.5, "high": 8}, "low must be an integer"),
        ({"type": "int", "low": 1, "high": 8, "step": 2}, "multiple of step"),
        ({"type": "int", "high": 8}, "needs both low and high"),
        ({"type": "int", "choices": [1, 2]}, "takes low/high, not choices"),
        ({"type": "categorical", "choices": []}, "choices is empty"),
        ({"type": "categorical", "choices": [None, "fp8"]}, "null is not a choice"),
        ({"type": "categorical", "choices": [[1], 2]}, "strings, numbers or booleans"),
        ({"type": "categorical", "choices": [1, 1]}, "duplicates"),
        ({"type": "bool", "choices": [True]}, "takes no choices"),
        ({"type": "int", "low": 1, "high": 2, "target": "file"}, "target 'file' is unknown"),
        ({"type": "int", "low": 1, "high": 2, "target": "env"}, "needs `name`"),
        ({"type": "int", "low": 1, "high": 2, "lgo": True}, "unknown key(s) lgo"),
        ({"type": "categorical", "choices": ["a"], "omit": ["b"]}, "omit names values"),
        ({"type": "categorical", "choices": [1, 2], "env_by_choice": {"4": {}}}, "env_by_choice"),
    ],
)
def test_invalid_specs_are_rejected_naming_group_and_param(spec: dict, expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        ss.validate_space({"batching": {"max_num_seqs": spec}})
    message = err.value.one_line()
    assert message.startswith("search_space.batching.max_num_seqs: ")
    assert expected in message
    assert "\n" not in message


def test_a_param_in_two_groups_is_rejected() -> None:
    space = {
        "memory": {"block_size": {"type": "bool"}},
        "batching": {"block_size": BATCHING["max_num_seqs"]},
    }
    with pytest.raises(ConfigError, match=r"batching\.block_size: is also in group 'memory'"):
        ss.validate_space(space)


def test_to_launch_splits_args_and_env_as_declared() -> None:
    specs = {
        **BATCHING,
        "kv_gib": {
            "type": "int",
            "low": 1,
            "high": 4,
            "target": "env",
            "name": "VLLM_CPU_KVCACHE_SPACE",
        },
        "flag_env": {"type": "bool", "target": "env", "name": "VLLM_SOMETHING"},
        "quantization": {"type": "categorical", "choices": ["none", "fp8"], "omit": ["none"]},
        "tp": {
            "type": "categorical",
            "choices": [1, 2],
            "name": "tensor_parallel_size",
            "env_by_choice": {2: {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}},
        },
    }
    launch = ss.to_launch(
        {
            "max_num_seqs": 16,
            "enable_chunked_prefill": False,
            "kv_gib": 2,
            "flag_env": True,
            "quantization": "none",
            "tp": 2,
        },
        specs,
    )
    assert launch.args == {
        "max_num_seqs": 16,
        "enable_chunked_prefill": False,
        "quantization": None,
        "tensor_parallel_size": 2,
    }
    assert launch.env == {
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "VLLM_SOMETHING": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "0|1",
    }
    tp1 = ss.to_launch({"tp": 1, "quantization": "fp8"}, specs)
    assert tp1.env == {} and tp1.args == {"tensor_parallel_size": 1, "quantization": "fp8"}


def test_to_launch_rejects_params_without_spec() -> None:
    with pytest.raises(ConfigError, match="'max_num_seq' has no spec"):
        ss.to_launch({"max_num_seq": 4}, BATCHING)


def test_device_check_rejects_parallel_sizes_that_cannot_fit() -> None:
    space = {
        "parallelism": {
            "tensor_parallel_size": {"type": "categorical", "choices": [1, 2, 4, 8]},
            "pipeline_parallel_size": {"type": "categorical", "choices": [1]},
        }
    }
    checks.validate_against_devices(space, "cuda", 8)
    with pytest.raises(ConfigError) as err:
        checks.validate_against_devices(space, "cuda", 4)
    assert "search_space.parallelism.tensor_parallel_size: values [8]" in err.value.one_line()
    # A fixed PP of 2 counts, unless the space tunes PP itself (trial args override fixed ones).
    checks.validate_against_devices(space, "cuda", 8, fixed_args={"pipeline_parallel_size": 2})
    tp_only = {
        "parallelism": {"tensor_parallel_size": space["parallelism"]["tensor_parallel_size"]}
    }
    with pytest.raises(ConfigError, match=r"values \[4, 8\]"):
        checks.validate_against_devices(
            tp_only, "cuda", 4, fixed_args={"pipeline_parallel_size": 2}
        )


def test_devices_needed_is_the_product_of_parallel_sizes() -> None:
    assert checks.devices_needed({"tensor_parallel_size": 4, "pipeline_parallel_size": 2}) == 8
    assert checks.devices_needed({"max_num_seqs": 3}) == 1


def test_unknown_params_lists_arg_params_the_parser_lacks() -> None:
    space = {
        "batching": {**BATCHING, "max_num_seqz": BATCHING["max_num_seqs"]},
        "memory": {"kv": {"type": "int", "low": 1, "high": 2, "target": "env", "name": "X"}},
    }
    flags = {
        "--max-num-batched-tokens",
        "--max-num-seqs",
        "--enable-chunked-prefill",
        "--no-enable-chunked-prefill",
        "-tp",
    }
    assert checks.unknown_params(space, flags) == ["batching.max_num_seqz"]


def test_suggest_returns_values_inside_the_distributions() -> None:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(10):
        trial = study.ask()
        params = ss.suggest(trial, BATCHING)
        assert 256 <= params["max_num_batched_tokens"] <= 8192
        assert 4 <= params["max_num_seqs"] <= 256
        assert isinstance(params["enable_chunked_prefill"], bool)
        assert trial.distributions == ss.distributions(BATCHING)
        study.tell(trial, 0.0)


def test_grid_enumerates_steps_and_choices() -> None:
    specs = {
        "x": {"type": "int", "low": 2, "high": 8, "step": 2},
        "u": {"type": "float", "low": 0.7, "high": 0.9, "step": 0.05},
        "b": {"type": "bool"},
    }
    assert ss.grid(specs) == {
        "x": [2, 4, 6, 8],
        "u": [0.7, 0.75, 0.8, 0.85, 0.9],
        "b": [False, True],
    }
    with pytest.raises(ConfigError, match="grid sampler needs a step"):
        ss.grid(BATCHING)


@pytest.mark.parametrize(
    "path", sorted((CONF / "search_space").glob("*.yaml")), ids=lambda p: p.stem
)
def test_every_search_space_file_is_valid(path: Path) -> None:
    raw = yaml.safe_load(path.read_text())
    space = ss.coerce_space(raw)
    assert len(space) == 1, "one group per file"
    for specs in space.values():
        launch = ss.to_launch(
            {
                p: ss.grid({p: s})[p][0] if s.step or s.choices or s.type == "bool" else s.low
                for p, s in specs.items()
            },
            specs,
        )
        assert launch.args or launch.env


def test_cpu_preset_of_groups_composes_with_hydra() -> None:
    from tuner.cli import compose

    config = compose(["study=cpu_full"])
    space = ss.coerce_space(config.search_space)
    assert set(space) == {"batching", "memory", "parallelism", "quantization", "runtime"}
    launch = ss.to_launch({"tensor_parallel_size": 2, "quantization": "none"}, ss.flatten(space))
    assert launch.env == {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}
    assert launch.args == {"tensor_parallel_size": 2, "quantization": None}
    checks.validate_against_devices(space, "cpu", 2)


@pytest.mark.parametrize(
    "overrides",
    [
        ["search_space=[parallelism,quantization,memory_gpu,batching,runtime]", "cost=gpu_cloud"],
        ["objectives=latency_first", "sampler=grid"],
        ["sampler=nsga2"],
        ["sampler=gp"],
        ["sampler=random"],
    ],
)
def test_config_groups_compose(overrides: list[str]) -> None:
    from tuner.cli import compose

    config = compose(overrides)
    ss.coerce_space(config.search_space)
    assert config.sampler.name in {"tpe", "gp", "nsga2", "random", "grid"}
