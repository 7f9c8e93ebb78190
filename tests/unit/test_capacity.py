"""`tuner capacity` without a server: the search on rates with known verdicts, the SLO verdict of
one window, sizing, the stored config read back, bad input, and the replica count in k8s.yaml.
(Against real Locust and a server of known capacity: tests/integration/test_capacity_fake.py.)"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from types import TracebackType
from typing import Any

import optuna
import pytest
import yaml

from tests.fakes.stored_study import ACCEPTED, FINGERPRINT, make_stored_study, new_study
from tuner.cli import main
from tuner.composition import compose
from tuner.config import CostConfig, SloConfig, TunerConfig
from tuner.deployment.capacity.stored_config import from_dict, stored_config
from tuner.deployment.capacity.sweep import CapacitySearch, verdict
from tuner.errors import ConfigError
from tuner.measurement.stats import Measurements, MetricStats
from tuner.plan.sizing import (
    CapacityRecord,
    CapacityStep,
    Price,
    read_capacity,
    server_price,
    size,
    write_capacity,
)


def _step(rate: float, meets: bool) -> CapacityStep:
    return CapacityStep(rate, rate, rate if meets else 0.0, rate, 0.0, {"e2e": 1.0}, meets)


def knee(capacity: float):  # type: ignore[no-untyped-def]
    """A server that meets the SLOs at and below ``capacity``, and only there."""
    asked: list[float] = []

    def measure(rate: float, phase: str) -> CapacityStep:
        asked.append(rate)
        return _step(rate, rate <= capacity)

    return measure, asked


@pytest.mark.parametrize("start", [0.3, 2.0, 9.0, 40.0])
def test_the_search_brackets_the_capacity_within_its_resolution(start: float) -> None:
    measure, asked = knee(7.3)
    found = CapacitySearch(measure, start, max_steps=12, resolution=0.1).run()
    assert found.max_rps <= 7.3 < found.upper_rps
    assert found.upper_rps - found.max_rps <= 0.1 * found.max_rps
    assert len(asked) <= 12 and asked[0] == start
    assert all(found.max_rps <= r or s.meets for r, s in zip(asked, found.steps, strict=True))


def test_a_second_window_that_misses_moves_the_capacity_down() -> None:
    """One lucky window at 8 req/s: its confirmation misses, the search goes on below it."""
    seen: dict[float, int] = {}

    def measure(rate: float, phase: str) -> CapacityStep:
        seen[rate] = seen.get(rate, 0) + 1
        lucky = rate == 8.0 and seen[rate] == 1
        return _step(rate, rate <= 5.0 or lucky)

    found = CapacitySearch(measure, 2.0, max_steps=12, resolution=0.1).run()
    assert seen[8.0] == 2  # measured twice: met, then missed
    assert found.max_rps <= 5.0 < found.upper_rps <= 8.0  # the miss wins over the pass


def test_the_search_stops_at_its_step_budget_with_what_it_knows() -> None:
    measure, asked = knee(1000.0)
    found = CapacitySearch(measure, 1.0, max_steps=4).run()
    assert len(asked) == 4 and found.max_rps == 8.0 and math.isinf(found.upper_rps)


def test_nothing_meets_the_slos() -> None:
    measure, asked = knee(0.0)
    found = CapacitySearch(measure, 4.0, max_steps=20).run()
    assert found.max_rps == 0.0 and found.upper_rps == min(asked)
    assert min(asked) < 4.0 / 32  # halved down to a trickle before giving up


def test_progress_names_each_rate_with_what_remains() -> None:
    lines: list[str] = []
    measure, _ = knee(5.0)
    CapacitySearch(measure, 1.0, max_steps=10, progress=lines.append).run()
    assert lines[0].startswith("capacity 1/10 (sweep) 1 req/s") and "left" in lines[0]
    assert any("(bisect)" in line for line in lines)
    assert lines[-1].endswith("done")


def _measurements(
    p99_e2e: float, started: int, errors: int = 0, lag: float | None = None
) -> Measurements:
    e2e = MetricStats.of([p99_e2e] * 10)
    return Measurements(
        ttft=MetricStats.of([0.1] * 10),
        tpot=MetricStats.of([0.01] * 10),
        itl=MetricStats(),
        e2e=e2e,
        window_s=10.0,
        requests_started=started,
        completed=started - errors,
        failed=errors,
        errors_by_kind={},
        error_rate=errors / started,
        request_throughput=(started - errors) / 10,
        output_throughput=0.0,
        total_throughput=0.0,
        goodput=(started - errors) / 10,
        mean_prompt_tokens=None,
        mean_output_tokens=None,
        dispatch_lag_p99_s=lag,
    )


def test_a_window_meets_the_slos_only_with_every_p99_errors_and_the_offered_rate() -> None:
    slo = SloConfig(p99_e2e_s=2.0, p99_ttft_s=0.5, max_error_rate=0.01)
    assert verdict(_measurements(1.5, 100), slo, 10.0, "sweep").meets
    slow = verdict(_measurements(2.5, 100), slo, 10.0, "sweep")
    assert not slow.meets and "P99 E2E 2.5 s > 2 s" in slow.why
    failing = verdict(_measurements(1.5, 100, errors=5), slo, 10.0, "sweep")
    assert not failing.meets and "error rate 5.0% > 1.0%" in failing.why
    few = verdict(_measurements(1.5, 40), slo, 10.0, "sweep")  # 4 req/s sent of 10
    assert not few.meets and "sent only 4 req/s" in few.why
    assert verdict(_measurements(1.5, 85, lag=0.05), slo, 10.0, "sweep").meets  # Poisson luck
    late = verdict(_measurements(1.5, 100, lag=2.0), slo, 10.0, "sweep")
    assert not late.meets and "P99 2 s late" in late.why


def test_replicas_gpus_and_cost() -> None:
    price = server_price(CostConfig(gpu_hour={"H100": 2.0}), "cuda", "NVIDIA H100 80GB HBM3", 2, 0)
    assert price.per_hour == 4.0 and "2 x H100" in price.basis
    sized = size(100.0, 0.3, 12.0, devices=2, price=price)
    assert sized.replicas == math.ceil(130 / 12) == 11 and sized.gpus == 22
    assert sized.cost_per_month == pytest.approx(4.0 * 11 * 730)
    assert size(10.0, 0.0, 10.0 / 3, 1, Price(1.0, "")).replicas == 3  # not 4 by rounding
    cpu = server_price(CostConfig(cpu_hour=0.05, cpus=0), "cpu", "", 1, 7)
    assert cpu.per_hour == pytest.approx(0.35)
    unpriced = server_price(CostConfig(), "cuda", "H200", 1, 0)
    assert math.isnan(unpriced.per_hour) and "no price" in unpriced.basis
    for target, headroom in ((0.0, 0.3), (-1.0, 0.3), (5.0, 1.0), (5.0, -0.2)):
        with pytest.raises(ConfigError):
            size(target, headroom, 1.0, 1, price)


def test_the_stored_config_reads_back_as_the_composed_one(tmp_path: Path) -> None:
    config = compose([f"studies_dir={tmp_path}", "workload=open_loop", "slo.p99_e2e_s=3"])
    data = yaml.safe_load(yaml.safe_dump(dataclasses.asdict(config)))
    data["future_key"] = {"x": 1}  # written by a newer tuner: left out, not an error
    back = stored_config(data, "x")
    assert isinstance(back, TunerConfig)
    assert back.workload == config.workload and back.slo == config.slo
    assert back.search_space == config.search_space and back.server.args == config.server.args
    assert from_dict(CostConfig, {"gpu_hour": {"H100": 2.5}}).gpu_hour == {"H100": 2.5}
    with pytest.raises(ConfigError, match=r"no stored config\.yaml"):
        stored_config({}, "x")


def test_the_capacity_record_round_trips(tmp_path: Path) -> None:
    record = CapacityRecord(
        "s", "trial x", {"max_num_seqs": 32}, 8.0, math.inf, {"p99_e2e_s": 5}, [_step(8.0, True)]
    )
    write_capacity(tmp_path, record)
    back = read_capacity(tmp_path)
    assert back is not None and back.upper_rps == math.inf and back.steps == record.steps
    assert read_capacity(tmp_path / "none") is None
    # a rehearsal's capacity.json opens with its SIMULATED stamp: export still reads it back
    path = tmp_path / "capacity" / "capacity.json"
    stamped = {"simulated": "SIMULATED: a rehearsal", **json.loads(path.read_text())}
    path.write_text(json.dumps(stamped))
    again = read_capacity(tmp_path)
    assert again is not None and again.steps == record.steps


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target-rps", "0"], "target rate must be > 0"),
        (["--target-rps", "-2"], "target rate must be > 0"),
        (["--target-rps", "5", "--headroom", "1"], "headroom must be in [0, 1)"),
        (["--headroom", "-0.5"], "headroom must be in [0, 1)"),
        (["--max-steps", "1"], "--max-steps must be >= 2"),
    ],
)
def test_bad_capacity_input_is_one_line_and_exit_2(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_stored_study(tmp_path)
    rc = main(["capacity", "demo", "--studies-dir", str(tmp_path), *args])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and message in err, err


def test_capacity_of_a_study_without_a_completed_trial_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "empty"
    root.mkdir()
    (root / "config.yaml").write_text(yaml.safe_dump({"server": {"model": "m"}}))
    storage = optuna.storages.RDBStorage(f"sqlite:///{root / 'optuna.db'}")
    stage = new_study(storage, "empty:batching")
    trial = stage.ask()
    stage.tell(trial, state=optuna.trial.TrialState.FAIL)
    rc = main(["capacity", "empty", "--studies-dir", str(tmp_path), "--target-rps", "3"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "no completed trial" in err, err


def test_k8s_export_writes_the_measured_replica_count(tmp_path: Path) -> None:
    study = make_stored_study(tmp_path)
    params = dict(ACCEPTED.candidate_params or {})
    sized = size(30.0, 0.3, 9.0, 1, Price(0.1, "2 CPUs"))
    record = CapacityRecord("demo", "final", params, 9.0, 9.5, {}, [], sized)
    write_capacity(study.folder, record)
    out = tmp_path / "out"
    assert (
        main(
            ["export", "demo", "--studies-dir", str(tmp_path), "--format", "k8s", "--out", str(out)]
        )
        == 0
    )
    deployment = next(yaml.safe_load_all((out / "k8s.yaml").read_text()))
    assert deployment["spec"]["replicas"] == sized.replicas == 5
    assert "capacity: 9 req/s per replica" in (out / "k8s.yaml").read_text()
    # A capacity measured for another configuration is not this one's.
    write_capacity(study.folder, dataclasses.replace(record, params={"max_num_seqs": 4}))
    assert (
        main(
            ["export", "demo", "--studies-dir", str(tmp_path), "--format", "k8s", "--out", str(out)]
        )
        == 0
    )
    assert next(yaml.safe_load_all((out / "k8s.yaml").read_text()))["spec"]["replicas"] == 1


class _KneeServer:
    """ServedConfig without a server: every rate up to 9 req/s meets the SLOs (the search over
    such a server is tested above; here only what the command prints and writes matters)."""

    server_cpus = 2

    def __init__(self, *args: Any) -> None:
        pass

    def __enter__(self) -> _KneeServer:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        pass

    def measure(self, rate: float, phase: str, window_s: float | None = None) -> CapacityStep:
        return _step(rate, rate <= 9.0)


@pytest.mark.parametrize("rehearsal", [True, False])
def test_a_rehearsals_capacity_says_simulated_and_a_real_studys_does_not(
    rehearsal: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A study made on the simulated host: its stamp heads the printed result and capacity.json,
    and its rate per replica is "(simulated)"; a measured study's capacity prints as ever."""
    study = make_stored_study(tmp_path)
    config = yaml.safe_load((study.folder / "config.yaml").read_text())
    config["slo"] = {"p99_e2e_s": 5.0}  # capacity is judged against a latency SLO
    (study.folder / "config.yaml").write_text(yaml.safe_dump(config))
    if rehearsal:  # the fingerprint a study run on the simulated host stores: its GPUs' names
        baseline = optuna.load_study(study_name="baseline:fake", storage=study.url)
        gpus = {"gpus": ["NVIDIA H200 (simulated)"]}
        hardware = {**FINGERPRINT["hardware"], **gpus}  # type: ignore[dict-item]
        baseline.set_user_attr("fingerprint", {**FINGERPRINT, "hardware": hardware})
    monkeypatch.setattr("tuner.deployment.capacity.ServedConfig", _KneeServer)

    rc = main(["capacity", "demo", "--studies-dir", str(tmp_path), "--target-rps", "30"])
    captured = capsys.readouterr()
    out = captured.out.splitlines()
    data = json.loads((study.folder / "capacity" / "capacity.json").read_text())
    assert rc == 0, captured
    result = out[1:] if rehearsal else out  # the lines a measured study's capacity prints
    assert result[0].startswith("capacity of ") and "replicas" in result[2], out
    assert result[2].endswith("(simulated)" if rehearsal else "(measured)"), out
    if rehearsal:
        assert out[0].startswith("SIMULATED: a rehearsal on a simulated GPU host"), out
        # The terminal's first line too: progress (stderr, "[hh:mm:ss] ...") comes first there.
        assert captured.err.splitlines()[0].split("] ", 1)[1] == out[0], captured.err
        assert next(iter(data)) == "simulated" and data["simulated"] == out[0]
    else:
        assert "SIMULATED" not in captured.out + captured.err, captured
        assert "simulated" not in data and next(iter(data)) == "study"
        assert read_capacity(study.folder) is not None  # what tuner export reads: unchanged
