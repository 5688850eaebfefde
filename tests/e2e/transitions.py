"""What spark-operator does to a SparkApplication in each recovery scenario: the states it
writes to its status, and what it does to its driver pod.

One table, :data:`SCENARIOS`, that both sides of the differential test are checked against:
upstream's own controller (v2.5.2, ``test_recovery_on_node.py``: real pods, real Spark) and its
model (``standin.py``, ``test_recovery_matrix.py``: the light driver). A scenario whose two
sequences differ fails on one side; a difference we keep is listed in :data:`MODEL_ONLY` and in
the fidelity table of ``tests/e2e/README.md``.

The sequences are read from the API server's audit log (``tests/kubebench/bench.py`` records the
bodies of status writes of spark apps): every ``applicationState.state`` the operator wrote, in
order, consecutive repeats folded. Polling the app would miss short states (FAILING lasts one
reconcile). The driver pod's events are the operator's own: each driver pod it created (its
``spark-submit``) and each deletion it asked for, from the same log; the model records the same
two actions as it takes them (``standin.StandInSparkOperator.driver_pods``). What others do to
pods (the kubelet ending one, the garbage collector removing it with its app) is not the
operator's and is left out on both sides.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, Final

#: upstream's OnFailure retry of a dead driver (controller.go reconcileRunningSparkApplication →
#: FAILING; reconcileFailingSparkApplication with ShouldRetry → PENDING_RERUN;
#: reconcilePendingRerunSparkApplication → SUBMITTED), then the rerun to COMPLETED
ON_FAILURE_RETRY: Final = (
    "SUBMITTED",
    "RUNNING",
    "FAILING",
    "PENDING_RERUN",
    "SUBMITTED",
    "RUNNING",
    "SUCCEEDING",
    "COMPLETED",
)
#: Never: the dead driver's app FAILED; sparkguard's spec change (its resubmission) makes the
#: event filter write INVALIDATING (event_filter.go Update), reconcileInvalidating… deletes the
#: old resources → PENDING_RERUN → SUBMITTED, then the rerun to COMPLETED
NEVER_RESUBMITTED: Final = (
    "SUBMITTED",
    "RUNNING",
    "FAILING",
    "FAILED",
    "INVALIDATING",
    "PENDING_RERUN",
    "SUBMITTED",
    "RUNNING",
    "SUCCEEDING",
    "COMPLETED",
)
#: spark-submit failed once (the API server refused the driver pod): SUBMISSION_FAILED is the
#: first state written. OnFailure with a submission retry left: upstream submits again itself
#: (reconcileFailedSubmissionSparkApplication, ShouldRetry and TimeUntilNextRetryDue). Never:
#: FAILED at the next reconcile, then sparkguard's resubmission as after a dead driver.
SUBMISSION_FAILED: Final[Mapping[str, tuple[str, ...]]] = {
    "OnFailure": ("SUBMISSION_FAILED", "SUBMITTED", "RUNNING", "SUCCEEDING", "COMPLETED"),
    "Never": ("SUBMISSION_FAILED", *NEVER_RESUBMITTED[3:]),
}
#: a spec edit while RUNNING (any policy): the event filter writes INVALIDATING at once,
#: reconcileInvalidatingSparkApplication deletes the driver pod and resets the counters →
#: PENDING_RERUN → SUBMITTED once the old pod is gone; no FAILING, no FAILED
SPEC_EDIT: Final = ("SUBMITTED", "RUNNING", *NEVER_RESUBMITTED[4:])
#: Never, the driver dead, ``timeToLiveSeconds`` set: FAILED is the last state written; the
#: app is deleted TTL seconds after terminationTime (reconcileTerminatedSparkApplication)
TTL_DELETED: Final = NEVER_RESUBMITTED[:4]

#: the operator's actions on the driver pod (:func:`driver_pod_actions`)
CREATED: Final = "created"
DELETED: Final = "deleted"
#: a driver pod, deleted (deleteSparkResources: upstream's retry from FAILING, or the
#: INVALIDATING of a spec change, sparkguard's resubmission among them), then a new one
RERUN: Final = (CREATED, DELETED, CREATED)


@dataclasses.dataclass(frozen=True)
class Trace:
    """What spark-operator did to one app: the states it wrote, its driver pod actions."""

    states: tuple[str, ...]
    driver_pods: tuple[str, ...]


#: (scenario, restartPolicy) → what spark-operator does. ``killed``: the driver died (where
#: it died, before files, mid-write or after the commit, changes nothing here). A refused
#: submission made no pod (the API server refused it) and its retry's deletion found none
#: (validateSparkResourceDeletion: NotFound); an app deleted by its TTL while sparkguard's
#: finalizer holds it has its driver pod deleted by upstream at once (Reconcile →
#: handleSparkApplicationDeletion: deleteSparkResources), before the app goes.
SCENARIOS: Final[Mapping[tuple[str, str], Trace]] = {
    ("killed", "OnFailure"): Trace(ON_FAILURE_RETRY, RERUN),
    ("killed", "Never"): Trace(NEVER_RESUBMITTED, RERUN),
    ("submission-failed", "OnFailure"): Trace(SUBMISSION_FAILED["OnFailure"], (CREATED,)),
    ("submission-failed", "Never"): Trace(SUBMISSION_FAILED["Never"], (CREATED,)),
    ("spec-edit", "Never"): Trace(SPEC_EDIT, RERUN),
    ("ttl-deleted", "Never"): Trace(TTL_DELETED, (CREATED, DELETED)),
}
#: a run nothing disturbed (an executor lost and replaced is Spark's own business: upstream
#: marks that executor FAILED in executorState and nothing else); the model has no executors
#: to lose, so only the real operator is checked against it
UNDISTURBED: Final = Trace(("SUBMITTED", "RUNNING", "SUCCEEDING", "COMPLETED"), (CREATED,))
#: Never; a write to the app while upstream's first spark-submit ran: the SUBMITTED write
#: conflicts (not in the log), the retry's second spark-submit fails (its pod exists: no pod
#: made) → SUBMISSION_FAILED → FAILED with the first driver running; sparkguard's resubmission
#: → INVALIDATING deletes that pod → PENDING_RERUN, where the pod's deletion event is dropped
#: (it names the first submission); sparkguard's nudge (a spec change) → INVALIDATING (no pod
#: left to delete) → PENDING_RERUN → the rerun. The model does not submit twice.
SUBMITTED_TWICE: Final = Trace(
    (
        "SUBMISSION_FAILED",
        "FAILED",
        "INVALIDATING",
        "PENDING_RERUN",
        "INVALIDATING",
        "PENDING_RERUN",
        *NEVER_RESUBMITTED[6:],
    ),
    RERUN,
)
#: differences between the model and upstream we keep, per scenario (none today)
MODEL_ONLY: Final[Mapping[tuple[str, str], str]] = {}


def observed(
    events: Iterable[Mapping[str, Any]], namespace: str, name: str, *, operator: str
) -> Trace:
    """What ``operator`` (a username: the controller, whose kubeconfig its ``spark-submit``
    uses too) did to SparkApplication ``namespace/name``, read from ``events`` (audit events,
    oldest first). A purely computational function."""
    return Trace(
        tuple(written_states(events, namespace, name)),
        tuple(driver_pod_actions(events, namespace, name, user=operator)),
    )


def written_states(events: Iterable[Mapping[str, Any]], namespace: str, name: str) -> list[str]:
    """The application states written to SparkApplication ``namespace/name``'s status in
    ``events`` (audit events, oldest first), consecutive repeats folded. Only successful
    writes count. A purely computational function."""
    states: list[str] = []
    for event in events:
        ref = event.get("objectRef") or {}
        if (ref.get("resource"), ref.get("subresource")) != ("sparkapplications", "status"):
            continue
        if (ref.get("namespace"), ref.get("name")) != (namespace, name):
            continue
        if not 200 <= int((event.get("responseStatus") or {}).get("code", 0)) < 300:
            continue
        body = event.get("requestObject") or {}
        state = ((body.get("status") or {}).get("applicationState") or {}).get("state")
        if state and (not states or states[-1] != state):
            states.append(str(state))
    return states


def driver_pod_actions(
    events: Iterable[Mapping[str, Any]], namespace: str, name: str, *, user: str
) -> list[str]:
    """What ``user`` (the operator: its controller and the ``spark-submit`` it runs) did to
    the driver pod of SparkApplication ``namespace/name`` (``<name>-driver``) in ``events``
    (audit events, oldest first): :data:`CREATED` for each pod it made, :data:`DELETED` for
    each deletion it asked for, consecutive repeats folded (a pod being deleted is deleted
    again at the next reconcile). Only successful requests count: a refused creation made no
    pod, a deletion of a pod already gone deleted nothing. A purely computational function."""
    verbs = {"create": CREATED, "delete": DELETED}
    actions: list[str] = []
    for event in events:
        ref = event.get("objectRef") or {}
        if (ref.get("resource"), ref.get("subresource")) != ("pods", None):
            continue
        if (ref.get("namespace"), ref.get("name")) != (namespace, f"{name}-driver"):
            continue
        if (event.get("user") or {}).get("username") != user or event.get("verb") not in verbs:
            continue
        if not 200 <= int((event.get("responseStatus") or {}).get("code", 0)) < 300:
            continue
        action = verbs[str(event["verb"])]
        if not actions or actions[-1] != action:
            actions.append(action)
    return actions
