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

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from sparkguard.operator import appmeta, mutation
from sparkguard.spark_lib.spark import sparkconf
from sparkguard.spark_lib.storage import timeline
from sparkguard.spark_lib.tools import demo
from tests.e2e import transitions
from tests.e2e.conftest import leftovers, rows_once, states_of
from tests.e2e.test_recovery_scenario import (
    PLAIN_PARTITIONS,
    ChartReplicas,
    _mid_write,
    installed_chart_replicas,
)
from tests.e2e.test_spark_on_node import PODS, get, node_report, pods, spark_app, wait_for
from tests.kubebench.bench import JsonObj
from tests.kubebench.cluster import OPERATOR_NAMESPACE, RELEASE_NAME, KubeCluster
from tests.kubebench.fixtures import CLUSTER_JOB_NAMESPACE
from tests.kubebench.node import NODE_NAME
from tests.support.process import find_process

pytestmark = [pytest.mark.kube, pytest.mark.spark]

NAMESPACE = CLUSTER_JOB_NAMESPACE
APPS = f"/apis/sparkoperator.k8s.io/v1beta2/namespaces/{NAMESPACE}/sparkapplications"
CONFIG_MAPS = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
#: what a wait's failure adds to its message: the app's state, pods and logs
Report = Callable[[], str]
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
POLICIES: Final[dict[str, JsonObj]] = {
    "Never": {"type": "Never"},
    "OnFailure": {
        "type": "OnFailure",
        "onFailureRetries": 1,
        "onFailureRetryInterval": 1,
        "onSubmissionFailureRetries": 0,
    },
}
KILL_POINTS: Final = ("before-files", "mid-write", "after-commit")
#: the job's rows, in PLAIN_PARTITIONS tasks on the executor's one core, one after the other:
#: each task's temp file stays hidden until the job's outcome, so mid-write lasts from the first
#: task's file to the last task's end (about 5 s under the suite's load; the test polls every
#: 100 ms). Every run of every case writes them all once more: more rows only cost time.
ROWS: Final = 500_000


@dataclasses.dataclass
class Protected:
    """The chart's two operator replicas on the node cluster; the app's table and journal under
    ``data``."""

    cluster: KubeCluster
    chart: ChartReplicas
    data: Path


@contextlib.contextmanager
def protected_namespace(cluster: KubeCluster) -> Iterator[Protected]:
    """``spark-jobs`` labelled ``enforce=restricted``; a PersistentVolume (a local directory
    the caller reads) bound to a claim there; sparkguard's chart, its journal and the sidecar's
    allowed root on that directory, its operator the chart's two replicas as processes
    (``sparkguard operator``: the Deployment's environment, the chart's ServiceAccount),
    replica ``a`` the leader. Not under /tmp: sparkguard's containers mount
    their own /tmp (the library volume), and the bench's runtime cannot make a mount point
    inside another container mount (runc would make it in the volume). Also what
    ``benchmarks/recovery.py --real-operator`` runs on."""
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
        # a rerun upstream left unsubmitted is nudged after 15 s, not the chart's 60 s (a
        # normal rerun leaves PENDING_RERUN within a second or two)
        with installed_chart_replicas(cluster, data, operator={"resubmitTimeout": "15s"}) as chart:
            _no_operator_pods(cluster)
            yield Protected(cluster, dataclasses.replace(chart, namespace=NAMESPACE), data)
    finally:
        cluster.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims/{VOLUME}")
        cluster.request("DELETE", f"/api/v1/persistentvolumes/{VOLUME}")
        shutil.rmtree(data)


@pytest.fixture(scope="module")
def protected(kube_node_cluster: KubeCluster) -> Iterator[Protected]:
    """:func:`protected_namespace` on the module's node cluster."""
    with protected_namespace(kube_node_cluster) as done:
        yield done


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


def protected_app(name: str, data: Path, table: Path, *, policy: str = "OnFailure") -> JsonObj:
    """The demo's plain job as a protected SparkApplication: cluster mode, one executor,
    ``policy`` (OnFailure: one retry, 1 s apart); compliant with "restricted" on its own; the
    volume at the same path as on the node (the journal root the chart was given is a path
    there); sparkguard's backoff before a resubmission 1 s."""
    app = spark_app(name, data, "write")
    spec = app["spec"]
    app["metadata"]["labels"] = {appmeta.ENABLED: "true"}
    app["metadata"]["annotations"] = {appmeta.BACKOFF: "1s"}
    spec["mainApplicationFile"] = f"local://{demo.PLAIN_JOB}"
    spec["arguments"] = [str(table), str(ROWS), str(PLAIN_PARTITIONS)]
    spec["restartPolicy"] = POLICIES[policy]
    # spark.kubernetes.executor.deleteOnTermination stays false (spark_app): a driver that
    # shuts down leaves its executor pod, as a SIGKILLed one always does: the worst case
    spec["volumes"] = [{"name": VOLUME, "persistentVolumeClaim": {"claimName": VOLUME}}]
    for role in ("driver", "executor"):
        spec[role]["volumeMounts"] = [{"name": VOLUME, "mountPath": str(data)}]
        spec[role] |= {"podSecurityContext": POD_SECURITY, "securityContext": CONTAINER_SECURITY}
    return app


def driver_jvm(job: Path = demo.PLAIN_JOB) -> int | None:
    """The PID of the driver JVM running ``job`` (Spark's SparkSubmit in client mode, as Spark's
    image runs it in the driver pod; one driver of a job at a time), seen from the node's
    host."""

    def driver(words: list[str]) -> bool:
        submit = "org.apache.spark.deploy.SparkSubmit" in words and "client" in words
        return submit and any(w.endswith(job.name) for w in words)

    return find_process(driver)


def state(cluster: KubeCluster, name: str) -> str:
    app = get(cluster, f"{APPS}/{name}") or {}
    return str(((app.get("status") or {}).get("applicationState") or {}).get("state", ""))


