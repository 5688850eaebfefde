"""kopf handlers: admission mutation and failure recovery, calling the pure decisions.

:func:`build_registry` registers them on a fresh kopf registry, bound to one runtime. Every
replica serves admission (:mod:`admission`). The recovery handler sees every watch event of an
opted-in SparkApplication (including the initial listing after a restart) in every replica,
and remembers which apps need a step; only the leader acts, through the app's worker
(:mod:`reconciliation`). The resubmission records' handler wakes their workers
(:mod:`recreation`); the operator's start and stop run its background work (:mod:`lifecycle`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import kopf
from aiohttp import web

from sparkguard.operator import (
    admission,
    appmeta,
    crdwatch,
    deletions,
    finalizers,
    kube,
    lifecycle,
    metrics,
    mutation,
    podwatch,
    protection,
    reconciliation,
    recovery,
    recreation,
    resubmit,
)
from sparkguard.operator import config as config_
from sparkguard.operator import runtime as runtime_


def build_registry(runtime: runtime_.Runtime) -> kopf.OperatorRegistry:
    """A fresh kopf registry with the operator's handlers bound to ``runtime``."""
    registry = kopf.OperatorRegistry()
    config = runtime.config
    servers: list[web.AppRunner] = []

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kube.connection_info(runtime.kube.api_client.configuration)

    @kopf.on.startup(registry=registry)
    async def start_metrics(logger: runtime_.Logger, **_: Any) -> None:
        runtime.rollback_slots()
        lifecycle.start_leader_election(runtime)
        if runtime.insights is not None:
            runtime.spawn(
                crdwatch.serve_new_kinds(
                    runtime, registry, runtime.insights, interval=config.crd_check_seconds
                )
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
        await lifecycle.stop_background(runtime)
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
        type: str, namespace: str | None, name: str, logger: runtime_.Logger, **_: Any
    ) -> None:
        if namespace is None or type == "DELETED":
            if namespace is not None:
                runtime.records.pop(f"{namespace}/{name}", None)
            return
        runtime.records[f"{namespace}/{name}"] = (namespace, name)
        if runtime.leading():
            recreation.wake_record(runtime, namespace, name, logger=logger)

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
        logger: runtime_.Logger,
        **_: Any,
    ) -> None:
        if namespace is None:  # pragma: no cover - SparkApplications are namespaced
            return
        app = _plain(body)
        key = runtime_.AppKey.of(app)
        if type == "DELETED":
            runtime.pending.pop(key.id, None)
            runtime.metrics.track_recovery((namespace, name), recovering=False)
            runtime.metrics.track_app((namespace, name), protected=None)
            return
        # the dashboard's protected/unprotected apps: from the annotation the pod watch writes
        runtime.metrics.track_app(
            (namespace, name),
            protected=(
                appmeta.of(app).get(appmeta.PROTECTION) != protection.UNPROTECTED
                if appmeta.opted_in(app)
                else None
            ),
        )
        held = deletions.held_back(runtime, key, app)
        if held is None:
            decision = recovery.decide(
                app, now=runtime.clock(), config=config, holder=runtime.identity
            )
            runtime.decided(key, decision)
            if decision.action is recovery.Action.NOTHING:
                runtime.pending.pop(key.id, None)
                reconciliation.track(runtime, namespace, name, app)
                return  # the cheap, common case: no API call at all
        elif held.action is finalizers.Step.NOTHING:
            return  # on its way out (held by other finalizers): no recovery step
        runtime.pending[key.id] = key
        if not runtime.leading():
            return  # the leader acts; we remember the app in case we become the leader
        version = (app.get("metadata") or {}).get("resourceVersion")
        if version is not None and version in runtime.written.get(key.id, ()):
            return  # the echo of one of our own patches: its worker knows it, or a newer one
        reconciliation.wake(runtime, key, logger=logger, body=app)


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
        logger: runtime_.Logger,
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


def _plain(body: Mapping[str, Any]) -> dict[str, Any]:
    return dict(body)
