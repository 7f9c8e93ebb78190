"""Objectives and constraints: values against their formulas, signs, registry and plugins."""

from __future__ import annotations

import math
import re
import sys
import uuid
from pathlib import Path

import pytest

import objectives
import tuner.scoring.objective as obj
from tuner.config import CostConfig, ObjectivesConfig, SloConfig
from tuner.errors import ConfigError
from tuner.measurement.stats import Measurements, MetricStats
from tuner.scoring.objective import (
    NO_DATA_VIOLATION,
    ObjectiveContext,
    get_constraint,
    get_objective,
)

README = Path(objectives.__file__).with_name("README.md")
BUILTIN_OBJECTIVES = {
    "p99_e2e_latency",
    "p99_ttft",
    "output_throughput",
    "output_token_rate",
    "goodput",
    "cost_per_million_tokens",
    "energy_per_million_tokens",
}
BUILTIN_CONSTRAINTS = {
    "slo_p99_e2e",
    "slo_p99_ttft",
    "slo_p99_tpot",
    "error_rate",
    "rejected_rate",
    "quality_vs_baseline",
}


def stats(p99: float | None, n: int = 100) -> MetricStats:
    return MetricStats(n=n, p99=p99, p50=p99) if p99 is not None else MetricStats()


def meas(
    e2e: float | None = 1.0,
    ttft: float | None = 0.1,
    tpot: float | None = 0.01,
    tok_s: float = 1000.0,
    started: int = 100,
    failed: int = 0,
) -> Measurements:
    done = started - failed
    return Measurements(
        ttft=stats(ttft, done),
        tpot=stats(tpot, done),
        itl=stats(tpot, done),
        e2e=stats(e2e, done),
        window_s=10.0,
        requests_started=started,
        completed=done,
        failed=failed,
        errors_by_kind={"http": failed} if failed else {},
        error_rate=failed / started if started else 0.0,
        request_throughput=done / 10.0,
        output_throughput=tok_s,
        total_throughput=tok_s * 2,
        goodput=done / 20.0,
        mean_prompt_tokens=256.0,
        mean_output_tokens=64.0,
        dispatch_lag_p99_s=0.001,
    )


EMPTY = meas(e2e=None, ttft=None, tpot=None, tok_s=0.0, started=0)


def test_registry_has_the_builtins_and_lists_them_on_unknown_names() -> None:
    assert set(obj.known_objectives()) >= BUILTIN_OBJECTIVES
    assert set(obj.known_constraints()) >= BUILTIN_CONSTRAINTS
    with pytest.raises(ConfigError) as err:
        get_objective("p99_latncy")
    assert "p99_latncy" in err.value.one_line() and "p99_e2e_latency" in err.value.one_line()
    with pytest.raises(ConfigError, match=r"known: .*slo_p99_e2e"):
        get_constraint("slo")


def test_latency_and_throughput_values_and_no_fake_best_on_empty() -> None:
    ctx = ObjectiveContext()
    m = meas(e2e=1.7, ttft=0.25, tok_s=1234.0)
    assert get_objective("p99_e2e_latency").value(m, ctx) == 1.7
    assert get_objective("p99_ttft").value(m, ctx) == 0.25
    assert get_objective("output_throughput").value(m, ctx) == 1234.0
    assert math.isnan(get_objective("output_token_rate").value(m, ctx))  # no token times
    m.output_token_rate = 1190.5
    assert get_objective("output_token_rate").value(m, ctx) == 1190.5
    assert get_objective("goodput").value(m, ctx) == m.goodput
    for name in BUILTIN_OBJECTIVES - {"energy_per_million_tokens"}:
        assert math.isnan(get_objective(name).value(EMPTY, ctx)), name


def test_cpu_cost_follows_the_formula() -> None:
    ctx = ObjectiveContext(cost=CostConfig(cpu_hour=0.05), device="cpu", cpus=2)
    value = get_objective("cost_per_million_tokens").value(meas(tok_s=1000.0), ctx)
    assert value == pytest.approx((0.05 * 2) / (1000.0 * 3600) * 1e6)  # ≈ $0.0278
    # the server's pinned CPUs are billed, unless the operator set the price basis (cost.cpus)
    one = ObjectiveContext(cost=CostConfig(cpu_hour=0.05), device="cpu", cpus=1)
    assert get_objective("cost_per_million_tokens").value(meas(tok_s=1000.0), one) == (
        pytest.approx(value / 2)
    )
    fixed = ObjectiveContext(cost=CostConfig(cpu_hour=0.05, cpus=8), device="cpu", cpus=1)
    assert get_objective("cost_per_million_tokens").value(meas(tok_s=1000.0), fixed) == (
        pytest.approx(value * 4)
    )


def test_gpu_cost_uses_the_model_price_times_gpus_used() -> None:
    prices = {"H100": 2.99, "H200": 3.79, "A10": 0.75, "A100": 1.79}
    cost = get_objective("cost_per_million_tokens")
    h200 = ObjectiveContext(
        cost=CostConfig(gpu_hour=prices), device="cuda", gpus_used=2, gpu_model="NVIDIA H200"
    )
    assert cost.value(meas(tok_s=5000.0), h200) == pytest.approx(3.79 * 2 / (5000 * 3600) * 1e6)
    # A whole-word match: "A10" must not price an A100.
    a100 = ObjectiveContext(
        cost=CostConfig(gpu_hour=prices),
        device="cuda",
        gpus_used=1,
        gpu_model="NVIDIA A100-SXM4-80GB",
    )
    assert cost.value(meas(tok_s=3600.0), a100) == pytest.approx(1.79 / (3600 * 3600) * 1e6)
    assert cost.value(meas(tok_s=0.0, failed=100), a100) == math.inf


