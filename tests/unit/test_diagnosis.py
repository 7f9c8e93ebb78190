"""Bottleneck diagnosis: every rule of the table, its order, CPU vs GPU utilisation."""

from __future__ import annotations

from typing import Any

import pytest

from tuner.review import diagnosis as dg

# The telemetry summary of a real vLLM-CPU baseline trial (2 cores, 16 users, no queue).
REAL_CPU = {
    "client_saturated": False,
    "gpu": {},
    "metrics": {
        "kv_cache_usage_max": 0.0041,
        "preemptions": 0.0,
        "num_requests_running_mean": 13.0,
        "num_requests_waiting_max": 0.0,
        "num_requests_waiting_mean": 0.0,
    },
    "process": {"client_busiest_proc_cores": 0.207, "server_cpu_mean_cores": 1.77},
}


def telemetry(**changes: Any) -> dict[str, Any]:
    """REAL_CPU with ``section__key=value`` changes (e.g. metrics__preemptions=3)."""
    out: dict[str, Any] = {k: dict(v) if isinstance(v, dict) else v for k, v in REAL_CPU.items()}
    for key, value in changes.items():
        section, _, name = key.partition("__")
        if name:
            out[section][name] = value
        else:
            out[section] = value
    return out


@pytest.mark.parametrize(
    ("changes", "cores", "expected"),
    [
        ({}, 2, dg.BALANCED),  # 1.77 of 2 cores = 0.885: busy, but under the 0.90 line
        ({}, 1.9, dg.COMPUTE_BOUND),  # 1.77 of 1.9 cores
        ({"client_saturated": True}, 2, dg.CLIENT_SATURATED),
        ({"process__client_busiest_proc_cores": 0.95}, 2, dg.CLIENT_SATURATED),
        ({"metrics__kv_cache_usage_max": 0.95}, 2, dg.KV_CACHE_PRESSURE),
        ({"metrics__preemptions": 3.0}, 2, dg.KV_CACHE_PRESSURE),
        ({"metrics__num_requests_waiting_mean": 4.0}, 2, dg.QUEUEING),
        ({"process__server_cpu_mean_cores": 0.3}, 2, dg.UNDER_FED),
        ({"gpu": {"util_mean_pct": 97.0}}, 2, dg.COMPUTE_BOUND),  # GPU util wins over CPU
        ({"gpu": {"util_mean_pct": 20.0}}, 2, dg.UNDER_FED),
        ({"client_lagging": True, "client_over_server": {"tpot": 1.3}}, 2, dg.CLIENT_LAGGING),
        # tokens in bursts: TPOT under vLLM's own, E2E far over it (flagged by the trial)
        (
            {"client_lagging": True, "client_over_server": {"tpot": 0.71, "e2e": 3.48}},
            2,
            dg.CLIENT_LAGGING,
        ),
        # a ratio under the trial's limit was not flagged: no lag, whatever the number
        ({"client_lagging": False, "client_over_server": {"tpot": 1.05}}, 2, dg.BALANCED),
    ],
)
def test_each_rule_fires_on_its_signal(
    changes: dict[str, Any], cores: float, expected: str
) -> None:
    assert dg.diagnose(telemetry(**changes), cores=cores).bottleneck == expected


def test_first_rule_wins_and_every_match_is_listed_with_its_numbers() -> None:
    tel = telemetry(
        client_saturated=True, metrics__preemptions=2.0, metrics__num_requests_waiting_mean=5.0
    )
    d = dg.diagnose(tel, cores=2)
    assert d.bottleneck == dg.CLIENT_SATURATED
    assert d.matched == [dg.CLIENT_SATURATED, dg.KV_CACHE_PRESSURE, dg.QUEUEING]
    assert d.evidence == ["client_saturated 1 >= 1"]
    assert "client" in d.meaning and d.line().startswith("client_saturated (")


def test_queueing_evidence_names_the_threshold() -> None:
    d = dg.diagnose(telemetry(metrics__num_requests_waiting_mean=11.5), cores=2)
    assert d.evidence == ["waiting_mean 11.5 >= 1"]


def test_failed_and_missing_telemetry_are_not_guessed() -> None:
    assert dg.diagnose(REAL_CPU, ok=False).bottleneck == dg.FAILED
    assert dg.diagnose({}).bottleneck == dg.UNKNOWN
    assert dg.diagnose(None).bottleneck == dg.UNKNOWN
    # Unknown cores: no CPU utilisation signal, so neither compute_bound nor under_fed.
    assert "utilisation" not in dg.diagnose(REAL_CPU, cores=0).signals


def test_thresholds_are_data_a_caller_can_replace() -> None:
    strict = (dg.Rule("busy", "over half the cores", (dg.Check("utilisation", ">", 0.5),)),)
    assert dg.diagnose(REAL_CPU, cores=2, rules=strict).bottleneck == "busy"
    assert set(dg.OPERATORS) >= {c.op for r in dg.RULES for c in r.checks}
    assert all(r.label in dg.RULE_MEANINGS for r in dg.RULES)
