"""The ``sparkguard.io/rollback`` finalizer: an opted-in app is rolled back before it goes.

spark-operator deletes apps by itself (``timeToLiveSeconds``; a ScheduledSparkApplication's
``failedRunHistoryLimit`` and ``concurrencyPolicy: Replace``), also in the middle of a
recovery. Without a finalizer the app would simply vanish: its undecided instants would stay in
flight for ever, and a new app with the same job id would be refused by the storage contract's
O4 rule. With it, the API server keeps the app (``deletionTimestamp`` set) until the operator
has rolled the job back and removed the finalizer.

Pure decisions live here (no I/O); :mod:`deletions` acts on them. Every patch this module
builds is a JSON merge patch that the caller conditions on the app's uid and resourceVersion,
so another controller's finalizer written meanwhile is never dropped (a stale read conflicts
and is read again).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any, Final

from sparkguard.operator import appmeta
from sparkguard.operator import config as config_

#: the finalizer sparkguard puts on opted-in apps
FINALIZER: Final = "sparkguard.io/rollback"
#: spark-operator's states in which nothing of the app has run yet (its v1beta2 ``NEW`` is
#: the empty string; a fresh app has no status at all)
NOT_STARTED_STATES: Final = frozenset({"", "NEW"})
#: the state of an app whose driver ended successfully: its writes were committed
COMPLETED_STATES: Final = frozenset({"COMPLETED"})
#: the Apache operator's API group and its final states (see :func:`recovery.observe`)
APACHE_GROUP: Final = "spark.apache.org"
APACHE_TERMINATED_STATES: Final = frozenset(
    {"ResourceReleased", "TerminatedWithoutReleaseResources"}
)


class Step(enum.StrEnum):
    """What the operator should do about the finalizer of an app."""

    NOTHING = "finalizer-nothing"
    ADD = "finalizer-add"
    REMOVE = "finalizer-remove"
    #: deleted with our finalizer, writes may be undecided: roll back, then remove
    ROLL_BACK = "finalizer-roll-back"


class Reason(enum.StrEnum):
    """Kubernetes Event reasons of a deletion."""

    ROLLED_BACK_ON_DELETE = "RolledBackOnDelete"
    ROLLBACK_ON_DELETE_ABANDONED = "RollbackOnDeleteAbandoned"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Decision:
    """The finalizer step for one app; ``patch`` performs ADD/REMOVE (and ends ROLL_BACK)."""

    action: Step
    reason: str
    patch: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: for ``ROLL_BACK``: the app's options (job id, journal, storage Secret)
    options: appmeta.Options | None = None


def finalizers_of(app: Mapping[str, Any]) -> list[str]:
    """The app's ``metadata.finalizers`` (empty when it has none).

    A purely computational function with no side-effects.
    """
    found = (app.get("metadata") or {}).get("finalizers") or []
    return [str(item) for item in found] if isinstance(found, list) else []


def has_finalizer(app: Mapping[str, Any]) -> bool:
    """Whether ``app`` carries sparkguard's finalizer.

    A purely computational function with no side-effects.
    """
    return FINALIZER in finalizers_of(app)


def is_deleting(app: Mapping[str, Any]) -> bool:
    """Whether ``app`` is being deleted (the API server set its ``deletionTimestamp``).

    A purely computational function with no side-effects.
    """
    return bool((app.get("metadata") or {}).get("deletionTimestamp"))


def with_finalizer(finalizers: list[str]) -> list[str]:
    """``finalizers`` with ours appended once (the others kept, in their order).

    A purely computational function with no side-effects.
    """
    return finalizers if FINALIZER in finalizers else [*finalizers, FINALIZER]


def without_finalizer(finalizers: list[str]) -> list[str]:
    """``finalizers`` without ours (every other controller's kept, in their order).

    A purely computational function with no side-effects.
    """
    return [item for item in finalizers if item != FINALIZER]


def admission_adds(app: Mapping[str, Any], *, old: Mapping[str, Any] | None) -> bool:
    """Whether admission should add the finalizer to the (opted-in, valid) ``app``.

    A purely computational function with no side-effects. At CREATE always; at UPDATE only to
    an app that did not have it before (admitted before finalizers existed, or opted in by
    this update), so a removal (by the operator, or by hand) is never undone. Never to an app
    being deleted: the API server refuses new finalizers then.
    """
    if is_deleting(app) or has_finalizer(app):
        return False
    return old is None or not has_finalizer(old)


def may_have_undecided_writes(app: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether the app's job may have left instants in flight, and why (or why not).

    A purely computational function with no side-effects. Only two states are known to leave
    nothing: COMPLETED (the driver ended successfully, after its commits) and an app that
    never started (no state yet and no recovery recorded). Anything else is rolled back: the
    rollback is idempotent and cheap when there is nothing to do, and it also catches files a
    zombie executor wrote after an earlier rollback.
    """
    if str(app.get("apiVersion") or "").startswith(APACHE_GROUP + "/"):
        return _apache_may_have_undecided_writes(app)
    state = str(((app.get("status") or {}).get("applicationState") or {}).get("state") or "")
    if state in COMPLETED_STATES:
        return False, f"state {state}: every write of the job was committed"
    if state in NOT_STARTED_STATES and not appmeta.of(app).get(appmeta.HANDLED_FAILURE):
        return False, "the app never started: the job wrote nothing"
    return True, f"state {state or 'NEW'!r}: the job may have writes in flight"


def _apache_may_have_undecided_writes(app: Mapping[str, Any]) -> tuple[bool, str]:
    """:func:`may_have_undecided_writes` for an Apache app (``currentState`` and its history):
    nothing undecided after a final state that followed Succeeded, or before its first driver
    (no state, or Submitted with no earlier attempt and no recovery recorded)."""
    status = app.get("status") or {}
    state = str((status.get("currentState") or {}).get("currentStateSummary") or "")
    history = status.get("stateTransitionHistory") or {}
    keys = sorted((int(k) for k in history if str(k).isdigit()), reverse=True)
    before = (
        str((history.get(str(keys[1])) or {}).get("currentStateSummary") or "")
        if len(keys) > 1
        else ""
    )
    if state in APACHE_TERMINATED_STATES and before == "Succeeded":
        return False, f"state {state} after Succeeded: every write of the job was committed"
    fresh = state in ("", "Submitted") and keys in ([], [0])
    if fresh and not appmeta.of(app).get(appmeta.HANDLED_FAILURE):
        return False, "the app never started: the job wrote nothing"
    return True, f"state {state or 'new'!r}: the job may have writes in flight"


def _finalizers_patch(finalizers: list[str]) -> dict[str, Any]:
    return {"metadata": {"finalizers": finalizers}}


def decide(  # noqa: PLR0911 - one return per row of the decision table
    app: Mapping[str, Any], *, config: config_.OperatorConfig
) -> Decision:
    """The finalizer step for ``app``.

    A purely computational function with no side-effects. The table:

    * being deleted, without our finalizer → NOTHING;
    * being deleted with it, not opted in any more or with options that can't be read (no job
      id or journal to roll back) → REMOVE;
    * being deleted with it, nothing can be undecided (COMPLETED, never started) → REMOVE, no
      storage work;
    * being deleted with it otherwise → ROLL_BACK (then remove);
    * opted in, valid options, without it → ADD (one patch);
    * opted out (label/annotation removed or ``"false"``) with it → REMOVE;
    * otherwise → NOTHING.
    """
    current = finalizers_of(app)
    ours = FINALIZER in current
    parsed = appmeta.parse(app, config=config)
    if is_deleting(app):
        if not ours:
            return Decision(action=Step.NOTHING, reason="being deleted; no finalizer of ours")
        remove = _finalizers_patch(without_finalizer(current))
        if not parsed.enabled:
            return Decision(action=Step.REMOVE, reason="deleted, not opted in", patch=remove)
        if parsed.options is None:
            problems = "; ".join(str(p) for p in parsed.problems)
            return Decision(
                action=Step.REMOVE,
                reason=f"deleted with invalid annotations, nothing to roll back: {problems}",
                patch=remove,
            )
        undecided, why = may_have_undecided_writes(app)
        if not undecided:
            return Decision(action=Step.REMOVE, reason=f"deleted; {why}", patch=remove)
        return Decision(
            action=Step.ROLL_BACK,
            reason=f"deleted; {why}: rolling back job {parsed.options.job_id} first",
            patch=remove,
            options=parsed.options,
        )
    if parsed.enabled and parsed.options is not None and not ours:
        return Decision(
            action=Step.ADD,
            reason="opted in without the finalizer (admitted before it existed)",
            patch=_finalizers_patch(with_finalizer(current)),
        )
    if not parsed.enabled and ours:
        return Decision(
            action=Step.REMOVE,
            reason="opted out: the finalizer goes",
            patch=_finalizers_patch(without_finalizer(current)),
        )
    return Decision(action=Step.NOTHING, reason="finalizer as it should be")


def cleanup_command(app: Mapping[str, Any], options: appmeta.Options) -> str:
    """The command that rolls back by hand what the app's job left in flight.

    A purely computational function with no side-effects.
    """
    owner = appmeta.storage_owner(app.get("metadata"))
    by_owner = f" --owner '{owner}'" if owner else ""
    return f"sparkguard rollback --job-id {options.job_id} --journal {options.journal}{by_owner}"


def rolled_back_message(options: appmeta.Options, summary: Mapping[str, Any]) -> str:
    """The message of the ``RolledBackOnDelete`` Event.

    A purely computational function with no side-effects.
    """
    rolled_back = len(summary.get("instants_rolled_back") or ())
    committed = len(summary.get("instants_committed") or ())
    return (
        f"deleted app: rolled back job {options.job_id} before letting it go: "
        f"{rolled_back} instant(s) rolled back, {int(summary.get('files_deleted') or 0)} "
        f"file(s) deleted, {committed} committed instant(s) kept"
    )


def abandoned_message(
    app: Mapping[str, Any], options: appmeta.Options, *, timeout: float, error: str | None
) -> str:
    """The message of the ``RollbackOnDeleteAbandoned`` Warning: what is left, how to clean it.

    A purely computational function with no side-effects.
    """
    why = f" (last error: {error})" if error else ""
    return (
        f"the rollback of job {options.job_id} did not finish within "
        f"{config_.variable_of('delete_rollback_timeout_seconds')}={timeout:.0f}s{why}; the app "
        "is deleted anyway. Instants of this job that were not decided stay in flight, and "
        "writes of its job id by another app are refused until they are rolled back: run "
        f"{cleanup_command(app, options)}"
    )
