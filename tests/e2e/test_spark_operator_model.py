"""sparkguard against spark-operator as it really behaves, on the kube-apiserver bench.

The stand-in (``tests/e2e/standin.py``) models spark-operator v2 transition by transition (the
fidelity table: ``tests/e2e/README.md``); the light driver writes through sparkguard's Python
writer without a JVM. Each test is one behaviour of upstream that sparkguard must live with:

* SUBMISSION_FAILED: retried by spark-operator under OnFailure, FAILED at once under Never;
* OnFailure's own retries and sparkguard's resubmissions multiply: (1 + onFailureRetries) x
  (1 + max-retries) runs, because a resubmission (a spec change: INVALIDATING) zeroes the
  attempt counters;
* a rerun spark-operator drops (its INVALIDATING write conflicts, or its informer lags past the
  resubmission): sparkguard nudges, exactly one rerun follows;
* a spec edit while the driver runs: spark-operator kills it mid-write and reruns;
* timeToLiveSeconds deletes a FAILED app (needs sparkguard's finalizer);
* ScheduledSparkApplication runs: opted in by the label, one of them fails and is recovered.
"""

from __future__ import annotations

import re
import threading
from typing import Any

import pytest
from kubernetes import client

from sparkguard.operator import appmeta, finalizers
from sparkguard.spark_lib.storage import timeline
from tests.e2e import standin as standin_
from tests.e2e import transitions
from tests.e2e.conftest import (
    LIGHT_ROWS,
    leftovers,
    light_standin,
    model_did,
    rows_once,
    serve_until,
    states_of,
    wait_for,
)
from tests.e2e.test_recovery_scenario import ChartOperator
from tests.operator.apps import GROUP, PLURAL, VERSION, spark_app

pytestmark = [pytest.mark.kube]
ROLLED_BACK, COMMITTED = timeline.State.ROLLED_BACK, timeline.State.COMMITTED


def _succeeded(cluster: ChartOperator, name: str) -> bool:
    return cluster.notes(name).get(appmeta.PHASE) == "Succeeded"


@pytest.mark.parametrize("policy", ["Never", "OnFailure"])
def test_submission_failed(model_operator: ChartOperator, crd_version: str, policy: str) -> None:
    """spark-submit fails once (the pod webhook denied the driver pod, say).

    OnFailure: spark-operator resubmits after onSubmissionFailureRetryInterval x attempts; FAILED
    is never written, sparkguard neither rolls back nor resubmits. Never: SUBMISSION_FAILED turns
    into FAILED at the next reconcile; sparkguard rolls back (nothing) and resubmits once.
    """
    cluster = model_operator
    name = f"subfail-{policy.lower()}"
    extra: dict[str, Any] = {}
    if policy == "OnFailure":
        extra["restartPolicy"] = {
            "type": "OnFailure",
            "onSubmissionFailureRetries": 1,
            "onSubmissionFailureRetryInterval": 1,
        }
    created = cluster.create(spark_app(name, annotations={appmeta.BACKOFF: "1s"}, **extra))
    standin = light_standin(cluster, name)
    standin.fail_submissions = 1
    serve_until(standin, lambda: _succeeded(cluster, name), what=f"app {name} to succeed")
    reasons = cluster.event_reasons(name)
    assert standin.states[0] == "SUBMISSION_FAILED"
    if crd_version == "2.x":  # the differential test: what upstream v2.5.2 writes here
        did = model_did(cluster, standin)
        assert did == transitions.SCENARIOS["submission-failed", policy], did
    assert len(standin.runs) == 1  # one driver pod: the failed submission started none
    if policy == "OnFailure":
        assert "FAILED" not in standin.states
        assert "RollbackStarted" not in reasons
        assert "Resubmitted" not in reasons
    else:
        assert standin.states[1] == "FAILED"
        assert "SparkApplicationFailed" in [reason for reason, _ in standin.events]
        assert reasons.count("Resubmitted") == 1
    table = cluster.workdir / name / "table"
    assert rows_once(table) == (LIGHT_ROWS, 0, 0)
    assert leftovers(table) == []
    job_id = created["spec"]["sparkConf"]["spark.sparkguard.jobId"]
    assert states_of(table, job_id) == [COMMITTED]


