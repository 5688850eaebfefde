"""sparkguard's admission against spark-operator's real CRDs (1.x and 2.x), on the kube bench.

An app admitted by sparkguard's webhook must come back from the API server with everything
sparkguard added: a structural CRD silently prunes what it does not declare. On the 2.x CRD
the marker sidecar is native (an initContainer with ``restartPolicy: Always``); on the 1.x CRD,
which would prune that field, sparkguard must choose the regular sidecar, so again nothing it
added is lost but the seccompProfile of its containers' securityContext, a field the 1.x CRD
does not know (tests/operator/test_pod_security.py: such pods meet "baseline" only). And a
driver pod created without sparkguard's containers (spark-operator's pod webhook off) makes the
app ``Unprotected``.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from sparkguard.operator import appmeta, mutation, protection
from tests.kubebench.bench import KubeBench
from tests.operator.apps import GROUP, PLURAL, VERSION, spark_app
from tests.operator.kmocking import FakeRollback
from tests.operator.test_protection import driver_pod
from tests.operator.test_real_apiserver import Cluster, _eventually, bench_cluster, operating

pytestmark = pytest.mark.kube


def _probe_keeps_restart_policy(bench: KubeBench, namespace: str) -> bool:
    """Whether the CRD in effect now stores an initContainer's restartPolicy (not opted in:
    the webhook leaves the probe alone)."""
    custom = client.CustomObjectsApi(bench.api_client())
    name = f"probe-{uuid.uuid4().hex[:6]}"
    app = spark_app(name, namespace=namespace, enabled=False)
    app["spec"]["driver"]["initContainers"] = [
        {"name": "side", "image": "busybox", "restartPolicy": "Always"}
    ]
    try:
        stored = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, app)
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    finally:
        custom.api_client.close()
    return "restartPolicy" in stored["spec"]["driver"]["initContainers"][0]


def use_crd(bench: KubeBench, version: str, namespace: str) -> None:
    """Install spark-operator ``version``'s CRD and wait until the apiserver prunes by it."""
    bench.install_spark_operator_crd(version)
    keeps = version == "2.x"
    _eventually(lambda: _probe_keeps_restart_policy(bench, namespace) is keeps, timeout=60)


@pytest.fixture(params=["2.x", "1.x"])
def crd_cluster(request: pytest.FixtureRequest, kube_bench: KubeBench) -> Iterator[Cluster]:
    """A watched namespace with spark-operator ``request.param``'s CRD installed (the session's
    own CRD is put back afterwards)."""
    before = kube_bench.spark_operator
    # sidecar_native: auto, decided from the cluster
    with bench_cluster(kube_bench, prefix="sg-crd") as cluster:
        use_crd(kube_bench, request.param, cluster.namespace)
        try:
            yield cluster
        finally:
            use_crd(kube_bench, before, cluster.namespace)


