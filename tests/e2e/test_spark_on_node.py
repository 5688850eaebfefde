"""Upstream's Kubeflow spark-operator with real pods: the real kubelet runs them.

``kube_node_cluster`` (``tests/kubebench/node.py``) is ``kube_cluster`` with a node: the
kubelet built from the bench's Kubernetes module and the bench's container runtime
(``kubebench-cri``: containers as local processes, a network namespace per pod). The
SparkApplication here runs a real PySpark job (``node_job.py``) in cluster mode: upstream's
controller runs spark-submit, the kubelet runs the driver pod, the driver asks the API server
for an executor pod, the scheduler binds it and the kubelet runs it. (A job run to COMPLETED on
a driver and an executor pod is ``test_recovery_on_node.py``'s every case: it checks the pods
as the test that was here did.) One module-scoped cluster
serves every test; its teardown fails if the node left a process, mount or link, or changed a
host kernel setting.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_real_spark_operator import wait_for as poll
from tests.kubebench.bench import ADMIN_USER, JsonObj, KubeApiError
from tests.kubebench.cluster import KubeCluster
from tests.kubebench.fixtures import CLUSTER_JOB_NAMESPACE
from tests.kubebench.node import HOST_SYSCTLS, NODE_NAME, host_sysctls

pytestmark = pytest.mark.kube

NAMESPACE = CLUSTER_JOB_NAMESPACE
APPS = f"/apis/sparkoperator.k8s.io/v1beta2/namespaces/{NAMESPACE}/sparkapplications"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
JOB = Path(__file__).resolve().parent / "node_job.py"
SPARK_SA = "spark-operator-spark"
#: read before the module's cluster starts: the kubelet must never change them
SYSCTLS_BEFORE = host_sysctls()


def wait_for(
    what: str,
    probe: Callable[[], Any],
    *,
    timeout: float = 180.0,
    report: Callable[[], str] = str,
) -> Any:
    """:func:`~tests.e2e.test_real_spark_operator.wait_for`; on a timeout the error also says
    ``report()``."""
    try:
        return poll(what, probe, timeout=timeout)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{report()}") from None


def node_report(cluster: KubeCluster, name: str) -> str:
    """The app's status, its pods' phases and the last lines of every container's log."""
    lines = [f"app {name}: {app_state(cluster, name)}"]
    selector = f"sparkoperator.k8s.io/app-name={name}"
    lines += [f"pod {p['metadata']['name']}: {p['status']}" for p in pods(cluster, selector)]
    if cluster.node is not None:
        for log in sorted(cluster.node.pod_logs.glob(f"{NAMESPACE}_{name}*/*/*.log")):
            tail = log.read_text(errors="replace").splitlines()[-15:]
            lines += [f"--- {log.relative_to(cluster.node.pod_logs)}", *tail]
    return "\n".join(lines)


def get(cluster: KubeCluster, path: str) -> JsonObj | None:
    try:
        _, obj = cluster.request("GET", path)
    except KubeApiError as exc:
        if exc.status == 404:
            return None
        raise
    return dict(obj)


def pods(cluster: KubeCluster, selector: str) -> list[JsonObj]:
    _, found = cluster.request("GET", f"{PODS}?labelSelector={selector}")
    return list(found["items"])


