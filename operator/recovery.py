"""Failure recovery: what to do about a SparkApplication's state, decided from the object alone.

All progress lives in ``sparkguard.io/`` annotations on the app, so an operator that restarts
in the middle of a recovery reads where it stood and continues without acting twice::

    new FAILED ─▶ Recovering ─rollback─▶ RolledBack ─backoff─▶ Resubmitted (attempt+1)
                      │
                      │ no retries left
                      └─rollback─▶ Exhausted

A rollback that found only committed writes (the driver died after an outcome, before its
cleanup) is RolledBack and resubmitted like any other: the job may have had work left after
that write, and its rerun skips the writes it committed (``rerun=skip``). CommittedNotResubmitted,
which older versions concluded then, is still read as a settled phase.

``handled-failure`` identifies the failure acted on (from the status spark-operator wrote), so
the same failure seen again, e.g. after a restart, is recognised. The resubmission is one merge
patch that bumps ``spark.sparkguard.attempt`` in the spec *and* records phase Resubmitted:
it happens completely or not at all.

Several operators may look at one app (two replicas, a lease that expired mid-rollback). The
``Recovering`` patch carries a *claim* (holder and expiry, ``recovery.sparkguard.io/claim``),
written with a resourceVersion precondition, so exactly one of them wins it; the others wait
until it expires (its holder renews it while its rollback runs) and only then take over. A
resubmitted app that stays FAILED, or whose rerun stays unsubmitted in PENDING_RERUN, past
``resubmit_timeout`` is patched again (a *nudge*), because spark-operator's rerun on a spec
change is best effort.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final

from sparkguard.operator import appmeta, finalizers, mutation
from sparkguard.operator import config as config_

#: spark-operator's state between a spec change's INVALIDATING and the rerun's spark-submit: it
#: submits once the old driver pod is gone, woken by that pod's deletion event
#: (reconcilePendingRerunSparkApplication). The event handler drops a pod event whose
#: submission id is not the app's (event_handler.go enqueueSparkAppForUpdate), and an app
#: that spark-operator submitted twice (a write to the app while its first spark-submit ran makes
#: the status write conflict, and reconcileNewSparkApplication's retry runs spark-submit again,
#: which fails: SUBMISSION_FAILED, with the first driver running) names the second submission
#: while its pod is the first's: the deletion is dropped and the rerun waits for ever.
PENDING_RERUN: Final = "PENDING_RERUN"
#: spark-operator's final failure. SUBMISSION_FAILED and FAILING are never final: spark-operator
#: retries them itself (OnFailure/Always within onSubmissionFailureRetries/onFailureRetries) or
#: moves them to FAILED on its next reconcile (kubeflow/spark-operator
#: internal/controller/sparkapplication/controller.go, reconcileFailedSubmissionSparkApplication
#: and reconcileFailingSparkApplication, with pkg/util ShouldRetry). Acting on them would roll
#: back under a submission spark-operator is about to retry, and resubmit on top of its retry.
FAILED_STATES: Final = frozenset({"FAILED"})
#: failures spark-operator is still handling: sparkguard waits for FAILED
TRANSIENT_FAILURE_STATES: Final = frozenset({"SUBMISSION_FAILED", "FAILING"})
#: coordination state of operators, never set by users (outside ``sparkguard.io/``, which
#: admission checks key by key)
COORDINATION_PREFIX: Final = "recovery.sparkguard.io/"
#: JSON ``{"holder": <operator identity>, "until": <ISO time>}``: who may roll back now
CLAIM: Final = COORDINATION_PREFIX + "claim"
#: JSON ``{"at": <ISO time>, "nudges": n}``: when the resubmission was (last) patched
RESUBMISSION: Final = COORDINATION_PREFIX + "resubmission"
#: sparkConf key a nudge changes: a spec change that spark-operator turns into a rerun
CONF_RESUBMISSION: Final = "spark.sparkguard.resubmission"
#: longest wait between two nudges of a resubmission that spark-operator did not act on
MAX_NUDGE_INTERVAL: Final = 600.0
SUCCEEDED_STATES: Final = frozenset({"COMPLETED"})
#: the Apache operator's ``ApplicationStateSummary.isFailure`` states (apache/spark-kubernetes-
#: operator ``ApplicationStateSummary``): *stopping* states, after which the operator restarts
#: the app (ScheduledToRestart) or ends it; never final on their own
APACHE_FAILURE_STATES: Final = frozenset(
    {
        "Failed",
        "SchedulingFailure",
        "DriverEvicted",
        "DriverStartTimedOut",
        "DriverReadyTimedOut",
        "ExecutorsStartTimedOut",
    }
)
#: its ``isTerminated`` states: the app is over, the operator never runs it again
APACHE_TERMINATED_STATES: Final = finalizers.APACHE_TERMINATED_STATES
#: the state before a final one that makes it a success
APACHE_SUCCEEDED: Final = "Succeeded"
#: how many instants a last-rollback annotation lists (the counts are always complete)
_LISTED_INSTANTS: Final = 20
#: how long after a transition an operator still posts its Event when the replica that made
#: the transition died before posting it (kube-apiserver's default ``--event-ttl``: older
#: Events are gone anyway, and a late copy would only look new)
EVENT_REPLAY_SECONDS: Final = 3600.0


class Outcome(enum.StrEnum):
    """What an app's status says, whichever operator wrote it."""

    SUCCEEDED = "succeeded"  # final: every write committed
    FAILED = "failed"  # final: the operator will not run it again
    TRANSIENT = "transient"  # a failure the operator is still handling (retry or restart)
    OTHER = "other"  # new, running, stopping, or over without a failure (cancelled)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Observation:
    """An app's status read the way its kind's operator writes it (:func:`observe`)."""

    outcome: Outcome
    #: the state to name in messages and metrics
    state: str
    #: for FAILED: the failure's identity, stable while it stands (see :func:`observe`)
    failure: str | None = None
    #: the restarts the app's operator made itself before this final state (Apache: the final
    #: attempt's id; Kubeflow: 0, its retries are not sparkguard's budget)
    restarts: int = 0


