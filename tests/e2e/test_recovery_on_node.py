"""Recovery on the real spark-operator with real pods, in a Pod Security "restricted" namespace.

Everything here is real but the container images: upstream's Kubeflow spark-operator (v2.5.2,
controller and webhook) submits the app with ``spark-submit --deploy-mode cluster``; the
kubelet (``kube_node_cluster``: the real kubelet behind the bench's container runtime) runs the
driver pod, and the executor pod the driver asks for; sparkguard's chart operator (helm
installed, as the chart's ServiceAccount) admits the app. The job is the demo's unchanged
PySpark job (``demo_plain_job.py``: ``df.write.mode("append").parquet``, the JVM layer from the
conf admission injected). The namespace enforces ``restricted``, so every injected container
must meet it; the table and the journal live on a PersistentVolume (what a platform gives a
hardened namespace: ``restricted`` refuses hostPath volumes in pods) that the test reads too.

The driver is killed mid-write with SIGKILL, as the kernel's OOM killer ends a driver that
outgrew its memory limit (the commonest real driver death; a deleted pod is an eviction or an
operator's own action, and gets SIGTERM and a grace period first). spark-operator's own
OnFailure retry then runs the next driver, whose rollback initContainer undoes the killed
write while the first driver's executor may still be running (upstream's webhook makes the
SparkApplication an owner of executor pods, so they are not garbage-collected with their
driver). The app ends COMPLETED with every row once.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from sparkguard.operator import appmeta, mutation
from sparkguard.spark_lib.tools import demo
from tests.e2e.conftest import leftovers, rows_once
from tests.e2e.test_recovery_scenario import (
    PLAIN_PARTITIONS,
    PLAIN_ROWS,
    ChartOperator,
    _mid_write,
    installed_chart_operator,
)
from tests.e2e.test_spark_on_node import get, node_report, pods, spark_app, wait_for
from tests.kubebench.bench import JsonObj
from tests.kubebench.cluster import KubeCluster
from tests.kubebench.fixtures import CLUSTER_JOB_NAMESPACE

pytestmark = [pytest.mark.kube, pytest.mark.spark]

NAMESPACE = CLUSTER_JOB_NAMESPACE
APPS = f"/apis/sparkoperator.k8s.io/v1beta2/namespaces/{NAMESPACE}/sparkapplications"
CONFIG_MAPS = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
VOLUME = "sparkguard-data"
#: what an app must set itself to run under "restricted" (sparkguard's containers get theirs).
#: A user: the kubelet takes an image that names none (the bench's) as root and refuses it
#: under runAsNonRoot; Spark's image runs as 185 (OpenShift would assign one here). The bench's
#: runtime starts every process as the node's own user whatever the pod says.
POD_SECURITY = {
    "runAsNonRoot": True,
    "runAsUser": 185,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


@dataclasses.dataclass
class Protected:
    """The chart's operator on the node cluster; the app's table and journal under ``data``."""

    cluster: KubeCluster
    chart: ChartOperator
    data: Path


@pytest.fixture(scope="module")
def protected(kube_node_cluster: KubeCluster) -> Iterator[Protected]:
    """``spark-jobs`` labelled ``enforce=restricted``; a PersistentVolume (a local directory
    the test reads) bound to a claim there; sparkguard's chart operator, its journal and the
    sidecar's allowed root on that directory. Not under /tmp: sparkguard's containers mount
    their own /tmp (the library volume), and the bench's runtime cannot make a mount point
    inside another container mount (runc would make it in the volume)."""
    cluster = kube_node_cluster
    data = Path(tempfile.mkdtemp(prefix="sg-node-recovery-", dir="/var/tmp"))
    labels = {"pod-security.kubernetes.io/enforce": "restricted"}
    labels["pod-security.kubernetes.io/enforce-version"] = "latest"
    cluster.request(
        "PATCH",
        f"/api/v1/namespaces/{NAMESPACE}",
        {"metadata": {"labels": labels}},
        content_type="application/merge-patch+json",
    )
    cluster.apply_manifest(_volume(data))
    try:
        with installed_chart_operator(cluster, data) as chart:
            _no_operator_pods(cluster)
            yield Protected(cluster, dataclasses.replace(chart, namespace=NAMESPACE), data)
    finally:
        cluster.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims/{VOLUME}")
        cluster.request("DELETE", f"/api/v1/persistentvolumes/{VOLUME}")
        shutil.rmtree(data)


def _no_operator_pods(cluster: KubeCluster) -> None:
    """Scale the chart's Deployment to 0: the test runs its operator as a process, and on this
    cluster the kubelet would run the Deployment's replicas too."""
    _, found = cluster.request("GET", "/apis/apps/v1/deployments")
    for deployment in found["items"]:
        meta = deployment["metadata"]
        if meta["namespace"].startswith("sparkguard-e2e-"):
            cluster.request(
                "PATCH",
                f"/apis/apps/v1/namespaces/{meta['namespace']}/deployments/{meta['name']}/scale",
                {"spec": {"replicas": 0}},
                content_type="application/merge-patch+json",
            )


