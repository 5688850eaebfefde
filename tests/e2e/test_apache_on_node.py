"""Recovery on the real Apache Spark Kubernetes Operator (``spark.apache.org/v1``) with real pods.

Everything is real but the container images: upstream's Apache operator (release 1.0.0, built
from its source: ``tests/kubebench/build-apache-operator.sh``) builds the driver pod itself
from the app's ``driverSpec.podTemplateSpec`` (Spark's driver builder in its own JVM, no
``spark-submit``); the kubelet (``apache_node_bench``: the real kubelet behind the bench's
container runtime) runs it, and the executor pod the driver asks for; sparkguard's chart
operator (helm installed, as the chart's ServiceAccount) admits the app. The job is the demo's
unchanged PySpark job (``demo_plain_job.py``: ``df.write.mode("append").parquet``, the JVM layer
from the conf admission injected), its table on a hostPath volume the test reads too.

The driver's JVM is SIGKILLed mid-write (as the kernel's OOM killer ends one):

* ``restart``: admission mapped ``max-retries 1`` onto the app's ``restartConfig`` (OnFailure,
  one restart, 1 s): upstream's operator restarts the driver (``<name>-1-driver``) and that
  pod's rollback initContainer undoes the killed write; sparkguard's operator does nothing but
  mark the app Succeeded.
* ``recreate``: the user's own ``restartConfig`` (Never) is kept: upstream ends the app
  (Failed, then ResourceReleased); sparkguard's operator rolls the write back and recreates the
  app (new uid, ``resubmitted-from`` the old one), whose first driver completes.

Either way every row once (a plain reader and the committed-only reader), nothing
uncommitted or temporary left, and once the app is deleted no pod or ConfigMap of it.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from sparkguard.operator import appmeta, mutation
from sparkguard.spark_lib.spark import sparkconf
from sparkguard.spark_lib.tools import demo
from tests.e2e.test_recovery_on_node import ROWS, _every_row_once, _no_operator_pods, driver_jvm
from tests.e2e.test_recovery_scenario import (
    PLAIN_PARTITIONS,
    ChartReplicas,
    _mid_write,
    installed_chart_replicas,
)
from tests.e2e.test_spark_on_node import get, wait_for
from tests.kubebench.apache import ApacheOperatorBench
from tests.kubebench.bench import JsonObj
from tests.kubebench.fixtures import APACHE_JOB_NAMESPACE
from tests.kubebench.node import NODE_NAME

pytestmark = [pytest.mark.kube, pytest.mark.spark]

NAMESPACE: Final = APACHE_JOB_NAMESPACE
APPS: Final = f"/apis/spark.apache.org/v1/namespaces/{NAMESPACE}/sparkapplications"
PODS: Final = f"/api/v1/namespaces/{NAMESPACE}/pods"
#: the label upstream's operator puts on every pod of an app
APP_LABEL: Final = "spark.operator/spark-app-name"
VOLUME: Final = "data"


@dataclasses.dataclass
class Cluster:
    """The Apache operator's node bench, sparkguard's chart replicas on it, the tables' root."""

    bench: ApacheOperatorBench
    chart: ChartReplicas
    data: Path

    def get(self, path: str) -> JsonObj | None:
        return get(self.bench, path)

    def app(self, name: str) -> JsonObj | None:
        return self.get(f"{APPS}/{name}")

    def pods(self, name: str, role: str = "") -> list[JsonObj]:
        selector = f"{APP_LABEL}={name}" + (f",spark-role={role}" if role else "")
        _, found = self.bench.request("GET", f"{PODS}?labelSelector={selector}")
        return list(found["items"])

    def container_log(self, pod: JsonObj, container: str) -> str:
        node = self.bench.node
        assert node is not None
        meta = pod["metadata"]
        pattern = f"{NAMESPACE}_{meta['name']}_{meta['uid']}/{container}/*.log"
        return "\n".join(p.read_text(errors="replace") for p in sorted(node.pod_logs.glob(pattern)))

    def report(self, name: str) -> str:
        """The app's status, its pods' phases and the last lines of every container's log."""
        app = self.app(name) or {}
        lines = [f"app {name}: {app.get('status')}"]
        lines += [f"pod {p['metadata']['name']}: {p['status']}" for p in self.pods(name)]
        node = self.bench.node
        if node is not None:
            for log in sorted(node.pod_logs.glob(f"{NAMESPACE}_{name}-*/*/*.log")):
                tail = log.read_text(errors="replace").splitlines()[-15:]
                lines += [f"--- {log.relative_to(node.pod_logs)}", *tail]
        lines.append(f"--- the Apache operator: {self.bench.operator_log()[-3000:]}")
        return "\n".join(lines)