def observe(app: Mapping[str, Any]) -> Observation:
    """What ``app``'s status says: final success, final failure, transient, or nothing yet.

    A purely computational function with no side-effects. Kubeflow: ``applicationState``
    (COMPLETED, FAILED; SUBMISSION_FAILED/FAILING are transient). Apache
    (``spark.apache.org``): a failure is final only when ``currentState`` is terminated
    (ResourceReleased, TerminatedWithoutReleaseResources) and the history entry just before it
    (the largest key below the current one: the history is never trimmed at a final state)
    is a failure state; after Succeeded it is a success; a failure state on its own is
    stopping (the operator restarts or ends the app next) and a terminated state after
    anything else (an app cancelled by its deletion) is neither. The failure's identity is
    the app's uid + the final attempt's id + the terminal entry's history key: a restart by
    the operator makes another attempt (and keys only grow), a recreated app another uid.
    """
    status = app.get("status") or {}
    if mutation.kind_of(app) is mutation.APACHE:
        return _observe_apache(app, status)
    state = str((status.get("applicationState") or {}).get("state") or "")
    if state in SUCCEEDED_STATES:
        return Observation(outcome=Outcome.SUCCEEDED, state=state)
    if state in TRANSIENT_FAILURE_STATES:
        return Observation(outcome=Outcome.TRANSIENT, state=state)
    if state in FAILED_STATES:
        return Observation(outcome=Outcome.FAILED, state=state, failure=failure_id(status))
    return Observation(outcome=Outcome.OTHER, state=state)


def _observe_apache(app: Mapping[str, Any], status: Mapping[str, Any]) -> Observation:
    current = str((status.get("currentState") or {}).get("currentStateSummary") or "")
    if current in APACHE_FAILURE_STATES:
        return Observation(outcome=Outcome.TRANSIENT, state=current)
    if current not in APACHE_TERMINATED_STATES or (app.get("metadata") or {}).get(
        "deletionTimestamp"
    ):
        return Observation(outcome=Outcome.OTHER, state=current)
    history = status.get("stateTransitionHistory") or {}
    keys = sorted((int(k) for k in history if str(k).lstrip("-").isdigit()), reverse=True)
    before = (
        str((history.get(str(keys[1])) or {}).get("currentStateSummary") or "")
        if len(keys) > 1
        else ""
    )
    info = (status.get("currentAttemptSummary") or {}).get("attemptInfo") or {}
    raw_id = info.get("id")
    attempt = raw_id if isinstance(raw_id, int) and raw_id >= 0 else 0
    if before == APACHE_SUCCEEDED:
        return Observation(outcome=Outcome.SUCCEEDED, state=f"{before}/{current}")
    if before not in APACHE_FAILURE_STATES:
        return Observation(outcome=Outcome.OTHER, state=f"{before or 'new'}/{current}")
    uid = str((app.get("metadata") or {}).get("uid") or "")
    identity = f"{uid}/{attempt}/{keys[0]}"
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return Observation(
        outcome=Outcome.FAILED,
        state=before,
        failure=f"{before}-{attempt}-{digest}",
        restarts=attempt,
    )


class Phase(enum.StrEnum):
    """Where sparkguard stands with an app (annotation ``sparkguard.io/phase``)."""

    RECOVERING = "Recovering"
    ROLLED_BACK = "RolledBack"
    RESUBMITTED = "Resubmitted"
    EXHAUSTED = "Exhausted"
    SUCCEEDED = "Succeeded"
    COMMITTED_NOT_RESUBMITTED = "CommittedNotResubmitted"
    INVALID = "Invalid"


class Action(enum.StrEnum):
    """What the operator should do next about an app."""

    NOTHING = "nothing"
    MARK_INVALID = "mark-invalid"
    MARK_SUCCEEDED = "mark-succeeded"
    ROLLBACK = "rollback"  # then RolledBack (to resubmit later)
    GIVE_UP = "give-up"  # rollback, then Exhausted: no retries left
    WAIT = "wait"  # rolled back; the backoff has not expired (or another operator's claim)
    RESUBMIT = "resubmit"
    #: Apache apps: resubmit by recreating the app (:mod:`resubmit`), the patch holds the
    #: annotations of the new app
    RECREATE = "recreate"
    NUDGE = "nudge"  # resubmitted, but the app stayed FAILED: patch the resubmission again