def test_on_failure_retries_and_resubmissions_multiply(model_operator: ChartOperator) -> None:
    """Every run fails: onFailureRetries 1 and max-retries 1 give (1 + 1) x (1 + 1) = 4 runs.

    spark-operator shows FAILED only after its own retry (twice in all, once per sparkguard
    attempt), and the resubmission's INVALIDATING zeroes executionAttempts, so spark-operator's
    budget starts again for the resubmitted attempt (docs/operator.md's formula).
    """
    cluster = model_operator
    name = "budget"
    policy = {"type": "OnFailure", "onFailureRetries": 1, "onFailureRetryInterval": 1}
    notes = {appmeta.BACKOFF: "1s", appmeta.MAX_RETRIES: "1"}
    created = cluster.create(spark_app(name, annotations=notes, restartPolicy=policy))
    standin = light_standin(cluster, name)
    standin.kill_runs = set(range(10))
    serve_until(
        standin,
        lambda: cluster.notes(name).get(appmeta.PHASE) == "Exhausted",
        what="sparkguard to give up",
    )
    reasons = cluster.event_reasons(name)
    assert len(standin.runs) == (1 + 1) * (1 + 1)
    assert [run["executionAttempts"] for run in standin.runs] == [1, 2, 1, 2]
    assert [run["generation"] for run in standin.runs] == [1, 1, 2, 2]
    assert standin.states.count("FAILED") == 2
    assert reasons.count("Resubmitted") == 1
    assert "RetriesExhausted" in reasons
    table = cluster.workdir / name / "table"
    assert rows_once(table)[0] == 0
    assert leftovers(table) == []
    job_id = created["spec"]["sparkConf"]["spark.sparkguard.jobId"]
    # Each killed run wrote to a location that did not exist (the previous rollback had removed
    # it): each rollback removed it again (docs/storage-contract.md, "The life of a table").
    assert states_of(table, job_id) == []
    assert not table.exists()


@pytest.mark.parametrize("lost_by", ["status-conflict", "lagging-informer"])
def test_a_dropped_rerun_is_nudged_once(model_operator: ChartOperator, lost_by: str) -> None:
    """spark-operator loses sparkguard's resubmission; sparkguard nudges; one rerun follows.

    ``status-conflict``: another status write lands between the resubmission and the update
    predicate's INVALIDATING write, which conflicts: ``SparkApplicationSpecUpdateFailed``, the
    rerun is dropped. ``lagging-informer``: spark-operator's watch lags past the nudge; it then
    sees both spec changes, the resubmission's with a stale resourceVersion (dropped the same
    way) and the nudge's (applied). Either way: one ``ResubmitRetried``, one rerun, every row
    once.
    """
    cluster = model_operator
    name = f"dropped-{lost_by}"
    created = cluster.create(spark_app(name, annotations={appmeta.BACKOFF: "1s"}))
    standin = light_standin(cluster, name)
    standin.kill_runs = {0}
    if lost_by == "status-conflict":
        standin.conflict_spec_updates = 1
    else:
        standin.pause_watch_on = "FAILED"  # the informer stalls before the resubmission

    def done() -> bool:
        if "ResubmitRetried" in cluster.event_reasons(name):
            standin.watch_paused.clear()
        return cluster.notes(name).get(appmeta.PHASE) == "Succeeded"

    serve_until(standin, done, what=f"app {name} to succeed after a nudge")
    reasons = cluster.event_reasons(name)
    standin_reasons = [reason for reason, _ in standin.events]
    assert standin_reasons.count("SparkApplicationSpecUpdateFailed") == 1
    assert reasons.count("Resubmitted") == 1
    assert reasons.count("ResubmitRetried") == 1
    assert len(standin.runs) == 2
    assert standin.runs[1]["generation"] == standin.runs[0]["generation"] + 2
    assert standin.states.count("INVALIDATING") == 1
    assert cluster.notes(name)[appmeta.ATTEMPT] == "1"
    table = cluster.workdir / name / "table"
    assert rows_once(table) == (LIGHT_ROWS, 0, 0)
    assert leftovers(table) == []
    job_id = created["spec"]["sparkConf"]["spark.sparkguard.jobId"]
    assert states_of(table, job_id) == [COMMITTED]  # the killed first write's location removed


