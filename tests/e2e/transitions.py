"""What spark-operator writes to a SparkApplication's status in each recovery scenario.

One table, :data:`WRITTEN`, that both sides of the differential test are checked against:
upstream's own controller (v2.5.2, ``test_recovery_on_node.py``: real pods, real Spark) and its
model (``standin.py``, ``test_recovery_matrix.py``: the light driver). A scenario whose two
sequences differ fails on one side; a difference we keep is listed in :data:`MODEL_ONLY` and in
the fidelity table of ``tests/e2e/README.md``.

The sequences are read from the API server's audit log (``tests/kubebench/bench.py`` records the
bodies of status writes of spark apps): every ``applicationState.state`` the operator wrote, in
order, consecutive repeats folded. Polling the app would miss short states (FAILING lasts one
reconcile).
"""

from __future__ import annotations

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
#: (policy, kill point) → what spark-operator writes; the kill point does not change it
WRITTEN: Final[Mapping[tuple[str, str], tuple[str, ...]]] = {
    (policy, point): ON_FAILURE_RETRY if policy == "OnFailure" else NEVER_RESUBMITTED
    for policy in ("Never", "OnFailure")
    for point in ("before-files", "mid-write", "after-commit")
}
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
#: states the model writes that upstream does not, or the reverse, per scenario (none today)
MODEL_ONLY: Final[Mapping[tuple[str, str], str]] = {}


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