class Reason(enum.StrEnum):
    """Kubernetes Event reasons the operator posts."""

    ROLLBACK_STARTED = "RollbackStarted"
    ROLLED_BACK = "RolledBack"
    ROLLBACK_FAILED = "RollbackFailed"
    RESUBMITTED = "Resubmitted"
    RESUBMIT_RETRIED = "ResubmitRetried"
    RETRIES_EXHAUSTED = "RetriesExhausted"
    INVALID_ANNOTATION = "InvalidAnnotation"
    COMMITTED_NOT_RESUBMITTED = "CommittedNotResubmitted"


#: phases after which nothing more happens for the failure they handled
SETTLED_PHASES: Final = frozenset(
    {Phase.RESUBMITTED, Phase.EXHAUSTED, Phase.COMMITTED_NOT_RESUBMITTED}
)
#: phases of an app in the middle of a recovery
RECOVERY_PHASES: Final = frozenset({Phase.RECOVERING, Phase.ROLLED_BACK})


@dataclasses.dataclass(frozen=True, kw_only=True)
class EventSpec:
    """A Kubernetes Event to post about the app."""

    type: str  # "Normal" | "Warning"
    reason: Reason
    message: str
    #: the phase transition the Event reports (``<failure>/<reason>[/<nudge>]``), if it reports
    #: one: every operator names that Event after it, so it is posted once, even when the
    #: replica that made the transition died before posting it and another posts it again
    transition: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Decision:
    """The next step for one app, with the patch that records (or performs) it.

    For ``ROLLBACK``/``GIVE_UP`` the patch records phase Recovering *before* the rollback; for
    ``RESUBMIT`` it is the resubmission itself; for ``MARK_*`` it records the phase.
    """

    action: Action
    reason: str
    attempt: int = 0
    failure_id: str | None = None
    retry_at: datetime.datetime | None = None
    options: appmeta.Options | None = None
    patch: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    event: EventSpec | None = None
    #: for ``ROLLBACK``/``GIVE_UP``: the claim the patch writes
    claim: Claim | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Claim:
    """Who may roll back an app's failure now, and until when (renewed while it works)."""

    holder: str
    until: datetime.datetime

    def to_annotation(self) -> str:
        """The value of the ``recovery.sparkguard.io/claim`` annotation."""
        return json.dumps({"holder": self.holder, "until": format_time_precise(self.until)})


@dataclasses.dataclass(frozen=True, kw_only=True)
class Conclusion:
    """What a finished rollback means for the app: its phase, the patch, the event."""

    phase: Phase
    patch: Mapping[str, Any]
    event: EventSpec


def backoff_delay(attempt: int, *, base: float, cap: float) -> float:
    """Seconds to wait before resubmitting after attempt ``attempt`` (0-based) failed.

    A purely computational function with no side-effects: ``base * 2**attempt``, at most ``cap``.
    """
    if base <= 0:
        return 0.0
    return float(min(cap, base * 2 ** min(attempt, 62)))


def failure_id(status: Mapping[str, Any]) -> str:
    """An identifier of the failure ``status`` describes, stable while that failure stands.

    A purely computational function with no side-effects. spark-operator stamps every
    submission (submission id, attempt counters and times), so a later failure of a rerun
    gets a different id, while re-reading the same failure gives the same one.
    """
    state = str((status.get("applicationState") or {}).get("state") or "")
    fields = {
        key: status.get(key)
        for key in (
            "submissionID",
            "sparkApplicationId",
            "submissionAttempts",
            "executionAttempts",
            "lastSubmissionAttemptTime",
            "terminationTime",
        )
    }
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()
    return f"{state}-{digest[:16]}"


def current_attempt(app: Mapping[str, Any]) -> int:
    """The attempt the app is running (0 for the first): annotation, else sparkConf, else 0.

    A purely computational function with no side-effects.
    """
    for raw in (
        appmeta.of(app).get(appmeta.ATTEMPT),
        ((app.get("spec") or {}).get("sparkConf") or {}).get(mutation.CONF_ATTEMPT),
    ):
        if isinstance(raw, str) and raw.strip().isdigit():
            return int(raw.strip())
    return 0


def parse_time(text: str | None) -> datetime.datetime | None:
    """An annotation timestamp (ISO 8601, UTC), or ``None`` if absent or unreadable.

    A purely computational function with no side-effects.
    """
    if not text:
        return None
    try:
        value = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=datetime.UTC)


def format_time(value: datetime.datetime) -> str:
    """The annotation form of a timestamp: ISO 8601 in UTC, whole seconds."""
    return value.astimezone(datetime.UTC).replace(microsecond=0).isoformat()


def format_time_precise(value: datetime.datetime) -> str:
    """ISO 8601 in UTC with milliseconds: for claims and resubmission checks (short times)."""
    return value.astimezone(datetime.UTC).isoformat(timespec="milliseconds")


