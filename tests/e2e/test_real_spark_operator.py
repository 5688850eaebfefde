"""Upstream's Kubeflow spark-operator on the bench, without sparkguard.

The cluster (``kube_cluster``, ``tests/kubebench/cluster.py``) runs upstream's own controller
and webhook (release v2.5.2, built from its source), the real kube-controller-manager and
kube-scheduler. The controller runs the real ``spark-submit --deploy-mode cluster`` from the
PySpark wheel; there is no kubelet, so a test plays the node's part by patching the driver
pod's status, and pods are never bound (no Node: the scheduler reports them Unschedulable).
"""

from __future__ import annotations

import json
import ssl
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.podstatus import run_then_exit, wait_for
from tests.kubebench.bench import JsonObj, KubeApiError
from tests.kubebench.cluster import KubeCluster
from tests.kubebench.fixtures import CLUSTER_JOB_NAMESPACE

pytestmark = pytest.mark.kube

NAMESPACE = CLUSTER_JOB_NAMESPACE
APPS = f"/apis/sparkoperator.k8s.io/v1beta2/namespaces/{NAMESPACE}/sparkapplications"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
#: a toleration only upstream's pod webhook puts on the driver pod (spark-submit cannot)
WEBHOOK_TOLERATION = {"key": "sparkguard.io/test", "operator": "Exists", "effect": "NoSchedule"}


def spark_pi(name: str, restart_policy: JsonObj) -> JsonObj:
    """A SparkApplication as upstream's examples write one (SparkPi), run as the chart's
    Spark ServiceAccount."""
    return {
        "apiVersion": "sparkoperator.k8s.io/v1beta2",
        "kind": "SparkApplication",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "type": "Scala",
            "mode": "cluster",
            "image": "docker.io/library/spark:4.0.0",
            "sparkVersion": "4.0.0",
            "mainClass": "org.apache.spark.examples.SparkPi",
            "mainApplicationFile": "local:///opt/spark/examples/jars/spark-examples.jar",
            "restartPolicy": restart_policy,
            "driver": {
                "cores": 1,
                "memory": "512m",
                "serviceAccount": "spark-operator-spark",
                "tolerations": [WEBHOOK_TOLERATION],
            },
            "executor": {"instances": 1, "cores": 1, "memory": "512m"},
        },
    }


class StateWatch:
    """Every ``applicationState.state`` an app goes through, in order, from a watch on it
    (a poll would miss FAILING: upstream writes FAILED a few milliseconds later)."""

    def __init__(self, cluster: KubeCluster, name: str) -> None:
        self.states: list[str] = []
        self._url = f"{cluster.server}{APPS}?" + urllib.parse.urlencode(
            {"watch": "1", "fieldSelector": f"metadata.name={name}", "timeoutSeconds": "1"}
        )
        self._token = cluster.admin_token
        self._context = ssl.create_default_context(cafile=cluster.ca_file)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watch-{name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(10)

    def _run(self) -> None:
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=self._context)
        )
        version = ""
        while not self._stopped.is_set():
            url = self._url + (f"&resourceVersion={version}" if version else "")
            request = urllib.request.Request(  # noqa: S310 - https://127.0.0.1 only
                url, headers={"Authorization": f"Bearer {self._token}"}
            )
            with opener.open(request, timeout=30) as stream:
                for line in stream:  # one event per line, until timeoutSeconds
                    event = json.loads(line)
                    if event["type"] == "ERROR":  # e.g. 410 Gone: list again
                        version = ""
                        break
                    obj = event["object"]
                    version = obj["metadata"]["resourceVersion"]
                    status = obj.get("status") or {}
                    state = (status.get("applicationState") or {}).get("state")
                    if state and (not self.states or self.states[-1] != state):
                        self.states.append(state)