def container_log(cluster: KubeCluster, pod: str, container: str, uid: str = "*") -> str:
    """The log of ``container`` in pod ``pod`` (``uid``: that pod's, not an earlier one's of
    the same name, whose logs the kubelet may not have removed yet)."""
    assert cluster.node is not None
    logs = sorted(cluster.node.pod_logs.glob(f"{NAMESPACE}_{pod}_{uid}/{container}/*.log"))
    return "\n".join(p.read_text(errors="replace") for p in logs)


#: (restartPolicy, where the driver dies, how): the matrix under both policies, the driver's JVM
#: SIGKILLed; the driver pod deleted, OnFailure mid-write; a user's spec edit, Never mid-write
CASES: Final = [
    *((policy, point, "sigkill") for policy in POLICIES for point in KILL_POINTS),
    ("OnFailure", "mid-write", "delete-pod"),
    ("Never", "mid-write", "spec-edit"),
]
#: test-only Hadoop settings of the JVM protocol that hold the driver at a kill point long
#: enough to see it from outside: after the inflight instant and the journal entry, before any
#: task (before-files); after the outcome, between two files of the publication (after-commit)
PAUSES: Final = {
    "before-files": {"spark.hadoop.sparkguard.test.setupPauseMs": "6000"},
    "after-commit": {"spark.hadoop.sparkguard.test.publishPauseMs": "1000"},
}


def _at(point: str, table: Path) -> bool:
    """The first driver is at kill point ``point`` on ``table`` (local files: the volume)."""
    if point == "mid-write":
        return _mid_write(table)
    names = timeline.SPARKGUARD_DIR, "timeline"
    inflight = list(table.joinpath(*names).glob("*.inflight"))
    outcomes = list(table.joinpath(*names).glob("*.outcome"))
    temp = list(table.glob(".part-*.sg-tmp-*"))
    if point == "before-files":
        return bool(inflight) and not outcomes and not list(table.glob("*part-*"))
    # after-commit: the outcome written, the publication (W9a) under way
    return bool(outcomes) and bool(temp)


def _driver_at(cluster: KubeCluster, name: str, table: Path, point: str, report: Report) -> JsonObj:
    """App ``name``'s first driver pod, once it is at kill point ``point`` on ``table``."""
    found: JsonObj = wait_for(
        f"the first driver at {point}",
        lambda: _at(point, table) and get(cluster, f"{PODS}/{name}-driver"),
        timeout=600,
        report=report,
    )
    return found


def _sigkill_driver(name: str, report: Report) -> None:
    """SIGKILL the JVM of app ``name``'s driver (as the OOM killer ends one)."""
    pid = driver_jvm()
    assert pid is not None, report()
    os.kill(pid, signal.SIGKILL)


def _every_row_once(table: Path, job_id: str) -> None:
    """Every row once for a plain directory reader (Spark's rules: "." and "_" files are
    hidden) and for sparkguard's committed-only reader; no temp or uncommitted file; the job's
    one instant on ``table`` is committed (a first write rolled back removed the location it
    created)."""
    plain = ds.dataset(str(table), format="parquet").to_table(columns=["id"])
    ids = plain.column("id").to_pylist()
    assert (len(ids), len(set(ids))) == (ROWS, ROWS)
    assert rows_once(table, rows=ROWS) == (ROWS, 0, 0)
    assert leftovers(table) == []
    assert states_of(table, job_id) == [timeline.State.COMMITTED]


def _deleted_leaving_nothing(
    cluster: KubeCluster, name: str, report: Report, config_maps_before: set[str] | None = None
) -> None:
    """Delete app ``name`` (unless it is gone already) and wait until no pod of it is left,
    nor (given the ConfigMaps there were before it) a ConfigMap."""
    if get(cluster, f"{APPS}/{name}") is not None:
        cluster.request("DELETE", f"{APPS}/{name}")

    def nothing_left() -> bool:
        if pods(cluster, f"sparkoperator.k8s.io/app-name={name}"):
            return False
        return config_maps_before is None or _config_maps(cluster) <= config_maps_before

    wait_for("the app's pods and ConfigMaps to be gone", nothing_left, timeout=120, report=report)


#: upstream's controller as the API server knows it (its ``spark-submit`` uses its kubeconfig)
UPSTREAM: Final = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{RELEASE_NAME}-controller"


def _did_as_upstream_does(
    cluster: KubeCluster, name: str, expected: transitions.Trace, report: Report
) -> list[JsonObj]:
    """The differential test's real side: what upstream's controller did to app ``name`` (its
    status writes and its driver pod actions, from the audit log) is ``expected`` (a scenario
    of the table the stand-in is checked against too, or one only the real operator runs).
    Returns the audit events.

    The API server writes a request's audit event once its response is complete: a state a
    test has just read may not be in the log yet, so the log is read again for a while."""
    deadline = time.monotonic() + 20
    while True:
        events = cluster.audit_events()
        seen = transitions.observed(events, NAMESPACE, name, operator=UPSTREAM)
        if seen == expected or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    print("upstream did:", seen)
    assert seen == expected, report()
    return events


def _config_maps(cluster: KubeCluster) -> set[str]:
    return {c["metadata"]["name"] for c in cluster.request("GET", CONFIG_MAPS)[1]["items"]}