def _json_object(text: str | None) -> dict[str, Any] | None:
    """The JSON object an annotation value holds, or ``None`` if absent or unreadable."""
    try:
        value = json.loads(text) if text else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def parse_claim(text: str | None) -> Claim | None:
    """The claim an annotation value records, or ``None`` if absent or unreadable.

    A purely computational function with no side-effects.
    """
    value = _json_object(text)
    if value is None:
        return None
    until = parse_time(str(value.get("until") or ""))
    holder = value.get("holder")
    if until is None or not isinstance(holder, str):
        return None
    return Claim(holder=holder, until=until)


def claim_of(app: Mapping[str, Any]) -> Claim | None:
    """The rollback claim recorded on ``app``, if any.

    A purely computational function with no side-effects.
    """
    return parse_claim(appmeta.of(app).get(CLAIM))


def claim_patch(claim: Claim | None) -> dict[str, Any]:
    """The merge patch that records ``claim`` (or removes it).

    A purely computational function with no side-effects.
    """
    return _annotations_patch({CLAIM: claim.to_annotation() if claim is not None else None})


def _resubmission_of(app: Mapping[str, Any]) -> tuple[datetime.datetime, int] | None:
    value = _json_object(appmeta.of(app).get(RESUBMISSION))
    if value is None:
        return None
    at = parse_time(str(value.get("at") or ""))
    nudges = value.get("nudges")
    if at is None or not isinstance(nudges, int) or nudges < 0:
        return None
    return at, nudges


def _resubmission_record(at: datetime.datetime, nudges: int) -> str:
    return json.dumps({"at": format_time_precise(at), "nudges": nudges})


def nudge_interval(nudges: int, *, timeout: float) -> float:
    """Seconds a resubmission may go unanswered after ``nudges`` nudges before the next one.

    A purely computational function with no side-effects: ``timeout``, doubling per nudge, at
    most :data:`MAX_NUDGE_INTERVAL`.
    """
    return float(min(MAX_NUDGE_INTERVAL, timeout * 2 ** min(nudges, 30)))


def _annotations_patch(values: Mapping[str, str | None]) -> dict[str, Any]:
    return {"metadata": {"annotations": dict(values)}}


def _final_conclusion(
    phase: Phase,
    reason: Reason,
    *,
    failure: str | None,
    message: str,
    annotations: Mapping[str, str | None],
) -> Conclusion:
    """A recovery that ends without a resubmission: the phase, the message, a Warning."""
    return Conclusion(
        phase=phase,
        patch=_annotations_patch(
            {
                **annotations,
                appmeta.PHASE: phase.value,
                appmeta.NEXT_RETRY_AT: None,
                appmeta.MESSAGE: message,
            }
        ),
        event=_transition_event(failure, reason, message=message),
    )


def _transition_event(
    failure: str | None, reason: Reason, *, message: str, nudge: int | None = None
) -> EventSpec:
    """The Event that reports the transition to a phase, named by that transition."""
    kind = "Normal" if reason in (Reason.ROLLED_BACK, Reason.RESUBMITTED) else "Warning"
    transition = f"{failure}/{reason.value}" + (f"/{nudge}" if nudge is not None else "")
    return EventSpec(type=kind, reason=reason, message=message, transition=transition)


def _resubmitted_event(failure: str, *, attempt: int, options: appmeta.Options) -> EventSpec:
    return _transition_event(
        failure,
        Reason.RESUBMITTED,
        message=f"resubmitted job {options.job_id} as attempt {attempt} "
        f"(max-retries {options.max_retries})",
    )


def owed_event(
    app: Mapping[str, Any], *, now: datetime.datetime, config: config_.OperatorConfig
) -> EventSpec | None:
    """The Event that reported the transition into the phase ``app`` is in, if it is recent.

    A purely computational function with no side-effects. The operator writes a phase, then
    posts its Event; a replica killed between the two never posts it. Whoever acts on the app
    next posts it again under the transition's name (:attr:`EventSpec.transition`): created
    if it was lost, refused as a duplicate if it was not. Only transitions of the last
    :data:`EVENT_REPLAY_SECONDS` are owed, and only the phases a recovery moves through or ends
    in (RolledBack, Resubmitted and its retries, Exhausted, CommittedNotResubmitted).
    """
    values = appmeta.of(app)
    failure = values.get(appmeta.HANDLED_FAILURE)
    phase = values.get(appmeta.PHASE)
    message = values.get(appmeta.MESSAGE) or ""
    if not failure:
        return None
    event: EventSpec | None = None
    at: datetime.datetime | None = None
    if phase == Phase.RESUBMITTED.value:
        record = _resubmission_of(app)
        options = appmeta.parse(app, config=config).options
        if record is None or options is None:
            return None
        at, nudges = record
        event = (
            _resubmitted_event(failure, attempt=current_attempt(app), options=options)
            if nudges == 0
            else _transition_event(failure, Reason.RESUBMIT_RETRIED, message=message, nudge=nudges)
        )
    else:
        reason = {
            Phase.ROLLED_BACK.value: Reason.ROLLED_BACK,
            Phase.EXHAUSTED.value: Reason.RETRIES_EXHAUSTED,
            Phase.COMMITTED_NOT_RESUBMITTED.value: Reason.COMMITTED_NOT_RESUBMITTED,
        }.get(phase or "")
        if reason is None:
            return None
        at = _last_rollback_at(app)
        event = _transition_event(failure, reason, message=message)
    if at is None or (now - at).total_seconds() > EVENT_REPLAY_SECONDS:
        return None
    return event


