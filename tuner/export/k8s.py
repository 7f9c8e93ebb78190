"""The Kubernetes Deployment and Service of an export, and their schema check.

Sizes come from the study: GPUs = the devices one server occupies (TP x PP x DP), memory from
the server's peak RSS in the measured trial, the start-up probe's budget from its measured
start-up time. The API key (and an optional HF token) come from a Secret, never inline.
:func:`validate` checks the manifests against the Kubernetes OpenAPI schema shipped with the
``kubernetes-validate`` package (offline, strict: unknown fields are errors).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import yaml

from tuner.errors import ArtifactError

if TYPE_CHECKING:
    from tuner.export.spec import ServeSpec
    from tuner.review.evidence import Evidence

K8S_VERSION = "1.30"  # a conservative API level: Deployment/Service are stable long before
PORT_NAME = "http"
DEFAULT_MEMORY_GIB = 16
MIN_STARTUP_BUDGET_S = 300
ANNOTATION = "tuner.dev"


def _labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": name}


def _probe(period_s: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": "/health", "port": PORT_NAME},
        "periodSeconds": period_s,
        "failureThreshold": failures,
    }


def _secret_env(name: str) -> list[dict[str, Any]]:
    ref = f"{name}-secrets"
    return [
        {
            "name": "VLLM_API_KEY",
            "valueFrom": {"secretKeyRef": {"name": ref, "key": "vllm-api-key"}},
        },
        {
            "name": "HF_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": ref, "key": "hf-token", "optional": True}},
        },
    ]


def _resources(spec: ServeSpec) -> dict[str, Any]:
    gib = DEFAULT_MEMORY_GIB
    if spec.memory_mib:
        gib = max(2, math.ceil(spec.memory_mib * 1.25 / 1024))
    requests: dict[str, Any] = {"memory": f"{gib}Gi"}
    limits: dict[str, Any] = {"memory": f"{gib}Gi"}
    if spec.device == "cuda":
        limits["nvidia.com/gpu"] = spec.devices
        requests["cpu"] = str(4 * spec.devices)
    else:
        requests["cpu"] = str(int(spec.cpus or 1))
    return {"requests": requests, "limits": limits}


def _volumes(spec: ServeSpec, name: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes: list[dict[str, Any]] = [
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}}
    ]
    mounts: list[dict[str, Any]] = [{"name": "shm", "mountPath": "/dev/shm"}]
    if spec.local_model:  # the model folder comes from a volume the operator provides
        volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": f"{name}-model"}})
        mounts.append({"name": "model", "mountPath": spec.container_model, "readOnly": True})
    else:
        volumes.append({"name": "hf-cache", "emptyDir": {}})
        mounts.append({"name": "hf-cache", "mountPath": "/root/.cache/huggingface"})
    return volumes, mounts


def _container(spec: ServeSpec, name: str, mounts: list[dict[str, Any]]) -> dict[str, Any]:
    startup_budget = max(MIN_STARTUP_BUDGET_S, 3 * (spec.startup_s or 0))
    env = _secret_env(name) + [{"name": k, "value": v} for k, v in spec.env.items()]
    return {
        "name": "vllm",
        "image": spec.image,
        "args": spec.container_flags(),
        "ports": [{"name": PORT_NAME, "containerPort": 8000, "protocol": "TCP"}],
        "env": env,
        "resources": _resources(spec),
        "startupProbe": _probe(10, math.ceil(startup_budget / 10)),
        "readinessProbe": _probe(5, 3),
        "livenessProbe": _probe(10, 3),
        "volumeMounts": mounts,
    }


def _annotations(evidence: Evidence) -> dict[str, str]:
    data = evidence.data
    trial = data.get("trial") or {}
    return {
        f"{ANNOTATION}/study": str(data.get("study")),
        f"{ANNOTATION}/choice": str(data.get("choice")),
        f"{ANNOTATION}/trial": f"{trial.get('optuna_study')}#{trial.get('number')}",
        f"{ANNOTATION}/evidence": " | ".join(evidence.lines),
    }


def replicas(evidence: Evidence) -> int:
    """`tuner capacity`'s replica count for its target load when measured, else 1."""
    sized = (evidence.data.get("capacity") or {}).get("replicas")
    return int(sized) if sized else 1


def manifests(spec: ServeSpec, evidence: Evidence, name: str) -> list[dict[str, Any]]:
    """[Deployment, Service] for ``spec``, named ``name``."""
    volumes, mounts = _volumes(spec, name)
    labels = _labels(name)
    meta = {"name": name, "labels": labels, "annotations": _annotations(evidence)}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": replicas(evidence),
            "selector": {"matchLabels": dict(labels)},
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {"containers": [_container(spec, name, mounts)], "volumes": volumes},
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "selector": dict(labels),
            "ports": [{"name": PORT_NAME, "port": 8000, "targetPort": PORT_NAME}],
        },
    }
    return [deployment, service]


def validate(text: str, version: str = K8S_VERSION) -> list[str]:
    """Schema errors of every document in ``text`` ([] = valid), strict and offline."""
    import kubernetes_validate

    errors = []
    for doc in (d for d in yaml.safe_load_all(text) if d):
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            errors.append(f"{doc.get('kind')}: {where}: {exc.message}")
        except (
            kubernetes_validate.SchemaNotFoundError,
            kubernetes_validate.InvalidSchemaError,
        ) as exc:
            errors.append(f"{doc.get('kind')}: {exc.message}")
    return errors


def check(text: str) -> None:
    """Raise ArtifactError if the manifests do not validate (a bug in the exporter)."""
    errors = validate(text)
    if errors:
        raise ArtifactError(f"the Kubernetes manifest does not validate: {errors[0]}")