@pytest.fixture(scope="module")
def cluster(apache_node_bench: ApacheOperatorBench) -> Iterator[Cluster]:
    """sparkguard's chart (two operator replicas as processes, as the chart's ServiceAccount)
    on the Apache operator's node bench; tables and journals under a directory of the node's
    host (not /tmp: sparkguard's containers mount their own)."""
    data = Path(tempfile.mkdtemp(prefix="sg-apache-node-", dir="/var/tmp"))
    try:
        with installed_chart_replicas(apache_node_bench, data, apache=True) as chart:
            _no_operator_pods(apache_node_bench)
            replicas = dataclasses.replace(chart, namespace=NAMESPACE)
            yield Cluster(apache_node_bench, replicas, data)
    finally:
        shutil.rmtree(data)


def _pod_template(role: str, data: Path) -> JsonObj:
    """The role's pod template: the tables' directory mounted at the same path as on the host
    (the journal root the chart was given is a path there); Spark's user (its image runs as
    185). The kubelet takes an image that names no user (the bench's) as root, and sparkguard's
    containers run as non-root: they take the pod's user."""
    return {
        "podTemplateSpec": {
            "spec": {
                "securityContext": {"runAsNonRoot": True, "runAsUser": 185},
                "volumes": [{"name": VOLUME, "hostPath": {"path": str(data), "type": "Directory"}}],
                "containers": [
                    {
                        "name": f"spark-kubernetes-{role}",
                        "volumeMounts": [{"name": VOLUME, "mountPath": str(data)}],
                    }
                ],
            }
        }
    }


def apache_app(name: str, data: Path, table: Path, **notes: str) -> JsonObj:
    """The demo's plain job as an opted-in Apache SparkApplication: one executor; the JVM
    options of the tests' drivers come from the node (its image rules)."""
    return {
        "apiVersion": "spark.apache.org/v1",
        "kind": "SparkApplication",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {appmeta.ENABLED_LABEL: "true"},
            "annotations": {appmeta.BACKOFF: "1s", **notes},
        },
        "spec": {
            "pyFiles": f"local://{demo.PLAIN_JOB}",
            "driverArgs": [str(table), str(ROWS), str(PLAIN_PARTITIONS)],
            "runtimeVersions": {"sparkVersion": "4.3.0"},
            "sparkConf": {
                "spark.kubernetes.container.image": "kubebench/spark:4.3.0",
                "spark.kubernetes.authenticate.driver.serviceAccountName": "spark",
                "spark.executor.instances": "1",
                "spark.executor.cores": "1",
                "spark.driver.memory": "512m",
                "spark.executor.memory": "512m",
                "spark.kubernetes.driver.request.cores": "100m",
                "spark.kubernetes.executor.request.cores": "100m",
                # the killed driver's executor pod stays until its app goes (the worst case)
                "spark.kubernetes.executor.deleteOnTermination": "false",
                "spark.ui.enabled": "false",
                "spark.sql.shuffle.partitions": "2",
            },
            "driverSpec": _pod_template("driver", data),
            "executorSpec": _pod_template("executor", data),
        },
    }