def owed_events(
    app: Mapping[str, Any], *, now: datetime.datetime, config: config_.OperatorConfig
) -> tuple[EventSpec, ...]:
    """The Events of the recent transitions ``app`` went through, oldest first.

    A purely computational function with no side-effects. :func:`owed_event`, and before it,
    for a Kubeflow app Resubmitted (not nudged yet) right after its rollback, the RolledBack
    Event: when the backoff is over at the conclusion, the conclusion and the resubmission are
    one patch (:func:`resubmission_after`), so phase RolledBack is never stored, and a replica
    killed after that patch owes both Events.
    """
    last = owed_event(app, now=now, config=config)
    if last is None or last.reason is not Reason.RESUBMITTED:
        return () if last is None else (last,)
    values = appmeta.of(app)
    record = _json_object(values.get(appmeta.LAST_ROLLBACK))
    options = appmeta.parse(app, config=config).options
    at = _last_rollback_at(app)
    if (
        record is None
        or options is None
        or at is None
        or mutation.kind_of(app) is mutation.APACHE
        or record.get("onDelete")
        or record.get("attempt") != current_attempt(app) - 1
    ):
        return (last,)
    delay = backoff_delay(int(record["attempt"]), base=options.backoff, cap=options.backoff_max)
    message = _rolled_back_message(record, at + datetime.timedelta(seconds=delay))
    failure = values.get(appmeta.HANDLED_FAILURE)
    return (_transition_event(failure, Reason.ROLLED_BACK, message=message), last)


def _rolled_back_message(compact: Mapping[str, Any], retry_at: datetime.datetime) -> str:
    return f"{_rollback_done(compact)}; resubmitting at {format_time(retry_at)}"


def _rollback_done(compact: Mapping[str, Any]) -> str:
    return (
        f"rolled back {compact.get('rolledBack', 0)} instant(s), deleted "
        f"{compact.get('filesDeleted', 0)} file(s), kept {compact.get('committed', 0)} "
        "committed instant(s)"
    )


def _last_rollback_at(app: Mapping[str, Any]) -> datetime.datetime | None:
    value = _json_object(appmeta.of(app).get(appmeta.LAST_ROLLBACK))
    return parse_time(str(value.get("at") or "")) if value is not None else None


