"""A candidate's launch resolved once against the server's fixed settings."""

from __future__ import annotations

from dataclasses import replace

from tuner.config import ServerConfig
from tuner.search import space
from tuner.search.launch import LaunchSpec
from tuner.search.resolved import resolve, resolve_params


def test_the_candidates_flags_sit_on_the_servers_and_count_its_devices() -> None:
    server = ServerConfig(
        args={"tensor_parallel_size": 2, "enforce_eager": True, "max_num_seqs": 8},
        env={"FIXED": "1"},
    )
    spec = LaunchSpec(
        args={"pipeline_parallel_size": 2, "enforce_eager": None, "max_num_seqs": 32},
        env={"OWN": "2"},
    )
    launch = resolve(spec, server)
    assert launch.spec is spec  # what the study varies and stores is kept as it was
    assert launch.flags == {
        "tensor_parallel_size": 2,
        "enforce_eager": None,
        "max_num_seqs": 32,
        "pipeline_parallel_size": 2,
    }
    assert launch.devices == 4  # TP 2 from the server x PP 2 from the candidate
    assert launch.env == {"OWN": "2"}  # the server's own env is the backend's to add
    # a candidate's None leaves the server's fixed flag out of the command line
    assert launch.argv == (
        "--tensor-parallel-size",
        "2",
        "--max-num-seqs",
        "32",
        "--pipeline-parallel-size",
        "2",
    )
    assert server.args["enforce_eager"] is True  # the server's config is not touched


def test_a_result_stores_the_candidate_with_the_cores_it_ran_on() -> None:
    launch = replace(resolve(LaunchSpec(args={"max_num_seqs": 4}), ServerConfig()), cpus=[2, 3])
    assert launch.record() == LaunchSpec(args={"max_num_seqs": 4}, cpus=[2, 3])


def test_a_copy_with_other_flags_renders_its_own_command_line() -> None:
    launch = resolve(LaunchSpec(args={"max_num_seqs": 4}), ServerConfig(args={"dtype": "bf16"}))
    assert launch.argv == ("--dtype", "bf16", "--max-num-seqs", "4")
    other = replace(launch, flags={"max_num_seqs": 8, "enforce_eager": False})
    assert other.argv == ("--max-num-seqs", "8", "--no-enforce-eager")
    assert replace(launch, cpus=[0]).argv == launch.argv


def test_stored_params_resolve_as_their_specs_launch_them() -> None:
    specs = {
        "max_num_seqs": {"type": "int", "low": 1, "high": 64},
        "kv_gib": {"type": "int", "low": 1, "high": 8, "target": "env", "name": "KV_GIB"},
    }
    server = ServerConfig(args={"max_num_seqs": 2})
    launch = resolve_params({"max_num_seqs": 16, "kv_gib": 4}, specs, server)
    assert launch == resolve(space.to_launch({"max_num_seqs": 16, "kv_gib": 4}, specs), server)
    assert launch.flags == {"max_num_seqs": 16} and launch.env == {"KV_GIB": "4"}
