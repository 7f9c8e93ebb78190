"""The vLLM backend's pure parts: argv, environment, failure classification, log parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.config import ServerConfig
from tuner.errors import PreflightError
from tuner.search.launch import LaunchSpec
from tuner.search.resolved import args_to_argv, resolve
from tuner.server import backend as b
from tuner.server import make_backend
from tuner.server.vllm import (
    classify_failure,
    log_tail,
    root_cause,
)

DATA = Path(__file__).resolve().parent.parent / "data"


def test_args_to_argv_booleans_lists_and_none() -> None:
    argv = args_to_argv(
        {
            "max_num_seqs": 16,
            "enforce_eager": True,
            "enable_prefix_caching": False,
            "quantization": None,
            "api_server_count": [1, 2],
        }
    )
    assert argv == [
        "--max-num-seqs",
        "16",
        "--enforce-eager",
        "--no-enable-prefix-caching",
        "--api-server-count",
        "1",
        "2",
    ]


def _server(tmp_path: Path, **kw: object) -> object:
    cfg = ServerConfig(model=str(tmp_path), args={"max_num_seqs": 8}, env={"A": "1"}, **kw)  # type: ignore[arg-type]
    launch = resolve(LaunchSpec(args={"max_num_seqs": 32}, env={"B": "2"}), cfg)
    return make_backend(cfg, launch, tmp_path / "s.log")


def test_argv_launch_overrides_fixed_args_and_never_contains_the_key(tmp_path: Path) -> None:
    srv = _server(tmp_path)
    argv = srv.argv()  # type: ignore[attr-defined]
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--max-num-seqs") + 1] == "32"
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    key = srv.api_key  # type: ignore[attr-defined]
    assert key and len(key) >= 24
    assert all(key not in part for part in argv)
    env = srv.environment()  # type: ignore[attr-defined]
    assert env["VLLM_API_KEY"] == key
    assert env["HF_HUB_OFFLINE"] == "1" and env["A"] == "1" and env["B"] == "2"
    assert float(env["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"]) >= 120


def test_a_launch_flag_naming_a_head_flag_replaces_it_once(tmp_path: Path) -> None:
    cfg = ServerConfig(model=str(tmp_path), served_model_name="served")
    spec = LaunchSpec(args={"host": "0.0.0.0", "served_model_name": None, "max_num_seqs": 4})
    argv = make_backend(cfg, resolve(spec, cfg), tmp_path / "s.log").argv()
    assert argv.count("--host") == 1 and argv[argv.index("--host") + 1] == "0.0.0.0"
    assert "--served-model-name" not in argv  # the launch's None leaves the head's flag out
    assert argv[argv.index("--model") + 1] == str(tmp_path) and "--port" in argv
    assert argv[-2:] == ["--max-num-seqs", "4"]  # the launch's flags, as resolved


def test_positional_model_launcher_and_empty_key(tmp_path: Path) -> None:
    srv = _server(tmp_path, launcher=["vllm", "serve", "{model}"], api_key="")
    argv = srv.argv()  # type: ignore[attr-defined]
    assert argv[:3] == ["vllm", "serve", str(tmp_path)]
    assert "--model" not in argv
    assert srv.api_key is None  # type: ignore[attr-defined]
    assert "VLLM_API_KEY" not in srv.environment()  # type: ignore[attr-defined]


def test_two_launches_get_different_keys_and_ports(tmp_path: Path) -> None:
    a, b_ = _server(tmp_path), _server(tmp_path)
    assert a.api_key != b_.api_key  # type: ignore[attr-defined]


def test_real_fp8_log_is_classified_with_its_root_cause() -> None:
    text = (DATA / "vllm_fp8_startup_failure.log").read_text()
    assert classify_failure(text) == b.REASON_ENGINE_INIT
    cause = root_cause(text)
    assert cause.startswith("RuntimeError: _C::static_scaled_fp8_quant()")
    assert "OSError" not in cause  # the ulimit WARNING line quotes an OSError


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate", b.REASON_OOM),
        ("ValueError: No available memory for the cache blocks.", b.REASON_OOM),
        (
            "api_server.py: error: argument --max-num-seqs: invalid int value: 'x'",
            b.REASON_INVALID_ARGUMENT,
        ),
        ("OSError: [Errno 98] Address already in use", b.REASON_PORT_IN_USE),
        ("something else entirely", b.REASON_OTHER),
    ],
)
def test_classify_failure(line: str, reason: str) -> None:
    assert classify_failure(line) == reason


def test_specific_reason_wins_over_the_engine_init_summary() -> None:
    log = "CUDA out of memory\nRuntimeError: Engine core initialization failed"
    assert classify_failure(log) == b.REASON_OOM


def test_log_tail(tmp_path: Path) -> None:
    p = tmp_path / "log"
    p.write_text("\n".join(str(i) for i in range(100)))
    assert log_tail(p, 3) == "97\n98\n99"
    assert log_tail(tmp_path / "missing") == ""


def test_preflight_rejects_missing_model_and_busy_port(tmp_path: Path) -> None:
    import socket

    cfg = ServerConfig(model=str(tmp_path / "nope"))
    with pytest.raises(PreflightError, match="neither a local folder"):
        make_backend(cfg, resolve(LaunchSpec(), cfg), tmp_path / "l").preflight()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        cfg = ServerConfig(model=str(tmp_path), port=port)
        with pytest.raises(PreflightError, match="already in use"):
            make_backend(cfg, resolve(LaunchSpec(), cfg), tmp_path / "l").preflight()


def test_pydantic_root_cause_carries_its_detail_line() -> None:
    log = (
        "(APIServer pid=1) INFO 11-30 [x.py:1] starting\n"
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig\n"
        "  Value error, max_num_batched_tokens (1714) is smaller than max_model_len (2048). "
        "[type=value_error, input_value=...]\n"
    )
    cause = root_cause(log)
    assert cause.startswith("ValidationError: 1 validation error for SchedulerConfig: Value error")
    assert "(1714) is smaller than max_model_len (2048)" in cause and "[type=" not in cause
    assert classify_failure(log) == b.REASON_INVALID_ARGUMENT
