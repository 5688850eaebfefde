"""Is a driver pod protected? Whether spark-operator's pod webhook gave it sparkguard's containers.

Admission puts sparkguard's initContainers, sidecar and volumes into the *SparkApplication*;
the driver *pod* gets them only from spark-operator's mutating pod webhook, which copies
``spec.driver.initContainers``/``sidecars`` and the volumes into the pod (v2
``internal/webhook/sparkpod_defaulter.go``, ``addInitContainers``/``addSidecarContainers``/
``addVolumes``; 1.x ``pkg/webhook/patch.go``). With that webhook disabled
(``webhook.enable=false``) or failing open (``failurePolicy: Ignore``, the 1.x default), the
pod is created without them: no rollback before the driver starts, no marker sidecar. Nothing
fails, so without this check nobody would notice.

Driver pods are recognised by the labels spark-operator and Spark put on them (upstream
``pkg/common`` constants): ``spark-role=driver`` (``LabelSparkRole``/``SparkRoleDriver``) and
``sparkoperator.k8s.io/app-name`` (``LabelSparkAppName``) naming the app; a pod of an earlier
run is told apart by ``sparkoperator.k8s.io/submission-id`` (``LabelSubmissionID``) against the
app's ``status.submissionID``, as spark-operator's own pod event handler does.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from typing import Any, Final

from sparkguard.operator import appmeta, mutation

ROLE_LABEL: Final = "spark-role"
DRIVER_ROLE: Final = "driver"
APP_NAME_LABEL: Final = "sparkoperator.k8s.io/app-name"
#: the Apache operator's label naming a driver pod's app (its ``Utils`` /
#: ``spark.operator/spark-app-name``, model §5)
APACHE_APP_NAME_LABEL: Final = "spark.operator/spark-app-name"
SUBMISSION_ID_LABEL: Final = "sparkoperator.k8s.io/submission-id"
#: the value of :data:`appmeta.PROTECTION` on an app whose driver pod lacks our containers
UNPROTECTED: Final = "unprotected"
#: the Warning Event's reason
REASON: Final = "Unprotected"
_OURS: Final = (mutation.LIB_INIT_NAME, mutation.ROLLBACK_INIT_NAME, mutation.SIDECAR_NAME)
_OUR_VOLUMES: Final = (mutation.LIB_VOLUME, mutation.TOKEN_VOLUME)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What one driver pod says about its app's protection.

    ``relevant`` is false for a pod that says nothing (the app is not opted in, or the pod
    belongs to an earlier run); ``missing`` names what of ours the pod lacks.
    """

    relevant: bool
    protected: bool = True
    missing: tuple[str, ...] = ()
    message: str = ""


def check_driver_pod(app: Mapping[str, Any], pod: Mapping[str, Any]) -> Verdict:
    """Whether ``pod`` (a driver pod of ``app``) carries sparkguard's rollback initContainer.

    A purely computational function with no side-effects. The rollback initContainer is the
    protection that must never be missing (it rolls back what an earlier attempt left before
    the driver starts); the message also lists our other containers and volumes the app
    declares but the pod lacks.
    """
    if not appmeta.opted_in(app):
        return Verdict(relevant=False)
    if mutation.kind_of(app) is mutation.APACHE:
        return _check_apache_driver_pod(app, pod)
    submission = ((app.get("status") or {}).get("submissionID")) or None
    pod_meta = pod.get("metadata") or {}
    pod_submission = (pod_meta.get("labels") or {}).get(SUBMISSION_ID_LABEL)
    if submission and pod_submission and pod_submission != submission:
        return Verdict(relevant=False)  # a pod of an earlier run
    spec = app.get("spec") or {}
    driver = spec.get("driver") or {}
    declared = [
        c.get("name")
        for c in [*(driver.get("initContainers") or []), *(driver.get("sidecars") or [])]
        if c.get("name") in _OURS
    ]
    pod_spec = pod.get("spec") or {}
    present = {
        c.get("name")
        for c in [*(pod_spec.get("initContainers") or []), *(pod_spec.get("containers") or [])]
    }
    if mutation.ROLLBACK_INIT_NAME in present:
        return Verdict(relevant=True)
    pod_name = pod_meta.get("name")
    if mutation.ROLLBACK_INIT_NAME not in declared:
        message = (
            f"driver pod {pod_name} runs without sparkguard's rollback initContainer "
            f"{mutation.ROLLBACK_INIT_NAME}, and so does the SparkApplication itself: it was "
            "stored without sparkguard's admission (its webhook down with failurePolicy "
            "Ignore, or the app created before it was installed); nothing rolls back an "
            "earlier attempt's output before this driver starts. Fix: recreate the app"
        )
        return Verdict(
            relevant=True, protected=False, missing=(mutation.ROLLBACK_INIT_NAME,), message=message
        )
    volumes = {v.get("name") for v in pod_spec.get("volumes") or []}
    declared_volumes = {v.get("name") for v in spec.get("volumes") or []}
    missing = tuple(
        [name for name in declared if name not in present]
        + [f"volume {v}" for v in _OUR_VOLUMES if v in declared_volumes and v not in volumes]
    )
    message = (
        f"driver pod {pod_name} lacks sparkguard's {', '.join(missing)}, which the "
        "SparkApplication declares: spark-operator's pod webhook did not apply the app's "
        "initContainers, sidecars and volumes (the webhook is disabled, or it failed with "
        "failurePolicy Ignore). The job runs unprotected: no rollback before the driver "
        "starts, no marker sidecar. Fix: install spark-operator with webhook.enable=true "
        "(and failurePolicy Fail), then rerun the app"
    )
    return Verdict(relevant=True, protected=False, missing=missing, message=message)


