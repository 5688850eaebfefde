"""The recovery decisions: a table per state, the backoff schedule, restart safety."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import pytest

from sparkguard.operator import appmeta, mutation, recovery
from sparkguard.operator import config as config_
from tests.operator.apps import apache_app, failed_status, spark_app

NOW = datetime.datetime(2026, 11, 22, 12, 0, 0, tzinfo=datetime.UTC)
Action, Phase = recovery.Action, recovery.Phase


def _app(*, status: dict[str, Any] | None = None, **notes: str) -> dict[str, Any]:
    return spark_app(annotations=dict(notes), status=status)


def _apply(app: dict[str, Any], patch: Any) -> dict[str, Any]:
    return mutation.apply_merge_patch(app, patch)


def _decide(
    app: dict[str, Any], config: config_.OperatorConfig, now: datetime.datetime = NOW
) -> recovery.Decision:
    return recovery.decide(app, now=now, config=config)


@pytest.mark.parametrize("state", [None, "", "SUBMITTED", "RUNNING", "PENDING_RERUN", "UNKNOWN"])
def test_live_states_need_nothing(config: config_.OperatorConfig, state: str | None) -> None:
    app = spark_app(state=state) if state is not None else spark_app()
    assert _decide(app, config).action is Action.NOTHING


def test_not_opted_in_needs_nothing_even_when_failed(config: config_.OperatorConfig) -> None:
    app = spark_app(enabled=False, status=failed_status())
    assert _decide(app, config).action is Action.NOTHING


@pytest.mark.parametrize("policy", ["Never", "OnFailure", "Always"])
@pytest.mark.parametrize("state", ["SUBMISSION_FAILED", "FAILING"])
def test_a_failure_spark_operator_still_handles_needs_nothing(
    config: config_.OperatorConfig, state: str, policy: str
) -> None:
    """SUBMISSION_FAILED and FAILING are never final upstream: spark-operator resubmits (within
    its retry budget) or moves the app to FAILED itself. A rollback now could claim the
    instant of the submission it is about to retry, and a resubmission would double it."""
    app = _app(status=failed_status(state=state))
    app["spec"]["restartPolicy"] = {"type": policy, "onSubmissionFailureRetries": 2}
    decision = _decide(app, config)
    assert decision.action is Action.NOTHING
    assert "(spark-operator) retries it" in decision.reason
    assert decision.patch is None or not decision.patch


def test_a_new_failure_starts_a_rollback(config: config_.OperatorConfig) -> None:
    state = "FAILED"
    decision = _decide(_app(status=failed_status(state=state)), config)
    assert decision.action is Action.ROLLBACK
    assert decision.attempt == 0
    assert decision.failure_id
    assert decision.failure_id.startswith(state)
    notes = decision.patch["metadata"]["annotations"]
    assert notes[appmeta.PHASE] == "Recovering"
    assert notes[appmeta.HANDLED_FAILURE] == decision.failure_id
    assert "spec" not in decision.patch  # nothing is resubmitted before the rollback
    assert decision.event is not None
    assert decision.event.reason is recovery.Reason.ROLLBACK_STARTED


def test_completed_is_marked_succeeded_once(config: config_.OperatorConfig) -> None:
    app = spark_app(state="COMPLETED")
    decision = _decide(app, config)
    assert decision.action is Action.MARK_SUCCEEDED
    assert _decide(_apply(app, decision.patch), config).action is Action.NOTHING


def test_invalid_annotations_are_marked_once(config: config_.OperatorConfig) -> None:
    app = _app(status=failed_status(), **{appmeta.MAX_RETRIES: "lots"})
    decision = _decide(app, config)
    assert decision.action is Action.MARK_INVALID
    assert decision.event is not None
    assert decision.event.type == "Warning"
    assert decision.event.reason is recovery.Reason.INVALID_ANNOTATION
    assert appmeta.MAX_RETRIES in decision.event.message
    marked = _apply(app, decision.patch)
    assert appmeta.of(marked)[appmeta.PHASE] == "Invalid"
    assert _decide(marked, config).action is Action.NOTHING  # no crash loop, no event storm


def _rolled_back(
    app: dict[str, Any], decision: recovery.Decision, **summary: Any
) -> dict[str, Any]:
    marked = _apply(app, decision.patch)
    full = {
        "instants_rolled_back": ("i1",),
        "instants_committed": (),
        "files_deleted": 3,
        "files_kept": 0,
        **summary,
    }
    conclusion = recovery.conclude_rollback(decision, summary=full, now=NOW)
    return _apply(marked, conclusion.patch)


def test_full_cycle_rollback_wait_resubmit(config: config_.OperatorConfig) -> None:
    app = _app(status=failed_status(), **{appmeta.BACKOFF: "30s"})
    first = _decide(app, config)
    app = _rolled_back(app, first)
    notes = appmeta.of(app)
    assert notes[appmeta.PHASE] == "RolledBack"
    assert notes[appmeta.NEXT_RETRY_AT] == "2026-11-22T12:00:30+00:00"
    assert '"filesDeleted": 3' in notes[appmeta.LAST_ROLLBACK]

    waiting = _decide(app, config, NOW + datetime.timedelta(seconds=10))
    assert waiting.action is Action.WAIT
    assert waiting.retry_at == NOW + datetime.timedelta(seconds=30)

    resubmit = _decide(app, config, NOW + datetime.timedelta(seconds=30))
    assert resubmit.action is Action.RESUBMIT
    assert resubmit.attempt == 1
    assert resubmit.patch["spec"] == {"sparkConf": {"spark.sparkguard.attempt": "1"}}
    assert resubmit.patch["metadata"]["annotations"][appmeta.PHASE] == "Resubmitted"
    assert resubmit.patch["metadata"]["annotations"][appmeta.ATTEMPT] == "1"

    after = _apply(app, resubmit.patch)
    # Restart safety: the same (stale) FAILED status read again soon after the resubmission
    # waits for spark-operator to answer it; it is never a second resubmission.
    stale = _decide(after, config, NOW + datetime.timedelta(seconds=40))
    assert stale.action is Action.WAIT
    assert "spark.sparkguard.attempt" not in str(stale.patch)
    # The app left FAILED: the resubmission was answered, nothing more to do.
    after["status"] = {"applicationState": {"state": "SUBMITTED"}}
    assert _decide(after, config, NOW + datetime.timedelta(hours=1)).action is Action.NOTHING


def test_an_unanswered_resubmission_is_patched_again(config: config_.OperatorConfig) -> None:
    """spark-operator may drop the rerun of a spec change: after the timeout, nudge it."""
    config = dataclasses.replace(config, resubmit_timeout_seconds=60)
    failed = _app(status=failed_status(), **{appmeta.BACKOFF: "0"})
    app = _rolled_back(failed, _decide(failed, config))
    resubmitted = _apply(app, _decide(app, config).patch)
    assert _decide(resubmitted, config, NOW + datetime.timedelta(seconds=59)).action is (
        Action.WAIT
    )
    nudge = _decide(resubmitted, config, NOW + datetime.timedelta(seconds=61))
    assert nudge.action is Action.NUDGE
    assert nudge.attempt == 1
    assert nudge.patch["spec"] == {"sparkConf": {recovery.CONF_RESUBMISSION: "1.1"}}
    assert nudge.event is not None
    assert nudge.event.reason is recovery.Reason.RESUBMIT_RETRIED
    assert nudge.event.type == "Warning"
    nudged = _apply(resubmitted, nudge.patch)
    assert appmeta.of(nudged)[appmeta.ATTEMPT] == "1"  # the same attempt, patched again
    # The next nudge waits twice as long; a second one changes the spec again.
    later = NOW + datetime.timedelta(seconds=61 + 119)
    assert _decide(nudged, config, later).action is Action.WAIT
    again = _decide(nudged, config, later + datetime.timedelta(seconds=2))
    assert again.patch["spec"] == {"sparkConf": {recovery.CONF_RESUBMISSION: "1.2"}}


def test_a_rerun_left_unsubmitted_in_pending_rerun_is_patched_again(
    config: config_.OperatorConfig,
) -> None:
    """spark-operator submits a spec change's rerun only when the old driver pod's deletion
    event reaches it, and drops that event when the pod carries another submission id than the
    app (spark-operator submitted twice): the rerun waits in PENDING_RERUN for ever. After the
    timeout, nudge it, as a dropped rerun. spark-operator's own OnFailure retry also passes
    PENDING_RERUN (the attempts kept): that one is never nudged."""
    config = dataclasses.replace(config, resubmit_timeout_seconds=60)
    failed = _app(status=failed_status(), **{appmeta.BACKOFF: "0"})
    app = _rolled_back(failed, _decide(failed, config))
    resubmitted = _apply(app, _decide(app, config).patch)
    # what the INVALIDATING reset leaves (resetSparkApplicationStatus), then PENDING_RERUN
    invalidated = failed_status(state="PENDING_RERUN")
    for key in ("submissionAttempts", "executionAttempts", "lastSubmissionAttemptTime"):
        del invalidated[key]
    waiting = {**resubmitted, "status": invalidated}
    early = _decide(waiting, config, NOW + datetime.timedelta(seconds=59))
    assert early.action is Action.WAIT
    assert early.retry_at == NOW + datetime.timedelta(seconds=60)
    nudge = _decide(waiting, config, NOW + datetime.timedelta(seconds=61))
    assert nudge.action is Action.NUDGE
    assert nudge.patch["spec"] == {"sparkConf": {recovery.CONF_RESUBMISSION: "1.1"}}
    assert "has not submitted the rerun (PENDING_RERUN" in nudge.reason
    # submitted since (the attempts counted again): the rerun is under way
    submitted = {**waiting, "status": {**invalidated, "submissionAttempts": 1}}
    later = NOW + datetime.timedelta(hours=1)
    assert _decide(submitted, config, later).action is Action.NOTHING
    # an OnFailure retry of the rerun by spark-operator itself, hours later: not ours
    retrying = {**resubmitted, "status": failed_status(state="PENDING_RERUN")}
    assert _decide(retrying, config, later).action is Action.NOTHING
    # nor PENDING_RERUN of an app sparkguard never resubmitted
    assert _decide(_app(status=invalidated), config, later).action is Action.NOTHING


def test_nudge_interval_doubles_up_to_ten_minutes() -> None:
    intervals = [recovery.nudge_interval(n, timeout=60) for n in range(6)]
    assert intervals == [60, 120, 240, 480, 600, 600]


def test_a_live_claim_of_another_operator_is_waited_for(config: config_.OperatorConfig) -> None:
    app = _app(status=failed_status())
    first = recovery.decide(app, now=NOW, config=config, holder="replica-a")
    assert first.action is Action.ROLLBACK
    assert first.claim == recovery.Claim(
        holder="replica-a", until=NOW + datetime.timedelta(seconds=config.claim_ttl_seconds)
    )
    claimed = _apply(app, first.patch)
    assert recovery.claim_of(claimed) == first.claim
    # The other replica sees the failure Recovering under a live claim: it waits, it does not
    # take the Recovering phase for an interrupted rollback.
    other = recovery.decide(claimed, now=NOW + datetime.timedelta(seconds=5), config=config,
                            holder="replica-b")  # fmt: skip
    assert other.action is Action.WAIT
    assert other.retry_at == first.claim.until
    assert "replica-a" in other.reason
    # Once the claim expired (its holder died), the other one takes over, with its own claim.
    expired = first.claim.until + datetime.timedelta(seconds=1)
    takeover = recovery.decide(claimed, now=expired, config=config, holder="replica-b")
    assert takeover.action is Action.ROLLBACK
    assert takeover.claim is not None
    assert takeover.claim.holder == "replica-b"
    # The holder itself (a step that failed and is retried) rolls back again under its claim.
    retry = recovery.decide(claimed, now=NOW, config=config, holder="replica-a")
    assert retry.action is Action.ROLLBACK


def test_the_conclusion_and_the_resubmission_clear_the_claim(
    config: config_.OperatorConfig,
) -> None:
    app = _app(status=failed_status(), **{appmeta.BACKOFF: "0"})
    rolled_back = _rolled_back(app, recovery.decide(app, now=NOW, config=config, holder="a"))
    assert recovery.claim_of(rolled_back) is None
    assert recovery.RESUBMISSION not in appmeta.of(rolled_back)
    resubmitted = _apply(rolled_back, _decide(rolled_back, config).patch)
    assert recovery.claim_of(resubmitted) is None
    assert recovery.RESUBMISSION in appmeta.of(resubmitted)


def test_coordination_annotations_are_not_user_options(config: config_.OperatorConfig) -> None:
    """The claim and the resubmission record live outside sparkguard.io/: never Invalid."""
    app = _app(status=failed_status())
    claimed = _apply(app, _decide(app, config).patch)
    assert appmeta.parse(claimed, config=config).options is not None


def test_the_next_failure_of_the_rerun_is_a_new_failure(config: config_.OperatorConfig) -> None:
    app = _app(status=failed_status(submission="sub-1"))
    app = _rolled_back(app, _decide(app, config))
    app = _apply(app, _decide(app, config, NOW + datetime.timedelta(hours=1)).patch)
    app["status"] = failed_status(submission="sub-2", terminated="2026-11-22T13:00:00Z")
    decision = _decide(app, config, NOW + datetime.timedelta(hours=2))
    assert decision.action is Action.ROLLBACK
    assert decision.attempt == 1


def test_interrupted_rollback_is_redone_not_skipped(config: config_.OperatorConfig) -> None:
    app = _app(status=failed_status())
    first = _decide(app, config)
    recovering = _apply(app, first.patch)  # the operator died during the rollback
    again = _decide(recovering, config)
    assert again.action is Action.ROLLBACK
    assert again.failure_id == first.failure_id


# CommittedNotResubmitted: what versions before 2026-12 concluded for an all-committed rollback
@pytest.mark.parametrize("phase", ["Resubmitted", "Exhausted", "CommittedNotResubmitted"])
def test_the_same_failure_handled_twice_is_a_no_op(
    config: config_.OperatorConfig, phase: str
) -> None:
    app = _app(status=failed_status())
    failure = recovery.failure_id(app["status"])
    handled = _app(
        status=failed_status(),
        **{appmeta.PHASE: phase, appmeta.HANDLED_FAILURE: failure, appmeta.ATTEMPT: "1"},
    )
    assert _decide(handled, config).action is Action.NOTHING


def test_max_retries_gives_up_after_a_rollback(config: config_.OperatorConfig) -> None:
    app = _app(status=failed_status(), **{appmeta.MAX_RETRIES: "2", appmeta.ATTEMPT: "2"})
    decision = _decide(app, config)
    assert decision.action is Action.GIVE_UP
    final = _rolled_back(app, decision)
    assert appmeta.of(final)[appmeta.PHASE] == "Exhausted"
    assert appmeta.NEXT_RETRY_AT not in appmeta.of(final)
    conclusion = recovery.conclude_rollback(
        decision, summary={"instants_rolled_back": ["i"]}, now=NOW
    )
    assert conclusion.event.reason is recovery.Reason.RETRIES_EXHAUSTED
    assert conclusion.event.type == "Warning"
    assert _decide(final, config).action is Action.NOTHING


def test_max_retries_zero_never_resubmits(config: config_.OperatorConfig) -> None:
    app = _app(status=failed_status(), **{appmeta.MAX_RETRIES: "0"})
    assert _decide(app, config).action is Action.GIVE_UP


def test_attempt_falls_back_to_the_spark_conf(config: config_.OperatorConfig) -> None:
    app = _app(status=failed_status(), **{appmeta.MAX_RETRIES: "1"})
    app["spec"]["sparkConf"]["spark.sparkguard.attempt"] = "1"
    assert _decide(app, config).action is Action.GIVE_UP


def test_everything_committed_is_rolled_back_and_resubmitted(
    config: config_.OperatorConfig,
) -> None:
    """Only committed instants found (the driver died after its outcome): RolledBack, then
    resubmitted after the backoff; the job may have more to write, its rerun skips what it
    committed."""
    app = _app(status=failed_status(), **{appmeta.BACKOFF: "0"})
    decision = _decide(app, config)
    conclusion = recovery.conclude_rollback(
        decision,
        summary={"instants_rolled_back": (), "instants_committed": ("a", "b"), "files_kept": 4},
        now=NOW,
    )
    assert conclusion.phase is Phase.ROLLED_BACK
    assert conclusion.event.reason is recovery.Reason.ROLLED_BACK
    assert "kept 2 committed instant(s)" in conclusion.event.message
    concluded = _apply(_apply(app, decision.patch), conclusion.patch)
    assert _decide(concluded, config, NOW + datetime.timedelta(seconds=1)).action is Action.RESUBMIT


def test_nothing_written_at_all_is_resubmitted(config: config_.OperatorConfig) -> None:
    app = _app(status=failed_status())
    decision = _decide(app, config)
    conclusion = recovery.conclude_rollback(decision, summary={}, now=NOW)
    assert conclusion.phase is Phase.ROLLED_BACK


def test_partly_committed_job_is_resubmitted(config: config_.OperatorConfig) -> None:
    app = _app(status=failed_status())
    decision = _decide(app, config)
    summary = {"instants_rolled_back": ("b",), "instants_committed": ("a",)}
    assert recovery.conclude_rollback(decision, summary=summary, now=NOW).phase is (
        Phase.ROLLED_BACK
    )


@pytest.mark.parametrize(
    ("base", "cap", "expected"),
    [
        (30, 600, [30, 60, 120, 240, 480, 600, 600]),
        (1, 5, [1, 2, 4, 5, 5, 5, 5]),
        (0, 600, [0, 0, 0, 0, 0, 0, 0]),
    ],
)
def test_backoff_schedule(base: float, cap: float, expected: list[float]) -> None:
    assert [recovery.backoff_delay(a, base=base, cap=cap) for a in range(7)] == expected
    assert recovery.backoff_delay(10_000, base=base, cap=cap) == expected[-1]


def test_backoff_grows_with_the_attempt(config: config_.OperatorConfig) -> None:
    app = _app(status=failed_status(), **{appmeta.ATTEMPT: "2", appmeta.BACKOFF: "10s"})
    app = _rolled_back(app, _decide(app, config))
    assert appmeta.of(app)[appmeta.NEXT_RETRY_AT] == "2026-11-22T12:00:40+00:00"


def test_failure_id_is_stable_and_distinguishes_reruns() -> None:
    one = failed_status(submission="a")
    assert recovery.failure_id(one) == recovery.failure_id(dict(one))
    assert recovery.failure_id(one) != recovery.failure_id(failed_status(submission="b"))
    assert recovery.failure_id(one) != recovery.failure_id(failed_status(state="SUBMISSION_FAILED"))


def test_last_rollback_annotation_stays_small() -> None:
    many = tuple(f"2026112212000000{i}-job" for i in range(500))
    compact = recovery.summarize_rollback({"instants_rolled_back": many})
    assert compact["rolledBack"] == 500
    assert len(compact["instantsRolledBack"]) == 20


def _concluded(
    app: dict[str, Any], decision: recovery.Decision, **summary: Any
) -> tuple[dict[str, Any], recovery.EventSpec]:
    full = {"instants_rolled_back": ("i1",), "files_deleted": 3, **summary}
    conclusion = recovery.conclude_rollback(decision, summary=full, now=NOW)
    return _apply(_apply(app, decision.patch), conclusion.patch), conclusion.event


@pytest.mark.parametrize(
    ("notes", "summary", "reason"),
    [
        ({}, {}, recovery.Reason.ROLLED_BACK),
        ({appmeta.MAX_RETRIES: "0"}, {}, recovery.Reason.RETRIES_EXHAUSTED),
        (
            {},
            {"instants_rolled_back": (), "instants_committed": ("c",)},
            recovery.Reason.ROLLED_BACK,
        ),
    ],
)
def test_the_event_of_a_conclusion_can_be_posted_again_from_the_app(
    config: config_.OperatorConfig,
    notes: dict[str, str],
    summary: dict[str, Any],
    reason: recovery.Reason,
) -> None:
    """A replica killed after writing the conclusion, before its Event: the next one posts it."""
    app = _app(status=failed_status(), **notes)
    concluded, posted = _concluded(app, _decide(app, config), **summary)
    assert posted.reason is reason
    assert posted.transition is not None
    assert posted.transition.startswith(appmeta.of(concluded)[appmeta.HANDLED_FAILURE])
    # The same Event (same transition: the same Event name), rebuilt from the annotations alone.
    owed = recovery.owed_event(concluded, now=NOW + datetime.timedelta(seconds=5), config=config)
    assert owed == posted
    # An hour on, the API server has dropped its Events (--event-ttl): none is owed any more.
    later = NOW + datetime.timedelta(seconds=recovery.EVENT_REPLAY_SECONDS + 1)
    assert recovery.owed_event(concluded, now=later, config=config) is None


def test_the_events_of_a_resubmission_and_its_retries_can_be_posted_again(
    config: config_.OperatorConfig,
) -> None:
    config = dataclasses.replace(config, resubmit_timeout_seconds=60)
    failed = _app(status=failed_status(), **{appmeta.BACKOFF: "0"})
    app, _ = _concluded(failed, _decide(failed, config))
    resubmit = _decide(app, config)
    resubmitted = _apply(app, resubmit.patch)
    assert recovery.owed_event(resubmitted, now=NOW, config=config) == resubmit.event
    nudge = _decide(resubmitted, config, NOW + datetime.timedelta(seconds=61))
    nudged = _apply(resubmitted, nudge.patch)
    owed = recovery.owed_event(nudged, now=NOW + datetime.timedelta(seconds=62), config=config)
    assert owed == nudge.event
    # Each retry is an Event of its own; the resubmission's is not posted a second time.
    assert nudge.event is not None
    assert resubmit.event is not None
    assert len({nudge.event.transition, resubmit.event.transition}) == 2


@pytest.mark.parametrize("phase", [None, "Recovering", "Succeeded", "Invalid"])
def test_no_event_is_owed_outside_the_transitions_of_a_recovery(
    config: config_.OperatorConfig, phase: str | None
) -> None:
    notes = {appmeta.HANDLED_FAILURE: "FAILED-0123", **({appmeta.PHASE: phase} if phase else {})}
    app = _app(status=failed_status(), **notes)
    assert recovery.owed_event(app, now=NOW, config=config) is None
    # Nor for a phase without the failure it handled (written by hand, or an old operator).
    app = _app(status=failed_status(), **{appmeta.PHASE: "RolledBack"})
    assert recovery.owed_event(app, now=NOW, config=config) is None


def test_two_merge_patches_merge_into_one_that_does_both() -> None:
    app = _app(status=failed_status(), **{appmeta.MESSAGE: "old", "keep": "k"})
    notes = {appmeta.MESSAGE: "a", recovery.CLAIM: None, "x": "1"}
    first = {"metadata": {"annotations": dict(notes)}}
    second = {
        "metadata": {"annotations": {appmeta.MESSAGE: "b"}},
        "spec": {"sparkConf": {"y": "2"}},
    }
    merged = recovery.merge_patches(first, second)
    assert _apply(app, merged) == _apply(_apply(app, first), second)
    assert appmeta.of(_apply(app, merged))["keep"] == "k"
    assert first == {"metadata": {"annotations": notes}}  # the inputs are left alone


def test_a_conclusion_after_the_backoff_carries_the_resubmission(
    config: config_.OperatorConfig,
) -> None:
    """backoff 0: the conclusion and the resubmission are one patch, and it leaves the app as
    the two patches one after the other would (Resubmitted, attempt 1, last-rollback kept)."""
    app = _app(status=failed_status(), **{appmeta.BACKOFF: "0"})
    decision = _decide(app, config)
    claimed = _apply(app, decision.patch)
    summary = {"instants_rolled_back": ("i1",), "files_deleted": 3}
    conclusion = recovery.conclude_rollback(decision, summary=summary, now=NOW)
    follow = recovery.resubmission_after(claimed, conclusion, now=NOW, config=config)
    assert follow is not None
    assert follow.action is Action.RESUBMIT
    two_steps = _apply(_apply(claimed, conclusion.patch), follow.patch)
    one_step = _apply(claimed, recovery.merge_patches(conclusion.patch, follow.patch))
    assert one_step == two_steps
    notes = appmeta.of(one_step)
    assert notes[appmeta.PHASE] == Phase.RESUBMITTED.value
    assert notes[appmeta.ATTEMPT] == "1"
    assert '"rolledBack": 1' in notes[appmeta.LAST_ROLLBACK]
    assert recovery.CLAIM not in notes
    assert one_step["spec"]["sparkConf"][mutation.CONF_ATTEMPT] == "1"


@pytest.mark.parametrize(
    ("notes", "summary"),
    [
        ({}, {}),  # the default backoff: the resubmission waits, a patch of its own
        ({appmeta.BACKOFF: "0", appmeta.MAX_RETRIES: "0"}, {}),  # Exhausted
    ],
    ids=["backoff", "exhausted"],
)
def test_no_resubmission_rides_on_a_conclusion_that_does_not_resubmit_now(
    config: config_.OperatorConfig, notes: dict[str, str], summary: dict[str, Any]
) -> None:
    app = _app(status=failed_status(), **notes)
    decision = _decide(app, config)
    full = {"instants_rolled_back": ("i1",), "files_deleted": 3, **summary}
    conclusion = recovery.conclude_rollback(decision, summary=full, now=NOW)
    claimed = _apply(app, decision.patch)
    assert recovery.resubmission_after(claimed, conclusion, now=NOW, config=config) is None


def test_an_apache_conclusion_never_carries_its_recreation(config: config_.OperatorConfig) -> None:
    """An Apache app is resubmitted by recreating it, in steps of their own: the conclusion
    stays a patch of its own even with the backoff over."""
    app = apache_app(annotations={appmeta.BACKOFF: "0"})
    states = ("Submitted", "DriverRequested", "DriverStarted", "Failed", "ResourceReleased")
    app["status"] = {
        "currentState": {"currentStateSummary": states[-1]},
        "stateTransitionHistory": {
            str(i): {"currentStateSummary": s, "lastTransitionTime": "2026-11-22T11:00:00Z"}
            for i, s in enumerate(states)
        },
        "currentAttemptSummary": {"attemptInfo": {"id": 0}},
    }
    decision = _decide(app, config)
    assert decision.action is Action.ROLLBACK
    conclusion = recovery.conclude_rollback(
        decision, summary={"instants_rolled_back": ("i1",)}, now=NOW
    )
    claimed = _apply(app, decision.patch)
    assert _decide(_apply(claimed, conclusion.patch), config).action is Action.RECREATE
    assert recovery.resubmission_after(claimed, conclusion, now=NOW, config=config) is None


def test_a_merged_resubmission_owes_the_rolled_back_event_too(
    config: config_.OperatorConfig,
) -> None:
    """Conclusion and resubmission in one patch, the replica killed before their Events: phase
    RolledBack was never stored, so the app in phase Resubmitted owes both, in order, under the
    names the first replica gave them (the API server refuses a second copy)."""
    app = _app(status=failed_status(), **{appmeta.BACKOFF: "0"})
    decision = _decide(app, config)
    claimed = _apply(app, decision.patch)
    summary = {"instants_rolled_back": ("i1",), "files_deleted": 3}
    conclusion = recovery.conclude_rollback(decision, summary=summary, now=NOW)
    follow = recovery.resubmission_after(claimed, conclusion, now=NOW, config=config)
    assert follow is not None
    resubmitted = _apply(claimed, recovery.merge_patches(conclusion.patch, follow.patch))
    owed = recovery.owed_events(resubmitted, now=NOW + datetime.timedelta(seconds=5), config=config)
    assert owed == (conclusion.event, follow.event)
    # An hour on, nothing is owed.
    later = NOW + datetime.timedelta(seconds=recovery.EVENT_REPLAY_SECONDS + 1)
    assert recovery.owed_events(resubmitted, now=later, config=config) == ()
    # Outside a resubmission, owed_events is owed_event.
    concluded = _apply(claimed, conclusion.patch)
    assert recovery.owed_events(concluded, now=NOW, config=config) == (conclusion.event,)


def test_a_resubmission_after_a_backoff_owes_the_rolled_back_event_as_well(
    config: config_.OperatorConfig,
) -> None:
    """The same with two patches (a backoff between them): the RolledBack Event, named after
    its transition, is owed as well; if it was posted, the API server refuses the copy."""
    app = _app(status=failed_status(), **{appmeta.BACKOFF: "10s"})
    decision = _decide(app, config)
    claimed = _apply(app, decision.patch)
    summary = {"instants_rolled_back": ("i1",), "files_deleted": 3}
    conclusion = recovery.conclude_rollback(decision, summary=summary, now=NOW)
    concluded = _apply(claimed, conclusion.patch)
    later = NOW + datetime.timedelta(seconds=11)
    resubmit = _decide(concluded, config, later)
    assert resubmit.action is Action.RESUBMIT
    resubmitted = _apply(concluded, resubmit.patch)
    owed = recovery.owed_events(resubmitted, now=later, config=config)
    assert owed == (conclusion.event, resubmit.event)
