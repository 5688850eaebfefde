"""The Apache Spark Kubernetes Operator's stand-in on the kube-apiserver bench.

The stand-in (``tests/e2e/apache_standin.py``) models ``apache/spark-kubernetes-operator``
(``tests/e2e/apache-model.md``); here it runs against the real apiserver with the bench's
``spark.apache.org/v1`` CRD and the light driver, without sparkguard's operator (its admission
and recovery for this kind are other work): the conf admission would inject is written by hand.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.chart import operator_harness as harness
from tests.e2e import apache_rules as rules
from tests.e2e import apache_standin as apache
from tests.kubebench.bench import APACHE_SPARK_OPERATOR_CRD, KubeBench
from tests.support import yamlfast

pytestmark = [pytest.mark.kube]
NAMESPACE = "apache-model"


@pytest.fixture(scope="module")
def apache_api(kube_bench: KubeBench) -> Iterator[client.ApiClient]:
    """The bench with the Apache operator's CRD installed and a namespace for its apps."""
    kube_bench.apply_manifest(yamlfast.load_all(APACHE_SPARK_OPERATOR_CRD.read_text()))
    kube_bench.wait_for_crd(f"{apache.PLURAL}.{apache.GROUP}")
    kube_bench.ensure_namespace(NAMESPACE)
    api = kube_bench.api_client()
    try:
        yield api
    finally:
        api.close()  # type: ignore[no-untyped-call]


def _app(name: str, restart: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{apache.GROUP}/{apache.VERSION}",
        "kind": "SparkApplication",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "runtimeVersions": {"sparkVersion": "4.0.0"},
            "pyFiles": "local:///opt/job.py",
            "sparkConf": {
                "spark.sparkguard.jobId": f"{name}-job",
                "spark.sparkguard.markers.type": "DIRECT",
            },
            "driverSpec": {
                "podTemplateSpec": {
                    "spec": {"containers": [{"name": "spark", "image": "apache/spark:4.0.0"}]}
                }
            },
            "applicationTolerations": {"restartConfig": restart},
        },
    }


def _summaries(history: dict[str, Any]) -> list[str]:
    return [history[k]["currentStateSummary"] for k in sorted(history, key=int)]


def test_a_failing_driver_is_restarted_once_then_released(
    apache_api: client.ApiClient, tmp_path: Path
) -> None:
    """OnFailure, maxRestartAttempts 1, a 1 s backoff: both drivers are killed mid-write.

    Upstream (model §4): attempt 0's Failed → its driver pod deleted, ScheduledToRestart, the
    history trimmed into ``previousAttemptSummary``; after the backoff attempt 1's driver pod
    ``<name>-1-driver``; its Failed → restartCounter 2 > 1 → ResourceReleased "The maximum
    number of restart attempts (1) has been exceeded.", summaries kept (attempt id 1), history
    keys continuing from the trimmed attempt's; no driver pod left, the finalizer on the app.
    """
    name = "fails"
    custom = client.CustomObjectsApi(apache_api)
    restart = {"restartPolicy": "OnFailure", "maxRestartAttempts": 1, "restartBackoffMillis": 1000}
    custom.create_namespaced_custom_object(
        apache.GROUP, apache.VERSION, NAMESPACE, apache.PLURAL, _app(name, restart)
    )
    (tmp_path / "pods").mkdir()
    standin = apache.StandInApacheOperator(
        apache_api, namespace=NAMESPACE, name=name, workdir=tmp_path / "pods",
        table=str(tmp_path / "table"), rows=400, partitions=4,
    )  # fmt: skip
    standin.kill_runs = {0, 1}
    stop = threading.Event()
    runner = threading.Thread(target=standin.serve, args=(stop,), daemon=True)
    runner.start()

    def released() -> bool:
        state = (standin.status().get("currentState") or {}).get("currentStateSummary")
        return state == "ResourceReleased" and standin.executors_left() == 0

    try:
        harness.eventually(released, what=f"app {name} to be released", timeout=120)
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\nruns: {standin.runs}\nerrors: {standin.errors[-5:]}\n"
            f"writes: {[rules.summary_of(w) for w in standin.writes]}"
        ) from None
    finally:
        stop.set()
        runner.join(30)
        standin.cleanup()
    app = standin.app()
    status = app["status"]
    assert [run["pod"] for run in standin.runs] == [f"{name}-0-driver", f"{name}-1-driver"]
    assert [run["ended_by"] for run in standin.runs] == ["killed", "killed"]
    assert status["currentState"]["message"] == (
        "The maximum number of restart attempts (1) has been exceeded."
    )
    assert status["currentAttemptSummary"]["attemptInfo"] == {
        "id": 1, "restartCounter": 1, "failureRestartCounter": 1,
        "schedulingFailureRestartCounter": 0,
    }  # fmt: skip
    previous = status["previousAttemptSummary"]
    assert previous["attemptInfo"]["id"] == 0
    running = ["DriverRequested", "DriverStarted", "DriverReady", "RunningHealthy", "Failed"]
    assert _summaries(previous["stateTransitionHistory"]) == ["Submitted", *running]
    history = status["stateTransitionHistory"]
    assert _summaries(history) == ["ScheduledToRestart", *running, "ResourceReleased"]
    keys = sorted(int(k) for k in history)
    assert keys == list(range(6, 6 + 7))  # attempt 0 had keys 0..5: no restart of the keys
    # the backoff runs in ScheduledToRestart: attempt 1's driver only 1 s after it
    scheduled, requested = (history[str(k)]["lastTransitionTime"] for k in keys[:2])
    waited = rules.parse_iso(requested) - rules.parse_iso(scheduled)
    assert waited.total_seconds() >= 1.0
    # each Failed carries the driver's last status: the killed container's exit
    failed = history[str(keys[-2])]["lastObservedDriverStatus"]
    assert failed["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137
    assert apache.FINALIZER in app["metadata"]["finalizers"]
    left = client.CoreV1Api(apache_api).list_namespaced_pod(
        NAMESPACE, label_selector=f"{apache.LABEL_APP}={name}"
    )
    assert [p.metadata.name for p in left.items if p.metadata] == []
