"""One app's recovery, brought as far as it can go: read, decide, act or wait, repeat.

Only the leader (see :mod:`leadership`) reconciles. Each app has at most one worker per process
(:func:`wake`): it reads the app fresh, asks :func:`recovery.decide` (or, for an app being
deleted, :func:`finalizers.decide`) what to do, does it, and repeats until nothing is left to
do. It waits (for a backoff, a claim, an unanswered resubmission) without holding up kopf, and
news of the app cuts its wait short. All progress is in annotations, so kopf keeps no state of
its own on the apps and a new leader simply continues (:func:`resync`).

No step relies on the lease alone (a lease can expire mid-rollback): every patch names the
app's uid, and the ones that decide something carry the resourceVersion they were decided on
(:mod:`patches`); a rollback starts only under a claim that one operator wins, and its
conclusion is written only while that claim is still ours (:mod:`claims`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any, Final

from sparkguard.operator import (
    appmeta,
    claims,
    deletions,
    errors,
    events,
    finalizers,
    patches,
    recovery,
    recreation,
)
from sparkguard.operator import runtime as runtime_

_log = logging.getLogger(__name__)


#: actions (not waits) in one reconciliation before yielding to the next event
MAX_STEPS: Final = 20


def wake(
    runtime: runtime_.Runtime,
    key: runtime_.AppKey,
    *,
    logger: runtime_.Logger,
    body: dict[str, Any] | None = None,
) -> None:
    """Make the app's worker look at it again (starting one if it has none).

    One worker per app and process: it waits (for a backoff, a claim, an unanswered
    resubmission) without holding up kopf, and news of the app cut its wait short. A new
    worker starts from ``body`` (the watch event's) if given, else it reads the app; a running
    one reads the app again.
    """
    flag = runtime.workers.get(key.id)
    if flag is not None:
        flag.set()
        return
    flag = asyncio.Event()
    runtime.workers[key.id] = flag
    runtime.spawn(_work(runtime, key, flag, logger=logger, body=body))


async def _work(
    runtime: runtime_.Runtime,
    key: runtime_.AppKey,
    flag: asyncio.Event,
    *,
    logger: runtime_.Logger,
    body: dict[str, Any] | None = None,
) -> None:
    try:
        await reconcile(runtime, key=key, logger=logger, wakeup=flag, seen=body)
        # reconcile waits for the app's Events after its last decision: news that arrived
        # meanwhile (wake set our flag, starting no worker) is looked at before we leave.
        while flag.is_set():
            await reconcile(runtime, key=key, logger=logger, wakeup=flag)
    finally:
        # No await between the last look at the flag and this: news that arrives from now
        # on starts a new worker.
        del runtime.workers[key.id]
        runtime.written.pop(key.id, None)


def resync(runtime: runtime_.Runtime) -> None:
    """Reconcile every app this replica saw needing a step (it just became the leader)."""
    keys = list(runtime.pending.values())
    if keys:
        _log.info("leading now: resuming %d app(s) that need a recovery step", len(keys))
    for key in keys:
        wake(runtime, key, logger=_AppLogger(_log, key))


class _AppLogger(logging.LoggerAdapter[logging.Logger]):
    def __init__(self, logger: logging.Logger, key: runtime_.AppKey) -> None:
        super().__init__(logger, {})
        self.prefix = f"[{key.namespace}/{key.name}] "

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        return f"{self.prefix}{msg}", kwargs


async def reconcile(
    runtime: runtime_.Runtime,
    *,
    key: runtime_.AppKey,
    logger: runtime_.Logger,
    wakeup: asyncio.Event | None = None,
    seen: dict[str, Any] | None = None,
) -> None:
    """Bring one app's recovery as far as it can go now; return when nothing is left to do.

    Never raises for a problem of the app or of storage: those become Events, metrics and a
    retry after ``error_backoff``; the loop ends when the app is gone (or replaced by another
    object of the same name), needs nothing, or this replica stops leading. ``seen``: the app
    as the watch event that woke us delivered it (no read needed for the first step: every
    write carries its resourceVersion, so a stale body only costs a conflict and a read).
    Returns once the Events it posted are out.
    """
    try:
        await _reconcile(runtime, key=key, logger=logger, wakeup=wakeup, seen=seen)
    finally:
        await events.wait_posted(runtime, key)


async def _reconcile(  # noqa: PLR0912, PLR0915 - one loop: read, decide, act or wait
    runtime: runtime_.Runtime,
    *,
    key: runtime_.AppKey,
    logger: runtime_.Logger,
    wakeup: asyncio.Event | None,
    seen: dict[str, Any] | None,
) -> None:
    config = runtime.config
    namespace, name = key.namespace, key.name
    wakeup = wakeup if wakeup is not None else asyncio.Event()
    steps = 0
    #: the app as our last patch returned it (or the watch delivered it): as fresh as a read,
    #: one request fewer
    written: dict[str, Any] | None = seen
    while steps < MAX_STEPS:
        if wakeup.is_set():
            written = None  # news since our last patch: read the app as it is now
        if written is None:
            wakeup.clear()
        if not runtime.leading():
            logger.info("not the leader any more; the leader continues")
            return
        app: dict[str, Any] | None = None
        try:
            app, written = (
                written or await runtime.kube.get_app(namespace, name, group=key.group),
                None,
            )
            if app is None or (key.uid is not None and runtime_.AppKey.of(app).uid != key.uid):
                runtime.pending.pop(key.id, None)
                runtime.metrics.track_recovery((namespace, name), recovering=False)
                return  # gone: a recovery of a deleted app ends quietly
            held = deletions.held_back(runtime, key, app)
            if held is not None:  # the finalizer's step comes first
                if held.action is finalizers.Step.NOTHING:
                    return  # on its way out (held by other finalizers): no recovery step
                steps += 1
                written = await deletions.finalize(runtime, app=app, decision=held, logger=logger)
                continue
            decision = recovery.decide(
                app, now=runtime.clock(), config=config, holder=runtime.identity
            )
            runtime.decided(key, decision)
            track(runtime, namespace, name, app)
            # The Events of the phase the app is in, if the replica that wrote the phase died
            # before posting them (known posted: no request).
            events.post_soon(
                runtime, app, *recovery.owed_events(app, now=runtime.clock(), config=config)
            )
            if decision.action is recovery.Action.NOTHING:
                if wakeup.is_set():
                    continue  # news arrived while we read: look again
                runtime.pending.pop(key.id, None)
                logger.debug("nothing to do: %s", decision.reason)
                return
            if decision.action is recovery.Action.WAIT:
                assert decision.retry_at is not None
                delay = (decision.retry_at - runtime.clock()).total_seconds()
                logger.info("waiting %.1fs: %s", delay, decision.reason)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        wakeup.wait(), timeout=min(max(delay, 0.0), config.max_sleep_seconds)
                    )
                continue
            steps += 1
            written = await _act(runtime, app=app, decision=decision, logger=logger)
        except errors.KubeConflictError as exc:
            runtime.metrics.conflicts.labels(step="patch").inc()
            logger.info("%s", exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - storage and API fail in many ways; we retry
            await _step_failed(runtime, app, exc, logger=logger)
    logger.warning("stopped after %d steps; the next event of this app continues", MAX_STEPS)


async def _step_failed(
    runtime: runtime_.Runtime,
    app: dict[str, Any] | None,
    exc: Exception,
    *,
    logger: runtime_.Logger,
) -> None:
    """A Warning Event and a metric for a failed step; then wait before the next try."""
    config = runtime.config
    reason = recovery.Reason.ROLLBACK_FAILED.value
    runtime.metrics.failures.labels(reason=reason).inc()
    message = (
        f"{type(exc).__name__}: {exc}; sparkguard retries in {config.error_backoff_seconds:.0f}s"
    )
    logger.warning("recovery step failed: %s", message)
    if app is not None:  # after the app's Events queued before it, like every Event
        warning = recovery.EventSpec(
            type="Warning", reason=recovery.Reason.ROLLBACK_FAILED, message=message
        )
        events.post_soon(runtime, app, warning)
        await events.wait_posted(runtime, runtime_.AppKey.of(app))
    await runtime.sleep(config.error_backoff_seconds)


async def _act(
    runtime: runtime_.Runtime,
    *,
    app: dict[str, Any],
    decision: recovery.Decision,
    logger: runtime_.Logger,
) -> dict[str, Any] | None:
    """Take the step; return the app as the last patch left it (``None``: read it again)."""
    action = decision.action
    if action in (recovery.Action.MARK_INVALID, recovery.Action.MARK_SUCCEEDED):
        marked = await patches.patch_app(runtime, app, decision.patch)
        if marked is None:
            return None
        if action is recovery.Action.MARK_INVALID:
            runtime.metrics.failures.labels(reason=recovery.Reason.INVALID_ANNOTATION.value).inc()
            logger.info("marked Invalid: %s", decision.reason)
        events.post_soon(runtime, app, decision.event)
        return marked
    if action in (recovery.Action.RESUBMIT, recovery.Action.NUDGE):
        patched = await patches.patch_app(runtime, app, decision.patch)
        if patched is not None:
            if action is recovery.Action.RESUBMIT:
                runtime.metrics.resubmissions.inc()
            else:
                runtime.metrics.resubmit_retries.inc()
            logger.info("%s", decision.reason)
            events.post_soon(runtime, patched, decision.event)
        return patched
    if action in (recovery.Action.ROLLBACK, recovery.Action.GIVE_UP):
        return await claims.roll_back(runtime, app=app, decision=decision, logger=logger)
    if action is recovery.Action.RECREATE:
        await recreation.recreate(runtime, app=app, decision=decision, logger=logger)
        return None
    raise AssertionError(f"unhandled action {action}")  # pragma: no cover


def track(runtime: runtime_.Runtime, namespace: str, name: str, app: Mapping[str, Any]) -> None:
    """Tell the metrics whether ``app`` is in a recovery phase (as its annotations say)."""
    phase = appmeta.of(app).get(appmeta.PHASE)
    runtime.metrics.track_recovery(
        (namespace, name), recovering=phase in {p.value for p in recovery.RECOVERY_PHASES}
    )
