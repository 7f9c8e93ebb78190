"""A request class's priority: planned with each of its requests, sent only to a server that
schedules by priority (vLLM refuses any priority but 0 on FCFS), out of the fingerprint while
no class sets one, and a value that is not an integer is one line and exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.cli import main
from tuner.composition import compose
from tuner.config.workload import LengthDist, RequestClass, WorkloadConfig
from tuner.loadgen import request_plan as wl
from tuner.loadgen.generator import Target
from tuner.loadgen.locust import LocustLoadGenerator
from tuner.loadgen.request import body
from tuner.search.launch import LaunchSpec
from tuner.search.resolved import resolve
from tuner.server.backend import ServerInfo
from tuner.study.state.fingerprint import fingerprint
from tuner.testing.tiny_tokenizer import make_tiny_tokenizer
from tuner.trial.run import _target


def _workload() -> WorkloadConfig:
    short = LengthDist(mean=8)
    return WorkloadConfig(
        classes=[
            RequestClass("chat", 3.0, "chat", short, short, priority=0),
            RequestClass("documents", 1.0, "completions", LengthDist(mean=40), short, priority=5),
        ]
    )


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_tokenizer(tmp_path_factory.mktemp("tok"))


def _target_of(tok_dir: Path, by_priority: bool) -> Target:
    return Target("http://127.0.0.1:1", None, "m", str(tok_dir), by_priority=by_priority)


def test_each_request_carries_its_class_priority_where_the_server_schedules_by_it(
    tok_dir: Path,
) -> None:
    workload = _workload()
    gen = LocustLoadGenerator()
    sent = gen.plan(_target_of(tok_dir, True), workload)
    by_class = {(p.request_class, p.priority) for p in sent}
    assert by_class == {("chat", 0), ("documents", 5)}
    bodies = [body({**p.__dict__}, "m") for p in sent]
    assert all(b.get("priority") == 5 for b, p in zip(bodies, sent, strict=True) if p.priority)
    assert all("priority" not in b for b, p in zip(bodies, sent, strict=True) if not p.priority)
    # FCFS: vLLM would refuse every documents request with a priority, so none is sent
    fcfs = gen.plan(_target_of(tok_dir, False), workload)
    assert [p.prompt_tokens_target for p in fcfs] == [p.prompt_tokens_target for p in sent]
    assert all("priority" not in body({**p.__dict__}, "m") for p in fcfs)
    # the cached plan itself keeps the priorities for the next trial that schedules by them
    assert any(p.priority for p in wl.build_plan(workload, str(tok_dir)))


@pytest.mark.parametrize(
    ("fixed", "launched", "expected"),
    [
        ({}, {"scheduling_policy": "priority"}, True),
        ({"scheduling_policy": "priority"}, {}, True),
        ({"scheduling_policy": "priority"}, {"scheduling_policy": "fcfs"}, False),
        ({}, {}, False),
    ],
)
def test_the_launch_under_load_says_whether_priorities_are_sent(
    fixed: dict[str, str], launched: dict[str, str], expected: bool
) -> None:
    config = compose([])
    config.server.args = {**config.server.args, **fixed}

    class _Server:
        api_key = None

    info = ServerInfo(base_url="http://127.0.0.1:1", pid=1, startup_s=0.0)
    launch = resolve(LaunchSpec(args=launched), config.server)
    target = _target(config, _Server(), info, launch)  # type: ignore[arg-type]
    assert target.by_priority is expected


def test_a_workload_without_priorities_keeps_its_baselines_fingerprint() -> None:
    plain = fingerprint(compose([]), "0.32.0", {"device": "cpu"})
    assert all("priority" not in c for c in plain["workload"]["classes"])
    ranked = compose(["workload.classes.0.priority=3"])
    found = fingerprint(ranked, "0.32.0", {"device": "cpu"})
    assert found["workload"]["classes"][0]["priority"] == 3


def test_a_priority_that_is_not_an_integer_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["run", "workload.classes.0.priority=high", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "priority" in err
