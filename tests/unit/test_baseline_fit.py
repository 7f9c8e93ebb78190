"""The baseline must fit: `tuner run` refuses a study whose fixed args cannot start on their GPUs
before any launch, by AIConfigurator's memory model (run for real), with the smallest TP (and
precision) that fits; silent where no estimate can be made."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.composition import compose
from tuner.errors import ConfigError
from tuner.plan.baseline import baseline_fit
from tuner.plan.planner import Planner
from tuner.study.decision.evaluation import Evaluator
from tuner.study.loop.prescreen import Prescreen

logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
# The simulated GPU host: a server tuner launches with vLLM's flags, without vLLM's import
RUN = ["run", "study=llama70b_8xh200", "server=simulated_gpu"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        # 141 GB of bf16 weights on one 141 GB H200
        (
            ["server.args.tensor_parallel_size=1"],
            "the smallest the plan says fits: tensor_parallel_size=2 (its own precision), or "
            "tensor_parallel_size=1 with quantization=fp8",
        ),
        # TP 8 x PP 2 on the preset's 8 GPUs
        (["+server.args.pipeline_parallel_size=2"], "needs 16 GPUs, the host has 8"),
    ],
)
def test_a_baseline_that_cannot_fit_is_one_line_exit_2_and_nothing_launched(
    args: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main([*RUN, *args, f"studies_dir={tmp_path}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("tuner: error: the baseline cannot start"), err
    assert said in err[0] and "nothing was launched" in err[0]
    assert "set server.args.tensor_parallel_size=" in err[0]
    assert not list(tmp_path.glob("*/trials/*"))  # no server was started


def test_the_presets_baselines_fit(tmp_path: Path) -> None:
    for preset in ("llama70b_8xh200", "llama8b_h100"):
        config = compose([f"study={preset}", f"studies_dir={tmp_path}"])
        baseline_fit(Planner(config))  # silent: each starts from what a user deploys first


def test_without_estimates_the_check_is_silent(tmp_path: Path) -> None:
    """A model the plan cannot read (no local config, no shipped family): the study runs as it
    would without AIConfigurator, and vLLM's start-up is the judge."""
    config = compose(
        [
            *RUN[1:],
            "server.model=acme/Unknown-70B",
            "server.args.tensor_parallel_size=1",
            f"studies_dir={tmp_path}",
        ]
    )
    assert Planner.available(config) is None
    with pytest.raises(ConfigError):
        Planner(config)
    screen = Prescreen.open(config, Evaluator(config, "H200"), lambda _: None, host_gpus=8)
    screen.baseline_fits()  # no error