def spark_app(name: str, out: Path, mode: str) -> JsonObj:
    """A Python SparkApplication (cluster mode, one executor) of ``node_job.py``; its output
    directory is a hostPath volume at /data in both pods."""
    mounts = [{"name": "out", "mountPath": "/data"}]
    # C1 only and the serial collector: JVMs that start faster on the bench's 2 cores
    java = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    pod = {"coreRequest": "100m", "cores": 1, "memory": "512m", "volumeMounts": mounts}
    pod["javaOptions"] = java
    return {
        "apiVersion": "sparkoperator.k8s.io/v1beta2",
        "kind": "SparkApplication",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "type": "Python",
            "pythonVersion": "3",
            "mode": "cluster",
            "image": "kubebench/spark:4.3.0",
            "imagePullPolicy": "IfNotPresent",
            "sparkVersion": "4.3.0",
            "mainApplicationFile": f"local://{JOB}",
            "arguments": ["/data", mode],
            "restartPolicy": {"type": "Never"},
            "sparkConf": {
                # executor pods stay after their driver: only the garbage collector removes them
                "spark.kubernetes.executor.deleteOnTermination": "false",
                "spark.ui.enabled": "false",
                "spark.sql.shuffle.partitions": "2",
            },
            "volumes": [{"name": "out", "hostPath": {"path": str(out), "type": "Directory"}}],
            "driver": {**pod, "serviceAccount": SPARK_SA},
            "executor": {**pod, "instances": 1},
        },
    }


@pytest.fixture
def apps(kube_node_cluster: KubeCluster) -> Iterator[Callable[[str, Path, str], str]]:
    """Apply SparkApplications; each is deleted at the end with what it owns."""
    made: list[str] = []

    def make(name: str, out: Path, mode: str) -> str:
        made.append(name)
        kube_node_cluster.apply_manifest(spark_app(name, out, mode))
        return name

    yield make
    for name in made:
        kube_node_cluster.request("DELETE", f"{APPS}/{name}")
    wait_for(
        "the apps' pods to be gone",
        lambda: (
            not any(
                p["metadata"]["name"].startswith(tuple(made))
                for p in pods(kube_node_cluster, "spark-role")
            )
        ),
    )


def app_state(cluster: KubeCluster, name: str) -> JsonObj:
    app = get(cluster, f"{APPS}/{name}") or {}
    return dict(app.get("status") or {})


def terminated(pod: JsonObj) -> JsonObj:
    statuses = pod["status"].get("containerStatuses") or []
    return dict(statuses[0]["state"].get("terminated") or {}) if statuses else {}


def test_kubelet_leaves_the_host_kernel_alone(kube_node_cluster: KubeCluster) -> None:
    """The node is Ready (so the kubelet passed its kernel checks) and the host's kernel
    settings are what they were before it started: it checks them against the node's own
    files, never writes them."""
    _, node = kube_node_cluster.request("GET", f"/api/v1/nodes/{NODE_NAME}")
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert [c["status"] for c in ready] == ["True"]
    assert host_sysctls() == SYSCTLS_BEFORE
    assert set(SYSCTLS_BEFORE) == set(HOST_SYSCTLS)


def test_init_containers_and_native_sidecar_run_in_order(kube_node_cluster: KubeCluster) -> None:
    """The kubelet's own pod lifecycle: two init containers one after the other, a native
    sidecar (started, its exec startup probe passed) before the main container, the main
    container's exit code, and the sidecar stopped after it: the pod Succeeded."""
    name = "ordered"

    def container(name: str, script: str, **extra: Any) -> JsonObj:
        mounts = [{"name": "trail", "mountPath": "/trail"}]
        command = ["sh", "-c", script]
        image = "kubebench/shell"
        return {"name": name, "image": image, "command": command, "volumeMounts": mounts, **extra}

    probe = {"exec": {"command": ["grep", "-q", "sidecar", "/trail/log"]}, "periodSeconds": 1}
    spec = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 5,
        "volumes": [{"name": "trail", "emptyDir": {}}],
        "initContainers": [
            container("first", "echo first >> /trail/log"),
            container("second", "echo second >> /trail/log"),
            container(
                "sidecar",
                "echo sidecar >> /trail/log; exec sleep 600",
                restartPolicy="Always",
                startupProbe=probe,
            ),
        ],
        "containers": [container("main", "cat /trail/log; exit 0")],
    }
    kube_node_cluster.apply_manifest(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec},
        namespace=NAMESPACE,
    )
    try:
        pod = wait_for(
            "the pod to succeed",
            lambda: (
                (p := get(kube_node_cluster, f"{PODS}/{name}"))
                and p["status"].get("phase") == "Succeeded"
                and p
            ),
            timeout=120,
        )
        inits = {s["name"]: s for s in pod["status"]["initContainerStatuses"]}
        main = pod["status"]["containerStatuses"][0]
        first, second = inits["first"]["state"]["terminated"], inits["second"]["state"]
        assert (first["exitCode"], first["reason"]) == (0, "Completed")
        assert first["finishedAt"] <= second["terminated"]["startedAt"]
        assert main["state"]["terminated"]["exitCode"] == 0
        # the sidecar ran before main started, and was stopped once main ended
        sidecar = inits["sidecar"]["state"]["terminated"]
        assert sidecar["startedAt"] <= main["state"]["terminated"]["startedAt"]
        assert sidecar["finishedAt"] >= main["state"]["terminated"]["finishedAt"]
        # main saw the trail in order: its log, which the kubelet reads from the runtime's
        # CRI-format file and serves to the API server (pods/log)
        _, log = kube_node_cluster.request("GET", f"{PODS}/{name}/log?container=main")
        assert log.splitlines() == ["first", "second", "sidecar"]
    finally:
        kube_node_cluster.request("DELETE", f"{PODS}/{name}")


