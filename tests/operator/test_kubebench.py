"""The kube test bench is a real apiserver: CRD served, status subresource, RBAC enforced."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tests.kubebench.bench import (
    BUILD_SCRIPT,
    KubeApiError,
    KubeBench,
    KubeBenchError,
    ensure_binaries,
)

pytestmark = pytest.mark.kube

GROUP, VERSION, PLURAL = "sparkoperator.k8s.io", "v1beta2", "sparkapplications"
CRD_NAME = f"{PLURAL}.{GROUP}"

T = TypeVar("T")


def _eventually(fn: Callable[[], T], timeout: float = 10.0) -> T:
    """RBAC and discovery changes reach the authorizer/caches asynchronously (milliseconds)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except ApiException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _spark_app(name: str, **spec_extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "type": "Python",
        "mode": "cluster",
        "image": "spark:4.0.0-python3",
        "mainApplicationFile": "local:///opt/app/job.py",
        "sparkVersion": "4.0.0",
        "sparkConf": {"spark.sql.shuffle.partitions": "4"},
        "restartPolicy": {
            "type": "OnFailure",
            "onFailureRetries": 3,
            "onFailureRetryInterval": 10,
            "onSubmissionFailureRetries": 2,
            "onSubmissionFailureRetryInterval": 20,
        },
        "driver": {
            "cores": 1,
            "memory": "512m",
            "serviceAccount": "spark",
            "env": [{"name": "A", "value": "1"}],
            "sidecars": [
                {
                    "name": "marker-sidecar",
                    "image": "sparkguard:dev",
                    "ports": [{"containerPort": 8677, "name": "markers"}],
                    "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8677}},
                }
            ],
        },
        "executor": {"cores": 1, "instances": 2, "memory": "512m"},
        # Typed in the CRD schema (spec.deps): kept.
        "deps": {"pyFiles": ["local:///opt/app/deps.zip"]},
    }
    spec.update(spec_extra)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SparkApplication",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


@pytest.fixture
def api(kube_bench: KubeBench) -> Iterator[client.ApiClient]:
    with kube_bench.api_client() as api_client:
        yield api_client


def test_default_namespace_exists(api: client.ApiClient) -> None:
    ns = client.CoreV1Api(api).read_namespace("default")
    assert ns.metadata is not None
    assert ns.metadata.name == "default"
    assert ns.status is not None
    assert ns.status.phase == "Active"


def test_sparkapplication_crd_is_served(kube_bench: KubeBench, api: client.ApiClient) -> None:
    crd = client.ApiextensionsV1Api(api).read_custom_resource_definition(CRD_NAME)
    assert crd.status is not None
    conditions = {c.type: c.status for c in crd.status.conditions or []}
    assert conditions.get("Established") == "True"
    assert crd.spec.names.short_names == ["sparkapp"]
    assert crd.spec.scope == "Namespaced"

    _, discovery = kube_bench.request("GET", f"/apis/{GROUP}/{VERSION}")
    resources = {r["name"]: r for r in discovery["resources"]}
    assert resources[PLURAL]["kind"] == "SparkApplication"
    assert resources[PLURAL]["namespaced"] is True
    assert "sparkapp" in resources[PLURAL]["shortNames"]
    assert f"{PLURAL}/status" in resources


def test_sparkapplication_create_read_and_status_subresource(api: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(api)
    name = f"app-{uuid.uuid4().hex[:8]}"
    created = cast(
        dict[str, Any],
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, _spark_app(name)),
    )
    assert created["metadata"]["generation"] == 1
    assert "status" not in created

    got = cast(
        dict[str, Any], custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name)
    )
    assert got["spec"]["driver"]["sidecars"][0]["readinessProbe"]["httpGet"]["port"] == 8677
    assert got["spec"]["deps"] == {"pyFiles": ["local:///opt/app/deps.zip"]}
    assert got["spec"]["restartPolicy"]["onFailureRetries"] == 3

    # Status goes through /status only; spec in the same patch is ignored there.
    patched = cast(
        dict[str, Any],
        custom.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            "default",
            PLURAL,
            name,
            {
                "spec": {"sparkVersion": "9.9.9"},
                "status": {
                    "applicationState": {"state": "FAILED", "errorMessage": "driver OOMKilled"},
                    "sparkApplicationId": "spark-123",
                    "submissionAttempts": 1,
                    "executionAttempts": 1,
                    "lastSubmissionAttemptTime": "2026-01-01T00:00:00Z",
                    "terminationTime": "2026-01-01T00:05:00Z",
                    "driverInfo": {"podName": f"{name}-driver", "webUIPort": 4040},
                },
            },
        ),
    )
    assert patched["status"]["applicationState"]["state"] == "FAILED"
    assert patched["spec"]["sparkVersion"] == "4.0.0"
    assert patched["metadata"]["generation"] == 1  # status writes never bump generation

    # ... and status sent to the main resource is ignored.
    after_main = cast(
        dict[str, Any],
        custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            "default",
            PLURAL,
            name,
            {
                "spec": {"sparkConf": {"spark.sql.shuffle.partitions": "8"}},
                "status": {"applicationState": {"state": "COMPLETED"}},
            },
        ),
    )
    assert after_main["status"]["applicationState"]["state"] == "FAILED"
    assert after_main["spec"]["sparkConf"]["spark.sql.shuffle.partitions"] == "8"
    assert after_main["metadata"]["generation"] == 2

    custom.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name)


