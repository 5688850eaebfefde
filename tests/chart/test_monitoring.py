"""The chart's Grafana dashboard and PrometheusRule, checked without Grafana or Prometheus.

Grafana cannot be installed here (docs/decisions.md, "Monitoring: a dashboard without
Grafana"), so the dashboard's JSON is checked for what Grafana needs to load it and for metric
names: every ``sparkguard_*`` name a panel, variable or alert uses must be one the code exports,
read from the operator's and the sidecar's own registries (not from a list kept by hand). The
queries themselves run against a real Prometheus in tests/operator/test_prometheus.py.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

import prometheus_client

from sparkguard.operator import metrics as operator_metrics
from sparkguard.sidecar import metrics as sidecar_metrics
from tests.chart.conftest import render

ON = {
    "metrics": {
        "podMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "dashboard": {"enabled": True},
    }
}
#: the sample names Prometheus stores for each metric type
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
}


def exported_names() -> set[str]:
    """Every sample name the operator and the sidecar export (from their registries)."""
    registries = [operator_metrics.Metrics().registry, sidecar_metrics.build_metrics().registry]
    names: set[str] = set()
    for registry in registries:
        family: prometheus_client.Metric
        for family in registry.collect():
            names.update(family.name + suffix for suffix in _SUFFIXES[family.type])
    return names


def used_names(text: str) -> set[str]:
    return set(re.findall(r"\bsparkguard_[a-z0-9_]+", text))


@functools.cache
def _objects() -> dict[str, dict[str, Any]]:
    """The chart rendered once with every monitoring toggle on (read-only: tests copy)."""
    return {o["kind"]: o for o in render(ON)}


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(_objects()["ConfigMap"]["data"]["sparkguard.json"])
    return loaded


def test_monitoring_objects_are_off_by_default() -> None:
    kinds = {o["kind"] for o in render(None)}
    assert not kinds & {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap"}


def test_dashboard_configmap_carries_the_grafana_sidecar_label() -> None:
    configmap = _objects()["ConfigMap"]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert list(configmap["data"]) == ["sparkguard.json"]


def test_dashboard_loads_in_grafana_shape() -> None:
    board = dashboard()
    assert isinstance(board["schemaVersion"], int)
    assert board["schemaVersion"] >= 36
    assert board["uid"] == "sparkguard"
    assert board["title"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    source = variables["datasource"]
    assert (source["type"], source["query"]) == ("datasource", "prometheus")
    for name, variable in variables.items():
        if name != "datasource":
            assert variable["datasource"]["uid"] == "${datasource}", name
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        assert {"x", "y", "w", "h"} <= panel["gridPos"].keys(), panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["description"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
            assert used_names(target["expr"]), (panel["title"], target["expr"])


def test_every_metric_the_dashboard_and_alerts_use_is_exported() -> None:
    exported = exported_names()
    assert "sparkguard_operator_rollbacks_total" in exported  # the derivation works
    assert "sparkguard_sidecar_flush_duration_seconds_bucket" in exported
    objects = _objects()
    board = objects["ConfigMap"]["data"]["sparkguard.json"]
    rules = json.dumps(objects["PrometheusRule"]["spec"])
    assert used_names(board) - exported == set()
    assert used_names(rules) - exported == set()


def test_every_alert_names_the_action() -> None:
    groups = _objects()["PrometheusRule"]["spec"]["groups"]
    alerts = [r for g in groups for r in g["rules"]]
    assert {a["alert"] for a in alerts} == {
        "SparkguardRecoveryStuck",
        "SparkguardRetriesExhausted",
        "SparkguardAppUnprotected",
        "SparkguardSidecarFlushFailures",
        "SparkguardNoLeader",
        "SparkguardRollbackFailures",
    }
    for alert in alerts:
        assert alert["annotations"]["summary"], alert["alert"]
        assert "Action:" in alert["annotations"]["description"], alert["alert"]
        assert alert["labels"]["severity"] in ("warning", "critical")


def test_pod_monitor_keeps_only_the_marker_sidecar_of_driver_pods() -> None:
    monitor = _objects()["PodMonitor"]
    assert monitor["spec"]["selector"] == {"matchLabels": {"spark-role": "driver"}}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "markers"
    assert endpoint["relabelings"][0] == {
        "sourceLabels": ["__meta_kubernetes_pod_container_name"],
        "regex": "sparkguard-markers",
        "action": "keep",
    }
    watched = render({**ON, "operator": {"watchNamespaces": ["spark-a"]}})
    (scoped,) = [o for o in watched if o["kind"] == "PodMonitor"]
    assert scoped["spec"]["namespaceSelector"] == {"matchNames": ["spark-a"]}