class App:
    """One SparkApplication on the cluster: its status, driver pod and every state it had."""

    def __init__(self, cluster: KubeCluster, name: str) -> None:
        self.cluster = cluster
        self.name = name
        self._watch = StateWatch(cluster, name)

    @property
    def states(self) -> list[str]:
        """Every distinct applicationState.state so far, in order."""
        return list(self._watch.states)

    def stop_watching(self) -> None:
        self._watch.stop()

    def get(self) -> JsonObj:
        _, app = self.cluster.request("GET", f"{APPS}/{self.name}")
        return dict(app)

    def state(self) -> str:
        return str((self.get().get("status") or {}).get("applicationState", {}).get("state", ""))

    def wait_state(self, state: str, *, timeout: float = 90.0) -> JsonObj:
        wait_for(
            f"{self.name} to be {state} (seen {self.states})",
            lambda: self.state() == state,
            timeout=timeout,
        )
        return self.get()

    def driver_pod(self) -> JsonObj | None:
        try:
            _, pod = self.cluster.request("GET", f"{PODS}/{self.name}-driver")
        except KubeApiError as exc:
            if exc.status == 404:
                return None
            raise
        return dict(pod)

    def wait_driver_pod(self, *, other_than: str | None = None) -> JsonObj:
        """The driver pod once it exists (a new one: uid not ``other_than``) and the app's
        status names its submission (the controller writes it when spark-submit returned)."""

        def new_pod() -> JsonObj | None:
            status = self.get().get("status") or {}
            pod = self.driver_pod()
            if pod is None or pod["metadata"]["uid"] == other_than:
                return None
            submission = pod["metadata"]["labels"].get("sparkoperator.k8s.io/submission-id")
            return pod if status.get("submissionID") == submission else None

        found: JsonObj = wait_for(f"{self.name}'s driver pod", new_pod)
        return found

    def end_driver(self, pod: JsonObj, *, exit_code: int = 1) -> None:
        """The kubelet's part: the driver container runs, then exits with ``exit_code``."""
        running, failed = run_then_exit(pod, exit_code=exit_code)
        for status in (running, failed):
            self.cluster.request(
                "PATCH",
                f"{PODS}/{pod['metadata']['name']}/status",
                {"status": status},
                content_type="application/merge-patch+json",
            )
            if status is running:
                self.wait_state("RUNNING")

    def owned_by_driver(self, pod: JsonObj) -> dict[str, list[str]]:
        """The ConfigMaps, Services and NetworkPolicies whose ownerReference is ``pod`` (what
        spark-submit made for that driver)."""
        uid = pod["metadata"]["uid"]
        owned: dict[str, list[str]] = {}
        for kind, path in (
            ("ConfigMap", f"/api/v1/namespaces/{NAMESPACE}/configmaps"),
            ("Service", f"/api/v1/namespaces/{NAMESPACE}/services"),
            ("NetworkPolicy", f"/apis/networking.k8s.io/v1/namespaces/{NAMESPACE}/networkpolicies"),
        ):
            _, items = self.cluster.request("GET", path)
            owned[kind] = sorted(
                item["metadata"]["name"]
                for item in items["items"]
                if any(ref["uid"] == uid for ref in item["metadata"].get("ownerReferences") or [])
            )
        return owned

    def wait_owned_by_driver(self, pod: JsonObj) -> dict[str, list[str]]:
        """:meth:`owned_by_driver` once there is one of each kind."""

        def both() -> dict[str, list[str]] | None:
            owned = self.owned_by_driver(pod)
            return owned if all(owned.values()) else None

        found: dict[str, list[str]] = wait_for(f"spark-submit's objects for {self.name}", both)
        return found

    def delete_and_wait_gone(self) -> None:
        """Delete the app; the garbage collector (kube-controller-manager) deletes what it
        owns, and what that owns in turn: nothing of it is left in the namespace."""
        self.cluster.request("DELETE", f"{APPS}/{self.name}")
        wait_for(f"{self.name} and everything it owns to be gone", self._nothing_left)

    def _nothing_left(self) -> bool:
        for path in (
            APPS,
            PODS,
            f"/api/v1/namespaces/{NAMESPACE}/configmaps",
            f"/api/v1/namespaces/{NAMESPACE}/services",
            f"/apis/networking.k8s.io/v1/namespaces/{NAMESPACE}/networkpolicies",
        ):
            _, items = self.cluster.request("GET", path)
            if any(i["metadata"]["name"].startswith(self.name) for i in items["items"]):
                return False
        return True


@pytest.fixture
def app_factory(kube_cluster: KubeCluster) -> Iterator[Callable[[str, JsonObj], App]]:
    """Apply apps; each is deleted at the end, with everything it owns."""
    made: list[App] = []

    def make(name: str, restart_policy: JsonObj) -> App:
        app = App(kube_cluster, name)  # watching before the app exists: every state
        made.append(app)
        kube_cluster.apply_manifest(spark_pi(name, restart_policy))
        return app

    yield make
    for app in made:
        app.stop_watching()
        app.delete_and_wait_gone()


