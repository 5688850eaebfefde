"""Native or regular marker sidecar: what the cluster can keep and run, read from the cluster.

A native sidecar is an initContainer with ``restartPolicy: Always``. Two things must hold for
one to work:

- the **kube-apiserver** runs native sidecars: Kubernetes >= 1.29 (``SidecarContainers`` beta,
  on by default), read from ``/version``;
- the **installed SparkApplication CRD keeps the field**: its structural schema prunes every
  field it does not declare, and spark-operator's 1.x CRDs (generated against a Kubernetes API
  older than 1.28) declare no container ``restartPolicy``. A pruned ``restartPolicy`` turns the
  sidecar into a plain init container that never exits: the driver never starts. Read from
  the CustomResourceDefinition ``sparkapplications.sparkoperator.k8s.io``: the field is kept
  when ``spec.driver.initContainers.items`` declares ``restartPolicy``, or when the schema
  preserves unknown fields at that level or above it (``x-kubernetes-preserve-unknown-fields``
  on a node whose child on the path is not declared).

Both are read again every :data:`REFRESH_SECONDS` (a CRD or the control plane can be upgraded
under a running operator); a read that fails keeps nothing and chooses the regular sidecar,
which works everywhere, and says why once per distinct reason.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from kubernetes import client

from sparkguard.operator import mutation

logger = logging.getLogger(__name__)

#: the CRD whose schema decides (cluster-scoped; the chart grants ``get`` on this name only)
CRD_NAME: Final = f"{mutation.PLURAL}.{mutation.GROUP}"
#: the first Kubernetes version that runs native sidecars (SidecarContainers beta, on)
NATIVE_SIDECARS_SINCE: Final = (1, 29)
#: how long one answer is used before the CRD and ``/version`` are read again
REFRESH_SECONDS: Final = 300.0
#: the path from the CRD version's schema root to one driver initContainer
_INIT_CONTAINER_PATH: Final = ("spec", "driver", "initContainers", "[]")
_MINOR: Final = re.compile(r"[0-9]+")


def supports_native_sidecars(major: str, minor: str) -> bool:
    """Whether an API server reporting ``major``/``minor`` (as ``/version`` does) runs native
    sidecars. A purely computational function with no side-effects; ``minor`` may carry a
    suffix (``"29+"`` on some distributions)."""
    found = _MINOR.match(minor or "")
    if not major.isdigit() or found is None:
        return False
    return (int(major), int(found.group())) >= NATIVE_SIDECARS_SINCE


def keeps_init_container_restart_policy(crd: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether the CRD stores ``restartPolicy`` of a driver initContainer, and where it says so.

    A purely computational function with no side-effects. Follows the structural pruning
    rules: along ``spec.driver.initContainers[]``, a field the schema declares is checked
    further down; a field it does not declare is kept only when that node preserves unknown
    fields. Reads the served version :data:`mutation.VERSION`.
    """
    versions = (crd.get("spec") or {}).get("versions") or []
    served = [v for v in versions if v.get("name") == mutation.VERSION]
    if not served:
        return False, f"the CRD serves no {mutation.VERSION}"
    node: Mapping[str, Any] = (served[0].get("schema") or {}).get("openAPIV3Schema") or {}
    where = ""
    for step in (*_INIT_CONTAINER_PATH, "restartPolicy"):
        if step == "[]":
            items = node.get("items")
            if not isinstance(items, Mapping):
                return _unknown_kept(node, where=where, missing="items")
            node, where = items, f"{where}.items"
            continue
        properties = node.get("properties") or {}
        if step not in properties:
            return _unknown_kept(node, where=where, missing=step)
        node, where = properties[step], f"{where}.{step}" if where else step
    return True, f"{where} is declared"


def _unknown_kept(node: Mapping[str, Any], *, where: str, missing: str) -> tuple[bool, str]:
    at = where or "the schema root"
    if node.get("x-kubernetes-preserve-unknown-fields") is True:
        return True, f"{at} preserves unknown fields ({missing} is not declared)"
    return False, f"{at} declares no {missing} and prunes unknown fields"