@pytest.mark.parametrize(("policy", "point", "how"), CASES, ids=["-".join(c) for c in CASES])
def test_driver_killed_is_recovered_and_every_row_once(
    protected: Protected, policy: str, point: str, how: str
) -> None:
    """``sigkill``: the driver's JVM SIGKILLed (its executor sees the connection drop and
    exits at once). ``delete-pod``: the driver pod deleted (SIGTERM, then Spark's own
    shutdown); its executor pod stays (the app owns it too) and may outlive the driver into
    the next driver's rollback: the zombie case. ``spec-edit``: a user edits the spec while the
    driver writes (``suspend`` alone, then a conf key): upstream's INVALIDATING deletes the
    driver pod and reruns the app; sparkguard sees no failure.

    OnFailure: upstream reruns the driver itself, and the rerun's rollback initContainer undoes
    the killed write (after-commit: publishes the committed one, R8a). Never: upstream makes the
    app FAILED; sparkguard's operator rolls back and resubmits (a spec change upstream turns
    into a rerun). Either way the unchanged job's rerun commits its write once (after-commit:
    it skips the committed write, ``rerun=skip``)."""
    cluster, data = protected.cluster, protected.data
    name = f"{policy.lower()}-{point}-{how}"
    table = data / name
    config_maps_before = _config_maps(cluster)
    app = protected_app(name, data, table, policy=policy)
    app["spec"]["sparkConf"] |= PAUSES.get(point, {})
    created = protected.chart.create(app)
    conf = created["spec"]["sparkConf"]
    job_id = conf["spark.sparkguard.jobId"]
    # admission injected the rollback initContainer and the JVM layer: nothing in the app
    # asked for them but the opt-in label
    inits = [c["name"] for c in created["spec"]["driver"].get("initContainers") or []]
    assert mutation.ROLLBACK_INIT_NAME in inits, inits
    assert conf[sparkconf.COMMIT_PROTOCOL_KEY] == sparkconf.PROTOCOL_CLASS
    assert conf[sparkconf.JARS_KEY] == mutation.JAR_URI
    report = lambda: node_report(cluster, name)  # noqa: E731
    started = time.monotonic()
    took: dict[str, float] = {}

    first = _driver_at(cluster, name, table, point, report)
    if how == "sigkill":
        _sigkill_driver(name, report)
    elif how == "delete-pod":
        cluster.request("DELETE", f"{PODS}/{name}-driver")
    else:  # spec-edit: suspend alone is no rerun; any other spec field is (upstream's filter)
        for edit in ({"suspend": False}, {"sparkConf": {"spark.sql.shuffle.partitions": "4"}}):
            cluster.request(
                "PATCH",
                f"{APPS}/{name}",
                {"spec": edit},
                content_type="application/merge-patch+json",
            )
    killed_at = time.time()
    took["to the kill"] = time.monotonic() - started
    first_uid = first["metadata"]["uid"]
    zombies = [
        p["metadata"]["name"]
        for p in pods(cluster, f"spark-role=executor,sparkoperator.k8s.io/app-name={name}")
    ]
    print(f"{how} of the driver at {point} at {killed_at:.1f}; its executor pods {zombies}")

    second = wait_for(
        "the next driver pod",
        lambda: (
            (p := get(cluster, f"{PODS}/{name}-driver")) and p["metadata"]["uid"] != first_uid and p
        ),
        timeout=300,
        report=report,
    )
    took["to the next driver pod"] = time.monotonic() - started
    wait_for(
        f"{name} to complete",
        lambda: (
            state(cluster, name) in ("COMPLETED", "FAILED")
            and (policy == "OnFailure" or state(cluster, name) == "COMPLETED")
        ),
        timeout=600,
        report=report,
    )
    took["to COMPLETED"] = time.monotonic() - started
    # what upstream did, every status write and driver pod action (the audit log): the
    # differential test's table. The driver pod deleted writes the same as a SIGKILL: the pod's
    # SIGTERM ends the driver container with an error before the pod is gone, FAILING (a poll
    # of the app misses it)
    scenario = ("spec-edit", "Never") if how == "spec-edit" else ("killed", policy)
    _did_as_upstream_does(cluster, name, transitions.SCENARIOS[scenario], report)
    status = (get(cluster, f"{APPS}/{name}") or {})["status"]
    notes = protected.chart.notes(name)
    reasons = protected.chart.event_reasons(name)
    print("sparkguard's events:", reasons)
    # resubmissions counted: sparkguard's only under Never, exactly one; upstream's retry under
    # OnFailure, exactly one (two execution attempts); a spec edit is upstream's rerun, not a
    # failure: sparkguard does nothing, the counters reset
    recovered = how != "spec-edit"
    if not recovered:
        assert "Resubmitted" not in reasons, reasons
        assert "RollbackStarted" not in reasons, reasons
        assert (status["executionAttempts"], status["submissionAttempts"]) == (1, 1), status
    elif policy == "Never":
        assert reasons.count("Resubmitted") == 1, reasons
        assert notes[appmeta.ATTEMPT] == "1", notes
        assert status["executionAttempts"] == 1, status
    else:
        assert "Resubmitted" not in reasons, reasons
        assert "RollbackStarted" not in reasons, reasons
        assert status["executionAttempts"] == 2, status
    # sparkguard's operator rolled back only under Never, before resubmitting (its record on
    # the app): the killed write, or after-commit the committed one's publication
    last = notes.get(appmeta.LAST_ROLLBACK)
    if policy == "OnFailure" or not recovered:
        assert last is None, notes
    else:
        record = json.loads(last or "{}")
        expected_counts = (0, 1) if point == "after-commit" else (1, 0)
        assert (record.get("rolledBack"), record.get("committed")) == expected_counts, record

    # the next driver's rollback initContainer ran and ended well; under OnFailure it is what
    # undid the killed write (found on the app's volume)
    second_name = second["metadata"]["name"]
    driver = get(cluster, f"{PODS}/{second_name}")
    assert driver is not None
    rollback = {s["name"]: s for s in driver["status"]["initContainerStatuses"]}[
        mutation.ROLLBACK_INIT_NAME
    ]["state"]["terminated"]
    assert rollback["exitCode"] == 0, rollback
    log = container_log(
        cluster, second_name, mutation.ROLLBACK_INIT_NAME, second["metadata"]["uid"]
    )
    print("rollback initContainer:", rollback["startedAt"], rollback["finishedAt"], log[-2000:])
    assert "does not exist yet" not in log, log
    if policy == "OnFailure" and point != "after-commit":
        assert "rolled_back" in log, log
    for zombie in zombies:
        executor_log = container_log(cluster, zombie, "spark-kubernetes-executor")
        print(f"first executor {zombie} log:", executor_log[-1500:])
    # the run that completed: real pods on the node; its executor pod made by its driver (whose
    # pod and the app own it), bound by the scheduler, run by the kubelet, its own pod IP
    done = wait_for(
        "the completed driver pod to end",
        lambda: (
            (p := get(cluster, f"{PODS}/{second_name}"))
            and p["status"].get("phase") in ("Succeeded", "Failed")
            and p
        ),
        timeout=60,
        report=report,
    )
    assert (done["spec"]["nodeName"], done["status"]["phase"]) == (NODE_NAME, "Succeeded")
    selector = f"spark-role=executor,sparkoperator.k8s.io/app-name={name}"
    (executor,) = [p for p in pods(cluster, selector) if p["metadata"]["name"] not in zombies]
    owners = {(r["kind"], r["uid"]) for r in executor["metadata"]["ownerReferences"]}
    assert ("Pod", second["metadata"]["uid"]) in owners, owners
    assert ("SparkApplication", created["metadata"]["uid"]) in owners, owners
    assert executor["spec"]["nodeName"] == NODE_NAME
    assert executor["status"]["podIP"] != done["status"]["podIP"]
    assert status["executorState"][executor["metadata"]["name"]] == "COMPLETED", status

    # every row once, nothing uncommitted; the job's one instant is the rerun's commit (the
    # killed first write's location removed), or after-commit the killed driver's (the rerun
    # skipped its write)
    _every_row_once(table, job_id)
    # deleting the app leaves no pod and no ConfigMap of it
    _deleted_leaving_nothing(cluster, name, report, config_maps_before)
    took["to nothing left"] = time.monotonic() - started
    print("seconds:", {k: round(v, 1) for k, v in took.items()})