def _volume(path: Path) -> list[JsonObj]:
    """A PersistentVolume on ``path`` and its claim in the job namespace, bound to each other."""
    size = {"storage": "1Gi"}
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": VOLUME},
            "spec": {
                "capacity": size,
                "accessModes": ["ReadWriteMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": str(path), "type": "Directory"},
                "claimRef": {"namespace": NAMESPACE, "name": VOLUME},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": VOLUME, "namespace": NAMESPACE},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "volumeName": VOLUME,
                "resources": {"requests": size},
            },
        },
    ]


def protected_app(name: str, data: Path, table: Path) -> JsonObj:
    """The demo's plain job as a protected SparkApplication: cluster mode, one executor,
    OnFailure with one retry; compliant with "restricted" on its own; the volume at the same
    path as on the node (the journal root the chart was given is a path there)."""
    app = spark_app(name, data, "write")
    spec = app["spec"]
    app["metadata"]["labels"] = {appmeta.ENABLED: "true"}
    spec["mainApplicationFile"] = f"local://{demo.PLAIN_JOB}"
    spec["arguments"] = [str(table), str(PLAIN_ROWS), str(PLAIN_PARTITIONS)]
    spec["restartPolicy"] = {
        "type": "OnFailure",
        "onFailureRetries": 1,
        "onFailureRetryInterval": 1,
        "onSubmissionFailureRetries": 0,
    }
    # spark.kubernetes.executor.deleteOnTermination stays false (spark_app): a driver that
    # shuts down leaves its executor pod, as a SIGKILLed one always does: the worst case
    spec["volumes"] = [{"name": VOLUME, "persistentVolumeClaim": {"claimName": VOLUME}}]
    for role in ("driver", "executor"):
        spec[role]["volumeMounts"] = [{"name": VOLUME, "mountPath": str(data)}]
        spec[role] |= {"podSecurityContext": POD_SECURITY, "securityContext": CONTAINER_SECURITY}
    return app


