"""Serving a SparkApplication kind whose CRD was installed after the operator started.

kopf finds the resources it serves when it starts; its own CRD observation (``scanning``) is off
(:func:`main.build_settings`: it would need cluster-wide list/watch on every CRD and on
namespaces). Instead the operator passes kopf an ``Insights`` object it keeps, and this loop
reads each kind's CRD by name (``get``, the chart's ``crdRules``) every
``crd_check_interval``: when a kind that kopf does not serve yet has its CRD now, the kind is
added to kopf's insights the way kopf's own observer does (``revise_resources``, then a notice
on ``insights.revised``): kopf starts watching it and its webhook answers, without a restart.

This uses kopf's internals (``kopf._cogs.structs.references.Resource``,
``kopf._core.reactor.observation.revise_resources``), pinned by ``constraints.txt`` and tested
on the kube bench (``tests/e2e/test_apache_recovery.py``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Final

import kopf
from kopf._cogs.structs import references
from kopf._core.reactor import observation

from sparkguard.operator import mutation
from sparkguard.operator import runtime as runtime_

_log = logging.getLogger(__name__)
#: seconds between two looks at the CRDs of the kinds kopf does not serve yet
CHECK_INTERVAL: Final = 10.0


def served(insights: references.Insights, kind: mutation.AppKind) -> bool:
    """Whether kopf serves ``kind`` (watches it) now."""
    return any(
        r.group == kind.group and r.plural == kind.plural for r in insights.watched_resources
    )


def established(crd: dict[str, Any]) -> bool:
    """Whether the apiserver serves the CRD's API: its ``Established`` condition is true and it
    is not being deleted. A watch started before that answers 404, and kopf's failed watcher
    stops the whole operator."""
    if (crd.get("metadata") or {}).get("deletionTimestamp"):
        return False
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(
        isinstance(c, dict) and c.get("type") == "Established" and c.get("status") == "True"
        for c in conditions
    )


def resource_of(crd: dict[str, Any], kind: mutation.AppKind) -> references.Resource:
    """kopf's description of ``kind``'s resource, from its CRD."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    version = next(
        (
            str(v.get("name"))
            for v in spec.get("versions") or []
            if v.get("name") == kind.version and v.get("served")
        ),
        kind.version,
    )
    return references.Resource(
        group=kind.group,
        version=version,
        plural=kind.plural,
        kind=str(names.get("kind") or "SparkApplication"),
        singular=str(names.get("singular") or "sparkapplication"),
        shortcuts=frozenset(names.get("shortNames") or ()),
        categories=frozenset(names.get("categories") or ()),
        subresources=frozenset({"status"}),
        namespaced=spec.get("scope", "Namespaced") == "Namespaced",
        preferred=True,
        verbs=frozenset({"get", "list", "watch", "patch", "create", "delete", "update"}),
    )


async def serve_new_kinds(
    runtime: runtime_.Runtime,
    registry: kopf.OperatorRegistry,
    insights: references.Insights,
    *,
    interval: float = CHECK_INTERVAL,
) -> None:
    """Every ``interval``: add each kind whose CRD exists now and kopf does not serve."""
    await insights.ready_resources.wait()  # kopf's initial scan first
    while True:
        for kind in mutation.KINDS:
            if served(insights, kind):
                continue
            try:
                crd = await runtime.kube.get_crd(kind.crd_name)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - looked at again next time
                _log.warning("could not read the CRD %s: %s", kind.crd_name, exc)
                continue
            if crd is None or not established(crd):
                continue  # not there, or not served yet: looked at again next time
            resource = resource_of(crd, kind)
            async with insights.revised:
                observation.revise_resources(
                    resources=[resource], insights=insights, registry=registry, group=kind.group
                )
                await insights.backbone.fill(resources=[resource])
                insights.revised.notify_all()
            _log.info("the CRD %s is installed now: serving %s apps", kind.crd_name, kind.name)
        await runtime.sleep(interval)