QUOTA = "sparkguard-no-pods"


@pytest.mark.parametrize("policy", list(POLICIES))
def test_a_refused_submission_is_recovered_and_every_row_once(
    protected: Protected, policy: str
) -> None:
    """SUBMISSION_FAILED by upstream's real ``spark-submit`` failing: a ResourceQuota of no
    pods in the namespace (a full quota: the commonest refused submission on a cluster) makes
    the API server refuse the driver pod, and is removed once upstream reported the failure.

    OnFailure (one submission retry, 2 s apart): upstream submits again itself; sparkguard
    neither rolls back nor resubmits. Never: upstream makes the app FAILED; sparkguard rolls
    back (nothing: no driver ran) and resubmits once. The app ends COMPLETED, every row once."""
    cluster, data = protected.cluster, protected.data
    name = f"{policy.lower()}-submission-failed"
    table = data / name
    app = protected_app(name, data, table, policy=policy)
    if policy == "OnFailure":
        app["spec"]["restartPolicy"] |= {
            "onSubmissionFailureRetries": 1,
            "onSubmissionFailureRetryInterval": 2,
        }
    app["metadata"]["annotations"][appmeta.BACKOFF] = "2s"
    report = lambda: node_report(cluster, name)  # noqa: E731
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": QUOTA, "namespace": NAMESPACE},
        "spec": {"hard": {"pods": "0"}},
    }
    cluster.apply_manifest([quota])
    try:
        created = protected.chart.create(app)
        # Never: FAILED follows SUBMISSION_FAILED at once (a poll may see only FAILED)
        wait_for(
            "the refused submission",
            lambda: state(cluster, name) in ("SUBMISSION_FAILED", "FAILED"),
            timeout=180,
            report=report,
        )
    finally:
        cluster.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/resourcequotas/{QUOTA}")
    wait_for(
        f"{name} to complete",
        lambda: state(cluster, name) == "COMPLETED",
        timeout=600,
        report=report,
    )

    events = _did_as_upstream_does(
        cluster, name, transitions.SCENARIOS["submission-failed", policy], report
    )
    # the refusal was the API server's, reported through spark-submit's failure
    refused = [
        ((e.get("requestObject") or {}).get("status") or {}).get("applicationState", {})
        for e in events
        if (e.get("objectRef") or {}).get("name") == name
        and (e.get("objectRef") or {}).get("subresource") == "status"
    ]
    messages = [s.get("errorMessage", "") for s in refused if s.get("state") == "SUBMISSION_FAILED"]
    assert any("quota" in m for m in messages), messages
    reasons = protected.chart.event_reasons(name)
    print("events:", reasons)
    if policy == "Never":
        assert reasons.count("Resubmitted") == 1, reasons
    else:
        assert "Resubmitted" not in reasons, reasons
        assert "RollbackStarted" not in reasons, reasons
    _every_row_once(table, created["spec"]["sparkConf"]["spark.sparkguard.jobId"])
    _deleted_leaving_nothing(cluster, name, report)


