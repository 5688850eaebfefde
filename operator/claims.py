"""The rollback of a failed app, under a claim that exactly one operator wins.

The claim (phase ``Recovering`` with a holder and an expiry, see :mod:`recovery`) is written
with the resourceVersion the rollback was decided on, so of two operators that saw the failure
one wins it and the other gets a conflict, reads the app again and waits. The winner takes a
rollback slot first (an app waiting for one holds no claim), renews the claim while the
library's rollback runs in the slot's thread, and writes the conclusion (with the resubmission,
when the backoff is already over) only while the claim is still ours: a lease that expired
mid-rollback never lets two operators conclude.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from sparkguard.operator import appmeta, errors, events, patches, recovery
from sparkguard.operator import runtime as runtime_

_log = logging.getLogger(__name__)


async def roll_back(
    runtime: runtime_.Runtime,
    *,
    app: dict[str, Any],
    decision: recovery.Decision,
    logger: runtime_.Logger,
) -> dict[str, Any] | None:
    """Roll the failed app's job back under our claim, and conclude while the claim is ours.

    Returns the app as the conclusion left it (``None``: read it again; the app is gone, or
    another operator won the claim or took it over).
    """
    new_failure = appmeta.of(app).get(appmeta.HANDLED_FAILURE) != decision.failure_id
    # A rollback slot first, the claim only then: an app waiting for a slot holds no claim, so
    # when the leader dies only the apps it was actually rolling back wait for their claims
    # to expire; the others are taken over as soon as the Lease is. (The decision may be
    # stale after the wait: the claim's precondition turns that into a conflict and a re-read.)
    async with _Slot(runtime.rollback_slots()) as slot:
        return await _claim_and_roll_back(
            runtime, app=app, decision=decision, logger=logger, slot=slot, new_failure=new_failure
        )


class _Slot:
    """One of the rollback slots, released when the rollback ends (before its conclusion)."""

    def __init__(self, semaphore: asyncio.Semaphore) -> None:
        self._semaphore = semaphore
        self._held = False
        self.waited = 0.0

    async def __aenter__(self) -> _Slot:
        queued = time.monotonic()
        await self._semaphore.acquire()
        self._held = True
        self.waited = time.monotonic() - queued  # the queue's share of the reaction
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        """Give the slot back (once)."""
        if self._held:
            self._held = False
            self._semaphore.release()


async def _claim_and_roll_back(
    runtime: runtime_.Runtime,
    *,
    app: dict[str, Any],
    decision: recovery.Decision,
    logger: runtime_.Logger,
    slot: _Slot,
    new_failure: bool,
) -> dict[str, Any] | None:
    options = decision.options
    assert options is not None
    meta = app["metadata"]
    namespace = meta["namespace"]
    runtime.metrics.rollback_queue_seconds.observe(slot.waited)
    if not runtime.leading():
        return None  # lost the Lease while waiting for the slot: the new leader does it
    # The claim: with the resourceVersion this was decided on, so of two operators that saw
    # the failure, one writes it and the other gets a conflict, reads it again and waits.
    marked = await patches.patch_app(runtime, app, decision.patch)
    if marked is None:
        return None
    if new_failure:
        state = recovery.observe(app).state or "FAILED"
        runtime.metrics.failures.labels(reason=state).inc()
    runtime.metrics.track_recovery((namespace, meta["name"]), recovering=True)
    # RollbackStarted goes out while the rollback runs (off the critical path); the app's
    # later Events follow it, in order.
    events.post_soon(runtime, marked, decision.event)
    logger.info("rolling back job %s: %s", options.job_id, decision.reason)
    return await _roll_back_claimed(
        runtime, marked=marked, decision=decision, logger=logger, slot=slot
    )


async def _roll_back_claimed(
    runtime: runtime_.Runtime,
    *,
    marked: dict[str, Any],
    decision: recovery.Decision,
    logger: runtime_.Logger,
    slot: _Slot,
) -> dict[str, Any] | None:
    options = decision.options
    assert options is not None
    meta = marked["metadata"]
    call = await runtime.rollback_call(marked, options)
    claim = _Claim(runtime, marked, decision)
    keeper = asyncio.get_running_loop().create_task(claim.keep())
    try:
        started = time.monotonic()
        try:
            summary = await asyncio.get_running_loop().run_in_executor(
                runtime.rollback_executor(), call
            )
        except Exception:
            runtime.metrics.rollbacks.labels(outcome="error").inc()
            raise
        finally:
            seconds = time.monotonic() - started
            runtime.metrics.rollback_seconds.observe(seconds)
            slot.release()  # the conclusion needs no slot
    finally:
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper
    runtime.metrics.record_rollback(summary)
    result = {
        "instants_rolled_back": tuple(summary.instants_rolled_back),
        "instants_committed": tuple(summary.instants_committed),
        "files_deleted": summary.files_deleted,
        "files_kept": summary.files_kept,
    }
    now = runtime.clock()
    conclusion = recovery.conclude_rollback(
        decision, summary=result, now=now, seconds=seconds, queued_seconds=slot.waited
    )
    outcome = (
        "rolled_back"
        if summary.instants_rolled_back
        else "committed"
        if summary.instants_committed
        else "nothing_to_do"
    )
    runtime.metrics.rollbacks.labels(outcome=outcome).inc()
    # With the backoff over already (backoff 0), the resubmission goes in the conclusion's
    # patch: one write instead of two, the same decision (taken on the app as the conclusion
    # leaves it, again on every re-read), and it too only while the claim is ours.
    resubmission: list[recovery.Decision | None] = [None]

    def concluding(app: Mapping[str, Any]) -> Mapping[str, Any]:
        resubmission[0] = recovery.resubmission_after(
            app, conclusion, now=now, config=runtime.config, holder=runtime.identity
        )
        follow = resubmission[0]
        return (
            conclusion.patch
            if follow is None
            else recovery.merge_patches(conclusion.patch, follow.patch)
        )

    # Recorded only while the claim is ours and the app is the one we rolled back: a deleted
    # app gets no RolledBack Event, and an operator that took over (our claim expired) is not
    # overwritten; it ran (or runs) the same idempotent rollback and concludes itself.
    concluded = None if claim.lost else await claim.write(concluding)
    if concluded is None:
        runtime.metrics.conflicts.labels(step="conclude").inc()
        logger.info("rollback done, but the app is gone or another operator took it over")
        return None
    if conclusion.phase is not recovery.Phase.ROLLED_BACK:
        runtime.metrics.failures.labels(reason=conclusion.event.reason.value).inc()
    follow = resubmission[0]
    runtime.metrics.track_recovery(
        (meta["namespace"], meta["name"]),
        recovering=conclusion.phase is recovery.Phase.ROLLED_BACK and follow is None,
    )
    logger.info("%s", conclusion.event.message)
    if follow is not None:
        runtime.decided(claim.key, follow)
        runtime.metrics.resubmissions.inc()
        logger.info("%s", follow.reason)
    events.post_soon(runtime, concluded, conclusion.event, follow.event if follow else None)
    return concluded


class _Claim:
    """Our claim on one app's rollback: the app as we last wrote it, renewed while we work."""

    def __init__(
        self, runtime: runtime_.Runtime, app: dict[str, Any], decision: recovery.Decision
    ) -> None:
        self.runtime = runtime
        self.app = app
        self.key = runtime_.AppKey.of(app)
        self.failure = decision.failure_id
        self.lost = False

    def still_ours(self, app: Mapping[str, Any] | None) -> bool:
        """Whether ``app`` is the same object, Recovering the same failure under our claim."""
        if app is None or runtime_.AppKey.of(app).uid != self.key.uid:
            return False
        notes = appmeta.of(app)
        claim = recovery.claim_of(app)
        return (
            notes.get(appmeta.PHASE) == recovery.Phase.RECOVERING.value
            and notes.get(appmeta.HANDLED_FAILURE) == self.failure
            and claim is not None
            and claim.holder == self.runtime.identity
        )

    async def write(
        self, patch: Mapping[str, Any] | Callable[[Mapping[str, Any]], Mapping[str, Any]]
    ) -> dict[str, Any] | None:
        """Patch the app while the claim is ours (re-reading on conflicts); ``None`` if lost.

        ``patch`` may be a function of the app as last seen: computed again after a re-read.
        """
        for _ in range(10):
            try:
                patched = await patches.patch_app(
                    self.runtime, self.app, patch(self.app) if callable(patch) else patch
                )
            except errors.KubeConflictError:
                self.runtime.metrics.conflicts.labels(step="claimed").inc()
                current = await self.runtime.kube.get_app(
                    self.key.namespace, self.key.name, group=self.key.group
                )
                if not self.still_ours(current):
                    self.lost = True
                    return None
                assert current is not None
                self.app = current
                continue
            if patched is None:
                self.lost = True
            else:
                self.app = patched
            return patched
        raise errors.KubeConflictError(
            f"SparkApplication {self.key.namespace}/{self.key.name} kept changing while "
            "sparkguard recorded its rollback; trying again"
        )

    async def keep(self) -> None:
        """Renew the claim every third of its lifetime until cancelled or lost."""
        ttl = self.runtime.config.claim_ttl_seconds
        while not self.lost:
            await self.runtime.sleep(ttl / 3)
            until = self.runtime.clock() + datetime.timedelta(seconds=ttl)
            claim = recovery.Claim(holder=self.runtime.identity, until=until)
            try:
                await self.write(recovery.claim_patch(claim))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - retried at the next renewal
                _log.warning("could not renew the rollback claim of %s: %s", self.key.name, exc)
