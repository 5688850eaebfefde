"""kopf handlers: admission mutation and failure recovery, calling the pure decisions.

The recovery handler reacts to every watch event of an opted-in SparkApplication (including
the initial listing after a restart), reads the app fresh, asks :func:`recovery.decide` what
to do, does it, and repeats until nothing is left to do. All progress is in annotations, so
kopf keeps no state of its own on the apps and a restarted operator simply continues.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any, Final, cast

import kopf
from aiohttp import web

from sparkguard.operator import (
    admission,
    appmeta,
    errors,
    kube,
    metrics,
    mutation,
    recovery,
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
        if config.metrics_port:
            servers.append(
                await metrics.start_server(
                    runtime.metrics, addr=config.metrics_addr, port=config.metrics_port
                )
            )
            logger.info("serving metrics on %s:%s", config.metrics_addr, config.metrics_port)

    @kopf.on.cleanup(registry=registry)
    async def stop_metrics(**_: Any) -> None:
        while servers:
            await servers.pop().cleanup()

    if config.webhook_mode is not config_.WebhookMode.DISABLED:
        admission_ = admission.Admission(config, runtime.kube.api_client)

        @kopf.on.mutate(
            mutation.GROUP,
            mutation.VERSION,
            mutation.PLURAL,
            id="sparkapplications",
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

    @kopf.on.event(
        mutation.GROUP,
        mutation.VERSION,
        mutation.PLURAL,
        # the label (scheduled runs carry it) or the annotation
        when=lambda body, **_: appmeta.opted_in(body),
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
        if type == "DELETED":
            runtime.metrics.track_recovery((namespace, name), recovering=False)
            return
        await reconcile(runtime, namespace=namespace, name=name, body=_plain(body), logger=logger)

    return registry


def _plain(body: Mapping[str, Any]) -> dict[str, Any]:
    return dict(body)


def _track(runtime: runtime_.Runtime, namespace: str, name: str, app: Mapping[str, Any]) -> None:
    phase = appmeta.of(app).get(appmeta.PHASE)
    runtime.metrics.track_recovery(
        (namespace, name), recovering=phase in {p.value for p in recovery.RECOVERY_PHASES}
    )


def _post(app: Mapping[str, Any], event: recovery.EventSpec | None) -> None:
    if event is not None:
        _event(app, type=event.type, reason=event.reason.value, message=event.message)


def _event(app: Mapping[str, Any], *, type: str, reason: str, message: str) -> None:
    """Post a Kubernetes Event about ``app`` (kopf posts it in the background)."""
    body = kopf.Body(cast(kopf.RawBody, dict(app)))
    kopf.event(body, type=type, reason=reason, message=message[:1000])


async def reconcile(
    runtime: runtime_.Runtime,
    *,
    namespace: str,
    name: str,
    body: Mapping[str, Any],
    logger: Logger,
) -> None:
    """Bring one app's recovery as far as it can go now; return when nothing is left to do.

    Never raises for a problem of the app or of storage: those become Events, metrics and a
    retry after ``error_backoff``; the loop ends when the app is gone or needs nothing.
    """
    config = runtime.config
    if recovery.decide(body, now=runtime.clock(), config=config).action is recovery.Action.NOTHING:
        _track(runtime, namespace, name, body)
        return  # the cheap, common case: no API call at all
    steps = 0
    while steps < MAX_STEPS:
        app: dict[str, Any] | None = None
        try:
            app = await runtime.kube.get_app(namespace, name)
            if app is None:
                runtime.metrics.track_recovery((namespace, name), recovering=False)
                return
            decision = recovery.decide(app, now=runtime.clock(), config=config)
            _track(runtime, namespace, name, app)
            if decision.action is recovery.Action.NOTHING:
                logger.debug("nothing to do: %s", decision.reason)
                return
            if decision.action is recovery.Action.WAIT:
                assert decision.retry_at is not None
                delay = (decision.retry_at - runtime.clock()).total_seconds()
                logger.info("waiting %.0fs before resubmitting (%s)", delay, decision.reason)
                await runtime.sleep(min(max(delay, 0.0), config.max_sleep_seconds))
                continue
            steps += 1
            await _act(runtime, app=app, decision=decision, logger=logger)
        except errors.KubeConflictError as exc:
            logger.info("%s", exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - storage and API fail in many ways; we retry
            reason = recovery.Reason.ROLLBACK_FAILED.value
            runtime.metrics.failures.labels(reason=reason).inc()
            message = (
                f"{type(exc).__name__}: {exc}; sparkguard retries in "
                f"{config.error_backoff_seconds:.0f}s"
            )
            logger.warning("recovery step failed: %s", message)
            if app is not None:
                _event(app, type="Warning", reason=reason, message=message)
            await runtime.sleep(config.error_backoff_seconds)
    logger.warning("stopped after %d steps; the next event of this app continues", MAX_STEPS)


async def _patch(
    runtime: runtime_.Runtime,
    app: Mapping[str, Any],
    patch: Mapping[str, Any],
    *,
    precondition: bool,
) -> dict[str, Any] | None:
    meta = app.get("metadata") or {}
    return await runtime.kube.patch_app(
        meta["namespace"],
        meta["name"],
        patch,
        resource_version=meta.get("resourceVersion") if precondition else None,
    )


async def _act(
    runtime: runtime_.Runtime,
    *,
    app: dict[str, Any],
    decision: recovery.Decision,
    logger: Logger,
) -> None:
    action = decision.action
    if action in (recovery.Action.MARK_INVALID, recovery.Action.MARK_SUCCEEDED):
        await _patch(runtime, app, decision.patch, precondition=False)
        if action is recovery.Action.MARK_INVALID:
            runtime.metrics.failures.labels(reason=recovery.Reason.INVALID_ANNOTATION.value).inc()
            logger.info("marked Invalid: %s", decision.reason)
        _post(app, decision.event)
        return
    if action is recovery.Action.RESUBMIT:
        if await _patch(runtime, app, decision.patch, precondition=True) is not None:
            runtime.metrics.resubmissions.inc()
            logger.info("%s", decision.reason)
            _post(app, decision.event)
        return
    if action in (recovery.Action.ROLLBACK, recovery.Action.GIVE_UP):
        await _rollback(runtime, app=app, decision=decision, logger=logger)
        return
    raise AssertionError(f"unhandled action {action}")  # pragma: no cover


async def _rollback(
    runtime: runtime_.Runtime,
    *,
    app: dict[str, Any],
    decision: recovery.Decision,
    logger: Logger,
) -> None:
    options = decision.options
    assert options is not None
    meta = app["metadata"]
    namespace = meta["namespace"]
    if appmeta.of(app).get(appmeta.HANDLED_FAILURE) != decision.failure_id:
        state = (app.get("status") or {}).get("applicationState", {}).get("state", "FAILED")
        runtime.metrics.failures.labels(reason=str(state)).inc()
    marked = await _patch(runtime, app, decision.patch, precondition=True)
    if marked is None:
        return
    runtime.metrics.track_recovery((namespace, meta["name"]), recovering=True)
    _post(marked, decision.event)
    logger.info("rolling back job %s: %s", options.job_id, decision.reason)

    storage_options: dict[str, Any] | None = None
    if options.storage_secret:
        data = await runtime.kube.read_secret(namespace, options.storage_secret)
        if data is None:
            raise errors.OperatorError(
                f"Secret {namespace}/{options.storage_secret} named by "
                f"{appmeta.STORAGE_SECRET} does not exist; create it or fix the annotation"
            )
        storage_options = rollbacks.storage_options_from_secret(rollbacks.decode_secret_data(data))

    async with runtime.rollback_slots():
        started = time.monotonic()
        try:
            summary = await asyncio.to_thread(
                runtime.rollback, options.job_id, options.journal, storage_options=storage_options
            )
        except Exception:
            runtime.metrics.rollbacks.labels(outcome="error").inc()
            raise
        finally:
            runtime.metrics.rollback_seconds.observe(time.monotonic() - started)
    result = {
        "instants_rolled_back": tuple(summary.instants_rolled_back),
        "instants_committed": tuple(summary.instants_committed),
        "files_deleted": summary.files_deleted,
        "files_kept": summary.files_kept,
    }
    conclusion = recovery.conclude_rollback(decision, summary=result, now=runtime.clock())
    outcome = (
        "committed"
        if conclusion.phase is recovery.Phase.COMMITTED_NOT_RESUBMITTED
        else "rolled_back"
        if summary.instants_rolled_back
        else "nothing_to_do"
    )
    runtime.metrics.rollbacks.labels(outcome=outcome).inc()
    if conclusion.phase is not recovery.Phase.ROLLED_BACK:
        runtime.metrics.failures.labels(reason=conclusion.event.reason.value).inc()
    # No precondition: the rollback is done whatever changed meanwhile, and this records it.
    await _patch(runtime, marked, conclusion.patch, precondition=False)
    runtime.metrics.track_recovery(
        (namespace, meta["name"]), recovering=conclusion.phase is recovery.Phase.ROLLED_BACK
    )
    logger.info("%s", conclusion.event.message)
    _post(marked, conclusion.event)
