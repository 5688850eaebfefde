"""Pod Security admission of the pods sparkguard's injection produces, on the kube bench.

The bench's kube-apiserver runs the built-in PodSecurity admission plugin. Namespaces labelled
``pod-security.kubernetes.io/enforce=restricted`` and ``=baseline`` get the driver and executor
pods of an opted-in app whose own containers comply, for every injection path: Kubeflow with
the native sidecar, Kubeflow with the classic sidecar (``shareProcessNamespace``), direct
markers (no sidecar), and Apache pod templates. Each app is admitted as the webhook admits it
(:func:`mutation.review`), stored through the SparkApplication CRD (which prunes what it does
not declare), and turned into pods as the operators build them (tests/e2e/sparkpods.py); the
pods are created with ``dryRun=All`` (admission runs, nothing is stored: the bench has no
kubelet to end them). Control pods, each with one injected container made non-compliant, are
refused, naming that container. On spark-operator 1.x's CRD, which prunes ``seccompProfile``,
``restricted`` cannot be met (by the app's own container neither); ``baseline`` can.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from sparkguard.operator import appmeta, mutation
from sparkguard.operator import config as config_
from tests.chart.operator_harness import foreign_spark_webhooks_set_aside
from tests.e2e import sparkpods
from tests.kubebench.bench import APACHE_SPARK_OPERATOR_CRD, KubeApiError, KubeBench
from tests.operator.apps import apache_app, spark_app
from tests.operator.test_crd_roundtrip import use_crd

pytestmark = pytest.mark.kube

LEVELS = ("restricted", "baseline")
#: the app's own Spark container, compliant with "restricted" by itself
SPARK_RESTRICTED: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "runAsUser": 185,
    "seccompProfile": {"type": "RuntimeDefault"},
}
#: the same, with what a pod can set at pod level set there (our containers inherit it)
POD_LEVEL = {"runAsNonRoot": True, "runAsUser": 185, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_ONLY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
CONFIG = config_.OperatorConfig(
    webhook_mode=config_.WebhookMode.MANAGED,
    image="registry.example/sparkguard:test",
    journal_root="s3://warehouse/_journal",
)


def kubeflow(name: str, *, pod_level: bool, **annotations: str) -> dict[str, Any]:
    roles = {
        role: (
            {"securityContext": CONTAINER_ONLY, "podSecurityContext": POD_LEVEL}
            if pod_level
            else {"securityContext": SPARK_RESTRICTED}
        )
        for role in ("driver", "executor")
    }
    app = spark_app(name, annotations=annotations)
    for role, security in roles.items():
        app["spec"][role].update(copy.deepcopy(security))
    return app


def apache(name: str, *, pod_level: bool) -> dict[str, Any]:
    specs = {}
    for role in ("driver", "executor"):
        spark = {"name": sparkpods.SPARK_CONTAINERS[role]}
        pod: dict[str, Any] = {"containers": [spark]}
        if pod_level:
            spark["securityContext"] = copy.deepcopy(CONTAINER_ONLY)
            pod["securityContext"] = copy.deepcopy(POD_LEVEL)
        else:
            spark["securityContext"] = copy.deepcopy(SPARK_RESTRICTED)
        specs[f"{role}Spec"] = {"podTemplateSpec": {"spec": pod}}
    return apache_app(name, **specs)


#: path -> (app builder, native sidecar)
PATHS = {
    "kubeflow-native-sidecar": (lambda n, p: kubeflow(n, pod_level=p), True),
    "kubeflow-classic-sidecar": (lambda n, p: kubeflow(n, pod_level=p), False),
    "kubeflow-direct-markers": (
        lambda n, p: kubeflow(n, pod_level=p, **{appmeta.MARKER_TYPE: "direct"}),
        True,
    ),
    "apache-pod-templates": (lambda n, p: apache(n, pod_level=p), True),
}


@pytest.fixture(scope="module")
def namespaces(kube_bench: KubeBench) -> Iterator[dict[str, str]]:
    """One namespace per enforced level (labelled ``enforce=<level>``, version latest)."""
    suffix = uuid.uuid4().hex[:6]
    made = {}
    for level in LEVELS:
        name = f"psa-{level}-{suffix}"
        kube_bench.apply_manifest(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": name,
                    "labels": {
                        "pod-security.kubernetes.io/enforce": level,
                        "pod-security.kubernetes.io/enforce-version": "latest",
                    },
                },
            }
        )
        made[level] = name
    kube_bench.apply_manifest(APACHE_SPARK_OPERATOR_CRD.read_text(encoding="utf-8"))
    kube_bench.wait_for_crd(mutation.APACHE.crd_name)
    # The apps are stored as the webhook admitted them: no other test's webhook may touch them.
    with foreign_spark_webhooks_set_aside(kube_bench, keep=f"psa-none-{suffix}"):
        yield made


def admitted(bench: KubeBench, app: dict[str, Any], *, native: bool) -> dict[str, Any]:
    """``app`` as sparkguard's webhook admits it at CREATE, as its CRD stored it (then deleted:
    without its finalizer, which no operator here would take off)."""
    review = mutation.review(app, old=None, config=CONFIG, owner_id="psa", native_sidecar=native)
    assert review.allowed, review.message
    kind = mutation.kind_of(app)
    namespace, name = app["metadata"]["namespace"], app["metadata"]["name"]
    body = mutation.apply_merge_patch(app, review.patch)
    body["metadata"].pop("finalizers", None)
    api = bench.api_client()
    try:
        custom = client.CustomObjectsApi(api)
        where = (kind.group, kind.version, namespace, kind.plural)
        stored: dict[str, Any] = custom.create_namespaced_custom_object(*where, body)
        custom.delete_namespaced_custom_object(*where, name)
    finally:
        api.close()
    return stored


def pods_of(app: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The driver and executor pods of a stored app, as its operator builds them."""
    name = app["metadata"]["name"]
    build = (
        sparkpods.apache_pod if mutation.kind_of(app) is mutation.APACHE else sparkpods.kubeflow_pod
    )
    return {
        "driver": build(app, "driver", name=f"{name}-driver"),
        "executor": build(app, "executor", name=f"{name}-exec-1"),
    }