def decide(  # noqa: PLR0911, PLR0912 - one return per row of the decision table
    app: Mapping[str, Any],
    *,
    now: datetime.datetime,
    config: config_.OperatorConfig,
    holder: str = "",
) -> Decision:
    """The next step for ``app`` at ``now``, for the operator named ``holder``.

    A purely computational function with no side-effects. The decision table:

    * not opted in → NOTHING; bad annotations → MARK_INVALID once (then NOTHING);
    * COMPLETED → MARK_SUCCEEDED once;
    * SUBMISSION_FAILED/FAILING → NOTHING (spark-operator retries it or makes it FAILED);
    * FAILED, a failure not handled yet (or one whose rollback was
      interrupted) → ROLLBACK, or GIVE_UP when the attempt reached max-retries;
    * the handled failure, Recovering under another operator's live claim → WAIT until the
      claim expires (then it is taken over: ROLLBACK again, which is idempotent);
    * the handled failure, rolled back → WAIT until next-retry-at, then RESUBMIT;
    * the handled failure, Resubmitted, still FAILED → WAIT until the resubmission is due to be
      answered, then NUDGE (the same attempt, patched again);
    * Resubmitted, PENDING_RERUN with the rerun not submitted (:func:`_rerun_not_submitted`) →
      the same WAIT, then NUDGE;
    * the handled failure, settled (Exhausted/CommittedNotResubmitted) → NOTHING;
    * any other state → NOTHING.
    """
    parsed = appmeta.parse(app, config=config)
    values = appmeta.of(app)
    phase = values.get(appmeta.PHASE)
    if not parsed.enabled:
        return Decision(action=Action.NOTHING, reason="not opted in")
    if parsed.options is None:
        if phase == Phase.INVALID.value:
            return Decision(action=Action.NOTHING, reason="already marked Invalid")
        message = "; ".join(str(p) for p in parsed.problems)
        return Decision(
            action=Action.MARK_INVALID,
            reason="invalid annotations",
            patch=_annotations_patch(
                {appmeta.PHASE: Phase.INVALID.value, appmeta.MESSAGE: message[:1000]}
            ),
            event=EventSpec(
                type="Warning",
                reason=Reason.INVALID_ANNOTATION,
                message=f"sparkguard will not protect this app: {message}",
            ),
        )
    options = parsed.options
    seen = observe(app)
    state = seen.state
    attempt = current_attempt(app)
    apache = mutation.kind_of(app) is mutation.APACHE

    if seen.outcome is Outcome.SUCCEEDED:
        if phase == Phase.SUCCEEDED.value:
            return Decision(action=Action.NOTHING, reason="already marked Succeeded")
        return Decision(
            action=Action.MARK_SUCCEEDED,
            reason=f"{state}",
            attempt=attempt,
            options=options,
            patch=_annotations_patch(
                {appmeta.PHASE: Phase.SUCCEEDED.value, appmeta.NEXT_RETRY_AT: None}
            ),
        )
    if seen.outcome is Outcome.TRANSIENT:
        return Decision(
            action=Action.NOTHING,
            reason=f"state {state!r}: its operator (spark-operator) retries it, restarts it "
            "or makes it final",
        )
    handled_failure = values.get(appmeta.HANDLED_FAILURE)
    if (
        state == PENDING_RERUN
        and not apache
        and phase == Phase.RESUBMITTED.value
        and handled_failure
        and _rerun_not_submitted(app)
    ):
        # our resubmission's rerun, not submitted yet: nudge it if it waits too long
        return _verify_resubmission(
            app,
            attempt=attempt,
            failure=handled_failure,
            options=options,
            now=now,
            config=config,
            waiting_in=state,
        )
    if seen.outcome is not Outcome.FAILED or seen.failure is None:
        return Decision(action=Action.NOTHING, reason=f"state {state or 'new'!r} needs nothing")

    failure = seen.failure
    handled = values.get(appmeta.HANDLED_FAILURE) == failure
    if handled and phase == Phase.RESUBMITTED.value and apache:
        # recorded on the old app just before its deletion: finish the recreation
        return _resubmit(
            attempt=attempt, failure=failure, options=options, now=now, apache=True, again=True
        )
    if handled and phase == Phase.RESUBMITTED.value:
        return _verify_resubmission(
            app, attempt=attempt, failure=failure, options=options, now=now, config=config
        )
    if handled and phase in {p.value for p in SETTLED_PHASES}:
        return Decision(
            action=Action.NOTHING,
            reason=f"failure {failure} already handled ({phase})",
            attempt=attempt,
            failure_id=failure,
            options=options,
        )
    if handled and phase == Phase.ROLLED_BACK.value:
        retry_at = parse_time(values.get(appmeta.NEXT_RETRY_AT)) or now
        if now < retry_at:
            return Decision(
                action=Action.WAIT,
                reason=f"backoff until {format_time(retry_at)}",
                attempt=attempt,
                failure_id=failure,
                retry_at=retry_at,
                options=options,
            )
        return _resubmit(
            attempt=attempt,
            failure=failure,
            options=options,
            now=now,
            apache=apache,
            used=seen.restarts,
        )
    claim = claim_of(app)
    if (
        handled
        and phase == Phase.RECOVERING.value
        and claim is not None
        and claim.holder != holder
        and now < claim.until
    ):
        return Decision(
            action=Action.WAIT,
            reason=f"{claim.holder} is rolling back failure {failure} (claim until "
            f"{format_time_precise(claim.until)})",
            attempt=attempt,
            failure_id=failure,
            retry_at=claim.until,
            options=options,
        )

    # A new failure, or one whose rollback was interrupted (phase Recovering, its claim expired
    # or ours): roll back. Rollback is idempotent, so doing it again after a restart is safe.
    # The budget: sparkguard's resubmissions, plus (Apache) the restarts its operator made
    give_up = attempt + seen.restarts >= options.max_retries
    new_claim = Claim(
        holder=holder, until=now + datetime.timedelta(seconds=config.claim_ttl_seconds)
    )
    return Decision(
        action=Action.GIVE_UP if give_up else Action.ROLLBACK,
        reason=f"{state} at attempt {attempt}"
        + (f" after {seen.restarts} restart(s) by its operator" if seen.restarts else "")
        + (f", no retries left (max-retries {options.max_retries})" if give_up else ""),
        attempt=attempt,
        failure_id=failure,
        options=options,
        patch=_annotations_patch(
            {
                appmeta.PHASE: Phase.RECOVERING.value,
                appmeta.HANDLED_FAILURE: failure,
                appmeta.ATTEMPT: str(attempt),
                appmeta.NEXT_RETRY_AT: None,
                appmeta.MESSAGE: f"{state}: rolling back job {options.job_id}",
                CLAIM: new_claim.to_annotation(),
                RESUBMISSION: None,
            }
        ),
        claim=new_claim,
        event=EventSpec(
            type="Normal",
            reason=Reason.ROLLBACK_STARTED,
            message=f"{state} at attempt {attempt}: rolling back the uncommitted output of job "
            f"{options.job_id}",
        ),
    )