def test_time_to_live_deletes_a_failed_app_only_after_its_rollback(protected: Protected) -> None:
    """Never and ``timeToLiveSeconds: 1``: the driver SIGKILLed mid-write, upstream makes the
    app FAILED and deletes it a second after its terminationTime, while sparkguard waits out
    its backoff (10 minutes here). sparkguard's finalizer holds the deletion until the job's
    write is rolled back; then the app goes with its pods, and nothing of the killed write is
    left: not a temp file, not the table location it created."""
    cluster, data = protected.cluster, protected.data
    name = "never-ttl"
    table = data / name
    app = protected_app(name, data, table, policy="Never")
    app["spec"]["timeToLiveSeconds"] = 1
    app["metadata"]["annotations"][appmeta.BACKOFF] = "10m"
    created = protected.chart.create(app)
    job_id = created["spec"]["sparkConf"]["spark.sparkguard.jobId"]
    report = lambda: node_report(cluster, name)  # noqa: E731
    _driver_at(cluster, name, table, "mid-write", report)
    _sigkill_driver(name, report)
    held: list[list[str]] = []

    def gone() -> bool:
        found = get(cluster, f"{APPS}/{name}")
        if found is not None and found["metadata"].get("deletionTimestamp"):
            held.append(list(found["metadata"].get("finalizers") or []))
        return found is None

    wait_for(f"{name} to be deleted by its TTL", gone, timeout=300, report=report)
    print("finalizers while deleted:", held[:3])
    events = _did_as_upstream_does(
        cluster, name, transitions.SCENARIOS["ttl-deleted", "Never"], report
    )
    # the deletion was upstream's (its TTL), and it waited for sparkguard's rollback
    deleted_by = [
        e["user"]["username"]
        for e in events
        if e["verb"] == "delete"
        and (e.get("objectRef") or {}).get("resource") == "sparkapplications"
        and (e.get("objectRef") or {}).get("name") == name
    ]
    assert deleted_by, "no deletion of the app was recorded"
    assert set(deleted_by) == {UPSTREAM}, deleted_by
    assert protected.chart.event_reasons(name).count("RolledBackOnDelete") == 1
    assert leftovers(table) == []
    assert states_of(table, job_id) == []  # the rollback removed the location the write made
    _deleted_leaving_nothing(cluster, name, report)


SCHEDULED = f"/apis/sparkoperator.k8s.io/v1beta2/namespaces/{NAMESPACE}/scheduledsparkapplications"
#: what upstream labels each run of a ScheduledSparkApplication with
#: (common.LabelScheduledSparkAppName)
SCHEDULED_APP_LABEL = "sparkoperator.k8s.io/scheduled-app-name"


def test_a_scheduled_run_killed_mid_write_is_recovered_once(protected: Protected) -> None:
    """A ScheduledSparkApplication opted in by its label. Upstream's scheduled controller
    creates each run as ``<name>-<UnixNano>`` with the scheduled app's labels (not its
    annotations) and an owner reference to it (controller.go ``createSparkApplication``);
    sparkguard admits the run as its own job (``<namespace>.<run>``). The first run's driver
    is SIGKILLed mid-write; Never: upstream makes the run FAILED, sparkguard rolls back and
    resubmits the run. The schedule is suspended once the first run exists: under Forbid a
    FAILED run counts as finished, and a second run would append the same rows to the same
    table. The run ends COMPLETED with every row once; deleting the scheduled app takes its run
    and the run's pods (the garbage collector, once sparkguard's finalizer let the run go)."""
    cluster, data = protected.cluster, protected.data
    name = "scheduled"
    table = data / name
    template = protected_app(name, data, table, policy="Never")
    cluster.request(
        "POST",
        SCHEDULED,
        {
            "apiVersion": "sparkoperator.k8s.io/v1beta2",
            "kind": "ScheduledSparkApplication",
            "metadata": {"name": name, "labels": {**template["metadata"]["labels"], "team": "a"}},
            "spec": {
                "schedule": "@every 3s",
                "concurrencyPolicy": "Forbid",
                "template": template["spec"],
            },
        },
    )

    def runs() -> list[JsonObj]:
        found = cluster.request("GET", f"{APPS}?labelSelector={SCHEDULED_APP_LABEL}={name}")[1]
        return list(found["items"])

    first = wait_for("the first run", lambda: (r := runs()) and r[0], timeout=120)
    merge = "application/merge-patch+json"
    cluster.request("PATCH", f"{SCHEDULED}/{name}", {"spec": {"suspend": True}}, content_type=merge)
    run = first["metadata"]["name"]
    assert run.removeprefix(f"{name}-").isdigit(), run
    assert first["metadata"]["labels"]["team"] == "a"
    assert first["metadata"]["ownerReferences"][0]["kind"] == "ScheduledSparkApplication"
    # admitted as its own job, with the rollback initContainer and the JVM layer
    conf = first["spec"]["sparkConf"]
    job_id = conf["spark.sparkguard.jobId"]
    assert job_id == f"{NAMESPACE}.{run}", conf
    assert conf[sparkconf.COMMIT_PROTOCOL_KEY] == sparkconf.PROTOCOL_CLASS
    inits = [c["name"] for c in first["spec"]["driver"].get("initContainers") or []]
    assert mutation.ROLLBACK_INIT_NAME in inits, inits
    # sparkguard's options are annotations, which no run gets: the default backoff (30 s) is
    # what a user's run waits; annotate the run, as a user could, to keep the test short. Once
    # upstream wrote SUBMITTED: a write while its first spark-submit runs makes it submit twice
    # (test_a_write_to_the_app_while_upstream_submits_it_is_recovered)
    wait_for(
        "the run submitted",
        lambda: state(cluster, run) in ("SUBMITTED", "RUNNING"),
        timeout=120,
    )
    cluster.request(
        "PATCH",
        f"{APPS}/{run}",
        {"metadata": {"annotations": {appmeta.BACKOFF: "1s"}}},
        content_type=merge,
    )
    report = lambda: node_report(cluster, run)  # noqa: E731
    _driver_at(cluster, run, table, "mid-write", report)
    _sigkill_driver(run, report)
    wait_for(
        f"{run} to complete",
        lambda: state(cluster, run) == "COMPLETED",
        timeout=600,
        report=report,
    )
    _did_as_upstream_does(cluster, run, transitions.SCENARIOS["killed", "Never"], report)
    reasons = protected.chart.event_reasons(run)
    assert reasons.count("Resubmitted") == 1, reasons
    assert [r["metadata"]["name"] for r in runs()] == [run]  # suspended: no second run
    _every_row_once(table, job_id)

    cluster.request("DELETE", f"{SCHEDULED}/{name}")
    wait_for(
        "the run to go with its scheduled app",
        lambda: get(cluster, f"{APPS}/{run}") is None,
        timeout=120,
        report=report,
    )
    _deleted_leaving_nothing(cluster, run, report)