@dataclasses.dataclass(frozen=True)
class SidecarMode:
    """Where the marker sidecar goes, and why (said in the operator's log)."""

    native: bool
    reason: str


def decide(
    *,
    server_version: tuple[str, str] | None,
    crd: Mapping[str, Any] | None,
    unreadable: str | None = None,
) -> SidecarMode:
    """Native sidecar only when the API server runs them and the CRD keeps ``restartPolicy``.

    A purely computational function with no side-effects. ``server_version``: ``/version``'s
    major and minor; ``crd``: the CustomResourceDefinition as a plain dict, or ``None`` with
    ``unreadable`` saying why it could not be read (the regular sidecar then).
    """
    if server_version is not None and not supports_native_sidecars(*server_version):
        major, minor = server_version
        return SidecarMode(
            False, f"Kubernetes {major}.{minor} runs no native sidecars (needs >= 1.29)"
        )
    if crd is None:
        return SidecarMode(
            False,
            f"cannot read the CRD {CRD_NAME} ({unreadable or 'not found'}), so whether it keeps "
            "a container's restartPolicy is unknown; grant the operator get on it "
            "(the chart does) to allow native sidecars",
        )
    kept, where = keeps_init_container_restart_policy(crd)
    if not kept:
        return SidecarMode(
            False,
            f"the installed CRD {CRD_NAME} would prune an initContainer's restartPolicy "
            f"({where}: a spark-operator 1.x CRD); upgrade the CRD to use native sidecars",
        )
    if server_version is None:  # pragma: no cover - read_cluster always gives one or fails
        return SidecarMode(False, "the API server version is unknown")
    return SidecarMode(
        True, f"Kubernetes {'.'.join(server_version)} and the CRD keeps it ({where})"
    )


class SidecarModeCache:
    """The current :class:`SidecarMode`, read from the cluster at most every ``refresh`` s.

    Concurrent admissions share one read. A failed read is not cached as an answer for long:
    it gives the regular sidecar and is retried at the next refresh.
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        refresh: float = REFRESH_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api_client = api_client
        self.refresh = refresh
        self.clock = clock
        self._mode: SidecarMode | None = None
        self._read_at = 0.0
        self._lock = asyncio.Lock()
        self._said: set[str] = set()

    async def current(self) -> SidecarMode:
        """The mode to inject with now (reading the cluster when the last answer is stale)."""
        async with self._lock:
            if self._mode is None or self.clock() - self._read_at >= self.refresh:
                mode = await asyncio.to_thread(self._read)
                self._mode, self._read_at = mode, self.clock()
                if mode.reason not in self._said:  # once per distinct reason, not per request
                    self._said.add(mode.reason)
                    if mode.native:
                        logger.info("marker sidecar injected as a native sidecar: %s", mode.reason)
                    else:
                        logger.warning(
                            "marker sidecar injected as a regular container: %s", mode.reason
                        )
            return self._mode

    def _read(self) -> SidecarMode:
        try:
            info = client.VersionApi(self.api_client).get_code()
        except Exception as exc:  # noqa: BLE001 - any failure: the regular sidecar, ask again later
            return SidecarMode(False, f"cannot read the API server version ({exc})")
        version = (str(info.major), str(info.minor))
        if not supports_native_sidecars(*version):
            return decide(server_version=version, crd=None)
        crd, unreadable = self._read_crd()
        return decide(server_version=version, crd=crd, unreadable=unreadable)

    def _read_crd(self) -> tuple[dict[str, Any] | None, str | None]:
        method, url, headers, _, _ = self.api_client.param_serialize(
            "GET",
            f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}",
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        try:
            response = self.api_client.call_api(method, url, header_params=headers)
            data = response.read()  # type: ignore[no-untyped-call]
        except Exception as exc:  # noqa: BLE001 - unreachable: the regular sidecar
            return None, str(exc)
        if response.status >= 400:
            reason = "forbidden: RBAC" if response.status == 403 else f"HTTP {response.status}"
            return None, reason
        try:
            return dict(json.loads(data)), None
        except ValueError as exc:
            return None, f"not JSON: {exc}"
