"""The securityContext of the containers sparkguard injects into driver and executor pods.

Platform teams run Spark in namespaces labelled for Pod Security ``restricted``, with arbitrary
UIDs (OpenShift's ``restricted-v2``) and read-only root filesystems. Every container sparkguard
adds (the library and rollback initContainers, the marker sidecar) therefore gets
:func:`restricted` unless the operator is told otherwise (``SPARKGUARD_INJECTED_SECURITY_CONTEXT``,
the chart's ``injected.containers.securityContext``): no privilege escalation, no capabilities,
the runtime's seccomp profile, a non-root user and a read-only root. It sets no ``runAsUser``:
the image runs as any non-root UID in group 0, and OpenShift refuses a fixed one.

The app's own choices come first (:func:`for_pod`): a field that the pod's securityContext sets
for all its containers (``runAsUser``, ``seccompProfile``, …) is left out of ours, so our
containers inherit the app's value instead of overriding it. The app's own containers are
never touched.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any, Final

#: the fields a pod's securityContext sets for every container, which a container's overrides
#: (``PodSecurityContext`` and ``SecurityContext`` of core/v1 share them)
POD_LEVEL_FIELDS: Final = (
    "appArmorProfile",
    "runAsGroup",
    "runAsNonRoot",
    "runAsUser",
    "seLinuxOptions",
    "seccompProfile",
    "windowsOptions",
)


def restricted() -> dict[str, Any]:
    """The default securityContext of an injected container: meets Pod Security ``restricted``.

    A purely computational function with no side-effects (a fresh dict each call).
    """
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def for_pod(configured: Mapping[str, Any], pod: Mapping[str, Any] | None) -> dict[str, Any]:
    """The securityContext an injected container gets in a pod whose own securityContext is
    ``pod`` (the app's; ``None`` when it has none).

    A purely computational function with no side-effects. ``configured`` (the operator's
    setting) less every pod-level field the pod sets: our container inherits the app's value,
    which therefore stays whatever the app made it (stricter or not; the app's own containers
    live by it too). A pod that sets ``runAsUser: 0`` also drops our ``runAsNonRoot``: the
    kubelet would refuse to start a container that must not run as root but inherits root.
    """
    context = copy.deepcopy(dict(configured))
    pod = pod or {}
    for field in POD_LEVEL_FIELDS:
        if pod.get(field) is not None:
            context.pop(field, None)
    if pod.get("runAsUser") == 0:
        context.pop("runAsNonRoot", None)
    return context


#: the core/v1 SecurityContext's fields and their shapes: a type, a tuple of allowed strings, a
#: nested object (dict), or a list of a type ([type])
_PROFILE: Final = {"type": ("RuntimeDefault", "Localhost", "Unconfined"), "localhostProfile": str}
_SHAPE: Final[Mapping[str, Any]] = {
    "allowPrivilegeEscalation": bool,
    "appArmorProfile": _PROFILE,
    "capabilities": {"add": [str], "drop": [str]},
    "privileged": bool,
    "procMount": ("Default", "Unmasked"),
    "readOnlyRootFilesystem": bool,
    "runAsGroup": int,
    "runAsNonRoot": bool,
    "runAsUser": int,
    "seLinuxOptions": {"level": str, "role": str, "type": str, "user": str},
    "seccompProfile": _PROFILE,
    "windowsOptions": {
        "gmsaCredentialSpec": str,
        "gmsaCredentialSpecName": str,
        "hostProcess": bool,
        "runAsUserName": str,
    },
}
_TYPE_NAMES: Final = {bool: "true or false", int: "an integer >= 0", str: "a string"}


def parse(text: str) -> dict[str, Any]:
    """A container securityContext from its JSON text, checked field by field.

    A purely computational function with no side-effects. Raises :class:`ValueError` naming
    the first bad field (``securityContext.capabilities.drop``, …) and what it must be. An
    empty text, ``null`` (Helm's rendering of a value set to null) or ``{}`` is an empty
    context: the injected containers get none.
    """
    try:
        value = json.loads(text) if text.strip() else None
    except ValueError as exc:
        raise ValueError(f"must be a JSON object (a container securityContext): {exc}") from None
    if value is None:
        return {}
    _check(value, dict(_SHAPE), "securityContext")
    if not isinstance(value, dict):  # pragma: no cover - _check refused it
        raise AssertionError(value)
    return value


def _check(value: Any, shape: Any, where: str) -> None:
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            raise ValueError(f"{where} must be an object")
        for key, item in value.items():
            if key not in shape:
                known = ", ".join(sorted(shape))
                raise ValueError(f"{where}.{key} is not a field of it (known: {known})")
            _check(item, shape[key], f"{where}.{key}")
    elif isinstance(shape, list):
        if not isinstance(value, list):
            raise ValueError(f"{where} must be a list")
        for index, item in enumerate(value):
            _check(item, shape[0], f"{where}[{index}]")
    elif isinstance(shape, tuple):
        if value not in shape:
            raise ValueError(f"{where} must be one of {', '.join(shape)}, not {value!r}")
    elif shape is int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{where} must be {_TYPE_NAMES[int]}, not {value!r}")
    elif not isinstance(value, shape):
        raise ValueError(f"{where} must be {_TYPE_NAMES[shape]}, not {value!r}")