def _upstream_submitting(name: str) -> int | None:
    """The PID of the JVM of upstream's ``spark-submit --deploy-mode cluster`` of app
    ``name`` (a host process of its controller), or None."""

    def submit(words: list[str]) -> bool:
        cluster = "org.apache.spark.deploy.SparkSubmit" in words and "cluster" in words
        return cluster and "--name" in words and words[words.index("--name") + 1] == name

    return find_process(submit)


def test_a_write_to_the_app_while_upstream_submits_it_is_recovered(protected: Protected) -> None:
    """Never. Anyone writes to the app (a label, an annotation: a user's kubectl, a GitOps
    controller) while upstream's first ``spark-submit`` of it runs (held there with SIGSTOP,
    so the write lands in that window every time). Upstream's status write after the submission
    then conflicts, and reconcileNewSparkApplication's retry runs spark-submit again, which
    fails (the driver pod exists): SUBMISSION_FAILED, then FAILED, while the first driver runs.
    sparkguard rolls back and resubmits; upstream's INVALIDATING deletes the first driver pod,
    and the rerun waits in PENDING_RERUN for that pod's deletion event, which upstream drops
    (the pod names the first submission, the app the second: event_handler.go). sparkguard
    nudges the rerun after its resubmit timeout (15 s here); COMPLETED, every row once."""
    cluster, data = protected.cluster, protected.data
    name = "never-written-while-submitted"
    table = data / name
    created = protected.chart.create(protected_app(name, data, table, policy="Never"))
    job_id = created["spec"]["sparkConf"]["spark.sparkguard.jobId"]
    report = lambda: node_report(cluster, name)  # noqa: E731
    submit = wait_for("upstream's spark-submit", lambda: _upstream_submitting(name), timeout=120)
    os.kill(submit, signal.SIGSTOP)
    try:
        cluster.request(
            "PATCH",
            f"{APPS}/{name}",
            {"metadata": {"annotations": {"example.com/owner": "team-a"}}},
            content_type="application/merge-patch+json",
        )
    finally:
        os.kill(submit, signal.SIGCONT)
    wait_for(
        f"{name} to complete",
        lambda: state(cluster, name) == "COMPLETED",
        timeout=600,
        report=report,
    )
    _did_as_upstream_does(cluster, name, transitions.SUBMITTED_TWICE, report)
    reasons = protected.chart.event_reasons(name)
    print("sparkguard's events:", reasons)
    assert reasons.count("Resubmitted") == 1, reasons
    assert reasons.count("ResubmitRetried") == 1, reasons
    assert protected.chart.notes(name)[appmeta.ATTEMPT] == "1"
    _every_row_once(table, job_id)
    _deleted_leaving_nothing(cluster, name, report)


def _executor_jvm(cluster: KubeCluster, name: str) -> int | None:
    """The PID of the JVM of app ``name``'s executor pod (named after Spark's app name, not
    the SparkApplication's: found by its label), seen from the node's host."""
    selector = f"spark-role=executor,sparkoperator.k8s.io/app-name={name}"
    names = {p["metadata"]["name"] for p in pods(cluster, selector)}

    def executor(words: list[str]) -> bool:
        backend = "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend" in words
        return backend and "--podName" in words and words[words.index("--podName") + 1] in names

    return find_process(executor) if names else None


def test_an_executor_killed_mid_write_is_replaced_and_every_row_once(protected: Protected) -> None:
    """The executor's JVM SIGKILLed while its tasks write (the OOM killer, a node lost): Spark's
    driver asks for a new executor pod and runs the lost tasks again there; the killed
    attempts' files are never committed (the protocol commits one attempt per task). No rerun:
    upstream writes no failure, sparkguard does nothing. COMPLETED, every row once."""
    cluster, data = protected.cluster, protected.data
    name = "onfailure-executor-killed"
    table = data / name
    created = protected.chart.create(protected_app(name, data, table, policy="OnFailure"))
    job_id = created["spec"]["sparkConf"]["spark.sparkguard.jobId"]
    report = lambda: node_report(cluster, name)  # noqa: E731
    pid = wait_for(
        "the executor at mid-write",
        lambda: _mid_write(table) and _executor_jvm(cluster, name),
        timeout=600,
        report=report,
    )
    os.kill(pid, signal.SIGKILL)
    selector = f"spark-role=executor,sparkoperator.k8s.io/app-name={name}"
    (lost,) = [p["metadata"]["name"] for p in pods(cluster, selector)]
    wait_for(
        f"{name} to complete",
        lambda: state(cluster, name) == "COMPLETED",
        timeout=600,
        report=report,
    )
    _did_as_upstream_does(cluster, name, transitions.UNDISTURBED, report)
    executors = (get(cluster, f"{APPS}/{name}") or {})["status"]["executorState"]
    print("executors:", executors)
    assert executors.pop(lost) == "FAILED", executors
    assert list(executors.values()) == ["COMPLETED"], executors
    reasons = protected.chart.event_reasons(name)
    assert not {"RollbackStarted", "Resubmitted"} & set(reasons), reasons
    _every_row_once(table, job_id)
    _deleted_leaving_nothing(cluster, name, report)


STREAM_JOB: Final = Path(__file__).resolve().with_name("node_stream_job.py")
#: the stream's input: files of STREAM_ROWS rows each, one file per micro-batch
STREAM_FILES: Final = 4
STREAM_ROWS: Final = 1_000