def test_sparkapplication_schema_is_enforced(api: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(api)
    with pytest.raises(ApiException) as bad_type:
        custom.create_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, _spark_app("bad-type", type="Go")
        )
    assert bad_type.value.status == 422
    bad_retries = _spark_app("bad-retries")
    bad_retries["spec"]["restartPolicy"]["onFailureRetryInterval"] = 0
    with pytest.raises(ApiException) as bad_interval:
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, bad_retries)
    assert bad_interval.value.status == 422
    nameless_sidecar = _spark_app("bad-sidecar")
    nameless_sidecar["spec"]["driver"]["sidecars"] = [{"image": "x"}]
    with pytest.raises(ApiException) as bad_sidecar:
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, nameless_sidecar)
    assert bad_sidecar.value.status == 422


def test_service_account_rbac_is_enforced(kube_bench: KubeBench) -> None:
    ns = f"rbac-{uuid.uuid4().hex[:6]}"
    kubeconfig = kube_bench.service_account_kubeconfig(ns, "sparkguard-operator")
    sa_client = cast(
        client.ApiClient,
        config.new_client_from_config(config_file=kubeconfig),  # type: ignore[no-untyped-call]
    )
    with sa_client:
        custom = client.CustomObjectsApi(sa_client)
        with pytest.raises(ApiException) as denied:
            custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)
        assert denied.value.status == 403
        assert f"system:serviceaccount:{ns}:sparkguard-operator" in str(denied.value.body)

        kube_bench.apply_manifest(
            f"""
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: sparkapps-reader, namespace: {ns}}}
rules:
- apiGroups: ["{GROUP}"]
  resources: ["{PLURAL}"]
  verbs: ["get", "list", "watch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: sparkapps-reader, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: sparkapps-reader}}
subjects:
- {{kind: ServiceAccount, name: sparkguard-operator, namespace: {ns}}}
"""
        )
        listed = cast(
            dict[str, Any],
            _eventually(lambda: custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)),
        )
        assert listed["items"] == []

        # The Role is namespaced: other namespaces and writes stay forbidden.
        with pytest.raises(ApiException) as other_ns:
            custom.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)
        assert other_ns.value.status == 403
        with pytest.raises(ApiException) as write:
            custom.create_namespaced_custom_object(
                GROUP, VERSION, ns, PLURAL, _spark_app("nope") | {"metadata": {"name": "nope"}}
            )
        assert write.value.status == 403


def test_apply_manifest_replaces_existing_objects(
    kube_bench: KubeBench, api: client.ApiClient
) -> None:
    manifest = """
apiVersion: v1
kind: Service
metadata: {name: kb-svc}
spec:
  selector: {app: kb}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: kb-cm}
data: {k: v1}
"""
    first = kube_bench.apply_manifest(manifest)
    second = kube_bench.apply_manifest(
        manifest.replace("k: v1", "k: v2").replace("port: 80,", "port: 81,")
    )
    assert second[0]["spec"]["clusterIP"] == first[0]["spec"]["clusterIP"]
    assert second[0]["spec"]["ports"][0]["port"] == 81
    cm = client.CoreV1Api(api).read_namespaced_config_map("kb-cm", "default")
    assert cm.data == {"k": "v2"}

    hook = kube_bench.apply_manifest(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "kb-hook"},
            "webhooks": [
                {
                    "name": "kb.sparkguard.io",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Ignore",
                    "clientConfig": {"url": "https://127.0.0.1:9/mutate"},
                    "rules": [
                        {
                            "apiGroups": ["nothing.example.com"],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["nothings"],
                        }
                    ],
                }
            ],
        },
        server_side=True,
    )
    assert hook[0]["metadata"]["name"] == "kb-hook"
    client.AdmissionregistrationV1Api(api).delete_mutating_webhook_configuration("kb-hook")


def test_failed_build_raises_with_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No `go` on PATH and an empty cache: build.sh fails loudly and ensure_binaries raises."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SPARKGUARD_CACHE": str(tmp_path)}
    proc = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode != 0
    assert "'go' not found" in proc.stderr
    assert proc.stdout == ""

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SPARKGUARD_KUBE_BIN_DIR", raising=False)
    with pytest.raises(KubeBenchError, match="'go' not found"):
        ensure_binaries()
    assert not os.path.exists(tmp_path / "kube")


def test_requests_keep_one_connection_a_thread_and_outlive_an_apiserver_restart() -> None:
    """The bench's requests reuse one kept-alive connection per thread (not a TLS handshake a
    request); after kube-apiserver is SIGKILLed and restarted, a thread's stale connection is
    seen before reuse, so a POST (never resent: it may have been carried out) goes through on a
    new one, and so does a GET."""
    path = "/api/v1/namespaces/default/configmaps"
    with KubeBench() as bench, ThreadPoolExecutor(max_workers=1) as worker:

        def request(method: str, target: str, body: Any = None) -> tuple[int, Any, Any]:
            status, found = bench.request(method, target, body)
            conn = bench._connections._local.conn
            return status, found, (conn, conn.sock)

        _, _, first = worker.submit(request, "GET", path).result()
        for _ in range(5):
            assert worker.submit(request, "GET", path).result()[2] == first
        # the calling thread has a connection of its own
        assert request("GET", path)[2][0] is not first[0]

        bench.restart_apiserver()  # its readiness probe renews this thread's connection only
        made = {"metadata": {"name": f"kb-{uuid.uuid4().hex[:8]}"}, "data": {"k": "v"}}
        status, _, after = worker.submit(request, "POST", path, made).result()
        assert status == 201
        assert after[1] is not first[1]
        _, found, _ = worker.submit(request, "GET", f"{path}/{made['metadata']['name']}").result()
        assert found["data"] == {"k": "v"}
        with pytest.raises(KubeApiError) as refused:
            worker.submit(request, "POST", path, made).result()
        assert refused.value.status == 409
