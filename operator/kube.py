"""Kubernetes I/O the operator does itself (kopf does the watching and the webhook).

The official client is synchronous; every call runs in a worker thread so the event loop (and
with it every other app's recovery) never blocks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, cast

import kopf
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sparkguard.operator import errors, mutation


class KubeClient:
    """SparkApplications and Secrets, through one ``kubernetes.client.ApiClient``."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client
        self._custom = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)

    async def get_app(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The SparkApplication as stored now, or ``None`` when it is gone."""
        try:
            found = await asyncio.to_thread(
                self._custom.get_namespaced_custom_object,
                mutation.GROUP,
                mutation.VERSION,
                namespace,
                mutation.PLURAL,
                name,
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return cast(dict[str, Any], found)

    async def patch_app(
        self, namespace: str, name: str, patch: Mapping[str, Any], *, resource_version: str | None
    ) -> dict[str, Any] | None:
        """Apply a JSON merge patch to the app; ``None`` when it is gone.

        With ``resource_version`` the patch applies only to that version of the object, so a
        decision taken on a stale read is never written: :class:`errors.KubeConflictError`.
        """
        body = dict(patch)
        if resource_version:
            meta = dict(body.get("metadata") or {})
            meta["resourceVersion"] = resource_version
            body["metadata"] = meta
        try:
            patched = await asyncio.to_thread(
                self._custom.patch_namespaced_custom_object,
                mutation.GROUP,
                mutation.VERSION,
                namespace,
                mutation.PLURAL,
                name,
                body,
                _content_type="application/merge-patch+json",
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            if exc.status == 409:
                raise errors.KubeConflictError(
                    f"SparkApplication {namespace}/{name} changed while sparkguard acted on it; "
                    "reading it again"
                ) from exc
            raise
        return cast(dict[str, Any], patched)

    async def read_secret(self, namespace: str, name: str) -> Mapping[str, str] | None:
        """The (still base64-encoded) data of a Secret, or ``None`` when it does not exist."""
        try:
            secret = await asyncio.to_thread(self._core.read_namespaced_secret, name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return cast(Mapping[str, str], secret.data or {})


def load_api_client(*, kubeconfig: str | None = None) -> client.ApiClient:
    """An ApiClient for the operator: in-cluster, else ``kubeconfig`` (or the default one)."""
    import kubernetes.config as kube_config

    configuration = client.Configuration()
    if kubeconfig is None:
        try:
            kube_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            return client.ApiClient(configuration)
        except kube_config.ConfigException:
            pass
    kube_config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=kubeconfig, client_configuration=configuration
    )
    return client.ApiClient(configuration)


def connection_info(configuration: client.Configuration) -> kopf.ConnectionInfo:
    """kopf's credentials for the same endpoint and identity as ``configuration``."""
    header = configuration.get_api_key_with_prefix(
        "BearerToken"
    ) or configuration.get_api_key_with_prefix("authorization")
    parts = header.split(" ", 1) if header else []
    scheme, token = (
        (None, None) if not parts else (None, parts[0]) if len(parts) == 1 else (parts[0], parts[1])
    )
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        username=configuration.username or None,
        password=configuration.password or None,
        scheme=scheme,
        token=token,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
    )
