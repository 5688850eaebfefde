"""kopf handlers: admission mutation and failure recovery, calling the pure decisions.

Every replica serves admission. The recovery handler sees every watch event of an opted-in
SparkApplication (including the initial listing after a restart) in every replica, and
remembers which apps need a step; only the leader (see :mod:`leadership`) acts: it reads the
app fresh, asks :func:`recovery.decide` what to do, does it, and repeats until nothing is left
to do. A replica that becomes leader goes through the apps it remembered. All progress is in
annotations, so kopf keeps no state of its own on the apps and a new leader simply continues.

No step relies on the lease alone (a lease can expire mid-rollback): every patch names the
app's uid, so it never lands on an app recreated under the same name, and the ones that decide
something carry the resourceVersion they were decided on; a rollback starts only under a claim
that one operator wins (:mod:`recovery`), and its conclusion is written only while that claim
is still ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

import kopf
from aiohttp import web

from sparkguard.operator import (
    admission,
    appmeta,
    crdwatch,
    errors,
    finalizers,
    kube,
    leadership,
    metrics,
    mutation,
    podwatch,
    recovery,
    resubmit,
    rollbacks,
)
from sparkguard.operator import config as config_
from sparkguard.operator import runtime as runtime_

Logger = logging.Logger | logging.LoggerAdapter[Any]

#: actions (not waits) in one reconciliation before yielding to the next event
MAX_STEPS: Final = 20


def build_registry(runtime: runtime_.Runtime) -> kopf.OperatorRegistry:
    """A fresh kopf registry with the operator's handlers bound to ``runtime``."""
    registry = kopf.OperatorRegistry()
    config = runtime.config
    servers: list[web.AppRunner] = []

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kube.connection_info(runtime.kube.api_client.configuration)

    @kopf.on.startup(registry=registry)
    async def start_metrics(logger: Logger, **_: Any) -> None:
        runtime.rollback_slots()
        start_leader_election(runtime)
        if runtime.insights is not None:
            _spawn(
                runtime,
                crdwatch.serve_new_kinds(
                    runtime, registry, runtime.insights, interval=config.crd_check_seconds
                ),
            )
        if config.metrics_port:
            servers.append(
                await metrics.start_server(
                    runtime.metrics, addr=config.metrics_addr, port=config.metrics_port
                )
            )
            logger.info("serving metrics on %s:%s", config.metrics_addr, config.metrics_port)

    @kopf.on.cleanup(registry=registry)
    async def stop_metrics(**_: Any) -> None:
        await stop_background(runtime)
        while servers:
            await servers.pop().cleanup()

    if config.webhook_mode is not config_.WebhookMode.DISABLED:
        admission_ = admission.Admission(config, runtime.kube.api_client)

        for kind in mutation.KINDS:
            _register_admission(registry, admission_, kind, config=config)

    for kind in mutation.KINDS:
        _register_recovery(registry, runtime, kind)

    @kopf.on.event(
        "",
        "v1",
        "configmaps",
        id="resubmission-records",
        labels={resubmit.RECORD_LABEL: "true"},
        registry=registry,
    )
    async def on_record(
        type: str, namespace: str | None, name: str, logger: Logger, **_: Any
    ) -> None:
        if namespace is None or type == "DELETED":
            if namespace is not None:
                runtime.records.pop(f"{namespace}/{name}", None)
            return
        runtime.records[f"{namespace}/{name}"] = (namespace, name)
        if runtime.leading():
            wake_record(runtime, namespace, name, logger=logger)

    # Driver pods without sparkguard's containers: the Unprotected signal (podwatch.py).
    podwatch.DriverPodWatch(runtime).register(registry)
    return registry