def _sink_files(sink: Path) -> tuple[set[str], set[str]]:
    """The data files Spark's file sink committed (its ``_spark_metadata`` log: ``add``
    entries), and the data files a plain directory reader sees (neither ``.`` nor ``_``
    names, anywhere under ``sink``); both as paths relative to ``sink``."""
    committed: set[str] = set()
    for log in sorted((sink / "_spark_metadata").glob("*")):
        if log.name.startswith(".") or not log.is_file():
            continue
        for line in log.read_text().splitlines()[1:]:  # the first line is the version
            entry = json.loads(line)
            if entry.get("action") == "add":
                path = Path(entry["path"].removeprefix("file:"))
                committed.add(str(path.relative_to(sink)))
    plain = {
        str(f.relative_to(sink))
        for f in sink.rglob("*.parquet")
        if not any(part.startswith((".", "_")) for part in f.relative_to(sink).parts)
    }
    return committed, plain


def test_a_streaming_query_killed_mid_batch_resumes_and_every_row_once(
    protected: Protected,
) -> None:
    """OnFailure. A plain Structured Streaming job (``node_stream_job.py``: a parquet file
    source, one file per micro-batch, Spark's parquet file sink, ``availableNow``) under the JVM
    layer admission injected (its checkpoint file manager and streaming commit protocol). The
    driver is SIGKILLed while a batch after the first is in flight (its offsets logged, its
    commit not). Upstream's retry runs the next driver: its rollback initContainer undoes what
    the killed batch left, the query resumes from its checkpoint and writes the rest. COMPLETED;
    the sink holds every input row once, for Spark's reader (the files its ``_spark_metadata``
    lists) and for a plain directory reader, which sees no other file; no temp file is left."""
    cluster, data = protected.cluster, protected.data
    name = "onfailure-stream-sigkill"
    source, sink, checkpoint = (data / name / part for part in ("in", "out", "checkpoint"))
    source.mkdir(parents=True)
    for i in range(STREAM_FILES):
        rows = pa.table({"n": pa.array(range(i * STREAM_ROWS, (i + 1) * STREAM_ROWS), pa.int64())})
        pq.write_table(rows, source / f"part-{i}.parquet")
    app = protected_app(name, data, sink, policy="OnFailure")
    app["spec"]["mainApplicationFile"] = f"local://{STREAM_JOB}"
    app["spec"]["arguments"] = [str(source), str(sink), str(checkpoint), "2"]
    created = protected.chart.create(app)
    conf = created["spec"]["sparkConf"]
    assert conf[sparkconf.CHECKPOINT_MANAGER_KEY] == sparkconf.CHECKPOINT_MANAGER_CLASS, conf
    report = lambda: node_report(cluster, name)  # noqa: E731

    def mid_batch() -> bool:
        """A batch after the first is logged, not committed, and its tasks have files open
        (the JVM protocol's hidden temp names: each task opens its file, then waits for its
        rows, which the job's tasks hold back PAUSE_S seconds)."""
        offsets = {p.name for p in (checkpoint / "offsets").glob("[0-9]*")}
        commits = {p.name for p in (checkpoint / "commits").glob("[0-9]*")}
        if not any(b != "0" and b not in commits for b in offsets):
            return False
        # the batch's write undecided: an instant the timeline reads as inflight (a temp file
        # also lives through the publication after the outcome, which a rollback rolls
        # forward, and through an abort: not the case this test kills)
        instants = timeline.timeline_for(str(sink)).statuses() if sink.exists() else []
        undecided = any(s.state is timeline.State.INFLIGHT for s in instants)
        return undecided and any(".sg-tmp-" in p.name for p in sink.rglob("*"))

    wait_for("a batch after the first in flight", mid_batch, timeout=600, report=report)
    pid = wait_for("the driver's JVM", lambda: driver_jvm(STREAM_JOB), timeout=30, report=report)
    os.kill(pid, signal.SIGKILL)
    wait_for(
        f"{name} to complete",
        lambda: state(cluster, name) == "COMPLETED",
        timeout=600,
        report=report,
    )
    _did_as_upstream_does(cluster, name, transitions.SCENARIOS["killed", "OnFailure"], report)
    # the next driver's rollback initContainer undid the killed batch's write
    log = container_log(cluster, f"{name}-driver", mutation.ROLLBACK_INIT_NAME)
    assert "rolled_back" in log, log
    committed, plain = _sink_files(sink)
    assert plain == committed, (sorted(plain - committed), sorted(committed - plain))
    ids = ds.dataset([str(sink / f) for f in sorted(committed)], format="parquet")
    values = ids.to_table(columns=["n"]).column("n").to_pylist()
    total = STREAM_FILES * STREAM_ROWS
    assert (len(values), len(set(values))) == (total, total)
    temp = [str(p) for p in sink.rglob("*") if ".sg-tmp-" in p.name]
    assert temp == [], temp
    _deleted_leaving_nothing(cluster, name, report)


HOOKS = "/apis/admissionregistration.k8s.io/v1"


@contextlib.contextmanager
def upstream_webhooks_off(cluster: KubeCluster) -> Iterator[None]:
    """spark-operator installed with ``webhook.enable=false``: its webhook configurations
    gone (the pod webhook and the app defaulter), put back as they were afterwards."""
    saved: list[tuple[str, JsonObj]] = []
    for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        for item in cluster.request("GET", f"{HOOKS}/{kind}")[1]["items"]:
            if item["metadata"]["name"].startswith(RELEASE_NAME):
                saved.append((kind, item))
                cluster.request("DELETE", f"{HOOKS}/{kind}/{item['metadata']['name']}")
    try:
        yield
    finally:
        for kind, item in saved:
            meta = {k: item["metadata"][k] for k in ("name", "labels") if k in item["metadata"]}
            cluster.request("POST", f"{HOOKS}/{kind}", {**item, "metadata": meta})


