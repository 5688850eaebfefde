"""The chart runs the operator highly available: replicas, rolling updates, a PDB, a Lease.

Rendered with the real Helm engine; ``tests/e2e/test_recovery_scenario.py`` runs two replicas
with this environment on the bench and kills the leader mid-recovery, and ``test_rbac.py``
proves the Lease rules are used and sufficient.
"""

from __future__ import annotations

from typing import Any

from tests.chart.conftest import render

VALUES: dict[str, Any] = {"operator": {"journalRoot": "s3://bucket/journal"}}


def _one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def _env(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_two_replicas_roll_one_at_a_time_with_a_disruption_budget() -> None:
    objects = render(VALUES, namespace="ops")
    deployment = _one(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    budget = _one(objects, "PodDisruptionBudget")
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"] == deployment["spec"]["selector"]
    env = _env(deployment)
    assert env["SPARKGUARD_LEADER_ELECTION"] == "true"
    assert env["SPARKGUARD_LEASE_NAMESPACE"] == "ops"
    assert env["SPARKGUARD_POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert {"SPARKGUARD_LEASE_DURATION", "SPARKGUARD_CLAIM_TTL", "SPARKGUARD_RESUBMIT_TIMEOUT"} <= (
        env.keys()
    )


def test_the_lease_rules_are_a_role_in_the_release_namespace_limited_to_its_lease() -> None:
    objects = render(VALUES, namespace="ops")
    lease = _env(_one(objects, "Deployment"))["SPARKGUARD_LEASE_NAME"]
    (role,) = [
        o
        for o in objects
        if o["kind"] == "Role" and o["metadata"]["name"].endswith("-leader-election")
    ]
    assert role["metadata"]["namespace"] == "ops"
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [lease],
            "verbs": ["get", "update"],
        },
    ]


def test_one_replica_without_leader_election_has_no_budget_and_no_lease_rules() -> None:
    values = {"operator": {"journalRoot": "s3://b/j", "replicas": 1}}
    values["operator"]["leaderElection"] = {"enabled": False}
    objects = render(values)
    kinds = [o["kind"] for o in objects]
    assert "PodDisruptionBudget" not in kinds
    assert "Role" not in kinds
    deployment = _one(objects, "Deployment")
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 1
    assert _env(deployment)["SPARKGUARD_LEADER_ELECTION"] == "false"
