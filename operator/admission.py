"""Admission with the cluster in view: what the pure :func:`mutation.review` cannot know.

- the owner's fresh random id (one per CREATE request);
- whether the marker sidecar can be a native sidecar: the API server runs them (Kubernetes
  >= 1.29) *and* the installed SparkApplication CRD keeps a container's ``restartPolicy``
  (:mod:`sidecarmode`, read again every few minutes);
- whether another live SparkApplication already uses the job id: a metadata-only list, selected
  by the job id's label (``sparkguard.io/job-id-hash``), of the apps the operator sees (every
  watched namespace, or the whole cluster), of **both kinds** (Kubeflow's and Apache's: one job
  id, one writer, whichever operator runs it). A kind whose CRD is not installed has no apps.

"Live" means: not being deleted, and not marked ``Succeeded`` by the operator (a completed app
no longer holds its job id). Two apps with one job id created at the same instant can both pass
the check (neither is stored yet); the owner recorded in storage is the second line of defence.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Iterator, Mapping
from typing import Any, Final, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sparkguard.operator import appmeta, mutation, resubmit, sidecarmode
from sparkguard.operator import config as config_

logger = logging.getLogger(__name__)

#: only metadata comes back: a list of 1,000 apps stays small (no specs, no status)
_METADATA_ONLY: Final = (
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
)
_PAGE: Final = 500


def effective_job_id(app: Mapping[str, Any]) -> str | None:
    """The job id an opted-in app writes under (annotation, else derived); ``None`` otherwise.

    A purely computational function with no side-effects.
    """
    if not appmeta.opted_in(app):
        return None
    given = appmeta.of(app).get(appmeta.JOB_ID)
    if given:
        return given
    meta = app.get("metadata") or {}
    namespace, name = meta.get("namespace"), meta.get("name")
    if not namespace or not name:
        return None
    return appmeta.derive_job_id(namespace=str(namespace), name=str(name))


def is_live(app: Mapping[str, Any]) -> bool:
    """Whether ``app`` still holds its job id: not being deleted, not ``Succeeded``.

    A purely computational function with no side-effects.
    """
    meta = app.get("metadata") or {}
    return not meta.get("deletionTimestamp") and appmeta.of(app).get(appmeta.PHASE) != "Succeeded"


class Admission:
    """The admission decisions of one running operator (shared by every request)."""

    def __init__(
        self,
        config: config_.OperatorConfig,
        api_client: client.ApiClient,
        *,
        sidecar_mode: sidecarmode.SidecarModeCache | None = None,
    ) -> None:
        self.config = config
        self.api_client = api_client
        self.sidecar_mode = sidecar_mode or sidecarmode.SidecarModeCache(api_client)

    async def native_sidecars(self) -> bool:
        """Whether to inject the marker sidecar as a native sidecar: the setting when forced,
        else what the cluster can keep and run (:mod:`sidecarmode`, cached for minutes)."""
        if self.config.sidecar_native is not None:
            return self.config.sidecar_native
        return (await self.sidecar_mode.current()).native

    async def review(
        self, app: Mapping[str, Any], *, old: Mapping[str, Any] | None
    ) -> mutation.Review:
        """The verdict on one request: :func:`mutation.review`, then the duplicate job id.

        An app in a namespace the operator does not watch passes untouched (the chart's
        namespaceSelector keeps it away already; managed mode has none): it would never be
        recovered, so mutating it would only promise what nobody keeps.
        """
        namespace = (app.get("metadata") or {}).get("namespace")
        if not self.config.clusterwide and namespace not in self.config.namespaces:
            return mutation.Review(allowed=True)
        # Apache apps: always native (their CRD keeps restartPolicy; Kubernetes >= 1.34)
        apache = mutation.kind_of(app) is mutation.APACHE
        keep_owner = (
            apache
            and old is None
            and bool(appmeta.of(app).get(appmeta.RESUBMITTED_FROM))
            and await asyncio.to_thread(self.resubmission_of, app)
        )
        verdict = mutation.review(
            app,
            old=old,
            config=self.config,
            owner_id=secrets.token_hex(8),
            marker_token=secrets.token_urlsafe(32),
            native_sidecar=True if apache else await self.native_sidecars(),
            keep_owner=keep_owner,
        )
        job_id = verdict.job_id
        if not verdict.allowed or job_id is None:
            return verdict
        if old is not None and effective_job_id(old) == job_id:
            return verdict  # the id it already held: checked when it got it
        meta = app.get("metadata") or {}
        holder = await asyncio.to_thread(
            self.holder_of,
            job_id,
            namespace=meta.get("namespace"),
            name=meta.get("name"),
            kind=mutation.kind_of(app),
        )
        if holder is None:
            return verdict
        return mutation.Review(
            allowed=False,
            problems=(
                appmeta.Problem(
                    appmeta.JOB_ID,
                    f"{job_id!r} is already the job id of SparkApplication {holder}; two live "
                    "apps with one job id would roll back each other's writes: set another "
                    f"{appmeta.JOB_ID} (or delete {holder} first)",
                ),
            ),
        )

    def resubmission_of(self, app: Mapping[str, Any]) -> bool:
        """Whether ``app`` is the recreation the operator's resubmission record describes
        (:func:`resubmit.vouches_for`): only then does it keep the owner it carries."""
        meta = app.get("metadata") or {}
        uid = appmeta.of(app).get(appmeta.RESUBMITTED_FROM) or ""
        try:
            found = client.CoreV1Api(self.api_client).read_namespaced_config_map(
                resubmit.record_name(uid), str(meta.get("namespace"))
            )
        except ApiException as exc:
            if exc.status in (403, 404):
                return False
            raise
        return resubmit.vouches_for(dict(found.data or {}), app)

    def holder_of(
        self,
        job_id: str,
        *,
        namespace: object,
        name: object,
        kind: mutation.AppKind = mutation.KUBEFLOW,
    ) -> str | None:
        """``namespace/name (group)`` of another live opted-in app with ``job_id``, of either
        kind, or ``None``. The app itself (same kind, namespace and name) is skipped; an app of
        the other kind with the same name is another app.

        Selects by :data:`appmeta.JOB_ID_LABEL`, which admission puts on every app it
        mutates: apps stored without admission (the webhook was down) are not seen.
        """
        selector = f"{appmeta.JOB_ID_LABEL}={appmeta.job_id_label(job_id)}"
        for other_kind in mutation.KINDS:
            for other in self._list_metadata(selector, other_kind):
                meta = other.get("metadata") or {}
                if other_kind is kind and (meta.get("namespace"), meta.get("name")) == (
                    namespace,
                    name,
                ):
                    continue
                if is_live(other) and effective_job_id(other) == job_id:
                    return f"{meta.get('namespace')}/{meta.get('name')} ({other_kind.group})"
        return None

    def _list_metadata(self, selector: str, kind: mutation.AppKind) -> Iterator[Mapping[str, Any]]:
        """The metadata of ``kind``'s apps with ``selector``; none when its CRD is missing."""
        base = f"/apis/{kind.group}/{kind.version}"
        paths = (
            [f"{base}/{kind.plural}"]
            if self.config.clusterwide
            else [f"{base}/namespaces/{ns}/{kind.plural}" for ns in self.config.namespaces]
        )
        for path in paths:
            token: str | None = None
            while True:
                query: list[tuple[str, Any]] = [("labelSelector", selector), ("limit", _PAGE)]
                if token:
                    query.append(("continue", token))
                method, url, headers, _, _ = self.api_client.param_serialize(
                    "GET",
                    path,
                    query_params=query,
                    header_params={"Accept": _METADATA_ONLY},
                    auth_settings=["BearerToken"],
                )
                try:
                    response = self.api_client.call_api(method, url, header_params=headers)
                except ApiException as exc:
                    if exc.status == 404:
                        return  # the kind's CRD is not installed: no apps of it
                    raise
                data = response.read()  # type: ignore[no-untyped-call]
                if response.status == 404:
                    return  # the kind's CRD is not installed (or not served): no apps of it
                if response.status >= 400:
                    raise ApiException(http_resp=response)
                page = cast(dict[str, Any], json.loads(data))
                yield from page.get("items") or ()
                token = (page.get("metadata") or {}).get("continue")
                if not token:
                    break
