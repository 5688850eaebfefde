"""The chart for production: spread replicas, security contexts, labels, extra env and volumes,
NetworkPolicies, documented schema, the Kubernetes floor. Rendered by the real Helm engine."""

from __future__ import annotations

import json
from typing import Any

import yaml

from tests.chart.conftest import CHART, FLIPPED, render

SELECTOR = {
    "app.kubernetes.io/name": "sparkguard",
    "app.kubernetes.io/instance": "sg",
    "app.kubernetes.io/component": "operator",
}


def _one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def _pod(values: dict[str, Any] | None) -> dict[str, Any]:
    pod: dict[str, Any] = _one(render(values), "Deployment")["spec"]["template"]["spec"]
    return pod


def test_default_values_spread_the_replicas_over_nodes_beside_the_pdb() -> None:
    objects = render(None)
    assert _one(objects, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"] == SELECTOR
    deployment = _one(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    (spread,) = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread == {
        "maxSkew": 1,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": SELECTOR},
    }


def test_topology_spread_can_be_replaced_or_turned_off() -> None:
    (zone,) = _pod(FLIPPED)["topologySpreadConstraints"]
    assert zone["topologyKey"] == "topology.kubernetes.io/zone"
    assert zone["labelSelector"] == {"matchLabels": SELECTOR}  # filled in by the chart
    assert "topologySpreadConstraints" not in _pod({"operator": {"spreadAcrossNodes": False}})
    own = {"maxSkew": 2, "topologyKey": "k", "whenUnsatisfiable": "DoNotSchedule"}
    own["labelSelector"] = {"matchLabels": {"x": "y"}}
    assert _pod({"operator": {"topologySpreadConstraints": [own]}})[
        "topologySpreadConstraints"
    ] == [own]


def test_security_contexts_are_overridable_and_restricted_by_default() -> None:
    pod = _pod(None)
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "fsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert pod["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    flipped = _pod(FLIPPED)
    # null leaves a default out (OpenShift assigns the UID); given keys merge with the rest
    assert flipped["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert flipped["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is False
    assert flipped["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_common_labels_are_on_every_object_and_the_pod_but_not_in_selectors() -> None:
    objects = render(FLIPPED)
    for obj in objects:
        labels = obj["metadata"].get("labels") or {}
        assert labels.get("team") == "data", obj["kind"]
        assert labels.get("cost-centre") == "42a", obj["kind"]
    deployment = _one(objects, "Deployment")
    assert deployment["spec"]["template"]["metadata"]["labels"]["cost-centre"] == "42a"
    assert "cost-centre" not in deployment["spec"]["selector"]["matchLabels"]


def test_env_from_and_extra_volumes_reach_the_operator_container() -> None:
    pod = _pod(FLIPPED)
    (container,) = pod["containers"]
    assert container["envFrom"] == FLIPPED["operator"]["envFrom"]
    assert FLIPPED["operator"]["extraVolumeMounts"][0] in container["volumeMounts"]
    assert FLIPPED["operator"]["extraVolumes"][0] in pod["volumes"]
    assert {m["name"] for m in container["volumeMounts"]} <= {v["name"] for v in pod["volumes"]}
    assert "envFrom" not in _pod(None)["containers"][0]


def test_no_network_policy_unless_asked() -> None:
    assert not [o for o in render(None) if o["kind"] == "NetworkPolicy"]


def test_network_policies_open_the_operator_ports_and_the_driver_marker_port() -> None:
    policies = [o for o in render(FLIPPED) if o["kind"] == "NetworkPolicy"]
    (operator,) = [p for p in policies if p["metadata"]["namespace"] == "sparkguard"]
    assert operator["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "sg"
    ports = {rule["ports"][0]["port"]: rule.get("from") for rule in operator["spec"]["ingress"]}
    webhook_port, metrics_port, health_port = 9443, 9191, 8181
    assert ports == {
        webhook_port: None,  # the API server calls the webhook from an address we cannot know
        metrics_port: FLIPPED["networkPolicy"]["metricsFrom"],
        health_port: None,
    }
    markers = sorted(
        (p for p in policies if p["metadata"]["namespace"] != "sparkguard"),
        key=lambda p: str(p["metadata"]["namespace"]),
    )
    assert [p["metadata"]["namespace"] for p in markers] == ["spark-a", "spark-b"]
    for policy in markers:
        spec = policy["spec"]
        assert spec["podSelector"] == {"matchLabels": {"spark-role": "driver"}}
        (rule,) = spec["ingress"]
        assert rule["from"] == [{"podSelector": {"matchLabels": {"spark-role": "executor"}}}]
        assert rule["ports"] == [{"port": FLIPPED["sidecar"]["port"], "protocol": "TCP"}]


def _leaves(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    for key, child in (node.get("properties") or {}).items():
        here = f"{path}{key}"
        nested = child.get("properties")
        if nested and key != "issuerRef":
            found.extend(_leaves(child, here + "."))
        else:
            found.append((here, child))
    return found


def test_every_value_in_the_schema_has_a_description() -> None:
    """Editors and `helm show values` readers see each value's `# --` text in the schema too."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    missing = [path for path, node in _leaves(schema) if not node.get("description")]
    assert missing == []
    operator = schema["properties"]["operator"]["properties"]
    assert operator["replicas"]["description"].startswith("Operator replicas.")


def test_the_chart_needs_kubernetes_1_29() -> None:
    """Native sidecars are on by default from 1.29 (the webhook's matchConditions from 1.28):
    below it Helm refuses to install the chart instead of leaving it half working."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == ">=1.29.0-0"


def test_the_operator_reads_secrets_only_by_the_names_admission_allows() -> None:
    """`secrets get` is limited by name, and the operator is told the same names, so admission
    refuses an app whose storage Secret it could not read at its first rollback."""
    from sparkguard.operator import appmeta
    from sparkguard.operator import config as operator_config
    from tests.operator.apps import spark_app

    objects = render(
        {
            "rbac": {"storageSecretNames": ["s3-etl", "s3-ml"]},
            "operator": {"journalRoot": "s3://warehouse/_journal"},
        }
    )
    (role,) = [r for r in objects if r["kind"] == "ClusterRole" and "crd" not in str(r)]
    (secrets,) = [rule for rule in role["rules"] if rule["resources"] == ["secrets"]]
    assert secrets == {
        "apiGroups": [""],
        "resources": ["secrets"],
        "resourceNames": ["s3-etl", "s3-ml"],
        "verbs": ["get"],
    }
    (container,) = _one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    config = operator_config.load_config(env)
    assert config.storage_secret_names == ("s3-etl", "s3-ml")

    def problems(secret: str) -> list[str]:
        app = spark_app(annotations={appmeta.STORAGE_SECRET: secret})
        return [str(p) for p in appmeta.parse(app, config=config).problems]

    assert problems("s3-ml") == []
    (refused,) = problems("team-creds")
    assert "'team-creds'" in refused
    assert "s3-etl, s3-ml" in refused
    assert "rbac.storageSecretNames" in refused
    # by default: one name, sparkguard-storage; without Secret reads, no rule at all
    (default_role,) = [
        r for r in render(None) if r["kind"] == "ClusterRole" and "crd" not in str(r)
    ]
    assert {"resourceNames": ["sparkguard-storage"]}.items() <= next(
        rule for rule in default_role["rules"] if rule["resources"] == ["secrets"]
    ).items()
    assert "secrets" not in str(render({"rbac": {"readStorageSecrets": False}}))


def test_the_operator_memory_limit_holds_sixteen_large_rollbacks() -> None:
    """benchmarks/rollback_memory.py: 16 rollbacks at once (the default concurrency) of
    100,000 marked files each peaked at 1,042 MiB; the limit leaves room above it."""
    (container,) = _pod(None)["containers"]
    limit = container["resources"]["limits"]["memory"]
    assert limit.endswith("Mi")
    assert int(limit[:-2]) >= 1042 * 1.2
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["SPARKGUARD_MAX_CONCURRENT_ROLLBACKS"] == "16"
