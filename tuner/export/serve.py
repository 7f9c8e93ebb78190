"""`tuner export`: the chosen configuration as files a deployment uses, each with its evidence.

The :class:`Exporter` seam: ``render(spec, evidence) -> {filename: text}``,
registered by format name in :data:`EXPORTERS`:

- ``cli``    ``vllm-serve.sh``: the server command the study measured (host/port for serving)
- ``yaml``   ``vllm-config.yaml``: for ``vllm serve --config vllm-config.yaml``
- ``docker`` ``docker-run.sh``: the vLLM OpenAI image with the same flags
- ``k8s``    ``k8s.yaml``: a Deployment (GPUs = TP x PP x DP, /health probes, resources, env)
  and a Service

The flags are the study's fixed server args (``config.yaml``) with the chosen params on top,
turned into flags and environment by :func:`tuner.search.space.to_launch` as in the study.
Secrets are never written: secret-named variables are dropped, the API key and HF token come
from the caller's environment (scripts) or a Secret (Kubernetes), and every file passes
through a :class:`~tuner.redact.Redactor`.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

import yaml

from tuner.errors import ArtifactError, ConfigError
from tuner.export.spec import EVIDENCE_FILE, SERVE_HOST, SERVE_PORT, ServeSpec, build_serve_spec
from tuner.paths import safe_name
from tuner.plan.sizing import read_capacity
from tuner.redact import Redactor
from tuner.review.evidence import Evidence, build_evidence, windows_line
from tuner.review.slos import HandoverSlos
from tuner.review.stored import Choice, Review, study_redactor


class Exporter(Protocol):
    """Renders a serve spec with its evidence into files (name -> text)."""

    name: str

    def render(self, spec: ServeSpec, evidence: Evidence) -> dict[str, str]: ...


def comment_block(lines: list[str]) -> str:
    return "".join(f"# {line}\n" for line in lines)


def flag_groups(argv: list[str]) -> list[list[str]]:
    """Flags with their values: ``[["--x", "1"], ["--y"]]``."""
    groups: list[list[str]] = []
    for token in argv:
        if token.startswith("--") or not groups:
            groups.append([token])
        else:
            groups[-1].append(token)
    return groups


def _continued(groups: list[list[str]], indent: str = "  ") -> str:
    """A command over several lines, one group (a flag with its value) per line."""
    return (" \\\n" + indent).join(shlex.join(g) for g in groups) + "\n"


_API_KEY_CHECK = (
    'if [ -z "${VLLM_API_KEY-}" ]; then\n'
    '  echo "VLLM_API_KEY is not set; the server listens on all interfaces" >&2\n'
    "  exit 1\n"
    "fi\n"
)


class CliExporter:
    name = "cli"
    filename = "vllm-serve.sh"

    def render(self, spec: ServeSpec, evidence: Evidence) -> dict[str, str]:
        launcher = [p.replace("{python}", "python3") for p in spec.launcher]
        positional = any("{model}" in p for p in launcher)
        flags = spec.flags()
        if positional:  # `vllm serve MODEL`: the model is positional, not --model
            launcher = [p.replace("{model}", spec.model) for p in launcher]
            flags = flags[2:]
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in spec.env.items())
        body = (
            "#!/usr/bin/env bash\n"
            + comment_block(evidence.lines)
            + "# vLLM reads the API key from VLLM_API_KEY (never put it on the command line).\n"
            + "set -euo pipefail\n"
            + _API_KEY_CHECK
            + exports
            + "exec "
            + _continued([launcher, *flag_groups(flags)])
        )
        return {self.filename: body}


class YamlExporter:
    name = "yaml"
    filename = "vllm-config.yaml"

    def render(self, spec: ServeSpec, evidence: Evidence) -> dict[str, str]:
        config: dict[str, Any] = {"model": spec.model}
        if spec.served_model_name:
            config["served-model-name"] = spec.served_model_name
        config.update({"host": SERVE_HOST, "port": SERVE_PORT})
        config.update({k.replace("_", "-"): v for k, v in spec.args.items()})
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in spec.env.items())
        usage = [
            f"usage: vllm serve --config {self.filename}",
            f"environment: {env or '(none)'}; API key from VLLM_API_KEY",
        ]
        text = comment_block(evidence.lines + usage) + yaml.safe_dump(config, sort_keys=False)
        return {self.filename: text}


_HF_CACHE = "HF-CACHE-MOUNT"  # replaced after quoting, so that the shell expands $HOME


class DockerExporter:
    name = "docker"
    filename = "docker-run.sh"

    def render(self, spec: ServeSpec, evidence: Evidence) -> dict[str, str]:
        run = [["docker", "run", "--rm"], ["--name", _k8s_name(spec.name)], ["--ipc=host"]]
        if spec.device == "cuda":
            run.append(["--gpus", str(spec.devices)])
        run += [["-p", f"{SERVE_PORT}:{SERVE_PORT}"], ["-e", "VLLM_API_KEY"], ["-e", "HF_TOKEN"]]
        run += [["-e", f"{key}={value}"] for key, value in spec.env.items()]
        if spec.local_model:
            run.append(["-v", f"{Path(spec.model).expanduser()}:{spec.container_model}:ro"])
        else:
            run.append(["-v", _HF_CACHE])
        notes = [f"image: {spec.image} (the vLLM version the study measured: {spec.vllm_version})"]
        if spec.device != "cuda":
            notes.append("CPU image: vLLM's x86_64 CPU release image; no --gpus")
        body = (
            "#!/usr/bin/env bash\n"
            + comment_block(evidence.lines + notes)
            + "set -euo pipefail\n"
            + _API_KEY_CHECK
            + "exec "
            + _continued([*run, [spec.image], *flag_groups(spec.container_flags())])
        )
        return {
            self.filename: body.replace(
                _HF_CACHE, '"$HOME/.cache/huggingface":/root/.cache/huggingface'
            )
        }


def _k8s_name(study: str) -> str:
    cleaned = "".join(c if c.isalnum() else "-" for c in study.lower()).strip("-")
    return f"vllm-{cleaned}"[:63].rstrip("-")


class K8sExporter:
    name = "k8s"
    filename = "k8s.yaml"

    def render(self, spec: ServeSpec, evidence: Evidence) -> dict[str, str]:
        from tuner.export.k8s import check, manifests

        docs = manifests(spec, evidence, _k8s_name(spec.name))
        header = comment_block(
            [
                *evidence.lines,
                f"Create Secret {_k8s_name(spec.name)}-secrets with the keys vllm-api-key and "
                "hf-token (optional) before applying.",
            ]
        )
        text = header + yaml.safe_dump_all(docs, sort_keys=False)
        check(text)
        return {self.filename: text}


EXPORTERS: dict[str, Exporter] = {
    e.name: e for e in (CliExporter(), YamlExporter(), DockerExporter(), K8sExporter())
}
ALL = "all"


def exporter(name: str) -> list[Exporter]:
    """The exporters of a format name (``all``: every one). Unknown: ConfigError."""
    if name == ALL:
        return list(EXPORTERS.values())
    if name not in EXPORTERS:
        raise ConfigError(
            f"unknown export format {name!r}", hint=f"known: {', '.join([*EXPORTERS, ALL])}"
        )
    return [EXPORTERS[name]]


def render_all(
    spec: ServeSpec, evidence: Evidence, formats: list[Exporter], redactor: Redactor
) -> dict[str, str]:
    """Every file of ``formats`` plus evidence.json, redacted."""
    files: dict[str, str] = {}
    for exp in formats:
        files.update(exp.render(spec, evidence))
    files[EVIDENCE_FILE] = json.dumps(_finite(evidence.data), indent=2, default=str) + "\n"
    return {name: redactor.text(text) for name, text in files.items()}


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def with_capacity(evidence: Evidence, review: Review, choice: Choice) -> Evidence:
    """Add `tuner capacity`'s measured result for this choice (replicas for k8s.yaml); one
    measured for another configuration of the study is not this one's."""
    record = read_capacity(review.paths.root)
    if record is None or record.params != choice.params:
        return evidence
    found = {"max_rps": record.max_rps, "upper_rps": record.to_dict()["upper_rps"]}
    how = "simulated" if review.simulated else "measured"  # a rehearsal's rate is no measurement
    if record.sizing is not None:
        found.update(asdict(record.sizing))
        evidence.lines.append(
            f"capacity: {record.max_rps:.3g} req/s per replica ({how}); "
            f"{record.sizing.replicas} replicas for {record.sizing.target_rps:g} req/s "
            f"with {record.sizing.headroom:.0%} headroom"
        )
    else:
        evidence.lines.append(f"capacity: {record.max_rps:.3g} req/s per replica ({how})")
    evidence.data["capacity"] = found
    return evidence