def _register_recovery(
    registry: kopf.OperatorRegistry, runtime: runtime_.Runtime, kind: mutation.AppKind
) -> None:
    """The recovery handler of one SparkApplication kind: one path for both kinds
    (:func:`recovery.decide` reads each kind's status its own way)."""
    config = runtime.config

    @kopf.on.event(
        kind.group,
        kind.version,
        kind.plural,
        id=f"recovery/{kind.name}",
        # the label (scheduled runs carry it) or the annotation; or our finalizer (an app
        # opted out since still needs it removed)
        when=lambda body, **_: appmeta.opted_in(body) or finalizers.has_finalizer(body),
        registry=registry,
    )
    async def on_event(
        type: str,  # kopf's name for the watch event type
        body: kopf.Body,
        namespace: str | None,
        name: str,
        logger: Logger,
        **_: Any,
    ) -> None:
        if namespace is None:  # pragma: no cover - SparkApplications are namespaced
            return
        app = _plain(body)
        key = runtime_.AppKey.of(app)
        if type == "DELETED":
            runtime.pending.pop(key.id, None)
            runtime.metrics.track_recovery((namespace, name), recovering=False)
            return
        held = _held_back(runtime, key, app)
        if held is None:
            decision = recovery.decide(
                app, now=runtime.clock(), config=config, holder=runtime.identity
            )
            runtime.decided(key, decision)
            if decision.action is recovery.Action.NOTHING:
                runtime.pending.pop(key.id, None)
                _track(runtime, namespace, name, app)
                return  # the cheap, common case: no API call at all
        elif held.action is finalizers.Step.NOTHING:
            return  # on its way out (held by other finalizers): no recovery step
        runtime.pending[key.id] = key
        if not runtime.leading():
            return  # the leader acts; we remember the app in case we become the leader
        version = (app.get("metadata") or {}).get("resourceVersion")
        if version is not None and version in runtime.written.get(key.id, ()):
            return  # the echo of one of our own patches: its worker knows it, or a newer one
        wake(runtime, key, logger=logger, body=app)


#: the kopf handler id of each kind's mutating webhook: the path the chart's
#: MutatingWebhookConfiguration calls (``/<id>``)
WEBHOOK_IDS: Final = {
    mutation.KUBEFLOW.name: "sparkapplications",
    mutation.APACHE.name: "apache-sparkapplications",
}


def _register_admission(
    registry: kopf.OperatorRegistry,
    admission_: admission.Admission,
    kind: mutation.AppKind,
    *,
    config: config_.OperatorConfig,
) -> None:
    """The mutating webhook of one kind: one decision path (:meth:`admission.Admission.review`)
    for both, which finds where things go from the app's ``apiVersion``."""

    @kopf.on.mutate(
        kind.group,
        kind.version,
        kind.plural,
        id=WEBHOOK_IDS[kind.name],
        operations=["CREATE", "UPDATE"],
        ignore_failures=config.webhook_ignore_failures,
        registry=registry,
    )
    async def admit(
        body: kopf.Body,
        patch: kopf.Patch,
        warnings: list[str],
        logger: Logger,
        **kwargs: Any,
    ) -> None:
        old: Mapping[str, Any] | None = kwargs.get("old")
        verdict = await admission_.review(
            _plain(body), old=_plain(old) if old is not None else None
        )
        if not verdict.allowed:
            logger.info("denied: %s", verdict.message)
            raise kopf.AdmissionError(verdict.message, code=422)
        if verdict.problems:
            warnings.append(verdict.message)
        patch.update(verdict.patch)


def start_leader_election(runtime: runtime_.Runtime) -> None:
    """Campaign for the Lease in the background (if configured); resync when elected."""
    config = runtime.config
    runtime.metrics.leader.set(0 if config.leader_election else 1)
    if not config.leader_election or runtime.elector is not None:
        return
    assert config.lease_namespace is not None  # check_config guarantees it

    async def changed(leading: bool) -> None:
        runtime.metrics.leader.set(1 if leading else 0)
        if leading:
            resync(runtime)
            for namespace, name in list(runtime.records.values()):
                wake_record(runtime, namespace, name, logger=_log)
        else:  # running workers see it at their next step and stop
            for flag in runtime.workers.values():
                flag.set()

    runtime.elector = leadership.LeaderElector(
        runtime.kube,
        namespace=config.lease_namespace,
        name=config.lease_name,
        identity=runtime.identity,
        timing=leadership.Timing.for_duration(config.lease_duration_seconds),
        on_change=changed,
    )
    _spawn(runtime, runtime.elector.run())