def test_a_deleted_driver_pod_ends_its_executor(
    kube_node_cluster: KubeCluster, apps: Callable[[str, Path, str], str], tmp_path: Path
) -> None:
    """A driver pod deleted mid-run: the kubelet stops it (SIGTERM: exit 143); its executor,
    which lost its driver, ends by itself (the pod Failed). The garbage collector does not
    delete the executor pod: upstream's webhook made the SparkApplication its owner too, so
    the collector only drops the reference to the deleted driver pod; the pod goes with the
    app (the fixture deletes the app and waits for that). The driver does not delete it
    either (``deleteOnTermination`` is off)."""
    name = apps("node-hang", tmp_path, "hang")
    selector = f"spark-role=executor,sparkoperator.k8s.io/app-name={name}"
    executor = wait_for(
        "a running executor pod",
        lambda: next(
            (p for p in pods(kube_node_cluster, selector) if p["status"].get("phase") == "Running"),
            None,
        ),
        timeout=480,
        report=lambda: node_report(kube_node_cluster, name),
    )
    executor_name = executor["metadata"]["name"]
    owners = {(r["kind"], r["name"]) for r in executor["metadata"]["ownerReferences"]}
    assert owners == {("Pod", f"{name}-driver"), ("SparkApplication", name)}

    kube_node_cluster.request("DELETE", f"{PODS}/{name}-driver")
    wait_for(
        "the driver pod to be gone",
        lambda: get(kube_node_cluster, f"{PODS}/{name}-driver") is None,
        report=lambda: node_report(kube_node_cluster, name),
    )
    ended = wait_for(
        "the executor to end and lose its driver's owner reference",
        lambda: (
            (p := get(kube_node_cluster, f"{PODS}/{executor_name}"))
            and p["status"].get("phase") in ("Failed", "Succeeded")
            and all(r["kind"] != "Pod" for r in p["metadata"]["ownerReferences"])
            and p
        ),
        report=lambda: node_report(kube_node_cluster, name),
    )
    assert ended["status"]["phase"] == "Failed"
    assert terminated(ended)["exitCode"] != 0
    writes = [
        (e["verb"], e.get("userAgent", ""))
        for e in kube_node_cluster.audit_events(user=ADMIN_USER)
        if e.get("objectRef", {}).get("name") == executor_name
        and e["verb"] in ("patch", "delete")
        and not e.get("objectRef", {}).get("subresource")
    ]
    # the collector's one change: the owner reference (its user agent names the controller)
    assert [verb for verb, agent in writes if "garbage-collector" in agent] == ["patch"], writes
