"""Resubmitting an Apache app by recreating it: a record, a deletion, a creation.

The Apache Spark operator never runs a terminated app again (no rerun on a spec change,
``tests/e2e/apache-model.md`` §5), so sparkguard resubmits one by replacing it with a new object
of the same name and spec. Every step is resumable after a crash, by whichever replica leads:

1. **Record.** A ConfigMap ``sparkguard-resubmit-<old uid>`` (label
   :data:`RECORD_LABEL`) in the app's namespace holds the new app's manifest: name, labels,
   annotations (the recovery state: attempt, handled failure, last rollback, the owner, and
   ``sparkguard.io/resubmitted-from: <old uid>``), ownerReferences and the spec as admitted.
   Status, uid, resourceVersion, finalizers and managedFields are dropped. Created once
   (AlreadyExists: an earlier try made it).
2. **Let go.** The old app is patched (uid + resourceVersion precondition): our finalizer off
   (the deletion is ours: no rollback-on-delete), phase Resubmitted; then deleted with a uid
   precondition. The Apache operator's own finalizer goes when its clean-up sees the app
   terminated.
3. **Recreate.** When the old app is gone **and** no pod labelled
   ``spark.operator/spark-app-name=<name>`` is left (the new app's attempt 0 has the same driver
   pod name as the old one's, and the Apache operator adopts an existing pod of that name), the
   manifest is created. Admission keeps its owner because the record vouches for it. An app
   of that name found instead (created by someone else: a GitOps controller, a user) is left
   alone: the record is dropped with a Warning.
4. **Done.** The record is deleted.

:func:`next_step` decides each step of a record; its worker
(:func:`~sparkguard.operator.recreation.finish_resubmission`) is driven by the records' watch,
so a restarted operator finds them in its initial listing and goes on.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping
from typing import Any, Final

from sparkguard.operator import appmeta, recovery

#: the ConfigMap name of the record of the resubmission of the app with this uid
RECORD_PREFIX: Final = "sparkguard-resubmit-"
#: the label on every record (the operator watches ConfigMaps with it)
RECORD_LABEL: Final = "sparkguard.io/resubmission"
#: the record's data keys
MANIFEST_KEY: Final = "manifest"
UID_KEY: Final = "uid"
#: the label the Apache operator puts on an app's driver pods (model §5)
APACHE_APP_LABEL: Final = "spark.operator/spark-app-name"
#: what a recreated app does not take over from the old one
_DROPPED_META: Final = (
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "finalizers",
    "managedFields",
    "selfLink",
)


def record_name(uid: str) -> str:
    """The record ConfigMap's name for the app with ``uid``.

    A purely computational function with no side-effects.
    """
    return f"{RECORD_PREFIX}{uid}"


def new_manifest(
    app: Mapping[str, Any], *, annotations: Mapping[str, str | None]
) -> dict[str, Any]:
    """The manifest that recreates ``app``: its metadata and spec, the new ``annotations``
    applied (``None`` removes a key), without status, identity, version or finalizers.

    A purely computational function with no side-effects.
    """
    meta = dict(app.get("metadata") or {})
    notes = {
        k: v
        for k, v in {**(meta.get("annotations") or {}), **annotations}.items()
        if v is not None and k != recovery.CLAIM
    }
    notes[appmeta.RESUBMITTED_FROM] = str(meta.get("uid"))
    new_meta = {k: v for k, v in meta.items() if k not in _DROPPED_META}
    new_meta["annotations"] = notes
    return {
        "apiVersion": app.get("apiVersion"),
        "kind": app.get("kind") or "SparkApplication",
        "metadata": new_meta,
        "spec": app.get("spec") or {},
    }


def record(app: Mapping[str, Any], manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The record ConfigMap of the resubmission of ``app`` as ``manifest``.

    A purely computational function with no side-effects.
    """
    meta = app.get("metadata") or {}
    uid = str(meta.get("uid"))
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": record_name(uid),
            "namespace": meta.get("namespace"),
            "labels": {RECORD_LABEL: "true"},
            "annotations": {"sparkguard.io/app": str(meta.get("name"))},
        },
        "data": {MANIFEST_KEY: json.dumps(manifest, sort_keys=True), UID_KEY: uid},
    }


def manifest_of(data: Mapping[str, str]) -> tuple[str, dict[str, Any]] | None:
    """(old uid, manifest) of a record's data, or ``None`` if it is not a readable record.

    A purely computational function with no side-effects.
    """
    try:
        manifest = json.loads(data.get(MANIFEST_KEY) or "")
    except ValueError:
        return None
    uid = data.get(UID_KEY)
    if not isinstance(manifest, dict) or not uid:
        return None
    if not (manifest.get("metadata") or {}).get("name"):
        return None
    return uid, manifest


def vouches_for(data: Mapping[str, str] | None, app: Mapping[str, Any]) -> bool:
    """Whether the record ``data`` is the one of ``app``'s recreation: same name, same
    ``resubmitted-from`` uid, same owner (admission keeps the owner only then).

    A purely computational function with no side-effects.
    """
    found = manifest_of(data or {})
    if found is None:
        return False
    uid, manifest = found
    meta, wanted = app.get("metadata") or {}, manifest.get("metadata") or {}
    return (
        appmeta.of(app).get(appmeta.RESUBMITTED_FROM) == uid
        and meta.get("name") == wanted.get("name")
        and appmeta.storage_owner(meta) is not None
        and appmeta.storage_owner(meta) == appmeta.storage_owner(wanted)
    )


class Step(enum.StrEnum):
    """The next step of a record."""

    WAIT_APP = "wait-app"  # the old app still exists: its recovery deletes it
    WAIT_PODS = "wait-pods"  # the old app is gone; its driver pods are not yet
    CREATE = "create"
    DONE = "done"  # the new app exists: drop the record
    ABANDON = "abandon"  # another app of that name exists: drop the record, warn


@dataclasses.dataclass(frozen=True, kw_only=True)
class Next:
    """What to do about a record now."""

    step: Step
    reason: str


def next_step(*, old_uid: str, current: Mapping[str, Any] | None, pods: list[str]) -> Next:
    """The next step of the record of ``old_uid``'s resubmission.

    A purely computational function with no side-effects. ``current`` is the app of the
    record's name as stored now (``None``: none), ``pods`` its driver pods left.
    """
    if current is not None:
        meta = current.get("metadata") or {}
        if meta.get("uid") == old_uid:
            return Next(step=Step.WAIT_APP, reason="the old app is not deleted yet")
        if appmeta.of(current).get(appmeta.RESUBMITTED_FROM) == old_uid:
            return Next(step=Step.DONE, reason="the app was recreated")
        return Next(
            step=Step.ABANDON,
            reason=f"another app named {meta.get('name')} (uid {meta.get('uid')}) was created "
            "meanwhile, not by sparkguard; it is left alone and this resubmission dropped",
        )
    if pods:
        return Next(
            step=Step.WAIT_PODS,
            reason=f"waiting for the old app's pods to go ({', '.join(sorted(pods))}): the new "
            "app's first driver pod has the same name",
        )
    return Next(step=Step.CREATE, reason="the old app and its pods are gone")