def assert_submitted_by_spark_submit(app: App, pod: JsonObj) -> None:
    """What the real spark-submit made, what upstream's webhook added, where the scheduler
    left the pod."""
    meta = pod["metadata"]
    labels = meta["labels"]
    assert labels["spark-role"] == "driver"
    assert labels["sparkoperator.k8s.io/app-name"] == app.name
    assert labels["sparkoperator.k8s.io/launched-by-spark-operator"] == "true"
    status = app.get()["status"]
    assert labels["sparkoperator.k8s.io/submission-id"] == status["submissionID"]
    assert status["driverInfo"]["podName"] == meta["name"]
    # upstream's pod webhook: the owner reference to the app and the driver's tolerations
    owners = [(r["kind"], r["name"]) for r in meta.get("ownerReferences") or []]
    assert ("SparkApplication", app.name) in owners
    assert WEBHOOK_TOLERATION in pod["spec"]["tolerations"]
    # spark-submit's ConfigMaps (spark.properties; the executors' pod template), the driver's
    # headless Service and its executors' NetworkPolicy, owned by the driver pod
    owned = app.wait_owned_by_driver(pod)
    assert any(name.endswith("-driver-svc") for name in owned["Service"]), owned
    # upstream's pod templates of this submission stayed in the controller's own /tmp
    assert not (Path("/tmp/spark") / status["submissionID"]).exists()
    # kube-scheduler saw it: no Node to bind it to
    wait_for(
        "the scheduler to report the driver pod unschedulable",
        lambda: _unschedulable(app, meta["name"]),
    )


def _unschedulable(app: App, pod_name: str) -> bool:
    _, pod = app.cluster.request("GET", f"{PODS}/{pod_name}")
    conditions = pod.get("status", {}).get("conditions") or []
    return any(
        c["type"] == "PodScheduled"
        and c["status"] == "False"
        and c.get("reason") == "Unschedulable"
        for c in conditions
    )


def test_never_a_failed_driver_fails_the_app(app_factory: Callable[[str, JsonObj], App]) -> None:
    """restartPolicy Never: upstream's controller submits with spark-submit; the driver's
    failure makes the app FAILED, with the exit code in its error message."""
    app = app_factory("pi-never", {"type": "Never"})
    pod = app.wait_driver_pod()
    assert_submitted_by_spark_submit(app, pod)

    app.end_driver(pod, exit_code=3)
    status = app.wait_state("FAILED")["status"]
    assert "ExitCode: 3" in status["applicationState"]["errorMessage"]
    assert app.states == ["SUBMITTED", "RUNNING", "FAILING", "FAILED"]
    assert app.driver_pod() is not None  # Never: the failed driver pod stays


def test_on_failure_reruns_once_then_fails(app_factory: Callable[[str, JsonObj], App]) -> None:
    """restartPolicy OnFailure with one retry: the failed driver pod is deleted (and with it,
    by the garbage collector, what spark-submit made for it), the app goes PENDING_RERUN and
    spark-submit makes a new driver pod with a new submission id; its failure uses the
    budget up: FAILED."""
    app = app_factory(
        "pi-onfailure",
        {"type": "OnFailure", "onFailureRetries": 1, "onFailureRetryInterval": 1},
    )
    first = app.wait_driver_pod()
    first_submission = app.get()["status"]["submissionID"]
    owned_first = app.wait_owned_by_driver(first)

    app.end_driver(first)
    second = app.wait_driver_pod(other_than=first["metadata"]["uid"])
    assert_submitted_by_spark_submit(app, second)
    status = app.get()["status"]
    assert status["submissionID"] != first_submission
    assert status["executionAttempts"] == 2
    assert "PENDING_RERUN" in app.states, app.states
    # the garbage collector removed what the first driver owned
    wait_for(
        f"the first driver's {owned_first} to be garbage-collected",
        lambda: not any(app.owned_by_driver(first).values()),
    )

    app.end_driver(second)
    app.wait_state("FAILED")
    assert app.states == [
        *("SUBMITTED", "RUNNING", "FAILING", "PENDING_RERUN"),
        *("SUBMITTED", "RUNNING", "FAILING", "FAILED"),
    ]
