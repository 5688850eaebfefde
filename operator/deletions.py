"""A deleted app's way out: the steps of the ``sparkguard.io/rollback`` finalizer, done.

:mod:`finalizers` decides (no I/O); this module acts. The finalizer is added to an opted-in
app; when the app is deleted, its job is rolled back first, within
``delete_rollback_timeout_seconds``, and then the finalizer is removed, keeping every other
one. A deletion is never held longer: a rollback that fails or hangs until the timeout is
reported (a Warning naming what is left in flight and the command that cleans it) and the app
is let go. A replica killed midway leaves the app, and the idempotent rollback, to the next
leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Mapping
from typing import Any

from sparkguard.operator import appmeta, errors, events, finalizers, patches, recovery, rollbacks
from sparkguard.operator import runtime as runtime_


def held_back(
    runtime: runtime_.Runtime, key: runtime_.AppKey, app: Mapping[str, Any]
) -> finalizers.Decision | None:
    """The finalizer's step for ``app``, if it has one or the app is being deleted.

    ``None``: no finalizer step, and the app is not being deleted (its recovery decides). A
    ``NOTHING`` decision means: being deleted, held by other finalizers only; such an app
    gets no recovery step (it is forgotten here).
    """
    held = finalizers.decide(app, config=runtime.config)
    if held.action is finalizers.Step.NOTHING:
        if not finalizers.is_deleting(app):
            return None
        runtime.pending.pop(key.id, None)
        runtime.metrics.track_recovery((key.namespace, key.name), recovering=False)
    runtime.decided(key, held)
    return held


async def finalize(
    runtime: runtime_.Runtime,
    *,
    app: dict[str, Any],
    decision: finalizers.Decision,
    logger: runtime_.Logger,
) -> dict[str, Any] | None:
    """Add or remove the finalizer (one patch); for a deleted app, roll back first.

    Returns the app as the last patch left it (``None``: read it again).
    """
    action = decision.action
    if action is finalizers.Step.ADD:
        logger.info("adding finalizer %s: %s", finalizers.FINALIZER, decision.reason)
        return await patches.patch_app(runtime, app, decision.patch)
    notes: dict[str, str] = {}
    if action is finalizers.Step.ROLL_BACK:
        notes = await _roll_back_on_delete(runtime, app=app, decision=decision, logger=logger)
    elif finalizers.is_deleting(app):
        runtime.metrics.deletions.labels(outcome="no_rollback").inc()
    logger.info("removing finalizer %s: %s", finalizers.FINALIZER, decision.reason)
    key = runtime_.AppKey.of(app)
    runtime.metrics.track_recovery((key.namespace, key.name), recovering=False)
    return await _remove_finalizer(runtime, app, notes=notes)


async def _remove_finalizer(
    runtime: runtime_.Runtime, app: dict[str, Any], *, notes: Mapping[str, str]
) -> dict[str, Any] | None:
    """Remove our finalizer, keeping every other one (re-read and redone on a conflict).

    The patch carries the uid and the resourceVersion of the app it was computed from, so a
    finalizer another controller added meanwhile is never dropped: the conflict makes us read
    the app again. Removing the finalizer is the last step of a deletion: a replica killed
    before it leaves the app (and the idempotent rollback) to the next leader.
    """
    current: dict[str, Any] | None = app
    for _ in range(10):
        if current is None or not finalizers.has_finalizer(current):
            return current
        patch: dict[str, Any] = {
            "metadata": {
                "finalizers": finalizers.without_finalizer(finalizers.finalizers_of(current))
            }
        }
        if notes:
            patch["metadata"]["annotations"] = dict(notes)
        try:
            return await patches.patch_app(runtime, current, patch)
        except errors.KubeConflictError:
            runtime.metrics.conflicts.labels(step="finalizer").inc()
            key = runtime_.AppKey.of(current)
            fresh = await runtime.kube.get_app(key.namespace, key.name, group=key.group)
            current = fresh if fresh is not None and runtime_.AppKey.of(fresh) == key else None
    key = runtime_.AppKey.of(app)
    raise errors.KubeConflictError(
        f"SparkApplication {key.namespace}/{key.name} kept changing while sparkguard removed "
        "its finalizer; trying again"
    )


async def _roll_back_on_delete(
    runtime: runtime_.Runtime,
    *,
    app: dict[str, Any],
    decision: finalizers.Decision,
    logger: runtime_.Logger,
) -> dict[str, str]:
    """Roll back a deleted app's job, within ``delete_rollback_timeout_seconds``; report it.

    Storage errors are retried (every ``error_backoff``) until the timeout; then, or when the
    rollback hangs, a Warning ``RollbackOnDeleteAbandoned`` says what is left in flight and
    the command that cleans it, and the app is let go anyway: a deletion is never held longer.
    Returns the annotations the finalizer's removal records.
    """
    options = decision.options
    assert options is not None  # finalizers.decide sets them for ROLL_BACK
    config = runtime.config
    timeout = config.delete_rollback_timeout_seconds
    logger.info("rolling back job %s of the deleted app: %s", options.job_id, decision.reason)
    last_error: str | None = None
    started = time.monotonic()
    try:
        async with asyncio.timeout(timeout):
            while True:
                try:
                    summary = await _bounded_rollback(runtime, app=app, options=options)
                    break
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - storage fails in many ways; we retry
                    last_error = f"{type(exc).__name__}: {exc}"
                    runtime.metrics.rollbacks.labels(outcome="error").inc()
                    logger.warning(
                        "rollback of the deleted app failed (%s); retrying within %.0fs",
                        last_error,
                        timeout,
                    )
                    await runtime.sleep(config.error_backoff_seconds)
    except TimeoutError:
        message = finalizers.abandoned_message(app, options, timeout=timeout, error=last_error)
        logger.warning("%s", message)
        runtime.metrics.deletions.labels(outcome="abandoned").inc()
        runtime.metrics.failures.labels(
            reason=finalizers.Reason.ROLLBACK_ON_DELETE_ABANDONED.value
        ).inc()
        await _deletion_event(
            runtime, app, reason=finalizers.Reason.ROLLBACK_ON_DELETE_ABANDONED, message=message
        )
        return {appmeta.MESSAGE: message[:1000]}
    runtime.metrics.record_rollback(summary)
    result = {
        "instants_rolled_back": tuple(summary.instants_rolled_back),
        "instants_committed": tuple(summary.instants_committed),
        "files_deleted": summary.files_deleted,
        "files_kept": summary.files_kept,
    }
    runtime.metrics.rollbacks.labels(
        outcome="rolled_back" if summary.instants_rolled_back else "nothing_to_do"
    ).inc()
    runtime.metrics.deletions.labels(outcome="rolled_back").inc()
    message = finalizers.rolled_back_message(options, result)
    logger.info("%s", message)
    await _deletion_event(
        runtime, app, reason=finalizers.Reason.ROLLED_BACK_ON_DELETE, message=message
    )
    record = {
        "at": recovery.format_time(runtime.clock()),
        "attempt": recovery.current_attempt(app),
        "seconds": round(time.monotonic() - started, 3),
        "onDelete": True,
        **recovery.summarize_rollback(result),
    }
    return {appmeta.LAST_ROLLBACK: json.dumps(record), appmeta.MESSAGE: message[:1000]}


async def _deletion_event(
    runtime: runtime_.Runtime, app: Mapping[str, Any], *, reason: finalizers.Reason, message: str
) -> None:
    """Post the Event of a deletion, once per app (named by it: a replica that takes over and
    rolls back again is refused as a duplicate)."""
    name = events.transition_event_name(app, f"deleted/{reason.value}")
    kind = "Normal" if reason is finalizers.Reason.ROLLED_BACK_ON_DELETE else "Warning"
    await events.post(runtime, app, type=kind, reason=reason.value, message=message, name=name)


async def _bounded_rollback(
    runtime: runtime_.Runtime, *, app: Mapping[str, Any], options: appmeta.Options
) -> rollbacks.RollbackSummary:
    """The storage rollback of a deleted app, in a rollback slot and its thread.

    A thread can't be stopped: when the caller gives up waiting (the deletion timeout), the
    rollback goes on in its thread (it is idempotent), and its slot is released only when the
    thread really ends, so a hung storage never runs more rollbacks than there are slots.
    """
    call = await runtime.rollback_call(app, options)
    loop = asyncio.get_running_loop()
    slots = runtime.rollback_slots()
    await slots.acquire()

    def release(_: object) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed at shutdown
            loop.call_soon_threadsafe(slots.release)

    try:
        future = runtime.rollback_executor().submit(call)
    except BaseException:
        slots.release()
        raise
    future.add_done_callback(release)
    started = time.monotonic()
    try:
        return await asyncio.wrap_future(future)
    finally:
        runtime.metrics.rollback_seconds.observe(time.monotonic() - started)