def _resubmit(
    *,
    attempt: int,
    failure: str,
    options: appmeta.Options,
    now: datetime.datetime,
    apache: bool = False,
    used: int = 0,
    again: bool = False,
) -> Decision:
    """Kubeflow: the spec change that reruns the app. Apache: RECREATE, whose patch holds the
    annotations of the new app; its attempt counts the old app's restarts too (``used``), so
    the budget spans every attempt of every incarnation. Repeated on the old app recorded
    Resubmitted (``again``: its attempt is the new one already), it is the same recreation."""
    if apache:
        new_attempt = attempt if again else attempt + used + 1
        record = json.dumps({"at": format_time_precise(now), "nudges": 0})
        return Decision(
            action=Action.RECREATE,
            reason=f"resubmitting by recreating the app as attempt {new_attempt} of at most "
            f"{options.max_retries}",
            attempt=new_attempt,
            failure_id=failure,
            options=options,
            patch=_annotations_patch(
                {
                    appmeta.ATTEMPT: str(new_attempt),
                    appmeta.PHASE: Phase.RESUBMITTED.value,
                    appmeta.HANDLED_FAILURE: failure,
                    appmeta.NEXT_RETRY_AT: None,
                    appmeta.MESSAGE: f"resubmitted as attempt {new_attempt}",
                    CLAIM: None,
                    RESUBMISSION: record,
                }
            ),
            event=_resubmitted_event(failure, attempt=new_attempt, options=options),
        )
    new_attempt = attempt + 1
    patch = {
        "metadata": {
            "annotations": {
                appmeta.ATTEMPT: str(new_attempt),
                appmeta.PHASE: Phase.RESUBMITTED.value,
                appmeta.HANDLED_FAILURE: failure,
                appmeta.NEXT_RETRY_AT: None,
                appmeta.MESSAGE: f"resubmitted as attempt {new_attempt}",
                CLAIM: None,
                RESUBMISSION: _resubmission_record(now, 0),
            }
        },
        # spark-operator reruns an app whose spec changed: the attempt is that change.
        "spec": {"sparkConf": {mutation.CONF_ATTEMPT: str(new_attempt)}},
    }
    return Decision(
        action=Action.RESUBMIT,
        reason=f"resubmitting as attempt {new_attempt} of at most {options.max_retries}",
        attempt=new_attempt,
        failure_id=failure,
        options=options,
        patch=patch,
        event=_resubmitted_event(failure, attempt=new_attempt, options=options),
    )


def _rerun_not_submitted(app: Mapping[str, Any]) -> bool:
    """Whether ``app``'s status is that of a spec change's rerun before its spark-submit: the
    INVALIDATING reset zeroes ``submissionAttempts`` and ``lastSubmissionAttemptTime``
    (controller.go resetSparkApplicationStatus), which spark-operator's own OnFailure retry
    (from FAILING) keeps. A purely computational function with no side-effects."""
    status = app.get("status") or {}
    return not status.get("submissionAttempts") and not status.get("lastSubmissionAttemptTime")


def _verify_resubmission(
    app: Mapping[str, Any],
    *,
    attempt: int,
    failure: str,
    options: appmeta.Options,
    now: datetime.datetime,
    config: config_.OperatorConfig,
    waiting_in: str | None = None,
) -> Decision:
    """Resubmitted, yet spark-operator still reports the failure we handled, or (``waiting_in``
    PENDING_RERUN) has not submitted the rerun: wait, then nudge.

    spark-operator reruns an app whose spec changed from an event filter that is best effort
    (a conflicting status write drops the rerun with only an Event), and submits the rerun
    only when an event of the old driver pod's deletion reaches it (which it may drop: see
    :data:`PENDING_RERUN`), so a resubmission that is not answered within ``resubmit_timeout``
    is patched again with a new spec change (any write to the app wakes a waiting rerun; a spec
    change also reruns one that was dropped).
    """
    record = _resubmission_of(app)
    if record is None:  # resubmitted by an operator version that did not verify
        return Decision(
            action=Action.NOTHING,
            reason=f"failure {failure} already handled (Resubmitted)",
            attempt=attempt,
            failure_id=failure,
            options=options,
        )
    at, nudges = record
    due = at + datetime.timedelta(
        seconds=nudge_interval(nudges, timeout=config.resubmit_timeout_seconds)
    )
    if now < due:
        return Decision(
            action=Action.WAIT,
            reason=f"resubmitted attempt {attempt}; waiting for spark-operator to rerun it "
            f"(until {format_time_precise(due)})",
            attempt=attempt,
            failure_id=failure,
            retry_at=due,
            options=options,
        )
    nudge = nudges + 1
    waited = (now - at).total_seconds()
    if waiting_in is None:
        what = (
            f"the app still reports the failure sparkguard handled ({failure}): spark-operator "
            "dropped the rerun"
        )
    else:
        what = (
            f"spark-operator has not submitted the rerun ({waiting_in}: it lost the event of "
            "the old driver pod's deletion)"
        )
    message = (
        f"attempt {attempt} of job {options.job_id} was resubmitted {waited:.0f}s ago but "
        f"{what}; patched the spec again (retry {nudge})"
    )
    return Decision(
        action=Action.NUDGE,
        reason=message,
        attempt=attempt,
        failure_id=failure,
        options=options,
        patch={
            "metadata": {
                "annotations": {
                    RESUBMISSION: _resubmission_record(now, nudge),
                    appmeta.MESSAGE: message[:1000],
                }
            },
            "spec": {"sparkConf": {CONF_RESUBMISSION: f"{attempt}.{nudge}"}},
        },
        event=_transition_event(
            failure, Reason.RESUBMIT_RETRIED, message=message[:1000], nudge=nudge
        ),
    )


