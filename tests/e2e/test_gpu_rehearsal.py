"""Every GPU preset rehearsed end to end, as a GPU user walks it, on a simulated GPU host:
`tuner plan`, `tuner run` on Ray with 8 declared GPUs and two trials side by side, `tuner
report`, `tuner export --format k8s`, `tuner capacity`, and `tuner check` of the exported config
deployed on the simulated host. Everything but the GPUs is real: the CLI, Ray, vLLM's parser,
Locust, SQLite, the review.

The rehearsal shrinks the study, and says how: the stages that reach the GPUs, two trials a
stage, one confirmation round, short windows and fewer users; the presets' SLOs and objectives
stand as shipped. The same test runs against real vLLM on a GPU node with
``TUNER_REHEARSAL_REAL=1`` (scripts/gpu_rehearsal_check.py).

The one-GPU preset's simulated launches differ by 5 % (``TUNER_SIM_NOISE_CV``), as real GPUs'
P99s do between launches; the exported config is then deployed on a noiseless host, the model's
truth, and its SLOs must hold there: a hand-over the study called met with confidence is truly
met.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest
import yaml

from tests.conftest import ROOT, TINY_MODEL, leftover_processes
from tests.e2e.conftest import load_studies
from tuner.schema import TrialAttr

pytestmark = pytest.mark.e2e

REAL = os.environ.get("TUNER_REHEARSAL_REAL") == "1"
# What the rehearsal shrinks, stated: the study's size, the windows and the users, never what a
# measurement means. On real GPUs the presets run as shipped but for the number of trials.
SHRUNK = [
    "study.trials_per_stage=2",
    "study.repeats=1",
    "study.baseline_measurements=1",
    "workload.warmup_s=1",
    "workload.window_s=3",
    "quality.enabled=false",
]
SIMULATED = ["server=simulated_gpu", f"server.args.tokenizer={TINY_MODEL}"]
# Each preset's launch noise. 5 %: what P99 TTFT and TPOT move between launches of one config on
# real GPUs. The 8-GPU preset rehearses placement instead: its 3 s windows at 16 users read
# tokens/s in steps of a third (682, 1024, 1365), so with launch noise its one confirmation round
# rightly leaves TP 4's gain unproven, the study keeps TP 8, and the batching stage this test
# needs side by side never gets its GPUs.
NOISE_CV = {"llama8b_h100": "0.05", "llama70b_8xh200": "0"}
# The users each preset is rehearsed with. Two trials side by side, each with its host and its
# Locust, share a 2-core CI host: the 8B's 16 users (~2,000 tokens/s at the modelled speed)
# needed more than it had, tokens were read late, one config read 164 tokens/s per user alone
# and 152 beside another, and a check of the exported config read 8 % below its evidence. 8
# users need half of that. The 70B's 16 users keep its parallelism stage's TP 4, which leaves
# GPUs for its batching stage to run two trials side by side.
USERS = {"llama8b_h100": 8, "llama70b_8xh200": 16}
# 8 declared GPUs, and the cores of an 8-GPU node (4 per GPU) on a 2-core host
RAY = ["study.executor=ray", "study.parallel=2"]
if not REAL:  # a real node's GPUs and cores are what Ray detects
    RAY += ["ray.num_gpus=8", "ray.num_cpus=32"]
# Each preset's GPU system (its plan.system): the host the exported config is deployed on
SYSTEMS = {"llama8b_h100": "h100_sxm", "llama70b_8xh200": "h200_sxm"}
# The preset's stages that reach the GPUs, on the simulated host. The 8-GPU preset: tensor
# and pipeline parallelism (GPU sets, points that need more GPUs than the node), then batching,
# side by side on the GPUs the chosen TP frees. The one-GPU preset: fp8 (weights and KV cache
# in memory), its trials and confirmations side by side. A launch costs the simulated host
# ~10 s of CPU (vLLM's parser, AIConfigurator); every stage's search is the same code whatever
# its flags, and the unit tests cover each stage.
STAGES = {
    "llama8b_h100": "[quantization]",
    "llama70b_8xh200": "[parallelism,batching]",
}
PRESETS = [os.environ["TUNER_REHEARSAL_PRESET"]] if REAL else list(SYSTEMS)
# The check of the deployed config asks to resolve a 50 % change on the simulated host. The
# evidence of a shrunk study is a window or two of each config, measured two trials side by side,
# so the default 20 % took the check 12 windows (10 more than asked, ~70 s a preset) of a
# simulated server that reads the same tokens/s in every window. Asking more of the check is
# its own test (tests/integration/test_check_endpoint.py); a GPU node asks what users ask.
CHECK_RESOLVE = [] if REAL else ["--resolve", "0.5"]


@dataclass
class Rehearsal:
    preset: str
    folder: Path
    env: dict[str, str]

    @property
    def studies(self) -> Path:
        return self.folder / "studies"

    @property
    def study(self) -> Path:
        return self.studies / self.preset

    def tuner(self, *args: str, timeout: float = 900, ok: tuple[int, ...] = (0,)) -> str:
        """A `tuner` command; its output, or the test fails with it."""
        proc = subprocess.run(
            [sys.executable, "-m", "tuner.cli", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode in ok, (
            f"tuner {' '.join(args[:2])}: rc {proc.returncode}\n{out[-4000:]}"
        )
        return out


def overrides(preset: str) -> list[str]:
    if REAL:  # a GPU node: vLLM itself, on the model folder the check script names
        return [f"study={preset}", *SHRUNK, f"server.model={os.environ['TUNER_REHEARSAL_MODEL']}"]
    return [
        f"study={preset}",
        *SHRUNK,
        *SIMULATED,
        f"server.env.TUNER_SIM_NOISE_CV={NOISE_CV[preset]}",
        f"workload.concurrency={USERS[preset]}",
        f"study.stages={STAGES[preset]}",
        # the stages above rehearse placement in this order; a study with estimates would
        # otherwise play its own order (tests/unit/test_stage_order.py covers that choice)
        "study.stage_order=preset",
    ]


def tokenizer() -> str:
    return os.environ["TUNER_REHEARSAL_MODEL"] if REAL else str(TINY_MODEL)


@pytest.fixture
def rehearsal(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Rehearsal]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TUNER_SIM_STATE_DIR": str(tmp_path / "gpus")}
    yield Rehearsal(request.param, tmp_path, env)
    assert not leftover_processes(str(tmp_path)), "a server or load generator is left over"
    left = [line for line in _simulated_hosts() if str(tmp_path) in line]
    assert not left, f"simulated hosts left running: {left}"


def _simulated_hosts() -> list[str]:
    import psutil

    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "environ"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if "tuner.simulation" in cmd:
            env = proc.info.get("environ") or {}
            found.append(f"{proc.info['pid']} {cmd[:120]} {env.get('TUNER_TRIAL_DIR', '')}")
    return found


def _search_trials(storage: str) -> list[optuna.trial.FrozenTrial]:
    studies = load_studies(storage).values()
    return [t for study in studies for t in study.trials if TrialAttr.STATUS in t.user_attrs]


def _no_gpu_shared_at_once(trials: list[optuna.trial.FrozenTrial]) -> None:
    """Trials whose runs overlapped in time held disjoint GPUs (Ray's assignment)."""
    spans = []
    for t in trials:
        devices = t.user_attrs.get("devices") or {}
        if devices.get("gpu_ids") and devices.get("started_at"):
            spans.append((devices["started_at"], devices["ended_at"], set(devices["gpu_ids"])))
    assert len(spans) >= 2, "no trial recorded its GPUs"
    overlapped = 0
    for i, (s1, e1, g1) in enumerate(spans):
        for s2, e2, g2 in spans[i + 1 :]:
            if s1 < e2 and s2 < e1:
                overlapped += 1
                assert g1.isdisjoint(g2), f"GPUs {g1 & g2} held by two trials at once"
    # a real node of one GPU runs them one after the other
    assert overlapped or REAL, "no two trials ran side by side (study.parallel=2)"


def _deploy(rehearsal: Rehearsal, config_yaml: Path, log: Path) -> tuple[subprocess.Popen, str]:
    """The exported vLLM config started on the simulated host, as a user deploys it."""
    port = 18000 + os.getpid() % 1000
    env = {**rehearsal.env, "HF_HUB_OFFLINE": "1"}
    if not REAL:  # the simulated host: the preset's system, all 8 GPUs visible
        env |= {
            "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
            "TUNER_SIM_SYSTEM": SYSTEMS[rehearsal.preset],
            # the modelled start-up shrunk as the trials' (conf/server/simulated_gpu.yaml):
            # a 70B's 96 s on the GPUs would be slept in full
            "TUNER_SIM_STARTUP_SCALE": "0.02",
            "TUNER_SIM_NOISE_CV": "0",  # the truth: the model without launch noise
        }
    server = ["vllm", "serve"] if REAL else [sys.executable, "-m", "tuner.simulation"]
    cmd = [*server, "--config", str(config_yaml), "--host", "127.0.0.1", "--port", str(port)]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    return proc, f"http://127.0.0.1:{port}"


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path) -> None:
    import requests

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-2000:]
        try:
            if requests.get(url + "/health", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    pytest.fail(f"the deployed config did not start: {log.read_text()[-2000:]}")


@pytest.mark.parametrize("rehearsal", PRESETS, indirect=True)
def test_a_gpu_preset_walks_plan_run_report_export_capacity_check(rehearsal: Rehearsal) -> None:
    preset, dirs = rehearsal.preset, f"studies_dir={rehearsal.studies}"
    plan = rehearsal.tuner("plan", *overrides(preset), dirs, timeout=300)
    assert "fits" in plan.lower()

    run = rehearsal.tuner("run", *overrides(preset), *RAY, dirs)
    assert "decisions:" in run and "submitted to Ray" in run
    if not REAL:  # a rehearsal's lines say what they measure
        assert "measuring the SIMULATED GPU host" in run and "measuring vLLM" not in run
    # the hand-over is claimed met with the study's confidence, not merely on a mean
    assert "every SLO met with 90% confidence" in run, run[-3000:]
    logs = [f.read_text() for f in rehearsal.study.glob("trials/*/server.log")]
    noisy = float(NOISE_CV[preset]) > 0
    assert REAL or (logs and all((f"noise CV {NOISE_CV[preset]}" in log) is noisy for log in logs))
    # the GPU wall time beside the rehearsal's own
    assert ("the same study on the simulated GPUs" in run) is not REAL
    storage = f"sqlite:///{rehearsal.study}/optuna.db"
    trials = _search_trials(storage)
    assert all(t.user_attrs[TrialAttr.STATUS] in ("ok", "failed") for t in trials)
    _no_gpu_shared_at_once(trials)

    report = rehearsal.tuner("report", preset, "--studies-dir", str(rehearsal.studies))
    html = (rehearsal.study / "report" / "report.html").read_text()
    # made on the simulated host, every review says so first; on real GPUs, none does
    assert report.splitlines()[0].startswith("SIMULATED") is not REAL
    assert ("SIMULATED" in html.split("<h1>")[0]) is not REAL

    rehearsal.tuner("export", preset, "--studies-dir", str(rehearsal.studies), "--format", "all")
    export = rehearsal.study / "export"
    assert ("SIMULATED" in (export / "k8s.yaml").read_text().splitlines()[0]) is not REAL
    evidence = json.loads((export / "evidence.json").read_text())
    assert (next(iter(evidence)) == "simulated") is not REAL
    deployed = yaml.safe_load((export / "vllm-config.yaml").read_text())
    gpus = int(deployed.get("tensor-parallel-size", 1)) * int(
        deployed.get("pipeline-parallel-size", 1)
    )
    assert gpus <= 8  # the exported config fits the host

    capacity = rehearsal.tuner(
        "capacity",
        preset,
        "--studies-dir",
        str(rehearsal.studies),
        "--target-rps",
        "10",
        "--window-s",
        "3",
        "--max-steps",
        "2",
    )
    assert "replicas" in capacity
    assert capacity.splitlines()[0].startswith("SIMULATED") is not REAL  # stdout's first line

    log = rehearsal.folder / "deployed.log"
    proc, url = _deploy(rehearsal, export / "vllm-config.yaml", log)
    try:
        _wait_healthy(url, proc, log)
        check = rehearsal.tuner(
            "check",
            "--url",
            url,
            "--evidence",
            str(export / "evidence.json"),
            "--tokenizer",
            tokenizer(),
            "--windows",
            "2",
            *CHECK_RESOLVE,
            "--out",
            str(rehearsal.folder / "check"),
            ok=(0, 3),  # a pass, or objectives too noisy to resolve in 2 windows; never a FAIL
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    verdict = json.loads((rehearsal.folder / "check" / "check.json").read_text())
    assert (next(iter(verdict)) == "simulated") is not REAL  # a check of a rehearsal says so
    assert ("SIMULATED" in check) is not REAL
    slo_rows = [r for r in verdict["rows"] if r["kind"] == "slo"]
    assert slo_rows and all(r["verdict"].lower() == "met" for r in slo_rows), check[-3000:]
