"""The Apache Spark Kubernetes Operator (spark.apache.org/v1) on the bench, without sparkguard.

The bench (``apache_operator_bench``, ``tests/kubebench/apache.py``) runs upstream's operator,
release 1.0.0 built from its source, with the chart's properties and RBAC and the release's
CRDs. Upstream's operator builds the driver pod itself (Spark's KubernetesDriverBuilder, in its
own JVM: no spark-submit process). There is no kubelet: a test plays the node's part by
patching the driver pod's status, as ``test_real_spark_operator.py`` does for Kubeflow's.

What these tests pin is compared with the stand-in's model (``apache-model.md``) in
``README.md`` beside this file ("The Apache operator, real and modelled").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.e2e.podstatus import run_then_exit, wait_for
from tests.kubebench.apache import ApacheOperatorBench
from tests.kubebench.bench import JsonObj, KubeApiError
from tests.kubebench.fixtures import APACHE_JOB_NAMESPACE

pytestmark = pytest.mark.kube

NAMESPACE = APACHE_JOB_NAMESPACE
APPS = f"/apis/spark.apache.org/v1/namespaces/{NAMESPACE}/sparkapplications"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
FINALIZER = "sparkapplications.spark.apache.org/finalizer"
#: the states an attempt goes through before its driver fails: DriverRequested (AppInitStep
#: created the pod), DriverStarted and DriverReady (the start and ready observers, one status
#: write, once the Spark container is ready), RunningHealthy (AppRunningStep at the next
#: reconcile: no instanceConfig, so no executor threshold)
STARTED = ["DriverRequested", "DriverStarted", "DriverReady", "RunningHealthy"]


def spark_pi(name: str, tolerations: JsonObj) -> JsonObj:
    """A SparkApplication as upstream's examples/pi.yaml writes one, run as the chart's Spark
    ServiceAccount."""
    return {
        "apiVersion": "spark.apache.org/v1",
        "kind": "SparkApplication",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "mainClass": "org.apache.spark.examples.SparkPi",
            "jars": "local:///opt/spark/examples/jars/spark-examples.jar",
            "sparkConf": {
                "spark.kubernetes.authenticate.driver.serviceAccountName": "spark",
                "spark.kubernetes.container.image": "apache/spark:4.2.0-scala",
            },
            "applicationTolerations": tolerations,
            "runtimeVersions": {"sparkVersion": "4.2.0"},
        },
    }


def history(state_history: JsonObj | None) -> list[str]:
    """A ``stateTransitionHistory`` map (keys "0", "1", …) as its states, in key order."""
    entries = state_history or {}
    return [entries[k]["currentStateSummary"] for k in sorted(entries, key=int)]


class App:
    """One SparkApplication on the bench: its status and its driver pods."""

    def __init__(self, bench: ApacheOperatorBench, name: str) -> None:
        self.bench = bench
        self.name = name

    def get(self) -> JsonObj:
        _, app = self.bench.request("GET", f"{APPS}/{self.name}")
        return dict(app)

    def status(self) -> JsonObj:
        return dict(self.get().get("status") or {})

    def state(self) -> str:
        return str((self.status().get("currentState") or {}).get("currentStateSummary", ""))

    def wait_state(self, state: str, *, timeout: float = 90.0) -> JsonObj:
        wait_for(
            f"{self.name} to be {state} (status {self.status()})",
            lambda: self.state() == state,
            timeout=timeout,
        )
        return self.status()

    def pod(self, name: str) -> JsonObj | None:
        try:
            _, pod = self.bench.request("GET", f"{PODS}/{name}")
        except KubeApiError as exc:
            if exc.status == 404:
                return None
            raise
        return dict(pod)

    def wait_driver_pod(self, attempt: int) -> JsonObj:
        found: JsonObj = wait_for(
            f"{self.name}'s driver pod of attempt {attempt} (status {self.status()})",
            lambda: self.pod(f"{self.name}-{attempt}-driver"),
        )
        return found

    def fail_driver(self, pod: JsonObj, *, exit_code: int = 1) -> None:
        """The kubelet's part: the driver container runs and is ready (the app goes up to
        RunningHealthy), then exits with ``exit_code`` (phase Failed)."""
        running, failed = run_then_exit(pod, exit_code=exit_code)
        for status in (running, failed):
            self.bench.request(
                "PATCH",
                f"{PODS}/{pod['metadata']['name']}/status",
                {"status": status},
                content_type="application/merge-patch+json",
            )
            if status is running:
                self.wait_state("RunningHealthy")

    def delete_and_wait_gone(self) -> None:
        """Delete the app: the operator's cleanup (its finalizer) runs, then nothing of it is
        left (its driver pods have no node: they go at once)."""
        self.bench.request("DELETE", f"{APPS}/{self.name}")

        def gone() -> bool:
            _, apps = self.bench.request("GET", APPS)
            _, pods = self.bench.request("GET", PODS)
            items = [*apps["items"], *pods["items"]]
            return not any(i["metadata"]["name"].startswith(self.name) for i in items)

        wait_for(f"{self.name} and its pods to be gone", gone)


@pytest.fixture
def app_factory(
    apache_operator_bench: ApacheOperatorBench,
) -> Iterator[Callable[[str, JsonObj], App]]:
    """Apply apps; each is deleted at the end."""
    made: list[App] = []

    def make(name: str, tolerations: JsonObj) -> App:
        apache_operator_bench.apply_manifest(spark_pi(name, tolerations))
        app = App(apache_operator_bench, name)
        made.append(app)
        return app

    yield make
    for app in made:
        app.delete_and_wait_gone()


def assert_driver_pod_of(app: App, pod: JsonObj, attempt: int) -> None:
    """What upstream's operator (and Spark's driver builder in it) put on an attempt's pod."""
    meta = pod["metadata"]
    labels = meta["labels"]
    assert labels["spark.operator/name"] == "spark-kubernetes-operator"
    assert labels["spark.operator/spark-app-name"] == app.name
    assert labels["spark-role"] == "driver"
    assert labels["spark-app-selector"] == f"{app.name}-{attempt}"
    owners = [(r["kind"], r["name"], r["uid"]) for r in meta.get("ownerReferences") or []]
    assert owners == [("SparkApplication", app.name, app.get()["metadata"]["uid"])]
    container = pod["spec"]["containers"][0]
    assert container["args"][:3] == [
        "driver",
        "--properties-file",
        "/opt/spark/conf/spark.properties",
    ]
    assert pod["spec"]["serviceAccountName"] == "spark"


