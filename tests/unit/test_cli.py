"""The CLI's contract: every conf/ YAML composes; bad input is one line and exit code 2."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from tuner.cli import main
from tuner.composition import compose
from tuner.config import ParamSpec, TunerConfig

CONF = Path(__file__).resolve().parents[2] / "conf"


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize("preset", _options("study"))
def test_every_study_preset_composes(preset: str, tmp_path: Path) -> None:
    overrides = [f"study={preset}"]
    if preset.startswith("llama"):  # GPU examples: the model lives on the GPU host
        overrides.append(f"server.model={tmp_path}")
    config = compose(overrides)
    assert isinstance(config, TunerConfig)
    assert config.name == preset
    for stage in config.study.stages:
        assert stage in config.search_space, (preset, stage)
        assert all(isinstance(s, ParamSpec) for s in config.search_space[stage].values())


@pytest.mark.parametrize(
    "group", ["server", "workload", "search_space", "objectives", "cost", "sampler"]
)
def test_every_group_option_composes(group: str, tmp_path: Path) -> None:
    for option in _options(group):
        overrides = [f"{group}={option}", f"server.model={tmp_path}"]
        if group == "search_space":  # a group file names its stage at the top
            stage = next(iter(yaml.safe_load((CONF / group / f"{option}.yaml").read_text())))
            overrides = [f"{group}=[{option}]", f"study.stages=[{stage}]", overrides[1]]
        config = compose(overrides)
        assert isinstance(config, TunerConfig), (group, option)


BAD_INPUT = [
    (["trial", "no_such_key=1"], "no_such_key"),
    (["trial", "workload.concurrency=-1"], "concurrency"),
    (["trial", "workload.concurrency=abc"], "abc"),
    (["trial", "server.model=/does/not/exist"], "/does/not/exist"),
    (["trial", "workload.mode=sideways"], "workload.mode"),
    (["trial", "server=nope"], "nope"),
    (["trial", "search_space.batching.max_num_seqs.lgo=true"], "lgo"),
    (["trial", "workload.window_s=0"], "window_s"),
    (["trial", "workload.mode=open", "workload.burstiness=0"], "burstiness"),
    (["trial", "workload.mode=open", "workload.rate=0"], "rate"),
    (["trial", "workload.classes=[]"], "classes"),
    (["trial", "workload.processes=0"], "processes"),
    (["trial", "workload.classes.0.api=grpc"], "api"),
    (["trial", "workload.classes.0.prompt_tokens.kind=zipf"], "zipf"),
    (["trial", "workload.classes.0.output_tokens.low=0"], "output_tokens"),
    (["trial", "workload.classes.0.prompt_tokens.kind=normal"], "std=0 never varies"),
    (["trial", "workload.classes.0.prompt_tokens.high=1024"], "a uniform without std spans"),
    (["trial", "workload.classes.0.output_tokens.high=32"], "mean=64 is outside"),
    (["trial", "workload.dataset=/nope.jsonl"], "nope.jsonl"),
    (["trial", "server.port=70000"], "port"),
    (["trial", "server.device=tpu"], "tpu"),
    (["trial", "server.launcher=[]"], "launcher"),
    (["trial", "server.startup_timeout_s=-5"], "startup_timeout_s"),
    (["trial", "name=../x"], "name"),
    (["trial", "telemetry.client_lag_ratio=0.9"], "client_lag_ratio"),
    (["trial", "telemetry.interval_s=0"], "interval_s"),
    (["run", "study.storage=notaurl"], "storage"),
    (["run", "sampler=annealing"], "annealing"),
    (["run", "study.noise=loud"], "study.noise"),
    (["run", "study.count_search_window=maybe"], "count_search_window"),
    (["run", "objectives.names=[speed]"], "speed"),
    (["run", "objectives.select_by=speed"], "speed"),
    (["run", "objectives.constraints=[nope]"], "nope"),
    (["run", "search_space.batching.max_num_seqs.low=300"], "low"),
    (["run", "search_space.batching.max_num_seqs.type=complex"], "complex"),
    (["run", "search_space.memory.block_size.choices=[]"], "choices"),
    (["run", "search_space=[nope]"], "nope"),
    (["run", "study.strategy=random_walk"], "random_walk"),
    (["run", "study.trials_per_stage=0"], "trials_per_stage"),
    (["run", "study.repeats=-1"], "repeats"),
    (["run", "study.stages=[nope]"], "nope"),
    (["trial", "--no-such-flag"], "no-such-flag"),
    (["trial", "placement.server_cpus=0-"], "placement.server_cpus='0-' is not a CPU list"),
    (["run", "placement.client_cpus=99999"], "placement.client_cpus='99999' names CPUs 99999"),
    (["nonsense"], "nonsense"),
    ([], "required"),
    (["run", "study.slo_confidence=0.5"], "study.slo_confidence must be in (0.5, 1), got 0.5"),
    (["run", "study.slo_confidence=1.0"], "study.slo_confidence must be in (0.5, 1), got 1.0"),
    (["run", "study.repeats=3", "study.max_repeats=2"], "study.max_repeats (2) is below"),
]


def test_the_corpus_is_large_enough() -> None:
    assert len(BAD_INPUT) >= 30


@pytest.mark.parametrize(("argv", "needle"), BAD_INPUT)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # --dry-run too: a bad input must be rejected before planning, let alone starting
    runs = bool(argv) and argv[0] in ("trial", "run")
    rc = main([*argv, f"studies_dir={tmp_path}", "--dry-run"] if runs else argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("tuner: error:")
    assert needle in err
    assert not list(tmp_path.glob("*/trials/*"))  # nothing started


def _fake_cpus(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    """Show ``n`` CPUs to both sources the device check could read (the host's count and this
    process's affinity), so the outcome depends on ``n`` and not on the machine running it."""
    monkeypatch.setattr(os, "cpu_count", lambda: n)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(n)))