def summarize_rollback(summary: Mapping[str, Any]) -> dict[str, Any]:
    """A compact form of a rollback summary's JSON, small enough for an annotation.

    A purely computational function with no side-effects.
    """
    rolled_back = list(summary.get("instants_rolled_back") or ())
    committed = list(summary.get("instants_committed") or ())
    return {
        "rolledBack": len(rolled_back),
        "committed": len(committed),
        "filesDeleted": int(summary.get("files_deleted") or 0),
        "filesKept": int(summary.get("files_kept") or 0),
        "instantsRolledBack": rolled_back[:_LISTED_INSTANTS],
        "instantsCommitted": committed[:_LISTED_INSTANTS],
    }


def conclude_rollback(
    decision: Decision,
    *,
    summary: Mapping[str, Any],
    now: datetime.datetime,
    seconds: float | None = None,
    queued_seconds: float | None = None,
) -> Conclusion:
    """What the rollback ``summary`` means after ``decision``.

    ``summary`` has the fields of the library's ``RollbackSummary`` (``instants_rolled_back``,
    ``instants_committed``, ``files_deleted``, ``files_kept``).

    A purely computational function with no side-effects:

    * ``GIVE_UP`` → Exhausted;
    * otherwise → RolledBack, with next-retry-at after the backoff for this attempt; also when
      every instant the rollback found was committed (none rolled back): the job died after
      an outcome, and whether it had work left after that write nobody but its rerun can
      tell. The rerun skips its committed writes (``rerun=skip``), so resubmitting redoes no
      output, and the app can end COMPLETED instead of staying FAILED. (Until 2026-12 this
      concluded CommittedNotResubmitted: a job with a second write to come lost it.)
    """
    options = decision.options
    if options is None:  # pragma: no cover - decide() always sets options for rollbacks
        raise ValueError("a rollback decision carries the app's options")
    compact = summarize_rollback(summary)
    timing = {"seconds": round(seconds, 3)} if seconds is not None else {}
    if queued_seconds is not None:  # how long it waited for a rollback slot before
        timing["queued"] = round(queued_seconds, 3)
    record = json.dumps({"at": format_time(now), "attempt": decision.attempt, **timing, **compact})
    common = {
        appmeta.LAST_ROLLBACK: record,
        appmeta.HANDLED_FAILURE: decision.failure_id,
        CLAIM: None,
    }
    done = _rollback_done(compact)
    if decision.action is Action.GIVE_UP:
        message = (
            f"job {options.job_id} failed at attempt {decision.attempt} and max-retries is "
            f"{options.max_retries}: {done}; not resubmitted. Fix the job, then raise "
            f"{appmeta.MAX_RETRIES} or resubmit it yourself"
        )
        return _final_conclusion(
            Phase.EXHAUSTED,
            Reason.RETRIES_EXHAUSTED,
            failure=decision.failure_id,
            message=message,
            annotations=common,
        )
    delay = backoff_delay(decision.attempt, base=options.backoff, cap=options.backoff_max)
    retry_at = now + datetime.timedelta(seconds=delay)
    message = _rolled_back_message(compact, retry_at)
    return Conclusion(
        phase=Phase.ROLLED_BACK,
        patch=_annotations_patch(
            {
                **common,
                appmeta.PHASE: Phase.ROLLED_BACK.value,
                appmeta.NEXT_RETRY_AT: format_time(retry_at),
                appmeta.MESSAGE: message,
            }
        ),
        event=_transition_event(decision.failure_id, Reason.ROLLED_BACK, message=message),
    )


def merge_patches(first: Mapping[str, Any], second: Mapping[str, Any]) -> dict[str, Any]:
    """One JSON merge patch (RFC 7386) that does what ``first`` then ``second`` do.

    A purely computational function with no side-effects.
    """
    merged = dict(first)
    for key, value in second.items():
        before = merged.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            merged[key] = merge_patches(before, value)
        else:
            merged[key] = value
    return merged


def resubmission_after(
    app: Mapping[str, Any],
    conclusion: Conclusion,
    *,
    now: datetime.datetime,
    config: config_.OperatorConfig,
    holder: str = "",
) -> Decision | None:
    """The resubmission due as soon as ``conclusion`` is written on ``app``, if any.

    A purely computational function with no side-effects. When the backoff is already over
    (``backoff: 0``), :func:`decide` on the concluded app would resubmit at once; the operator
    then writes the conclusion and the resubmission in one patch
    (``merge_patches(conclusion.patch, decision.patch)``), under its claim, instead of two.
    Only Kubeflow's in-place resubmission is merged (an Apache app is recreated, in steps).
    """
    if conclusion.phase is not Phase.ROLLED_BACK:
        return None
    decision = decide(
        mutation.apply_merge_patch(app, conclusion.patch), now=now, config=config, holder=holder
    )
    return decision if decision.action is Action.RESUBMIT else None