def test_a_spec_edit_while_running_kills_the_driver_mid_write(
    model_operator: ChartOperator, crd_version: str
) -> None:
    """A user edits the spec while the driver writes: spark-operator invalidates the app in
    RUNNING, deletes the driver pod, resets the attempt counters and reruns it under the same
    pod name once the old pod is gone; the rerun's rollback initContainer undoes the killed
    write. A change of ``spec.suspend`` alone is no rerun. sparkguard never sees a failure."""
    cluster = model_operator
    name = "edited"
    created = cluster.create(spark_app(name))
    standin = light_standin(cluster, name)
    standin.stall_runs = {0}
    standin.kill_point = "mid-write"
    custom = client.CustomObjectsApi(cluster.api)
    edits: list[str] = []

    def done() -> bool:
        if not edits and (standin.workdir / "run-0" / "at-mid-write").exists():
            for spec in ({"suspend": False}, {"sparkConf": {"spark.sql.shuffle.partitions": "8"}}):
                custom.patch_namespaced_custom_object(
                    GROUP, VERSION, cluster.namespace, PLURAL, name, {"spec": spec}
                )
                edits.append(next(iter(spec)))
        return cluster.state(name) == "COMPLETED"

    serve_until(standin, done, what=f"app {name} to complete after the edit")
    reasons = cluster.event_reasons(name)
    assert edits == ["suspend", "sparkConf"]
    assert standin.states.count("INVALIDATING") == 1  # the sparkConf edit, not the suspend one
    if crd_version == "2.x":  # the differential test: what upstream v2.5.2 writes here
        did = model_did(cluster, standin)
        assert did == transitions.SCENARIOS["spec-edit", "Never"], did
    assert "FAILED" not in standin.states
    assert "FAILING" not in standin.states
    assert [run["ended_by"] for run in standin.runs] == ["deleted", "exited"]
    assert standin.runs[0]["pod"] == standin.runs[1]["pod"]
    status = cluster.get(name)["status"]
    assert (status["executionAttempts"], status["submissionAttempts"]) == (1, 1)
    assert "RollbackStarted" not in reasons
    assert "Resubmitted" not in reasons
    table = cluster.workdir / name / "table"
    assert rows_once(table) == (LIGHT_ROWS, 0, 0)
    assert leftovers(table) == []
    job_id = created["spec"]["sparkConf"]["spark.sparkguard.jobId"]
    assert states_of(table, job_id) == [COMMITTED]  # the killed first write's location removed


def test_time_to_live_deletes_a_failed_app_only_after_its_rollback(
    model_operator: ChartOperator, crd_version: str
) -> None:
    """spark-operator deletes a FAILED app ``timeToLiveSeconds`` after its terminationTime
    (``reconcileTerminatedSparkApplication``), maybe while sparkguard waits out its backoff;
    sparkguard's finalizer holds the deletion until the job's output is rolled back."""
    cluster = model_operator
    name = "ttl"
    created = cluster.create(
        spark_app(name, annotations={appmeta.BACKOFF: "10m"}, timeToLiveSeconds=1)
    )
    standin = light_standin(cluster, name)
    standin.kill_runs = {0}
    seen: list[list[str]] = []

    def gone() -> bool:
        try:
            app = cluster.get(name)
        except client.ApiException as exc:
            return bool(exc.status == 404)
        seen.append(list(app["metadata"].get("finalizers") or []))
        return False

    serve_until(standin, gone, what=f"app {name} to be deleted by its TTL")
    assert any(finalizers.FINALIZER in held for held in seen), seen
    if crd_version == "2.x":  # the differential test: what upstream v2.5.2 writes here
        did = model_did(cluster, standin)
        assert did == transitions.SCENARIOS["ttl-deleted", "Never"], did
    assert cluster.event_reasons(name).count("RolledBackOnDelete") == 1
    table = cluster.workdir / name / "table"
    assert leftovers(table) == []
    job_id = created["spec"]["sparkConf"]["spark.sparkguard.jobId"]
    assert states_of(table, job_id) == []  # the rollback removed the location the write created