@pytest.mark.parametrize("cpus", [1, 2, 4, 7])
def test_parallel_sizes_beyond_the_cpus_are_refused(
    cpus: int, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_cpus(monkeypatch, cpus)  # conf/search_space/parallelism.yaml offers TP up to 8
    argv = ["run", "search_space=[parallelism]", "study.stages=[parallelism]"]
    rc = main([*argv, f"studies_dir={tmp_path}", "--dry-run"])
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("tuner: error:"), err
    assert f"the {cpus} visible cpu devices" in err
    assert not list(tmp_path.glob("*/trials/*"))


@pytest.mark.parametrize("cpus", [8, 64])
def test_parallel_sizes_within_the_cpus_are_accepted(
    cpus: int, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_cpus(monkeypatch, cpus)
    argv = ["run", "search_space=[parallelism]", "study.stages=[parallelism]"]
    rc = main([*argv, f"studies_dir={tmp_path}", "--dry-run"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    stage = next(ln for ln in captured.out.splitlines() if ln.startswith("stage parallelism:"))
    assert "tensor_parallel_size: [1, 2, 4, 8]" in stage
    assert not list(tmp_path.glob("*/trials/*"))


def test_dry_run_prints_the_command_and_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["trial", "--dry-run", f"studies_dir={tmp_path}", "server.args.max_num_seqs=16"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "vllm.entrypoints.openai.api_server" in out and "--max-num-seqs 16" in out
    assert "concurrency: 16" in out
    if len(os.sched_getaffinity(0)) >= 2:  # the client on the last CPU, vLLM on the rest
        assert f"client on {max(os.sched_getaffinity(0))}\n" in out
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_run_dry_run_prints_every_stage_and_the_refinement(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["run", "study=cpu_full", f"studies_dir={tmp_path}", "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "stage runtime: 6 trials over {enforce_eager: [False, True]}" in out
    refine = next(line for line in out.splitlines() if line.startswith("stage refine"))
    assert refine.startswith("stage refine: 6 trials over") and "max_num_seqs" in refine
    assert "tensor_parallel_size" in refine  # the union of every group
    # 3 baseline measurements + 6 stages x (6 trials + 2 x 2 confirmations)
    assert "budget: at most 63 server launches" in out


def test_from_command_null_clears_the_presets_command() -> None:
    # The quickstart preset starts from a command; null starts from the fixed args instead.
    assert compose(["server.from_command=null"]).server.from_command is None