#: how long a stopping operator lets the Events it queued go out (a rollout loses none)
EVENT_FLUSH_SECONDS: Final = 5.0
#: the name of the tasks that post Events (:func:`_post_soon`)
_EVENT_TASK: Final = "sparkguard-events"


async def stop_background(runtime: runtime_.Runtime) -> None:
    """Stop the campaign and resyncs; let queued Events out (within
    :data:`EVENT_FLUSH_SECONDS`); release the Lease so another replica takes over now."""
    tasks = list(runtime.tasks)
    events = [t for t in tasks if t.get_name() == _EVENT_TASK]
    for task in tasks:
        if task.get_name() != _EVENT_TASK:
            task.cancel()
    if events:
        await asyncio.wait(events, timeout=EVENT_FLUSH_SECONDS)
    for task in events:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if runtime.rollback_threads is not None:  # running rollbacks end (idempotent) at exit
        runtime.rollback_threads.shutdown(wait=False, cancel_futures=True)
    if runtime.elector is not None:
        await runtime.elector.release()


def _spawn(runtime: runtime_.Runtime, work: Any) -> None:
    task: asyncio.Task[None] = asyncio.get_running_loop().create_task(work)
    runtime.tasks.add(task)
    task.add_done_callback(runtime.tasks.discard)


def resync(runtime: runtime_.Runtime) -> None:
    """Reconcile every app this replica saw needing a step (it just became the leader)."""
    keys = list(runtime.pending.values())
    if keys:
        _log.info("leading now: resuming %d app(s) that need a recovery step", len(keys))
    for key in keys:
        wake(runtime, key, logger=_AppLogger(_log, key))


