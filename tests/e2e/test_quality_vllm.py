"""The quality gate on real vLLM-CPU: kv_cache_dtype=fp8 changes greedy outputs of the tiny model.

Two server starts in all: the default server answers the quality set twice (the reference and a
rerun, which must agree exactly), then an fp8-KV-cache server answers it once. The measured drop
decides the constraint: a tolerance below it rejects the trial, one above it accepts it.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tuner.cli import compose
from tuner.config import SloConfig, TunerConfig
from tuner.loadgen.base import Target
from tuner.measure import measure
from tuner.objective import ObjectiveContext, get_constraint
from tuner.quality import (
    QualityConfig,
    QualityOutputs,
    attach_quality,
    context_excess,
    drops,
    gate_applies,
    load_items,
    quality_line,
    run_quality_set,
    score,
)
from tuner.server import LaunchSpec, make_backend

pytestmark = pytest.mark.e2e
QCFG = QualityConfig()  # the shipped set and defaults: 13 prompts, 64 tokens each


def _serve_and_ask(
    config: TunerConfig, launch: LaunchSpec, folder: Path, runs: int
) -> list[QualityOutputs]:
    """Start vLLM through tuner's backend, run the quality set ``runs`` times, stop it."""
    folder.mkdir(parents=True)
    items = load_items(QCFG.prompts)
    with make_backend(config.server, launch, folder / "server.log") as server:
        server.wait_ready(time.monotonic() + config.server.startup_timeout_s)
        model = config.server.served_model_name or config.server.model
        target = Target(server.base_url, server.api_key, model, config.server.model)
        return [
            run_quality_set(target, QCFG, folder / f"quality-{n}.jsonl", items) for n in range(runs)
        ]


def _violation(quality: dict[str, object]) -> float:
    ctx = ObjectiveContext(quality_excess=context_excess(quality))
    no_traffic = measure([], 0.0, 1.0, SloConfig())  # the gate reads no measurement
    return get_constraint("quality_vs_baseline").violation(no_traffic, ctx)


def test_fp8_kv_cache_changes_outputs_and_the_gate_sees_it(
    tmp_path: Path, tiny_model: Path, no_leftovers: None
) -> None:
    config = compose([f"studies_dir={tmp_path}", "name=e2e"])
    assert config.server.args.get("max_model_len") == 2048
    reference, rerun = _serve_and_ask(config, LaunchSpec(), tmp_path / "default", runs=2)
    (fp8,) = _serve_and_ask(
        config, LaunchSpec(args={"kv_cache_dtype": "fp8"}), tmp_path / "fp8", runs=1
    )
    items = load_items(QCFG.prompts)
    for outputs in (reference, rerun, fp8):
        assert outputs.errors == 0, outputs.summary()
        # ignore_eos + max_tokens: every answer has the same length, token ids came back
        assert all(r.token_ids and len(r.token_ids) == QCFG.max_tokens for r in outputs.rows)
    same = score(rerun, reference, items)
    assert same.exact_match_rate == 1.0 and same.token_agreement == 1.0
    changed = score(fp8, reference, items)
    assert changed.token_agreement is not None and changed.token_agreement < 1.0
    worst = max(drops(changed, score(reference, reference, items), QCFG.metrics).values())
    assert worst >= 1.0 - changed.token_agreement > 0
    print(f"\nfp8 KV cache vs default: {changed.to_dict()}")
    print({s.id: (s.prefix_agreement, s.token_agreement) for s in changed.per_item})
    print(f"quality set took {reference.seconds:.1f} s (default), {fp8.seconds:.1f} s (fp8)")
    assert gate_applies(QCFG, "quantization", config.search_space.get("quantization", {}))
    for tolerance, feasible in ((worst / 2, False), (worst + 0.01, True)):
        q = QualityConfig(tolerance=tolerance)
        quality = attach_quality(fp8.summary(), reference.path, q, applies=True)
        violation = _violation(quality)
        print(quality_line(quality), f"-> violation {violation:+.3f}")
        assert violation == pytest.approx(worst - tolerance)
        assert (violation <= 0) is feasible
