"""Recovery of Apache Spark operator apps, pure: final-failure detection from
``status.currentState`` and its history, the retry budget across the operator's restarts and
sparkguard's recreations, the resubmission record and its steps, the finalizer's reading."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest

from sparkguard.operator import appmeta, finalizers, mutation, protection, recovery, resubmit
from sparkguard.operator import config as config_
from tests.operator.apps import apache_app

NOW = datetime.datetime(2026, 11, 22, 12, 0, 0, tzinfo=datetime.UTC)
Action, Phase, Outcome = recovery.Action, recovery.Phase, recovery.Outcome


def _status(*states: str, attempt: int = 0, first_key: int = 0) -> dict[str, Any]:
    """A status as the Apache operator writes it: the history keys from ``first_key``."""
    history = {
        str(first_key + i): {"currentStateSummary": s, "lastTransitionTime": "2026-11-22T11:00:00Z"}
        for i, s in enumerate(states)
    }
    return {
        "currentState": {"currentStateSummary": states[-1]},
        "stateTransitionHistory": history,
        "currentAttemptSummary": {"attemptInfo": {"id": attempt}},
    }


RUN = ("Submitted", "DriverRequested", "DriverStarted", "DriverReady", "RunningHealthy")


def _app(status: dict[str, Any] | None = None, uid: str = "uid-1", **notes: str) -> dict[str, Any]:
    app = apache_app(annotations={appmeta.MAX_RETRIES: "2", appmeta.BACKOFF: "1s", **notes})
    app["metadata"]["uid"] = uid
    app["metadata"]["resourceVersion"] = "7"
    if status is not None:
        app["status"] = status
    return app


def _decide(app: dict[str, Any], config: config_.OperatorConfig) -> recovery.Decision:
    return recovery.decide(app, now=NOW, config=config, holder="me")


@pytest.mark.parametrize(
    "states",
    [
        RUN,
        (*RUN, "Failed"),  # stopping: the operator restarts or ends it next
        (*RUN, "DriverEvicted"),
        ("ScheduledToRestart",),  # a restart by the operator: never final
        (*RUN, "Succeeded"),
        (*RUN, "ResourceReleased"),  # cancelled (deleted while running): no failure
    ],
)
def test_only_a_terminated_state_after_a_failure_is_final(
    config: config_.OperatorConfig, states: tuple[str, ...]
) -> None:
    decision = _decide(_app(_status(*states)), config)
    assert decision.action is Action.NOTHING, decision.reason


@pytest.mark.parametrize("failure", sorted(recovery.APACHE_FAILURE_STATES))
@pytest.mark.parametrize("final", sorted(recovery.APACHE_TERMINATED_STATES))
def test_a_terminated_state_after_a_failure_is_rolled_back(
    config: config_.OperatorConfig, failure: str, final: str
) -> None:
    app = _app(_status(*RUN, failure, final))
    seen = recovery.observe(app)
    assert (seen.outcome, seen.state, seen.restarts) == (Outcome.FAILED, failure, 0)
    decision = _decide(app, config)
    assert decision.action is Action.ROLLBACK
    assert decision.patch["metadata"]["annotations"][appmeta.HANDLED_FAILURE] == seen.failure


def test_a_deleted_app_is_the_finalizers_not_a_failure(config: config_.OperatorConfig) -> None:
    app = _app(_status(*RUN, "Failed", "ResourceReleased"))
    app["metadata"]["deletionTimestamp"] = "2026-11-22T11:59:00Z"
    assert recovery.observe(app).outcome is Outcome.OTHER


def test_the_failure_identity_is_uid_attempt_and_history_key() -> None:
    base = _status(*RUN, "Failed", "ResourceReleased")
    one = recovery.observe(_app(base)).failure
    assert recovery.observe(_app(base)).failure == one  # read again: the same failure
    assert recovery.observe(_app(base, uid="uid-2")).failure != one  # a recreated app
    later = _status("ScheduledToRestart", *RUN[1:], "Failed", "ResourceReleased", attempt=1)
    assert recovery.observe(_app(later)).failure != one  # another attempt
    shifted = _status(*RUN, "Failed", "ResourceReleased", first_key=6)
    assert recovery.observe(_app(shifted)).failure != one  # another history key


def test_success_after_the_last_attempt_is_marked_succeeded(
    config: config_.OperatorConfig,
) -> None:
    app = _app(_status(*RUN, "Succeeded", "ResourceReleased"))
    decision = _decide(app, config)
    assert decision.action is Action.MARK_SUCCEEDED


def test_the_operators_restarts_count_against_max_retries(
    config: config_.OperatorConfig,
) -> None:
    """max-retries 2: a final failure after the operator's 2 restarts (attempt id 2, what the
    restartConfig admission maps gives) is rolled back and given up; after 1, resubmitted."""
    used_up = _status("ScheduledToRestart", *RUN[1:], "Failed", "ResourceReleased", attempt=2)
    assert _decide(_app(used_up), config).action is Action.GIVE_UP
    one_left = _status("ScheduledToRestart", *RUN[1:], "Failed", "ResourceReleased", attempt=1)
    decision = _decide(_app(one_left), config)
    assert decision.action is Action.ROLLBACK
    # a recreated app carries the attempts used before it: 1 more restart used them up
    again = _app(one_left, uid="uid-2", **{appmeta.ATTEMPT: "1"})
    assert _decide(again, config).action is Action.GIVE_UP


def _rolled_back(app: dict[str, Any], config: config_.OperatorConfig) -> dict[str, Any]:
    decision = _decide(app, config)
    app = mutation.apply_merge_patch(app, decision.patch)
    conclusion = recovery.conclude_rollback(
        decision,
        summary={"instants_rolled_back": ["i1"], "instants_committed": []},
        now=NOW - datetime.timedelta(seconds=10),
    )
    return mutation.apply_merge_patch(app, conclusion.patch)


def test_after_the_backoff_the_app_is_recreated_not_patched(
    config: config_.OperatorConfig,
) -> None:
    """Never restarted by its operator (restartPolicy Never), max-retries 2: rolled back,
    then RECREATE: the new app's annotations (attempt 1, Resubmitted, the failure handled);
    the old app recorded Resubmitted is recreated again (each step idempotent), same attempt."""
    app = _rolled_back(_app(_status(*RUN, "Failed", "ResourceReleased")), config)
    decision = _decide(app, config)
    assert decision.action is Action.RECREATE
    notes = decision.patch["metadata"]["annotations"]
    assert notes[appmeta.ATTEMPT] == "1"
    assert notes[appmeta.PHASE] == Phase.RESUBMITTED.value
    assert "spec" not in decision.patch  # no spec change: the Apache operator would not rerun
    released = mutation.apply_merge_patch(app, decision.patch)
    again = _decide(released, config)
    assert again.action is Action.RECREATE
    assert again.patch["metadata"]["annotations"][appmeta.ATTEMPT] == "1"
    # the new app, as its record describes it: nothing to do until it ends
    manifest = resubmit.new_manifest(released, annotations={})
    new = {**manifest, "metadata": {**manifest["metadata"], "uid": "uid-2"}}
    assert _decide(new, config).action is Action.NOTHING
    # its own final failure: a new failure, counted from attempt 1
    new["status"] = _status(*RUN, "Failed", "ResourceReleased")
    assert _decide(new, config).action is Action.ROLLBACK


def test_the_record_recreates_the_app_with_its_recovery_state_and_owner() -> None:
    app = _app(_status(*RUN, "Failed", "ResourceReleased"))
    app["metadata"].update(
        finalizers=[finalizers.FINALIZER, "sparkapplications.spark.apache.org/finalizer"],
        ownerReferences=[{"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "uid": "w"}],
        managedFields=[{"manager": "kubectl"}],
        generation=3,
        labels={"team": "a"},
    )
    app["metadata"]["annotations"][appmeta.OWNER_ANNOTATION] = "k8s:jobs/nightly/abc"
    app["metadata"]["annotations"][recovery.CLAIM] = "{}"
    manifest = resubmit.new_manifest(app, annotations={appmeta.ATTEMPT: "1"})
    meta = manifest["metadata"]
    assert set(meta) == {"name", "namespace", "annotations", "labels", "ownerReferences"}
    assert meta["ownerReferences"] == app["metadata"]["ownerReferences"]
    assert meta["annotations"][appmeta.ATTEMPT] == "1"
    assert meta["annotations"][appmeta.RESUBMITTED_FROM] == "uid-1"
    assert meta["annotations"][appmeta.OWNER_ANNOTATION] == "k8s:jobs/nightly/abc"
    assert recovery.CLAIM not in meta["annotations"]
    assert "status" not in manifest
    assert manifest["spec"] == app["spec"]
    record = resubmit.record(app, manifest)
    assert record["metadata"]["name"] == "sparkguard-resubmit-uid-1"
    assert record["metadata"]["labels"] == {resubmit.RECORD_LABEL: "true"}
    assert resubmit.manifest_of(record["data"]) == ("uid-1", json.loads(json.dumps(manifest)))
    # admission keeps the owner only for the app the record describes
    new = {**manifest, "metadata": dict(meta)}
    assert resubmit.vouches_for(record["data"], new)
    forged = {**new, "metadata": {**meta, "annotations": {**meta["annotations"]}}}
    forged["metadata"]["annotations"][appmeta.OWNER_ANNOTATION] = "k8s:other/app/x"
    assert not resubmit.vouches_for(record["data"], forged)
    assert not resubmit.vouches_for(None, new)
    assert resubmit.manifest_of({"manifest": "not json", "uid": "u"}) is None


def test_the_record_waits_for_the_old_app_and_its_pods_then_creates() -> None:
    step = resubmit.next_step
    old = {"metadata": {"name": "a", "uid": "old"}}
    assert step(old_uid="old", current=old, pods=[]).step is resubmit.Step.WAIT_APP
    waiting = step(old_uid="old", current=None, pods=["a-0-driver"])
    assert waiting.step is resubmit.Step.WAIT_PODS
    assert "a-0-driver" in waiting.reason
    assert step(old_uid="old", current=None, pods=[]).step is resubmit.Step.CREATE
    ours = {
        "metadata": {"name": "a", "uid": "new", "annotations": {appmeta.RESUBMITTED_FROM: "old"}}
    }
    assert step(old_uid="old", current=ours, pods=[]).step is resubmit.Step.DONE
    theirs = {"metadata": {"name": "a", "uid": "gitops"}}
    assert step(old_uid="old", current=theirs, pods=[]).step is resubmit.Step.ABANDON


@pytest.mark.parametrize(
    ("status", "undecided"),
    [
        (None, False),
        (_status("Submitted"), False),
        (_status(*RUN), True),
        (_status(*RUN, "Failed", "ResourceReleased"), True),
        (_status(*RUN, "Succeeded", "ResourceReleased"), False),
        (_status("ScheduledToRestart", attempt=1, first_key=6), True),
    ],
)
def test_the_finalizer_reads_the_apache_status(
    status: dict[str, Any] | None, undecided: bool
) -> None:
    app = _app(status)
    assert finalizers.may_have_undecided_writes(app)[0] is undecided


def _driver_pod(owner_uid: str, *init: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "nightly-0-driver",
            "labels": {"spark-role": "driver", protection.APACHE_APP_NAME_LABEL: "nightly"},
            "ownerReferences": [{"kind": "SparkApplication", "uid": owner_uid}],
        },
        "spec": {"initContainers": [{"name": n} for n in init], "containers": [{"name": "s"}]},
    }


def test_an_apache_driver_pod_without_the_rollback_init_is_unprotected(
    config: config_.OperatorConfig,
) -> None:
    admitted = mutation.mutate(_app(), config=config)
    ours = protection.check_driver_pod(
        admitted, _driver_pod("uid-1", "sparkguard-lib", "sparkguard-rollback")
    )
    assert (ours.relevant, ours.protected) == (True, True)
    # stored without admission: the template lacks it, so does the pod
    bare = protection.check_driver_pod(_app(), _driver_pod("uid-1"))
    assert (bare.relevant, bare.protected) == (True, False)
    assert "stored without sparkguard's admission" in bare.message
    # the template has it, the pod does not: the Apache operator did not use the template
    odd = protection.check_driver_pod(admitted, _driver_pod("uid-1"))
    assert not odd.protected
    assert "podTemplateSpec" in odd.message
    # a pod of an earlier app of the same name says nothing
    assert not protection.check_driver_pod(_app(), _driver_pod("uid-0")).relevant