def test_missing_gpu_price_is_a_setup_error_listing_known_models() -> None:
    ctx = ObjectiveContext(
        cost=CostConfig(gpu_hour={"H100": 2.99}),
        device="cuda",
        gpus_used=1,
        gpu_model="NVIDIA B200",
    )
    with pytest.raises(ConfigError, match=r"'NVIDIA B200'.*known: H100"):
        obj.resolve(ObjectivesConfig(), ctx)


def test_energy_needs_gpus_and_follows_power_over_rate() -> None:
    cfg = ObjectivesConfig(names=["p99_e2e_latency", "energy_per_million_tokens"])
    with pytest.raises(ConfigError, match="'energy_per_million_tokens' is not available"):
        obj.resolve(cfg, ObjectiveContext(device="cpu"))
    ctx = ObjectiveContext(device="cuda", gpus_used=1, energy_j=3600.0, window_s=10.0)
    energy = get_objective("energy_per_million_tokens")
    assert energy.value(meas(tok_s=1000.0), ctx) == pytest.approx(360.0 / 1000.0 * 1e6)
    no_nvml = ObjectiveContext(device="cuda", gpus_used=1, energy_j=None, window_s=10.0)
    assert math.isnan(energy.value(meas(), no_nvml))


@pytest.mark.parametrize(
    ("name", "slo", "m", "expected"),
    [
        ("slo_p99_e2e", SloConfig(p99_e2e_s=1.0), meas(e2e=1.5), 0.5),
        ("slo_p99_e2e", SloConfig(p99_e2e_s=2.0), meas(e2e=1.5), -0.25),
        ("slo_p99_e2e", SloConfig(p99_e2e_s=0.0), meas(e2e=99.0), -1.0),
        ("slo_p99_e2e", SloConfig(p99_e2e_s=1.0), EMPTY, NO_DATA_VIOLATION),
        ("slo_p99_ttft", SloConfig(p99_ttft_s=0.2), meas(ttft=0.3), 0.5),
        ("slo_p99_tpot", SloConfig(p99_tpot_s=0.02), meas(tpot=0.01), -0.5),
        ("slo_p99_tpot", SloConfig(p99_tpot_s=0.02), meas(tpot=None), -1.0),  # 1-token outputs
        ("error_rate", SloConfig(max_error_rate=0.01), meas(failed=5), 0.04),
        ("error_rate", SloConfig(max_error_rate=0.01), meas(), -0.01),
        ("error_rate", SloConfig(max_error_rate=0.01), EMPTY, NO_DATA_VIOLATION),
    ],
)
def test_constraint_violation_signs(
    name: str, slo: SloConfig, m: Measurements, expected: float
) -> None:
    assert get_constraint(name).violation(m, ObjectiveContext(slo=slo)) == pytest.approx(expected)


def test_evaluate_and_failed_evaluation() -> None:
    ctx = ObjectiveContext(slo=SloConfig(p99_e2e_s=2.0), cpus=2)
    selection = obj.resolve(ObjectivesConfig(), ctx)
    assert selection.directions == ["minimize", "maximize", "minimize"]
    good = obj.evaluate(selection, meas(e2e=1.0), ctx)
    assert good.feasible and good.complete and good.values[0] == 1.0
    failed = obj.failed_evaluation(selection)
    assert failed.values == [math.inf, -math.inf, math.inf]
    assert not failed.feasible and set(failed.violations) == BUILTIN_CONSTRAINTS
    assert failed.violations["error_rate"] == NO_DATA_VIOLATION
    assert not obj.evaluate(selection, EMPTY, ctx).complete


def test_a_second_class_with_the_same_name_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(obj, "_OBJECTIVES", dict(obj._OBJECTIVES))

    class Clash(obj.Objective):
        name = "p99_e2e_latency"
        direction = obj.MINIMIZE
        unit = "s"

        def value(self, m: Measurements, ctx: ObjectiveContext) -> float:
            return 0.0

    with pytest.raises(ConfigError, match="registered twice"):
        obj.register_objective(Clash)


def _installed_plugin(site: Path, module: str, code: str) -> str:
    """A package installed into ``site`` as pip installs one: its module and a dist-info
    whose entry points declare it under tuner's group. Returns the distribution's name."""
    dist = f"tuner-plugin-{module}"
    (site / f"{module}.py").write_text(code)
    info = site / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{obj.ENTRY_POINT_GROUP}]\nmine = {module}\n")
    return dist


def test_an_installed_package_registers_the_readme_example_by_its_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S)
    assert code, "objectives/README.md must keep its example"
    module = f"plugin_{uuid.uuid4().hex[:8]}"
    _installed_plugin(tmp_path, module, code.group(1))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(obj, "_OBJECTIVES", dict(obj._OBJECTIVES))
    path = list(objectives.__path__)
    try:
        loaded = obj.load_plugins()
        assert module in loaded and "objectives.latency" in loaded
        p95 = get_objective("p95_tpot")
        m = meas()
        m.tpot = MetricStats(n=10, p95=0.042)
        assert p95.direction == "minimize" and p95.value(m, ObjectiveContext()) == 0.042
        assert list(objectives.__path__) == path  # nothing patched into the package
    finally:
        sys.modules.pop(module, None)


def test_a_broken_plugin_names_itself_and_its_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = f"broken_{uuid.uuid4().hex[:8]}"
    dist = _installed_plugin(tmp_path, module, "raise RuntimeError('oops')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as err:
        obj.load_plugins()
    assert err.value.one_line() == (
        f"objectives plugin {module!r} failed to import: RuntimeError: oops "
        f"(fix or uninstall {dist})"
    )