def test_an_admitted_app_comes_back_intact(crd_cluster: Cluster) -> None:
    cluster = crd_cluster
    native = cluster.bench.spark_operator == "2.x"
    with operating(cluster, FakeRollback()):
        original = spark_app("roundtrip", namespace=cluster.namespace)
        created = cluster.create(copy.deepcopy(original))
    stored = cluster.get("roundtrip")
    assert stored["spec"] == created["spec"]

    # Exactly what admission meant to write, every field of it, is what the server kept.
    owner = stored["metadata"]["annotations"][appmeta.OWNER_ANNOTATION]
    with_owner = copy.deepcopy(original)
    with_owner["metadata"]["annotations"][appmeta.OWNER_ANNOTATION] = owner
    # the app's marker token is random: admission's, as the server kept it
    token = mutation.marker_token_of(stored)
    assert token
    expected = mutation.mutate(
        with_owner, config=cluster.config, native_sidecar=native, marker_token=token
    )
    if not native:  # the 1.x CRD (a Kubernetes API older than 1.19) has no seccompProfile
        expected["spec"] = _without(expected["spec"], "seccompProfile")
    assert stored["spec"] == expected["spec"]
    assert expected["metadata"]["annotations"].items() <= stored["metadata"]["annotations"].items()
    assert expected["metadata"]["labels"].items() <= stored["metadata"]["labels"].items()

    driver = stored["spec"]["driver"]
    init = {c["name"]: c for c in driver["initContainers"]}
    sidecars = {c["name"]: c for c in driver.get("sidecars") or []}
    assert {mutation.LIB_INIT_NAME, mutation.ROLLBACK_INIT_NAME} <= set(init)
    if native:  # 2.x keeps restartPolicy: a native sidecar
        assert init[mutation.SIDECAR_NAME]["restartPolicy"] == "Always"
        assert init[mutation.SIDECAR_NAME]["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert mutation.SIDECAR_NAME not in sidecars
    else:  # 1.x would prune it: sparkguard chose the regular sidecar
        assert mutation.SIDECAR_NAME not in init
        assert "restartPolicy" not in sidecars[mutation.SIDECAR_NAME]
        assert driver["shareProcessNamespace"] is True
    volumes = {v["name"] for v in stored["spec"]["volumes"]}
    assert {mutation.LIB_VOLUME, mutation.TOKEN_VOLUME} <= volumes
    for role in ("driver", "executor"):
        mounts = {m["name"] for m in stored["spec"][role]["volumeMounts"]}
        assert mutation.LIB_VOLUME in mounts
    conf = stored["spec"]["sparkConf"]
    assert conf["spark.sparkguard.owner"] == owner
    assert conf["spark.sparkguard.jobId"] == f"{cluster.namespace}.roundtrip"


def _without(value: Any, key: str) -> Any:
    """``value`` with ``key`` taken out of every object in it."""
    if isinstance(value, dict):
        return {k: _without(v, key) for k, v in value.items() if k != key}
    if isinstance(value, list):
        return [_without(v, key) for v in value]
    return value


def test_the_1x_crd_prunes_a_native_sidecar_written_by_hand(crd_cluster: Cluster) -> None:
    """Why the choice matters: what the 1.x CRD does to restartPolicy (the 2.x one keeps it)."""
    kept = _probe_keeps_restart_policy(crd_cluster.bench, crd_cluster.namespace)
    assert kept is (crd_cluster.bench.spark_operator == "2.x")


def test_a_driver_pod_without_our_containers_makes_the_app_unprotected(
    kube_bench: KubeBench,
) -> None:
    with bench_cluster(kube_bench, prefix="sg-pod") as cluster:
        namespace = cluster.namespace
        core = client.CoreV1Api(cluster.api)
        with operating(cluster, FakeRollback()):
            app = cluster.create(spark_app("etl", namespace=namespace))
            # As spark-operator creates it when its pod webhook is off: labels, no containers
            # of ours (the bench has no scheduler: the pod just stays Pending).
            pod = driver_pod(app, protected=False)
            del pod["metadata"]["uid"]
            core.create_namespaced_pod(namespace, pod)

            def flagged() -> dict[str, str]:
                notes = cluster.notes("etl")
                return notes if notes.get(appmeta.PROTECTION) == "unprotected" else {}

            notes = _eventually(flagged)
            reason = notes[appmeta.PROTECTION_REASON]
            assert "driver pod etl-driver lacks sparkguard's" in reason
            assert mutation.ROLLBACK_INIT_NAME in reason
            assert "webhook.enable=true" in reason
            _eventually(lambda: protection.REASON in cluster.event_reasons("etl"))
            events = core.list_namespaced_event(
                namespace, field_selector="involvedObject.name=etl,reason=Unprotected"
            ).items
            assert len(events) == 1
            assert events[0].type == "Warning"
            assert "etl-driver" in events[0].message

            # The next run's driver pod has them (the webhook fixed): the signal is cleared.
            fixed = driver_pod(app, name="etl-driver-2", protected=True)
            del fixed["metadata"]["uid"]
            core.create_namespaced_pod(namespace, fixed)
            _eventually(lambda: appmeta.PROTECTION not in cluster.notes("etl"))
            assert appmeta.PROTECTION_REASON not in cluster.notes("etl")
            assert cluster.event_reasons("etl").count(protection.REASON) == 1