def test_without_upstreams_pod_webhook_the_app_is_reported_unprotected(
    protected: Protected,
) -> None:
    """Upstream's webhook off (its chart's ``webhook.enable=false``): the driver pod runs
    without what sparkguard's admission put in the app (the rollback initContainer, the marker
    sidecar, their volumes: only upstream's pod webhook copies them into pods; the app's own
    security context and volume come through a pod template). sparkguard's operator sees the
    pod and reports the app unprotected (a Warning Event naming the fix, two annotations).
    Never, max-retries 0: if the job fails for lack of its sidecar, sparkguard rolls its write
    back and gives up; either way no reader sees an uncommitted row."""
    cluster, data, chart = protected.cluster, protected.data, protected.chart
    name = "never-no-webhook"
    table = data / name
    app = protected_app(name, data, table, policy="Never")
    app["metadata"]["annotations"][appmeta.MAX_RETRIES] = "0"
    # Without the webhook nothing of spec.driver/executor reaches the pods but what Spark's own
    # conf carries: "restricted" would refuse them, and the volume would be missing. A pod
    # template (spark.kubernetes.*.podTemplateFile, which upstream writes from spec.*.template)
    # is how such a platform gives pods their security context and volumes.
    for role in ("driver", "executor"):
        container = {
            "name": f"spark-kubernetes-{role}",
            "securityContext": CONTAINER_SECURITY,
            "volumeMounts": [{"name": VOLUME, "mountPath": str(data)}],
        }
        app["spec"][role]["template"] = {
            "spec": {
                "securityContext": POD_SECURITY,
                "containers": [container],
                "volumes": app["spec"]["volumes"],
            }
        }
    report = lambda: node_report(cluster, name)  # noqa: E731
    with upstream_webhooks_off(cluster):
        created = chart.create(app)
        job_id = created["spec"]["sparkConf"]["spark.sparkguard.jobId"]
        driver = wait_for(
            "the driver pod",
            lambda: get(cluster, f"{PODS}/{name}-driver"),
            timeout=300,
            report=report,
        )
    inits = [c["name"] for c in driver["spec"].get("initContainers") or []]
    assert mutation.ROLLBACK_INIT_NAME not in inits, inits
    notes = wait_for(
        "the app reported unprotected",
        lambda: (n := chart.notes(name)).get(appmeta.PROTECTION) == "unprotected" and n,
        timeout=180,
        report=report,
    )
    assert "webhook.enable=true" in notes[appmeta.PROTECTION_REASON], notes
    # the Event is posted after the annotations
    wait_for("the Unprotected event", lambda: "Unprotected" in chart.event_reasons(name))
    final = wait_for(
        f"{name} to end",
        lambda: (
            (
                (now := state(cluster, name)) == "COMPLETED"
                or (now == "FAILED" and chart.notes(name).get(appmeta.PHASE) == "Exhausted")
            )
            and now
        ),
        timeout=600,
        report=report,
    )
    print(f"{name} ended {final}; sparkguard's phase {chart.notes(name).get(appmeta.PHASE)}")
    # a plain reader sees the write whole or not at all, and nothing uncommitted stays
    assert leftovers(table) == []
    if table.exists() and final == "COMPLETED":
        assert rows_once(table, rows=ROWS) == (ROWS, 0, 0)
    else:
        assert timeline.State.COMMITTED not in states_of(table, job_id)
        plain = [p for p in table.rglob("*.parquet") if not p.name.startswith((".", "_"))]
        assert plain == [], plain
    _deleted_leaving_nothing(cluster, name, report)


def test_the_leader_killed_mid_recovery_the_other_replica_finishes_it_once(
    protected: Protected,
) -> None:
    """Never; the driver SIGKILLed mid-write; replica ``a``, the leader, SIGKILLed while it
    recovers the app (Recovering or RolledBack). Replica ``b`` takes the Lease and, once the
    claim expired, the recovery: the rollback again (idempotent), one resubmission. COMPLETED,
    every row once. Last in the module: replica ``a`` stays dead."""
    cluster, data, chart = protected.cluster, protected.data, protected.chart
    assert chart.lease_holder().startswith(f"{chart.release.name}-operator-a-")
    name = "never-leader-killed"
    table = data / name
    app = protected_app(name, data, table, policy="Never")
    # long enough for the kill to land before the resubmission, whatever the timing
    app["metadata"]["annotations"][appmeta.BACKOFF] = "4s"
    created = protected.chart.create(app)
    job_id = created["spec"]["sparkConf"]["spark.sparkguard.jobId"]
    report = lambda: f"{node_report(cluster, name)}\n{chart.output()}"  # noqa: E731
    _driver_at(cluster, name, table, "mid-write", report)
    _sigkill_driver(name, report)
    killed_in = wait_for(
        "replica a recovering the app",
        lambda: (
            chart.notes(name).get(appmeta.PHASE) in ("Recovering", "RolledBack")
            and chart.notes(name)[appmeta.PHASE]
        ),
        timeout=180,
        report=report,
    )
    chart.processes["a"].send_signal(signal.SIGKILL)
    print("replica a SIGKILLed in", killed_in)
    wait_for(
        f"{name} to complete",
        lambda: state(cluster, name) == "COMPLETED",
        timeout=600,
        report=report,
    )
    assert chart.processes["a"].wait(10) == -signal.SIGKILL
    assert chart.lease_holder().startswith(f"{chart.release.name}-operator-b-")
    _did_as_upstream_does(cluster, name, transitions.SCENARIOS["killed", "Never"], report)
    notes, reasons = chart.notes(name), chart.event_reasons(name)
    assert reasons.count("Resubmitted") == 1, reasons
    assert notes[appmeta.ATTEMPT] == "1", notes
    assert (get(cluster, f"{APPS}/{name}") or {})["status"]["executionAttempts"] == 1
    _every_row_once(table, job_id)
    _deleted_leaving_nothing(cluster, name, report)
