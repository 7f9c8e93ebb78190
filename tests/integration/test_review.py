"""`tuner report / export / dashboard` on a real SQLite storage (a stored study with known
numbers), the artifact and note APIs with live Optuna trials, and the real optuna-dashboard."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import optuna
import psutil
import pytest
import requests
import yaml

from tests.conftest import ROOT
from tests.fakes.stored_study import PLANTED, StoredStudy, make_stored_study
from tuner.cli import main
from tuner.export import k8s
from tuner.paths import StudyPaths
from tuner.redact import MASK
from tuner.review.artifacts import artifact_store, upload_trial_artifacts, write_study_note

pytestmark = [pytest.mark.integration, pytest.mark.shares_host]


@pytest.fixture
def stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StoredStudy:
    monkeypatch.setenv("HF_TOKEN", PLANTED["HF_TOKEN"])  # as if the user had it exported
    return make_stored_study(tmp_path / "studies")


def _storage_or_kept(name: str) -> bool:
    """The database (with its write-ahead log) and the files that keep what the user gave."""
    return name.startswith("optuna.db") or name in ("config.yaml", "server.log")


def leaks(folder: Path) -> list[str]:
    """Files under ``folder`` (outside the storage) that contain a planted secret."""
    found = []
    for path in folder.rglob("*"):
        if path.is_file() and not _storage_or_kept(path.name):
            data = path.read_bytes()
            found += [f"{path}: {k}" for k, v in PLANTED.items() if v.encode() in data]
    return found


def test_report_writes_every_file_and_prints_the_summary(
    stored: StoredStudy, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", "demo", "--studies-dir", str(stored.studies_dir)]) == 0
    out = capsys.readouterr().out
    assert "stage batching: ACCEPTED" in out and "report.html" in out
    report = stored.folder / "report"
    assert {p.name for p in report.iterdir()} == {
        "report.html",
        "pareto.png",
        "improvement.png",
        "latency_cdf.png",
        "importances.png",
        "trials.csv",
        "trials.parquet",
    }
    assert not leaks(stored.folder) and not any(v in out for v in PLANTED.values())


def test_export_all_formats_of_the_final_incumbent(
    stored: StoredStudy, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export", "demo", "--studies-dir", str(stored.studies_dir)]) == 0
    folder = stored.folder / "export"
    files = {p.name: p.read_text() for p in folder.iterdir()}
    assert set(files) == {
        "vllm-serve.sh",
        "vllm-config.yaml",
        "docker-run.sh",
        "k8s.yaml",
        "evidence.json",
    }
    assert yaml.safe_load(files["vllm-config.yaml"])["max-num-seqs"] == 32
    assert k8s.validate(files["k8s.yaml"]) == []
    assert _cpu_request(files["k8s.yaml"]) == "2"  # cost.cpus: the operator's basis wins
    evidence = json.loads(files["evidence.json"])
    assert evidence["trial"]["optuna_study"] == "demo:batching" and evidence["trial"]["number"] == 4
    assert evidence["delta_vs_baseline"]["output_throughput"]["change_pct"] == 50.0
    assert evidence["confirmation"]["candidate_values"] == [1500, 1480]
    assert evidence["measurements"]["latency_s"]["e2e"]["n"] == 100
    assert os.access(folder / "vllm-serve.sh", os.X_OK)
    assert "HF_TOKEN" not in files["vllm-serve.sh"] and not leaks(stored.folder)


def _cpu_request(k8s_yaml: str) -> str:
    docs = [d for d in yaml.safe_load_all(k8s_yaml) if d and d["kind"] == "Deployment"]
    return str(docs[0]["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"])


def test_export_requests_the_cpus_the_server_was_pinned_to(stored: StoredStudy) -> None:
    config_yaml = stored.folder / "config.yaml"
    config = yaml.safe_load(config_yaml.read_text())
    config["cost"]["cpus"] = 0  # the default: bill what the server ran on
    config_yaml.write_text(yaml.safe_dump(config))
    assert (
        main(["export", "demo", "--studies-dir", str(stored.studies_dir), "--format", "k8s"]) == 0
    )
    assert _cpu_request((stored.folder / "export" / "k8s.yaml").read_text()) == "1"


def test_export_pareto_writes_one_folder_per_optimal_trial(stored: StoredStudy) -> None:
    args = ["export", "demo", "--studies-dir", str(stored.studies_dir), "--pareto"]
    assert main([*args, "--format", "yaml"]) == 0
    folders = sorted(p.name for p in (stored.folder / "export").iterdir())
    assert folders == ["baseline-0", "batching-3", "batching-4"]
    assert (stored.folder / "export" / "batching-3" / "evidence.json").is_file()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["export", "nope"], "no study 'nope'"),
        (["export", "demo", "--trial", "1"], "trial batching#1 has no measurement of its own"),
        (["export", "demo", "--trial", "9"], "has no trial 9 in stage batching"),
        (["export", "demo", "--stage", "x", "--trial", "2"], "--stage 'x' is not a stage"),
        (["export", "demo", "--format", "helm"], "unknown export format 'helm'"),
        (["report", "demo", "--storage", "sqlite:///{dir}/other.db"], "has no study named"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    stored: StoredStudy, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    args = [a.replace("{dir}", str(stored.studies_dir)) for a in args]
    assert main([*args, "--studies-dir", str(stored.studies_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_artifacts_of_a_live_trial_and_a_study_note(tmp_path: Path) -> None:
    paths = StudyPaths(tmp_path / "s")
    folder = tmp_path / "trial"
    (folder / "loadgen").mkdir(parents=True)
    (folder / "server.log").write_text(f"HF_TOKEN={PLANTED['HF_TOKEN']}\nok\n")
    (folder / "loadgen" / "locust.html").write_text("<html></html>")
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'o.db'}")
    study = optuna.create_study(storage=storage, study_name="x:stage")
    trial = study.ask()
    ids = upload_trial_artifacts(storage, study, trial, folder, artifact_store(paths))
    study.tell(trial, 1.0)
    metas = optuna.artifacts.get_all_artifact_meta(study.trials[0], storage=storage)
    assert sorted(m.filename for m in metas) == ["locust.html", "server.log"] and len(ids) == 2
    log = next(m for m in metas if m.filename == "server.log")
    assert (paths.artifacts_dir / log.artifact_id).read_text() == f"HF_TOKEN={MASK}\nok\n"
    write_study_note(study, f"# note\nstorage postgresql://u:{PLANTED['VLLM_API_KEY']}@h/db")
    from optuna_dashboard import get_note

    assert get_note(study) == f"# note\nstorage postgresql://u:{MASK}@h/db"


@pytest.fixture
def dashboard(stored: StoredStudy) -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tuner.cli",
            "dashboard",
            "demo",
            "--studies-dir",
            str(stored.studies_dir),
            "--port",
            "0",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "optuna-dashboard for study" in line or len(lines) > 50:
            break
    url = line.split(": ", 1)[1].split()[0].removesuffix("/dashboard")
    yield proc, url
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0, "".join(lines)


def test_dashboard_serves_trials_with_attrs_artifacts_and_note(
    stored: StoredStudy, dashboard: tuple[subprocess.Popen[str], str]
) -> None:
    _, url = dashboard
    assert url.startswith("http://127.0.0.1:")
    studies = requests.get(f"{url}/api/studies", timeout=10).json()["study_summaries"]
    ids = {s["study_name"]: s["study_id"] for s in studies}
    assert set(ids) == {"baseline:fake", "demo:batching", "demo:confirm"}
    detail = requests.get(f"{url}/api/studies/{ids['demo:batching']}", timeout=10).json()
    trials = {t["number"]: t for t in detail["trials"]}
    attrs = {a["key"]: a["value"] for a in trials[4]["user_attrs"]}
    assert attrs["role"] == "search" and "m_e2e_p99_s" in attrs
    names = sorted(a["filename"] for a in trials[4]["artifacts"])
    assert names == ["requests.jsonl", "result.json", "server.log"]
    log = next(a for a in trials[4]["artifacts"] if a["filename"] == "server.log")
    body = requests.get(
        f"{url}/artifacts/{ids['demo:batching']}/{trials[4]['trial_id']}/{log['artifact_id']}",
        timeout=10,
    ).text
    assert f"HF_TOKEN={MASK}" in body and PLANTED["HF_TOKEN"] not in body
    assert "| batching#2 | search | ok | kv_cache_pressure |" in detail["note"]["body"]
    assert not leaks(stored.folder)


def test_dashboard_stops_with_its_server_on_ctrl_c(
    dashboard: tuple[subprocess.Popen[str], str],
) -> None:
    proc, url = dashboard
    children = psutil.Process(proc.pid).children(recursive=True)
    assert children, "optuna-dashboard runs as a child process"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0
    psutil.wait_procs(children, timeout=10)
    assert not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children)
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{url}/api/meta", timeout=2)