def _kill_first_driver_mid_write(cluster: Cluster, name: str, table: Path) -> JsonObj:
    """SIGKILL the JVM of app ``name``'s first driver once it is mid-write; its pod."""
    report: Callable[[], str] = lambda: cluster.report(name)  # noqa: E731
    wait_for(
        "the first driver mid-write",
        lambda: _mid_write(table) and cluster.get(f"{PODS}/{name}-0-driver"),
        timeout=600,
        report=report,
    )
    first = cluster.get(f"{PODS}/{name}-0-driver")
    assert first is not None
    pid = driver_jvm()
    assert pid is not None, report()
    os.kill(pid, signal.SIGKILL)
    return first


def _deleted_leaving_nothing(cluster: Cluster, name: str) -> None:
    """Delete app ``name`` and wait until nothing of it is left: no pod, and none of the
    ConfigMaps upstream made for its drivers (``<name>-<attempt>-…``: the driver's conf, the
    pod templates), which go with the driver pods that own them."""

    def config_maps() -> list[str]:
        _, found = cluster.bench.request("GET", f"/api/v1/namespaces/{NAMESPACE}/configmaps")
        names = [c["metadata"]["name"] for c in found["items"]]
        return [n for n in names if n.startswith(f"{name}-")]

    if cluster.app(name) is not None:
        cluster.bench.request("DELETE", f"{APPS}/{name}")
    wait_for(
        f"{name}, its pods and ConfigMaps to be gone",
        lambda: cluster.app(name) is None and not cluster.pods(name) and not config_maps(),
        timeout=120,
        report=lambda: f"{cluster.report(name)}\nConfigMaps: {config_maps()}",
    )


def _completed_run(cluster: Cluster, name: str, pod_name: str) -> JsonObj:
    """The driver pod ``pod_name`` as last seen once upstream recorded the app's attempt
    Succeeded (it deletes the pod as it releases the app's resources, maybe before the pod's
    own phase says so: the marker sidecar still stops), run on the node; while it ran, its
    executor pod (which that driver made and owns) ran on the node too."""
    executors: dict[str, JsonObj] = {}
    seen: dict[str, JsonObj] = {}

    def succeeded() -> bool:
        for pod in cluster.pods(name, "executor"):
            executors[pod["metadata"]["name"]] = pod
        if pod := cluster.get(f"{PODS}/{pod_name}"):
            seen["driver"] = pod
        history = ((cluster.app(name) or {}).get("status") or {}).get("stateTransitionHistory")
        states = [entry["currentStateSummary"] for entry in (history or {}).values()]
        return "Succeeded" in states and "driver" in seen

    wait_for(f"{name} to succeed", succeeded, timeout=240, report=lambda: cluster.report(name))
    done = seen["driver"]
    assert done["spec"]["nodeName"] == NODE_NAME
    ours = [
        p
        for p in executors.values()
        if any(r["uid"] == done["metadata"]["uid"] for r in p["metadata"]["ownerReferences"])
    ]
    assert [p["spec"]["nodeName"] for p in ours] == [NODE_NAME], executors
    return done


def _marked_succeeded(cluster: Cluster, name: str) -> None:
    """Until sparkguard's operator marked app ``name`` Succeeded (its phase annotation)."""
    wait_for(
        f"sparkguard to mark {name} Succeeded",
        lambda: appmeta.of(cluster.app(name) or {}).get(appmeta.PHASE) == "Succeeded",
        timeout=120,
        report=lambda: cluster.report(name),
    )


def _rollback_init(cluster: Cluster, pod: JsonObj) -> tuple[JsonObj, str]:
    """The rollback initContainer's end state in ``pod`` and its log."""
    statuses = {s["name"]: s for s in pod["status"]["initContainerStatuses"]}
    ended: JsonObj = statuses[mutation.ROLLBACK_INIT_NAME]["state"]["terminated"]
    return ended, cluster.container_log(pod, mutation.ROLLBACK_INIT_NAME)