def create_dry_run(bench: KubeBench, pod: dict[str, Any]) -> None:
    """Create ``pod`` with ``dryRun=All``: every admission plugin runs, nothing is stored."""
    namespace = pod["metadata"]["namespace"]
    bench.request("POST", f"/api/v1/namespaces/{namespace}/pods?dryRun=All", pod)


def refusal(bench: KubeBench, pod: dict[str, Any]) -> str:
    with pytest.raises(KubeApiError) as caught:
        create_dry_run(bench, pod)
    assert caught.value.status == 403, caught.value
    return str(caught.value)


def ours(pod: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod["spec"]
    names = (mutation.LIB_INIT_NAME, mutation.ROLLBACK_INIT_NAME, mutation.SIDECAR_NAME)
    return [c for c in [*spec.get("initContainers", []), *spec["containers"]] if c["name"] in names]


@pytest.mark.parametrize("pod_level", [False, True], ids=["container-level", "pod-level"])
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("level", LEVELS)
def test_the_injected_pods_are_admitted(
    kube_bench: KubeBench, namespaces: dict[str, str], level: str, path: str, pod_level: bool
) -> None:
    build, native = PATHS[path]
    name = f"app-{uuid.uuid4().hex[:6]}"
    app = build(name, pod_level)
    app["metadata"]["namespace"] = namespaces[level]
    stored = admitted(kube_bench, app, native=native)
    pods = pods_of(stored)
    driver = pods["driver"]["spec"]
    injected = {c["name"] for c in ours(pods["driver"])}
    if path == "kubeflow-direct-markers":
        assert injected == {mutation.LIB_INIT_NAME, mutation.ROLLBACK_INIT_NAME}
    else:
        assert mutation.SIDECAR_NAME in injected
    if path == "kubeflow-classic-sidecar":
        assert driver["shareProcessNamespace"] is True
        assert mutation.SIDECAR_NAME in [c["name"] for c in driver["containers"]]
    for role, pod in pods.items():
        assert ours(pod), f"{path}: no container of ours in the {role} pod"
        if pod_level:  # the pod's settings are inherited, not overridden
            assert all("seccompProfile" not in c["securityContext"] for c in ours(pod))
        create_dry_run(kube_bench, pod)


#: what makes one injected container's securityContext non-compliant, by the level refusing it
#: (not privileged: the API's validation refuses it beside allowPrivilegeEscalation false)
BREAKS: dict[str, dict[str, Any]] = {
    "restricted": {"allowPrivilegeEscalation": True},
    "baseline": {"capabilities": {"add": ["NET_ADMIN"]}},
}


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("level", LEVELS)
def test_a_non_compliant_injected_container_is_refused(
    kube_bench: KubeBench, namespaces: dict[str, str], level: str, path: str
) -> None:
    """The control: the same pods with one injected container loosened are refused, so the
    test above can fail."""
    build, native = PATHS[path]
    app = build(f"control-{uuid.uuid4().hex[:6]}", False)
    app["metadata"]["namespace"] = namespaces[level]
    pods = pods_of(admitted(kube_bench, app, native=native))
    for pod in pods.values():
        for container in ours(pod):
            loosened = copy.deepcopy(pod)
            (target,) = [c for c in ours(loosened) if c["name"] == container["name"]]
            target["securityContext"].update(copy.deepcopy(BREAKS[level]))
            message = refusal(kube_bench, loosened)
            assert f'violates PodSecurity "{level}:latest"' in message
            assert f'"{container["name"]}"' in message
    # and without any securityContext of ours, "restricted" refuses (what the issue saw)
    if level == "restricted":
        bare = copy.deepcopy(pods["driver"])
        for container in ours(bare):
            del container["securityContext"]
        message = refusal(kube_bench, bare)
        for field in ("allowPrivilegeEscalation", "capabilities", "seccompProfile"):
            assert field in message


def test_on_the_1x_crd_seccomp_is_pruned_so_only_baseline_admits(
    kube_bench: KubeBench, namespaces: dict[str, str]
) -> None:
    """spark-operator 1.x's CRD (a Kubernetes API older than 1.19) has no seccompProfile: it
    drops ours and the app's own, so its pods meet "baseline", never "restricted". sparkguard
    injects the classic sidecar there (sidecarmode.py)."""
    before = kube_bench.spark_operator
    use_crd(kube_bench, "1.x", namespaces["baseline"])
    try:
        for level in LEVELS:
            app = kubeflow(f"old-{uuid.uuid4().hex[:6]}", pod_level=False)
            app["metadata"]["namespace"] = namespaces[level]
            stored = admitted(kube_bench, app, native=False)
            assert "seccompProfile" not in str(stored["spec"])
            driver = pods_of(stored)["driver"]
            assert driver["spec"]["shareProcessNamespace"] is True
            if level == "baseline":
                create_dry_run(kube_bench, driver)
            else:
                message = refusal(kube_bench, driver)
                assert "seccompProfile" in message
                assert '"spark-kubernetes-driver"' in message  # the app's own container too
    finally:
        use_crd(kube_bench, before, namespaces["baseline"])