def wake(
    runtime: runtime_.Runtime,
    key: runtime_.AppKey,
    *,
    logger: Logger,
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
    _spawn(runtime, _work(runtime, key, flag, logger=logger, body=body))


async def _work(
    runtime: runtime_.Runtime,
    key: runtime_.AppKey,
    flag: asyncio.Event,
    *,
    logger: Logger,
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


_log = logging.getLogger(__name__)


class _AppLogger(logging.LoggerAdapter[logging.Logger]):
    def __init__(self, logger: logging.Logger, key: runtime_.AppKey) -> None:
        super().__init__(logger, {})
        self.prefix = f"[{key.namespace}/{key.name}] "

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        return f"{self.prefix}{msg}", kwargs


def _plain(body: Mapping[str, Any]) -> dict[str, Any]:
    return dict(body)


def _track(runtime: runtime_.Runtime, namespace: str, name: str, app: Mapping[str, Any]) -> None:
    phase = appmeta.of(app).get(appmeta.PHASE)
    runtime.metrics.track_recovery(
        (namespace, name), recovering=phase in {p.value for p in recovery.RECOVERY_PHASES}
    )


#: how many apps' last transition Events :attr:`Runtime.posted` remembers
_POSTED_REMEMBERED: Final = 10_000
#: how many transition Events of one app it remembers (a recovery posts at most three)
_POSTED_PER_APP: Final = 4


def transition_event_name(app: Mapping[str, Any], transition: str) -> str:
    """The name every operator gives the Event of ``transition`` of this very object (uid)."""
    meta = app.get("metadata") or {}
    digest = hashlib.sha256(f"{meta.get('uid')}/{transition}".encode()).hexdigest()[:20]
    return f"{str(meta.get('name'))[:200]}.{digest}"


async def _post(
    runtime: runtime_.Runtime, app: Mapping[str, Any], event: recovery.EventSpec | None
) -> None:
    """Post ``event``; one that reports a transition is posted once, by whichever operator.

    Its name comes from the transition, so a copy posted again (a replica took over from one
    killed between writing the phase and posting) is refused by the API server as a duplicate.
    """
    if event is None:
        return
    key = runtime_.AppKey.of(app).id
    name = transition_event_name(app, event.transition) if event.transition else None
    if name is not None and name in runtime.posted.get(key, ()):
        return
    posted = await _event(
        runtime, app, type=event.type, reason=event.reason.value, message=event.message, name=name
    )
    if posted and name is not None:
        names = runtime.posted.pop(key, ())
        runtime.posted[key] = (*names, name)[-_POSTED_PER_APP:]
        while len(runtime.posted) > _POSTED_REMEMBERED:
            runtime.posted.pop(next(iter(runtime.posted)))


def _post_soon(
    runtime: runtime_.Runtime, app: Mapping[str, Any], *events: recovery.EventSpec | None
) -> None:
    """Post ``events`` after the app's earlier Events, without waiting for them.

    An Event is informational: the recovery's next patch does not wait for it (a request and
    a round trip less on the way from FAILED to the resubmission). The app's Events still go
    out one after the other, in order; :func:`_events_posted` waits for them (a reconcile
    returns only once its Events are out).
    """
    wanted = [e for e in events if e is not None]
    if not wanted:
        return
    key = runtime_.AppKey.of(app).id
    before = runtime.posting.get(key)

    async def post() -> None:
        if before is not None:
            await asyncio.wait([before])  # its outcome is its own (a failure is logged)
        # A few at a time across all apps: in a burst of failures the patches that make the
        # recoveries go first at the API server, the Events follow
        async with runtime.event_slots():
            for event in wanted:
                await _post(runtime, app, event)

    task = asyncio.get_running_loop().create_task(post(), name=_EVENT_TASK)
    runtime.posting[key] = task
    runtime.tasks.add(task)
    task.add_done_callback(runtime.tasks.discard)

    def forget(done: asyncio.Task[None]) -> None:
        if runtime.posting.get(key) is done:
            del runtime.posting[key]

    task.add_done_callback(forget)


async def _events_posted(runtime: runtime_.Runtime, key: runtime_.AppKey) -> None:
    """Wait until the Events :func:`_post_soon` queued for the app are out."""
    task = runtime.posting.get(key.id)
    if task is not None:
        await asyncio.wait([task])


async def _event(
    runtime: runtime_.Runtime,
    app: Mapping[str, Any],
    *,
    type: str,
    reason: str,
    message: str,
    name: str | None = None,
) -> bool:
    """Post a Kubernetes Event about ``app``; a failure to post is logged, never raised.

    ``True`` once the Event exists (posted now, or before under the same ``name``).
    """
    try:
        await runtime.kube.post_event(app, type=type, reason=reason, message=message, name=name)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - an Event is informational
        _log.warning("could not post Event %s: %s", reason, exc)
        return False
    return True


async def reconcile(
    runtime: runtime_.Runtime,
    *,
    key: runtime_.AppKey,
    logger: Logger,
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
        await _events_posted(runtime, key)


async def _reconcile(  # noqa: PLR0912, PLR0915 - one loop: read, decide, act or wait
    runtime: runtime_.Runtime,
    *,
    key: runtime_.AppKey,
    logger: Logger,
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
            held = _held_back(runtime, key, app)
            if held is not None:  # the finalizer's step comes first
                if held.action is finalizers.Step.NOTHING:
                    return  # on its way out (held by other finalizers): no recovery step
                steps += 1
                written = await _finalize(runtime, app=app, decision=held, logger=logger)
                continue
            decision = recovery.decide(
                app, now=runtime.clock(), config=config, holder=runtime.identity
            )
            runtime.decided(key, decision)
            _track(runtime, namespace, name, app)
            # The Events of the phase the app is in, if the replica that wrote the phase died
            # before posting them (known posted: no request).
            _post_soon(runtime, app, *recovery.owed_events(app, now=runtime.clock(), config=config))
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
    runtime: runtime_.Runtime, app: dict[str, Any] | None, exc: Exception, *, logger: Logger
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
        _post_soon(runtime, app, warning)
        await _events_posted(runtime, runtime_.AppKey.of(app))
    await runtime.sleep(config.error_backoff_seconds)


async def _patch(
    runtime: runtime_.Runtime, app: Mapping[str, Any], patch: Mapping[str, Any]
) -> dict[str, Any] | None:
    """Patch exactly this object at exactly this version (uid + resourceVersion)."""
    meta = app.get("metadata") or {}
    patched = await runtime.kube.patch_app(
        meta["namespace"],
        meta["name"],
        patch,
        uid=meta.get("uid"),
        resource_version=meta.get("resourceVersion"),
        group=runtime_.AppKey.of(app).group,
    )
    if patched is not None:
        key = runtime_.AppKey.of(patched)
        version = (patched.get("metadata") or {}).get("resourceVersion")
        if version is not None:
            # the last few: the echo of the claim may come after the conclusion's response
            runtime.written[key.id] = (*runtime.written.get(key.id, ()), version)[-4:]
    return patched


async def _act(
    runtime: runtime_.Runtime,
    *,
    app: dict[str, Any],
    decision: recovery.Decision,
    logger: Logger,
) -> dict[str, Any] | None:
    """Take the step; return the app as the last patch left it (``None``: read it again)."""
    action = decision.action
    if action in (recovery.Action.MARK_INVALID, recovery.Action.MARK_SUCCEEDED):
        marked = await _patch(runtime, app, decision.patch)
        if marked is None:
            return None
        if action is recovery.Action.MARK_INVALID:
            runtime.metrics.failures.labels(reason=recovery.Reason.INVALID_ANNOTATION.value).inc()
            logger.info("marked Invalid: %s", decision.reason)
        _post_soon(runtime, app, decision.event)
        return marked
    if action in (recovery.Action.RESUBMIT, recovery.Action.NUDGE):
        patched = await _patch(runtime, app, decision.patch)
        if patched is not None:
            if action is recovery.Action.RESUBMIT:
                runtime.metrics.resubmissions.inc()
            else:
                runtime.metrics.resubmit_retries.inc()
            logger.info("%s", decision.reason)
            _post_soon(runtime, patched, decision.event)
        return patched
    if action in (recovery.Action.ROLLBACK, recovery.Action.GIVE_UP):
        return await _rollback(runtime, app=app, decision=decision, logger=logger)
    if action is recovery.Action.RECREATE:
        await _recreate(runtime, app=app, decision=decision, logger=logger)
        return None
    raise AssertionError(f"unhandled action {action}")  # pragma: no cover


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
                patched = await _patch(
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


async def _rollback(
    runtime: runtime_.Runtime,
    *,
    app: dict[str, Any],
    decision: recovery.Decision,
    logger: Logger,
) -> dict[str, Any] | None:
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
    logger: Logger,
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
    marked = await _patch(runtime, app, decision.patch)
    if marked is None:
        return None
    if new_failure:
        state = recovery.observe(app).state or "FAILED"
        runtime.metrics.failures.labels(reason=state).inc()
    runtime.metrics.track_recovery((namespace, meta["name"]), recovering=True)
    # RollbackStarted goes out while the rollback runs (off the critical path); the app's
    # later Events follow it, in order.
    _post_soon(runtime, marked, decision.event)
    logger.info("rolling back job %s: %s", options.job_id, decision.reason)
    return await _roll_back_claimed(
        runtime, marked=marked, decision=decision, logger=logger, slot=slot
    )


async def _roll_back_claimed(
    runtime: runtime_.Runtime,
    *,
    marked: dict[str, Any],
    decision: recovery.Decision,
    logger: Logger,
    slot: _Slot,
) -> dict[str, Any] | None:
    options = decision.options
    assert options is not None
    meta = marked["metadata"]
    namespace = meta["namespace"]
    storage_options = await _storage_options(runtime, namespace, options)
    claim = _Claim(runtime, marked, decision)
    keeper = asyncio.get_running_loop().create_task(claim.keep())
    try:
        started = time.monotonic()
        try:
            summary = await asyncio.get_running_loop().run_in_executor(
                runtime.rollback_executor(),
                functools.partial(
                    runtime.rollback,
                    options.job_id,
                    options.journal,
                    owner=_storage_owner(marked),
                    storage_options=storage_options,
                ),
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
        "committed"
        if conclusion.phase is recovery.Phase.COMMITTED_NOT_RESUBMITTED
        else "rolled_back"
        if summary.instants_rolled_back
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
        (namespace, meta["name"]),
        recovering=conclusion.phase is recovery.Phase.ROLLED_BACK and follow is None,
    )
    logger.info("%s", conclusion.event.message)
    if follow is not None:
        runtime.decided(claim.key, follow)
        runtime.metrics.resubmissions.inc()
        logger.info("%s", follow.reason)
    _post_soon(runtime, concluded, conclusion.event, follow.event if follow else None)
    return concluded


async def _storage_options(
    runtime: runtime_.Runtime, namespace: str, options: appmeta.Options
) -> dict[str, Any] | None:
    if not options.storage_secret:
        return None
    data = await runtime.kube.read_secret(namespace, options.storage_secret)
    if data is None:
        raise errors.OperatorError(
            f"Secret {namespace}/{options.storage_secret} named by "
            f"{appmeta.STORAGE_SECRET} does not exist; create it or fix the annotation"
        )
    return rollbacks.storage_options_from_secret(rollbacks.decode_secret_data(data))


def _storage_owner(app: Mapping[str, Any]) -> str | None:
    """The owner the app's writes record in storage (admission's annotation), if any."""
    return appmeta.storage_owner(app.get("metadata"))


def _held_back(
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


async def _finalize(
    runtime: runtime_.Runtime,
    *,
    app: dict[str, Any],
    decision: finalizers.Decision,
    logger: Logger,
) -> dict[str, Any] | None:
    """Add or remove the finalizer (one patch); for a deleted app, roll back first.

    Returns the app as the last patch left it (``None``: read it again).
    """
    action = decision.action
    if action is finalizers.Step.ADD:
        logger.info("adding finalizer %s: %s", finalizers.FINALIZER, decision.reason)
        return await _patch(runtime, app, decision.patch)
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
            return await _patch(runtime, current, patch)
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
    logger: Logger,
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
    name = transition_event_name(app, f"deleted/{reason.value}")
    kind = "Normal" if reason is finalizers.Reason.ROLLED_BACK_ON_DELETE else "Warning"
    await _event(runtime, app, type=kind, reason=reason.value, message=message, name=name)


async def _bounded_rollback(
    runtime: runtime_.Runtime, *, app: Mapping[str, Any], options: appmeta.Options
) -> rollbacks.RollbackSummary:
    """The storage rollback of a deleted app, in a rollback slot and its thread.

    A thread can't be stopped: when the caller gives up waiting (the deletion timeout), the
    rollback goes on in its thread (it is idempotent), and its slot is released only when the
    thread really ends, so a hung storage never runs more rollbacks than there are slots.
    """
    meta = app.get("metadata") or {}
    storage_options = await _storage_options(runtime, meta["namespace"], options)
    loop = asyncio.get_running_loop()
    slots = runtime.rollback_slots()
    await slots.acquire()

    def release(_: object) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed at shutdown
            loop.call_soon_threadsafe(slots.release)

    try:
        future = runtime.rollback_executor().submit(
            functools.partial(
                runtime.rollback,
                options.job_id,
                options.journal,
                owner=_storage_owner(app),
                storage_options=storage_options,
            )
        )
    except BaseException:
        slots.release()
        raise
    future.add_done_callback(release)
    started = time.monotonic()
    try:
        return await asyncio.wrap_future(future)
    finally:
        runtime.metrics.rollback_seconds.observe(time.monotonic() - started)


async def _recreate(
    runtime: runtime_.Runtime,
    *,
    app: dict[str, Any],
    decision: recovery.Decision,
    logger: Logger,
) -> None:
    """Resubmit an Apache app by recreating it (:mod:`resubmit`), steps 1-2 here.

    The old app is patched first (phase Resubmitted with the new attempt, our finalizer off:
    the deletion is ours and needs no rollback), under its uid and resourceVersion; then the
    record is written from what that patch returned; then the old app is deleted (uid
    precondition). A replica killed between two steps leaves an app in phase Resubmitted,
    which :func:`recovery.decide` sends here again; each step is idempotent.
    """
    meta = app["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    annotations = dict((decision.patch.get("metadata") or {}).get("annotations") or {})
    patch: dict[str, Any] = {
        "metadata": {
            "annotations": annotations,
            "finalizers": finalizers.without_finalizer(finalizers.finalizers_of(app)),
        }
    }
    released = await _patch(runtime, app, patch)
    if released is None:
        return  # gone meanwhile
    manifest = resubmit.new_manifest(released, annotations={})
    record = resubmit.record(released, manifest)
    if await runtime.kube.create_config_map(namespace, record):
        logger.info("resubmission record %s written", record["metadata"]["name"])
    deleted = await runtime.kube.delete_app(
        namespace, name, uid=str(meta.get("uid")), group=runtime_.AppKey.of(app).group
    )
    logger.info("%s: %s the old app", decision.reason, "deleted" if deleted else "already gone:")
    wake_record(runtime, namespace, record["metadata"]["name"], logger=logger)


def wake_record(runtime: runtime_.Runtime, namespace: str, name: str, *, logger: Logger) -> None:
    """Make the worker of one resubmission record go on (starting one if it has none)."""
    key = f"record/{namespace}/{name}"
    flag = runtime.workers.get(key)
    if flag is not None:
        flag.set()
        return
    flag = asyncio.Event()
    runtime.workers[key] = flag

    async def work() -> None:
        try:
            await finish_resubmission(runtime, namespace, name, logger=logger, wakeup=flag)
        finally:
            del runtime.workers[key]

    _spawn(runtime, work())


#: how often a resubmission record's worker looks whether the old app and its pods are gone
RECORD_POLL_SECONDS: Final = 0.5


async def finish_resubmission(
    runtime: runtime_.Runtime,
    namespace: str,
    record_name: str,
    *,
    logger: Logger,
    wakeup: asyncio.Event | None = None,
) -> None:
    """Steps 3-4 of a resubmission (:mod:`resubmit`): wait until the old app and its driver
    pods are gone, create the new app, drop the record. Errors are retried after
    ``error_backoff``; the worker ends when the record is gone or this replica stops leading.
    """
    wakeup = wakeup if wakeup is not None else asyncio.Event()
    while runtime.leading():
        wakeup.clear()
        try:
            data = await runtime.kube.read_config_map(namespace, record_name)
            if data is None:
                return
            found = resubmit.manifest_of(data)
            if found is None:
                logger.warning("resubmission record %s is unreadable; dropped", record_name)
                await runtime.kube.delete_config_map(namespace, record_name)
                return
            old_uid, manifest = found
            name = manifest["metadata"]["name"]
            group = str(manifest.get("apiVersion") or "").partition("/")[0]
            current = await runtime.kube.get_app(namespace, name, group=group)
            pods = (
                await runtime.kube.pod_names(namespace, f"{resubmit.APACHE_APP_LABEL}={name}")
                if current is None
                else []
            )
            step = resubmit.next_step(old_uid=old_uid, current=current, pods=pods)
            if step.step in (resubmit.Step.WAIT_APP, resubmit.Step.WAIT_PODS):
                logger.debug("resubmission of %s: %s", name, step.reason)
                if not wakeup.is_set():  # news of the record cuts nothing short: pods change
                    await runtime.sleep(RECORD_POLL_SECONDS)  # without it, so look again soon
                continue
            if step.step is resubmit.Step.CREATE:
                created = await runtime.kube.create_app(namespace, manifest)
                if created is not None:
                    runtime.metrics.resubmissions.inc()
                    logger.info("[%s/%s] recreated (resubmission of %s)", namespace, name, old_uid)
                    await _post(runtime, created, recovery.owed_event(
                        created, now=runtime.clock(), config=runtime.config
                    ))  # fmt: skip
                continue  # read again: DONE (or ABANDON if someone else was first)
            if step.step is resubmit.Step.ABANDON and current is not None:
                logger.warning("resubmission of %s: %s", name, step.reason)
                await _event(
                    runtime,
                    current,
                    type="Warning",
                    reason="ResubmissionAbandoned",
                    message=f"sparkguard did not recreate {name}: {step.reason}",
                )
            await runtime.kube.delete_config_map(namespace, record_name)
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the API fails in many ways; we retry
            logger.warning("resubmission record %s: %s; retrying", record_name, exc)
            await runtime.sleep(runtime.config.error_backoff_seconds)
