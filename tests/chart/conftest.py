"""Render the chart with the real Helm engine (helm-python-sdk embeds Helm v4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support import yamlfast

CHART = Path(__file__).resolve().parents[2] / "charts" / "sparkguard"

#: Every toggle flipped from its default.
FLIPPED: dict[str, Any] = {
    "fullnameOverride": "guard",
    "commonLabels": {"team": "data", "cost-centre": "42a"},
    "image": {
        "repository": "registry.example.com/sparkguard",
        "tag": "9.9.9",
        "pullPolicy": "Always",
    },
    "imagePullSecrets": [{"name": "regcred"}],
    "operator": {
        "logLevel": "DEBUG",
        "watchNamespaces": ["spark-a", "spark-b"],
        "journalRoot": "s3://bucket/sparkguard/journal",
        "maxConcurrentRollbacks": 8,
        "jvmLayer": False,
        "extraEnv": [{"name": "AWS_REGION", "value": "eu-west-1"}],
        "podAnnotations": {"a": "b"},
        "podLabels": {"team": "data"},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "spark", "operator": "Exists", "effect": "NoSchedule"}],
        "priorityClassName": "system-cluster-critical",
        "envFrom": [{"configMapRef": {"name": "proxy-settings"}}],
        "extraVolumes": [{"name": "ca", "configMap": {"name": "s3-ca"}}],
        "extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/ssl/s3", "readOnly": True}],
        "podSecurityContext": {"runAsUser": None, "runAsGroup": None, "fsGroup": None},
        "securityContext": {"readOnlyRootFilesystem": False},
        "spreadAcrossNodes": False,
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "DoNotSchedule",
            }
        ],
    },
    "serviceAccount": {"create": False, "name": "existing-sa", "annotations": {}},
    "rbac": {"create": True, "readStorageSecrets": False},
    "webhook": {
        "failurePolicy": "Ignore",
        "timeoutSeconds": 5,
        "namespaceSelector": {"matchLabels": {"sparkguard.io/inject": "true"}},
        "certManager": {"enabled": True, "issuerRef": {}},
    },
    "sidecar": {
        "image": {"repository": "registry.example.com/sidecar", "tag": "1.2.3"},
        "port": 7171,
        "batchIntervalMs": 20,
        "batchThreads": 8,
        "resources": {
            "requests": {"cpu": "50m", "memory": "64Mi"},
            "limits": {"cpu": "1", "memory": "128Mi"},
        },
        "allowedRoots": ["s3://warehouse/", "s3://staging/"],
    },
    "injected": {
        "containers": {
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
                "runAsUser": 1001,
                "seccompProfile": {"type": "Localhost", "localhostProfile": "spark.json"},
            }
        },
        "initContainers": {
            "resources": {
                "requests": {"cpu": "50m", "memory": "96Mi"},
                "limits": {"cpu": "1", "memory": "1Gi"},
            }
        },
    },
    "metrics": {
        "enabled": True,
        "port": 9191,
        "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
        "podMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "prom"}},
        "prometheusRule": {
            "enabled": True,
            "recoveryBoundSeconds": 7200,
            "labels": {"release": "prom"},
        },
        "dashboard": {"enabled": True, "annotations": {"grafana_folder": "Spark"}},
    },
    "livenessPort": 8181,
    "networkPolicy": {
        "enabled": True,
        "metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
        "allowMarkerPort": True,
    },
}

NO_WEBHOOK_NO_METRICS: dict[str, Any] = {
    "webhook": {"enabled": False},
    "metrics": {"enabled": False},
    "rbac": {"create": False},
    "serviceAccount": {"create": False},
}

VALUE_SETS = {"default": None, "flipped": FLIPPED, "minimal": NO_WEBHOOK_NO_METRICS}


def render(
    values: dict[str, Any] | None, *, namespace: str = "sparkguard", chart_dir: Path = CHART
) -> list[dict[str, Any]]:
    """Render the chart offline; returns the manifests as objects (NOTES.txt left out)."""
    import helm_python as helm

    chart = helm.Chart.load(str(chart_dir))
    rendered = chart.render(values, name="sg", namespace=namespace, is_install=True)
    objects: list[dict[str, Any]] = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(doc for doc in yamlfast.load_all(text) if doc)
    return objects


@pytest.fixture(params=sorted(VALUE_SETS))
def value_set(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any] | None]:
    return request.param, VALUE_SETS[request.param]
