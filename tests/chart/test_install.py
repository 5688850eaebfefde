"""`helm install` of the chart onto the real kube-apiserver bench."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any, cast

import pytest
from kubernetes import client

from tests.chart.conftest import CHART
from tests.kubebench.bench import KubeBench

pytestmark = pytest.mark.kube


def _helm(bench: KubeBench, namespace: str) -> Any:
    import helm_python as helm

    return helm.Config(kubeconfig_path=bench.kubeconfig_path, namespace=namespace)


@pytest.fixture(scope="module")
def installed(kube_bench: KubeBench) -> Iterator[dict[str, Any]]:
    """The chart installed once (release sg in namespace sparkguard-system)."""
    namespace = "sparkguard-system"
    api = kube_bench.api_client()
    core = client.CoreV1Api(api)
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    release = _helm(kube_bench, namespace).install(
        str(CHART),
        "sg",
        {"operator": {"journalRoot": "s3://bucket/journal"}},
        namespace=namespace,
        timeout=120,
    )
    try:
        yield {"namespace": namespace, "release": release, "api": api}
    finally:
        # Uninstall: the release's webhook (failurePolicy Fail, an unreachable Service on the
        # bench) would otherwise deny every later SparkApplication create in the session.
        _helm(kube_bench, namespace).uninstall("sg", timeout=60)
        api.close()


def test_install_creates_every_object(installed: dict[str, Any]) -> None:
    api = installed["api"]
    ns = installed["namespace"]
    apps = client.AppsV1Api(api)
    deployment = apps.read_namespaced_deployment("sg-sparkguard", ns)
    assert deployment.spec is not None
    # HA by default: two replicas, rolled one at a time, never both down.
    assert deployment.spec.replicas == 2
    assert deployment.spec.strategy is not None
    assert deployment.spec.strategy.type == "RollingUpdate"
    assert deployment.spec.strategy.rolling_update is not None
    assert deployment.spec.strategy.rolling_update.max_unavailable == 0
    container = deployment.spec.template.spec.containers[0]  # type: ignore[union-attr]
    assert container.args == ["--log-level", "INFO", "operator"]
    core = client.CoreV1Api(api)
    assert core.read_namespaced_service_account("sg-sparkguard", ns)
    service = core.read_namespaced_service("sg-sparkguard-webhook", ns)
    assert {p.name for p in service.spec.ports} == {"webhook", "metrics"}  # type: ignore[union-attr]
    secret = core.read_namespaced_secret("sg-sparkguard-webhook-tls", ns)
    rbac = client.RbacAuthorizationV1Api(api)
    assert rbac.read_cluster_role("sg-sparkguard")
    assert rbac.read_cluster_role_binding("sg-sparkguard")
    # Leader election: a Role on the one Lease in the release namespace, bound to the SA.
    lease_role = rbac.read_namespaced_role("sg-sparkguard-leader-election", ns)
    lease_rules = {
        (tuple(r.resources or ()), tuple(r.resource_names or ()), tuple(r.verbs))
        for r in lease_role.rules or []
    }
    assert lease_rules == {
        (("leases",), (), ("create",)),
        (("leases",), ("sg-sparkguard",), ("get", "update")),
    }
    lease_binding = rbac.read_namespaced_role_binding("sg-sparkguard-leader-election", ns)
    assert lease_binding.role_ref.name == "sg-sparkguard-leader-election"
    assert [(s.kind, s.name, s.namespace) for s in lease_binding.subjects or []] == [
        ("ServiceAccount", "sg-sparkguard", ns)
    ]
    pdb = client.PolicyV1Api(api).read_namespaced_pod_disruption_budget("sg-sparkguard", ns)
    assert pdb.spec is not None
    assert pdb.spec.min_available == 1
    assert pdb.spec.selector.match_labels == deployment.spec.selector.match_labels
    hooks = client.AdmissionregistrationV1Api(api)
    hook = hooks.read_mutating_webhook_configuration("sg-sparkguard")
    webhook = hook.webhooks[0]  # type: ignore[index]
    assert webhook.client_config.service.name == "sg-sparkguard-webhook"
    ca_bundle = webhook.client_config.ca_bundle
    if isinstance(ca_bundle, bytes):  # the typed client may decode base64 for us
        ca_bundle = base64.b64encode(ca_bundle).decode()
    assert ca_bundle == cast(dict[str, str], secret.data)["ca.crt"]


def test_upgrade_keeps_the_webhook_certificate(
    kube_bench: KubeBench, installed: dict[str, Any]
) -> None:
    core = client.CoreV1Api(installed["api"])
    ns = installed["namespace"]
    before = core.read_namespaced_secret("sg-sparkguard-webhook-tls", ns).data
    _helm(kube_bench, ns).upgrade(
        str(CHART), "sg", {"operator": {"journalRoot": "s3://bucket/journal2"}}, namespace=ns
    )
    after = core.read_namespaced_secret("sg-sparkguard-webhook-tls", ns).data
    assert before == after  # lookup reused the CA: no webhook outage on upgrade


def test_install_with_a_typo_fails_before_touching_the_cluster(kube_bench: KubeBench) -> None:
    import helm_python as helm

    with pytest.raises(helm.HelmError, match="sidecarr"):
        _helm(kube_bench, "default").install(
            str(CHART), "typo", {"sidecarr": {"port": 1}}, namespace="default"
        )
    assert _helm(kube_bench, "default").list() in ([], None) or all(
        r.get("name") != "typo" for r in _helm(kube_bench, "default").list()
    )


@pytest.mark.parametrize(
    "values",
    [
        {"operator": {"affinity": {"nodeAfinity": {}}}},
        {"operator": {"tolerations": [{"keyy": "spark", "operator": "Exists"}]}},
        {"operator": {"extraEnv": [{"nam": "AWS_REGION", "value": "eu-west-1"}]}},
    ],
    ids=["affinity", "tolerations", "extraEnv"],
)
def test_a_typo_inside_a_kubernetes_object_fails_the_install(
    kube_bench: KubeBench, values: dict[str, Any]
) -> None:
    import helm_python as helm

    with pytest.raises(helm.HelmError, match="additional properties"):
        _helm(kube_bench, "default").install(str(CHART), "k8s-typo", values, namespace="default")
    releases = _helm(kube_bench, "default").list() or []
    assert all(r.get("name") != "k8s-typo" for r in releases)