def _check_apache_driver_pod(app: Mapping[str, Any], pod: Mapping[str, Any]) -> Verdict:
    """:func:`check_driver_pod` for an Apache app: the pod is built from the app's
    ``driverSpec.podTemplateSpec`` (no pod webhook), so it lacks our containers only when the
    app was stored without sparkguard's admission; a pod owned by an earlier app of the same
    name (another uid) says nothing."""
    pod_meta = pod.get("metadata") or {}
    owners = {str(o.get("uid")) for o in pod_meta.get("ownerReferences") or []}
    uid = (app.get("metadata") or {}).get("uid")
    if owners and uid and uid not in owners:
        return Verdict(relevant=False)
    pod_spec = pod.get("spec") or {}
    present = {
        c.get("name")
        for c in [*(pod_spec.get("initContainers") or []), *(pod_spec.get("containers") or [])]
    }
    if mutation.ROLLBACK_INIT_NAME in present:
        return Verdict(relevant=True)
    template = (((app.get("spec") or {}).get("driverSpec") or {}).get("podTemplateSpec")) or {}
    declared = {c.get("name") for c in (template.get("spec") or {}).get("initContainers") or []}
    cause = (
        "the Apache operator did not build the pod from the app's driverSpec.podTemplateSpec"
        if mutation.ROLLBACK_INIT_NAME in declared
        else "the SparkApplication was stored without sparkguard's admission (its webhook "
        "down with failurePolicy Ignore, or the app created before it was installed)"
    )
    message = (
        f"driver pod {pod_meta.get('name')} runs without sparkguard's rollback initContainer "
        f"{mutation.ROLLBACK_INIT_NAME}: {cause}; nothing rolls back an earlier attempt's "
        "output before this driver starts. Fix: recreate the app"
    )
    return Verdict(
        relevant=True, protected=False, missing=(mutation.ROLLBACK_INIT_NAME,), message=message
    )


def annotations_patch(app: Mapping[str, Any], verdict: Verdict) -> dict[str, Any] | None:
    """The merge patch that records ``verdict`` on the app, or ``None`` if it says so already.

    A purely computational function with no side-effects. Unprotected: sets
    :data:`appmeta.PROTECTION` and :data:`appmeta.PROTECTION_REASON`; protected: removes them.
    """
    notes = appmeta.of(app)
    if verdict.protected:
        if not any(key in notes for key in appmeta.SIGNAL_KEYS):
            return None
        wanted: dict[str, str | None] = dict.fromkeys(appmeta.SIGNAL_KEYS)
    else:
        wanted = {appmeta.PROTECTION: UNPROTECTED, appmeta.PROTECTION_REASON: verdict.message}
        if all(notes.get(k) == v for k, v in wanted.items()):
            return None
    return {"metadata": {"annotations": wanted}}


def event_name(app: Mapping[str, Any], pod: Mapping[str, Any]) -> str:
    """One Event per driver pod, whichever replica posts it (a copy is refused as existing)."""
    app_meta, pod_meta = app.get("metadata") or {}, pod.get("metadata") or {}
    key = f"{app_meta.get('uid')}/{pod_meta.get('uid') or pod_meta.get('name')}/{REASON}"
    return f"{str(app_meta.get('name'))[:200]}.{hashlib.sha256(key.encode()).hexdigest()[:20]}"