def test_never_a_failed_driver_releases_the_app(
    app_factory: Callable[[str, JsonObj], App],
) -> None:
    """restartPolicy Never (the default): the operator adds its finalizer and creates the
    driver pod ``<name>-0-driver``; the driver's failure appends Failed, the clean-up deletes
    the pod and ends the app in ResourceReleased, with the whole history kept."""
    app = app_factory("pi-never", {})
    pod = app.wait_driver_pod(0)
    assert_driver_pod_of(app, pod, 0)
    assert FINALIZER in app.get()["metadata"].get("finalizers", [])
    status = app.wait_state("DriverRequested")
    assert status["currentAttemptSummary"]["attemptInfo"]["id"] == 0

    app.fail_driver(pod, exit_code=3)
    status = app.wait_state("ResourceReleased")
    assert history(status["stateTransitionHistory"]) == [
        *("Submitted", *STARTED, "Failed", "ResourceReleased")
    ]
    failed = [
        s for s in status["stateTransitionHistory"].values() if s["currentStateSummary"] == "Failed"
    ]
    driver_status = failed[0]["lastObservedDriverStatus"]
    assert driver_status["phase"] == "Failed"
    assert "previousAttemptSummary" not in status
    wait_for(
        "the failed driver pod to be deleted", lambda: app.pod(pod["metadata"]["name"]) is None
    )


def test_on_failure_restarts_then_gives_up(app_factory: Callable[[str, JsonObj], App]) -> None:
    """restartPolicy OnFailure, one restart, 1 s backoff: the failed attempt's pod is deleted,
    the app waits in ScheduledToRestart (the history trimmed to it, the ended attempt's moved
    to previousAttemptSummary), attempt 1 gets a new pod ``<name>-1-driver``; its failure exceeds
    the budget: ResourceReleased with the operator's message."""
    restart = {"restartPolicy": "OnFailure", "maxRestartAttempts": 1, "restartBackoffMillis": 1000}
    app = app_factory("pi-onfailure", {"restartConfig": restart})
    first = app.wait_driver_pod(0)
    app.fail_driver(first)

    second = app.wait_driver_pod(1)
    assert_driver_pod_of(app, second, 1)
    assert app.pod(first["metadata"]["name"]) is None
    status = app.wait_state("DriverRequested")
    previous = status["previousAttemptSummary"]
    assert previous["attemptInfo"]["id"] == 0
    # the ending attempt's history up to its failure; ScheduledToRestart opens the new one
    assert history(previous["stateTransitionHistory"]) == ["Submitted", *STARTED, "Failed"]
    attempt = status["currentAttemptSummary"]["attemptInfo"]
    assert (attempt["id"], attempt["restartCounter"], attempt["failureRestartCounter"]) == (1, 1, 1)
    # the trimmed history goes on from the previous attempt's last key
    keys = sorted(status["stateTransitionHistory"], key=int)
    assert int(keys[0]) == max(int(k) for k in previous["stateTransitionHistory"]) + 1
    assert history(status["stateTransitionHistory"])[:2] == [
        *("ScheduledToRestart", "DriverRequested")
    ]

    app.fail_driver(second)
    status = app.wait_state("ResourceReleased")
    assert history(status["stateTransitionHistory"]) == [
        *("ScheduledToRestart", *STARTED, "Failed", "ResourceReleased")
    ]
    message = status["currentState"]["message"]
    assert "The maximum number of restart attempts (1) has been exceeded." in message
    assert status["currentAttemptSummary"]["attemptInfo"]["id"] == 1
    wait_for(
        "the second driver pod to be deleted", lambda: app.pod(second["metadata"]["name"]) is None
    )