def driver_jvm(name: str) -> int | None:
    """The PID of the JVM in app ``name``'s driver container (Spark's SparkSubmit in client
    mode, as Spark's image runs it in the driver pod), seen from the node's host."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [w.decode(errors="replace") for w in argv]
        submit = "org.apache.spark.deploy.SparkSubmit" in words and "client" in words
        if submit and any(w.endswith(demo.PLAIN_JOB.name) for w in words):
            return int(entry.name)
    return None


def state(cluster: KubeCluster, name: str) -> str:
    app = get(cluster, f"{APPS}/{name}") or {}
    return str(((app.get("status") or {}).get("applicationState") or {}).get("state", ""))


def container_log(cluster: KubeCluster, pod: str, container: str) -> str:
    assert cluster.node is not None
    logs = sorted(cluster.node.pod_logs.glob(f"{NAMESPACE}_{pod}_*/{container}/*.log"))
    return "\n".join(p.read_text(errors="replace") for p in logs)


@pytest.mark.parametrize("how", ["sigkill", "delete-pod"])
def test_driver_killed_mid_write_is_rolled_back_by_the_next_driver_and_every_row_once(
    protected: Protected, how: str
) -> None:
    """``sigkill``: the driver's JVM SIGKILLed (its executor sees the connection drop and
    exits at once). ``delete-pod``: the driver pod deleted (SIGTERM, then Spark's own
    shutdown); its executor pod stays (the app owns it too) and may outlive the driver into
    the next driver's rollback: the zombie case."""
    cluster, data = protected.cluster, protected.data
    name = f"orders-{how}"
    table = data / name
    config_maps_before = {
        c["metadata"]["name"] for c in cluster.request("GET", CONFIG_MAPS)[1]["items"]
    }
    created = protected.chart.create(protected_app(name, data, table))
    # admission injected the rollback initContainer and the JVM layer
    inits = [c["name"] for c in created["spec"]["driver"].get("initContainers") or []]
    assert mutation.ROLLBACK_INIT_NAME in inits, inits
    report = lambda: node_report(cluster, name)  # noqa: E731
    states: list[str] = []

    def seen() -> str:
        now = state(cluster, name)
        if now and (not states or states[-1] != now):
            states.append(now)
        return now

    first = wait_for(
        "the first driver mid-write",
        lambda: seen() and _mid_write(table) and get(cluster, f"{PODS}/{name}-driver"),
        timeout=600,
        report=report,
    )
    if how == "sigkill":
        pid = driver_jvm(name)
        assert pid is not None, report()
        os.kill(pid, signal.SIGKILL)
    else:
        cluster.request("DELETE", f"{PODS}/{name}-driver")
    killed_at = time.time()
    first_uid = first["metadata"]["uid"]
    (executor,) = pods(cluster, f"spark-role=executor,sparkoperator.k8s.io/app-name={name}")
    zombie = executor["metadata"]["name"]
    print(f"{how} of the driver at {killed_at:.1f}; its executor pod {zombie}")

    second = wait_for(
        "the next driver pod",
        lambda: (
            seen() is not None
            and (p := get(cluster, f"{PODS}/{name}-driver"))
            and p["metadata"]["uid"] != first_uid
            and p
        ),
        timeout=300,
        report=report,
    )
    wait_for(
        f"{name} to complete",
        lambda: seen() in ("COMPLETED", "FAILED"),
        timeout=600,
        report=report,
    )
    print("states:", states)
    assert states[-1] == "COMPLETED", report()
    assert "PENDING_RERUN" in states, states
    assert "FAILED" not in states, states
    status = (get(cluster, f"{APPS}/{name}") or {})["status"]
    assert status["executionAttempts"] == 2, status

    # the next driver's rollback initContainer undid the killed write
    second_name = second["metadata"]["name"]
    driver = get(cluster, f"{PODS}/{second_name}")
    assert driver is not None
    rollback = {s["name"]: s for s in driver["status"]["initContainerStatuses"]}[
        mutation.ROLLBACK_INIT_NAME
    ]["state"]["terminated"]
    assert rollback["exitCode"] == 0, rollback
    log = container_log(cluster, second_name, mutation.ROLLBACK_INIT_NAME)
    print("rollback initContainer:", rollback["startedAt"], rollback["finishedAt"], log[-2000:])
    # it found the killed write's journal (on the app's volume) and rolled the instant back
    assert "does not exist yet" not in log, log
    assert "rolled_back" in log, log
    zombie_pod = get(cluster, f"{PODS}/{zombie}")
    if zombie_pod is not None:
        ended = (zombie_pod["status"].get("containerStatuses") or [{}])[0].get("state", {})
        print(f"first executor {zombie}: {ended}; rollback {rollback['startedAt']}..")
    executor_log = container_log(cluster, zombie, "spark-kubernetes-executor")
    print("first executor log:", executor_log[-3000:])

    # every row once: a plain directory reader (Spark's rules: "." and "_" files are hidden)
    # and sparkguard's committed-only reader; no temp or uncommitted file
    plain = ds.dataset(str(table), format="parquet").to_table(columns=["id"])
    ids = plain.column("id").to_pylist()
    assert (len(ids), len(set(ids))) == (PLAIN_ROWS, PLAIN_ROWS)
    assert rows_once(table, rows=PLAIN_ROWS) == (PLAIN_ROWS, 0, 0)
    assert leftovers(table) == []

    # deleting the app leaves no pod and no ConfigMap of it
    cluster.request("DELETE", f"{APPS}/{name}")
    wait_for(
        "the app's pods and ConfigMaps to be gone",
        lambda: (
            not pods(cluster, f"sparkoperator.k8s.io/app-name={name}")
            and {c["metadata"]["name"] for c in cluster.request("GET", CONFIG_MAPS)[1]["items"]}
            <= config_maps_before
        ),
        timeout=120,
        report=report,
    )


PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