def test_a_scheduled_run_that_fails_is_recovered(model_operator: ChartOperator) -> None:
    """A ScheduledSparkApplication opted in by its label: each run is ``<name>-<UnixNano>``,
    carries the labels (not the annotations) and is admitted as its own job; the first run is
    killed mid-write, sparkguard recovers it exactly once; Forbid starts a run only after the
    newest one is COMPLETED or FAILED."""
    cluster = model_operator
    name = "sched"
    custom = client.CustomObjectsApi(cluster.api)
    template = spark_app(name)["spec"]
    custom.create_namespaced_custom_object(
        GROUP, VERSION, cluster.namespace, standin_.SCHEDULED_PLURAL,
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ScheduledSparkApplication",
            "metadata": {
                "name": name,
                "labels": {appmeta.ENABLED_LABEL: "true", "team": "data"},
                "annotations": {"example.com/owner": "data-team"},
            },
            # the first run is read after a later one completed: kept by the history limits
            # (upstream's default keeps one of each, and deletes the first run under load)
            "spec": {
                "schedule": "@every 2s", "concurrencyPolicy": "Forbid", "template": template,
                "successfulRunHistoryLimit": 10, "failedRunHistoryLimit": 10,
            },
        },
    )  # fmt: skip

    def serve_run(run: str) -> standin_.StandInSparkOperator:
        # sparkguard's options never reach a run (annotations are not copied): its backoff is
        # the default 30 s; annotate the run, as a user could, to keep the test short.
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, cluster.namespace, PLURAL, run,
            {"metadata": {"annotations": {appmeta.BACKOFF: "1s"}}},
        )  # fmt: skip
        run_standin = light_standin(cluster, run)
        if not controller.runs:
            run_standin.kill_runs = {0}
        return run_standin

    controller = standin_.StandInScheduledController(
        cluster.api, namespace=cluster.namespace, name=name, serve_run=serve_run
    )
    first: list[str] = []

    def done() -> bool:
        names = list(controller.runs)
        if names and not first:
            first.append(names[0])
        return (
            bool(first)
            and _succeeded(cluster, first[0])
            and any(_succeeded(cluster, n) for n in names[1:])
        )

    stop = threading.Event()
    runner = threading.Thread(target=controller.serve, args=(stop,), daemon=True)
    runner.start()
    try:
        wait_for(done, what="the first run recovered and a later run completed", timeout=120)
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, cluster.namespace, standin_.SCHEDULED_PLURAL, name,
            {"spec": {"suspend": True}},
        )  # fmt: skip
    finally:
        stop.set()
        runner.join(30)
        controller.close()
    run = first[0]
    assert re.fullmatch(rf"{name}-\d{{19}}", run)
    app = cluster.get(run)
    labels = app["metadata"]["labels"]
    assert labels[standin_.SCHEDULED_APP_NAME_LABEL] == name
    assert labels[appmeta.ENABLED_LABEL] == "true"
    assert labels["team"] == "data"
    assert "example.com/owner" not in (app["metadata"].get("annotations") or {})
    job_id = app["spec"]["sparkConf"]["spark.sparkguard.jobId"]
    assert job_id == f"{cluster.namespace}.{run}"
    reasons = cluster.event_reasons(run)
    assert reasons.count("Resubmitted") == 1
    # ...and its rerun completed: Forbid starts the next run while the first is FAILED, so its
    # rerun overlaps that run; each pod's sidecar has the port to itself (kubelet.HostPorts).
    assert [r["ended_by"] for r in controller.runs[run].runs] == ["killed", "exited"]
    assert controller.runs[run].runs[1]["exit"] == 0
    for each in controller.runs:
        if _succeeded(cluster, each):
            table = cluster.workdir / each / "table"
            assert rows_once(table) == (LIGHT_ROWS, 0, 0), each
            assert leftovers(table) == [], each
    assert states_of(cluster.workdir / run / "table", job_id) == [COMMITTED]
    # Forbid: a run started only when the newest one had finished (COMPLETED or FAILED).
    for last, state, started in controller.decisions:
        assert not started or last is None or state in standin_.TERMINAL_STATES


def test_a_lagging_1x_predicate_applies_both_the_resubmission_and_the_nudge(
    model_operator: ChartOperator,
) -> None:
    """The 1.x update predicate retries its INVALIDATING write on a conflict (re-reading the
    app): a lagging informer then applies the resubmission *and* the nudge, two invalidations,
    the second one possibly killing the first rerun. Still: every row once, one resubmission,
    one nudge, and no run counted twice by sparkguard."""
    cluster = model_operator
    name = "lagging-1x"
    created = cluster.create(spark_app(name, annotations={appmeta.BACKOFF: "1s"}))
    standin = light_standin(cluster, name)
    standin.kill_runs = {0}
    standin.retry_spec_updates = True
    standin.pause_watch_on = "FAILED"  # the informer stalls before the resubmission

    def done() -> bool:
        if "ResubmitRetried" in cluster.event_reasons(name):
            standin.watch_paused.clear()
        return cluster.notes(name).get(appmeta.PHASE) == "Succeeded"

    serve_until(standin, done, what=f"app {name} to succeed")
    reasons = cluster.event_reasons(name)
    assert standin.states.count("INVALIDATING") == 2
    assert "SparkApplicationSpecUpdateFailed" not in [reason for reason, _ in standin.events]
    assert reasons.count("Resubmitted") == 1
    assert reasons.count("ResubmitRetried") == 1
    assert cluster.notes(name)[appmeta.ATTEMPT] == "1"
    assert len(standin.runs) in (2, 3)  # the first rerun may have started before the second
    assert standin.runs[-1]["ended_by"] == "exited"
    table = cluster.workdir / name / "table"
    assert rows_once(table) == (LIGHT_ROWS, 0, 0)
    assert leftovers(table) == []
    job_id = created["spec"]["sparkConf"]["spark.sparkguard.jobId"]
    assert states_of(table, job_id)[-1] == COMMITTED
    assert set(states_of(table, job_id)[:-1]) <= {ROLLED_BACK}