def write_files(folder: Path, files: dict[str, str]) -> list[Path]:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        written = []
        for name, text in files.items():
            path = folder / name
            path.write_text(text, encoding="utf-8")
            if name.endswith(".sh"):
                path.chmod(0o755)
            written.append(path)
    except OSError as exc:
        raise ArtifactError(f"cannot write the export to {folder}: {exc.strerror}") from exc
    return written


def export_choices(
    review: Review, choices: list[Choice], format_name: str, out_dir: Path | None = None
) -> list[Path]:
    """Write each choice's files (several choices: one subfolder each) and return the paths."""
    formats = exporter(format_name)
    root = out_dir or review.paths.export_dir
    redactor = study_redactor(review)
    written: list[Path] = []
    for choice in choices:
        folder = root if len(choices) == 1 else root / safe_name(choice.slug)
        spec = build_serve_spec(review, choice)
        evidence = with_capacity(build_evidence(review, choice), review, choice)
        files = render_all(spec, evidence, formats, redactor)
        written += write_files(folder, files)
        plan = (evidence.data.get("check") or {}).get("windows")
        if plan:  # how many windows the evidence holds, and whether a check can resolve with them
            print(redactor.text(f"{choice.label}: {windows_line(plan)}"))
        if slos := evidence.data.get("slos"):  # an SLO only met on the mean is said here too
            print(redactor.text(f"{choice.label}: {HandoverSlos.from_dict(slos).line()}"))
    return written


def export_command(
    name: str,
    storage: str | None,
    studies_dir: Path,
    format_name: str = ALL,
    trial: int | None = None,
    stage: str | None = None,
    pareto: bool = False,
    out_dir: Path | None = None,
) -> int:
    """`tuner export`: the final incumbent, one trial, or every Pareto-optimal trial."""
    from tuner.review.stored import open_review

    review = open_review(name, storage, studies_dir)
    if pareto and trial is not None:
        raise ConfigError("--pareto and --trial exclude each other", hint="pass one of them")
    if pareto:
        choices = [review.choice(v.stage, v.number) for v in review.pareto()]
        if not choices:
            raise ConfigError(f"study {name!r} has no feasible measured trial to export")
    else:
        choices = [review.choice(stage, trial)]
    written = export_choices(review, choices, format_name, out_dir)
    redactor = study_redactor(review)
    for choice in choices:
        print(redactor.text(f"{choice.label}: {choice.params or '(fixed args only)'}"))
    print("\n".join(f"  {p}" for p in written))
    return 0
