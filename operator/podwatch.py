"""Watching driver pods of opted-in apps: the ``Unprotected`` signal (see :mod:`protection`).

Each driver pod is looked at once (its containers cannot change after creation): the leader
reads the app, asks :func:`protection.check_driver_pod`, and records the answer on the app: a
Warning Event ``Unprotected`` (named after the pod, so a second replica or a restarted
operator never posts it twice) and the annotations ``sparkguard.io/protection`` +
``protection-reason``; a later protected pod removes them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

import kopf

from sparkguard.operator import appmeta, errors, mutation, protection
from sparkguard.operator import runtime as runtime_

Logger = logging.Logger | logging.LoggerAdapter[Any]
_log = logging.getLogger(__name__)

#: how many driver pods :class:`DriverPodWatch` remembers as checked
REMEMBERED: Final = 10_000


class DriverPodWatch:
    """The driver pods this process checked already (bounded; the oldest go first)."""

    def __init__(self, runtime: runtime_.Runtime) -> None:
        self.runtime = runtime
        self.checked: dict[str, None] = {}

    def register(self, registry: kopf.OperatorRegistry) -> None:
        """Add the pod handler to ``registry`` (pods labelled as spark-operator's drivers)."""

        for label in (protection.APP_NAME_LABEL, protection.APACHE_APP_NAME_LABEL):
            self._register_for(registry, label)

    def _register_for(self, registry: kopf.OperatorRegistry, label: str) -> None:
        @kopf.on.event(
            "",
            "v1",
            "pods",
            id=f"driver-pods/{label}",
            labels={protection.ROLE_LABEL: protection.DRIVER_ROLE, label: kopf.PRESENT},
            registry=registry,
        )
        async def on_driver_pod(type: str, body: kopf.Body, logger: Logger, **_: Any) -> None:
            if type == "DELETED":
                return
            await self.check(dict(body), logger=logger)

    async def check(
        self, pod: Mapping[str, Any], *, logger: Logger = _log
    ) -> protection.Verdict | None:
        """Look at one driver pod (once) and record what it says on its app; the verdict."""
        meta = pod.get("metadata") or {}
        key = str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")
        if key in self.checked or not self.runtime.leading():
            return None  # the leader records it (a new leader checks the pods it lists)
        namespace = meta.get("namespace")
        labels = meta.get("labels") or {}
        app_name, group = labels.get(protection.APP_NAME_LABEL), mutation.GROUP
        if not app_name:  # the Apache operator's driver pod
            app_name, group = labels.get(protection.APACHE_APP_NAME_LABEL), mutation.APACHE.group
        if not namespace or not app_name:
            return None
        app = await self.runtime.kube.get_app(str(namespace), str(app_name), group=group)
        verdict = protection.Verdict(relevant=False) if app is None else (
            protection.check_driver_pod(app, pod)
        )  # fmt: skip
        if app is not None and verdict.relevant:
            await self._record(app, pod, verdict, logger=logger)
        self.checked[key] = None
        while len(self.checked) > REMEMBERED:
            self.checked.pop(next(iter(self.checked)))
        return verdict

    async def _record(
        self,
        app: Mapping[str, Any],
        pod: Mapping[str, Any],
        verdict: protection.Verdict,
        *,
        logger: Logger,
    ) -> None:
        meta = app.get("metadata") or {}
        patch = protection.annotations_patch(app, verdict)
        if patch is not None:
            try:
                await self.runtime.kube.patch_app(
                    meta["namespace"],
                    meta["name"],
                    patch,
                    uid=meta.get("uid"),
                    resource_version=None,
                    group=runtime_.AppKey.of(app).group,
                )
            except errors.KubeConflictError:
                return  # the app was replaced by another of the same name: not its pod
        if verdict.protected:
            return
        logger.warning("%s: %s", appmeta.PROTECTION, verdict.message)
        try:
            await self.runtime.kube.post_event(
                app,
                type="Warning",
                reason=protection.REASON,
                message=verdict.message,
                name=protection.event_name(app, pod),
            )
        except Exception as exc:  # noqa: BLE001 - an Event is informational; the annotation stays
            _log.warning("could not post Event %s: %s", protection.REASON, exc)