def _admitted(created: JsonObj) -> str:
    """What admission put on the app (the JVM layer, the rollback initContainer in the driver's
    pod template); the job id."""
    conf = created["spec"]["sparkConf"]
    assert conf[sparkconf.COMMIT_PROTOCOL_KEY] == sparkconf.PROTOCOL_CLASS
    template = created["spec"]["driverSpec"]["podTemplateSpec"]["spec"]
    inits = [c["name"] for c in template.get("initContainers") or []]
    assert mutation.ROLLBACK_INIT_NAME in inits, inits
    return str(conf["spark.sparkguard.jobId"])


def _create(cluster: Cluster, app: JsonObj) -> JsonObj:
    _, created = cluster.bench.request("POST", APPS, app)
    return dict(created)


def test_a_driver_killed_mid_write_is_restarted_by_upstream_and_every_row_once(
    cluster: Cluster,
) -> None:
    """``restart``: upstream's own restart (from the restartConfig admission mapped), the
    killed write undone by the next driver pod's rollback initContainer."""
    name = "restart"
    table = cluster.data / name
    created = _create(cluster, apache_app(name, cluster.data, table, **{appmeta.MAX_RETRIES: "1"}))
    job_id = _admitted(created)
    restart = created["spec"]["applicationTolerations"]["restartConfig"]
    assert (restart["restartPolicy"], restart["maxRestartAttempts"]) == ("OnFailure", 1)
    started = time.monotonic()
    first = _kill_first_driver_mid_write(cluster, name, table)
    killed = time.monotonic() - started

    second = _completed_run(cluster, name, f"{name}-1-driver")
    _marked_succeeded(cluster, name)
    print(f"{name}: killed at {killed:.1f}s, done at {time.monotonic() - started:.1f}s")
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    ended, log = _rollback_init(cluster, second)
    print("rollback initContainer:", log[-1500:])
    assert ended["exitCode"] == 0, ended
    assert "rolled_back" in log, log
    reasons = cluster.chart.event_reasons(name)
    assert "RollbackStarted" not in reasons, reasons  # upstream restarted, the pod rolled back
    assert "Resubmitted" not in reasons, reasons
    _every_row_once(table, job_id)
    _deleted_leaving_nothing(cluster, name)


def test_a_final_failure_is_rolled_back_and_the_app_recreated_and_every_row_once(
    cluster: Cluster,
) -> None:
    """``recreate``: the user's restartConfig Never kept; upstream releases the failed app and
    sparkguard's operator rolls back and recreates it."""
    name = "recreate"
    table = cluster.data / name
    app = apache_app(name, cluster.data, table, **{appmeta.MAX_RETRIES: "1"})
    app["spec"]["applicationTolerations"] = {"restartConfig": {"restartPolicy": "Never"}}
    created = _create(cluster, app)
    job_id = _admitted(created)
    assert created["spec"]["applicationTolerations"]["restartConfig"]["restartPolicy"] == "Never"
    old_uid = created["metadata"]["uid"]
    started = time.monotonic()
    _kill_first_driver_mid_write(cluster, name, table)

    def recreated() -> Any:
        now = cluster.app(name)
        return now is not None and now["metadata"]["uid"] != old_uid and now

    new = wait_for("the app recreated", recreated, timeout=300, report=lambda: cluster.report(name))
    done = _completed_run(cluster, name, f"{name}-0-driver")
    _marked_succeeded(cluster, name)
    print(f"{name}: done at {time.monotonic() - started:.1f}s")
    notes = appmeta.of(new)
    assert notes[appmeta.RESUBMITTED_FROM] == old_uid
    assert notes[appmeta.ATTEMPT] == "1"
    reasons = cluster.chart.event_reasons(name)
    assert reasons.count("Resubmitted") == 1, reasons
    assert reasons.count("RollbackStarted") == 1, reasons
    ended, _ = _rollback_init(cluster, done)  # nothing left to undo: sparkguard did
    assert ended["exitCode"] == 0, ended
    _every_row_once(table, job_id)
    _deleted_leaving_nothing(cluster, name)
