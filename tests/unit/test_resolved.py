"""A candidate's launch resolved once against the server's fixed settings."""

from __future__ import annotations

from dataclasses import replace

from tuner.config import ServerConfig
from tuner.search.launch import LaunchSpec
from tuner.search.resolved import resolve


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
    assert launch.argv() == [
        "--tensor-parallel-size",
        "2",
        "--max-num-seqs",
        "32",
        "--pipeline-parallel-size",
        "2",
    ]
    assert server.args["enforce_eager"] is True  # the server's config is not touched


def test_a_result_stores_the_candidate_with_the_cores_it_ran_on() -> None:
    launch = replace(resolve(LaunchSpec(args={"max_num_seqs": 4}), ServerConfig()), cpus=[2, 3])
    assert launch.record() == LaunchSpec(args={"max_num_seqs": 4}, cpus=[2, 3])
