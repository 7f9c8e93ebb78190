"""`tuner dashboard`: optuna-dashboard on loopback for one study's storage and artifacts.

Before it starts, every measured trial that has no artifacts yet gets its folder's files
attached (:mod:`tuner.review.artifacts`) and each study of the name gets a fresh note (baseline,
decisions, best config, bottleneck per trial). The server runs in a child process of its own
session, bound to 127.0.0.1; the storage URL reaches it through the environment, not argv,
so a database password is not visible in the process list. Ctrl-C stops it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import requests

from tuner.errors import ConfigError, TunerError
from tuner.host.children import free_port, port_is_free, reap
from tuner.review.artifacts import (
    artifact_store,
    has_artifacts,
    upload_trial_artifacts,
    write_study_note,
)
from tuner.review.stored import Review, study_redactor
from tuner.study.state.storage import study_id

HOST = "127.0.0.1"
READY_TIMEOUT_S = 60.0
ENV_STORAGE, ENV_ARTIFACTS = "TUNER_DASHBOARD_STORAGE", "TUNER_DASHBOARD_ARTIFACTS"
# optuna-dashboard's own server, with the file-system artifact store of the study folder.
LAUNCH = (
    "import os, sys\n"
    "from optuna.artifacts import FileSystemArtifactStore\n"
    "from optuna_dashboard import run_server\n"
    f"run_server(os.environ['{ENV_STORAGE}'], host=sys.argv[1], port=int(sys.argv[2]),\n"
    f"           artifact_store=FileSystemArtifactStore(os.environ['{ENV_ARTIFACTS}']))\n"
)


class DashboardError(TunerError):
    """optuna-dashboard did not start."""


def attach_missing_artifacts(review: Review) -> int:
    """Upload the folder files of every trial that has none attached yet; how many trials."""
    store = artifact_store(review.paths)
    studies = review.studies()
    redactor = study_redactor(review)
    done = 0
    for view in review.trials():
        study = studies[view.study]
        if view.folder is None or not view.folder.is_dir():
            continue
        if has_artifacts(review.storage, study, view.trial):
            continue
        if upload_trial_artifacts(review.storage, study, view.trial, view.folder, store, redactor):
            done += 1
    return done


def write_notes(review: Review, markdown: str) -> None:
    """The same note on every study of this name (not the shared baseline study)."""
    redactor = study_redactor(review)
    for study in [*review.stages.values(), review.confirm]:
        if study is not None:
            write_study_note(study, markdown, redactor)


def start(review: Review, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        ENV_STORAGE: review.storage_url,
        ENV_ARTIFACTS: str(review.paths.artifacts_dir),
    }
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-c", LAUNCH, HOST, str(port)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches us; we stop its whole group
        )


def wait_ready(proc: subprocess.Popen[bytes], base_url: str, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
            raise DashboardError(
                f"optuna-dashboard exited with code {proc.returncode}: {tail}", hint=f"see {log}"
            )
        try:
            if requests.get(f"{base_url}/api/meta", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.3)
    raise DashboardError(
        f"optuna-dashboard did not answer within {timeout_s:.0f} s", hint=f"see {log}"
    )


def study_links(review: Review, base_url: str) -> list[str]:
    return [
        f"  {name}: {base_url}/dashboard/studies/{study_id(review.storage, study)}"
        for name, study in review.studies().items()
    ]


def choose_port(port: int) -> int:
    if port == 0:
        return free_port(HOST)
    if not port_is_free(HOST, port):
        raise ConfigError(f"port {HOST}:{port} is already in use", hint="pass --port 0 or another")
    return port


def serve(review: Review, port: int, say: Callable[[str], None], note: str) -> int:
    """Prepare, start, print the URLs and wait until Ctrl-C (then stop the server, exit 0)."""
    port = choose_port(port)
    attached = attach_missing_artifacts(review)
    write_notes(review, note)
    log = review.paths.dashboard_log
    proc = start(review, port, log)
    base_url = f"http://{HOST}:{port}"
    try:
        wait_ready(proc, base_url, log, READY_TIMEOUT_S)
        if attached:
            say(f"attached the artifacts of {attached} trial(s)")
        say(f"optuna-dashboard for study {review.name}: {base_url}/dashboard (Ctrl-C stops it)")
        for line in study_links(review, base_url):
            say(line)
        proc.wait()
        return 0 if proc.returncode == 0 else 1
    except KeyboardInterrupt:
        return 0
    finally:
        reap(proc, 5.0)


def dashboard_command(name: str, storage: str | None, studies_dir: Path, port: int) -> int:
    """`tuner dashboard`: serve the study until Ctrl-C."""
    from tuner.review.render import note_markdown
    from tuner.review.report import build_report
    from tuner.review.stored import open_review

    review = open_review(name, storage, studies_dir)
    note = note_markdown(build_report(review, figures=False))
    return serve(review, port, lambda line: print(line, flush=True), note)


def refresh_notes(name: str, storage: str | None, studies_dir: str | Path) -> None:
    """Rewrite the dashboard note of every study of ``name`` from what the storage holds now.

    `tuner run` calls it when the study ends (cheap: no figures), so the dashboard opens on
    the decisions as they stand.
    """
    from tuner.review.render import note_markdown
    from tuner.review.report import build_report
    from tuner.review.stored import open_review

    review = open_review(name, storage, studies_dir)
    write_notes(review, note_markdown(build_report(review, figures=False)))
