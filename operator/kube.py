"""Kubernetes I/O the operator does itself (kopf does the watching and the webhook).

The official client is synchronous; every call runs in a worker thread so the event loop (and
with it every other app's recovery) never blocks.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
import functools
import json
import secrets
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar, cast

import kopf
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sparkguard.operator import errors, mutation

T = TypeVar("T")
#: threads (and pooled connections) for the operator's own API calls: a burst of recoveries
#: must not queue behind asyncio's small default executor (cpu count + 4 threads)
API_THREADS: Final = 32
#: a thread (and connection) of its own for the Lease: its renewal never waits behind a burst
#: of recoveries' requests (a leader that cannot renew in time steps down)
LEASE_THREADS: Final = 1
#: seconds to connect and to wait for an answer, per request: a connection the API server
#: (or a load balancer) dropped without a word fails the request instead of holding a thread
#: and the recovery waiting on it for ever (the read bound is kube-apiserver's own default
#: ``--request-timeout``). The next step reads the app again, so a request that timed out
#: after it was applied is harmless.
REQUEST_TIMEOUT: Final = (10.0, 60.0)


class KubeClient:
    """SparkApplications, Secrets, Events and Leases, through one ``kubernetes.client.ApiClient``.

    ``on_request`` (if set) is called with a short name of every API request made (``get``,
    ``patch``, ``event``, ``lease-get``...), and ``on_error`` with the HTTP status of every
    request that failed (``unreachable`` when none came back): the operator counts them in its
    metrics.
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        request_timeout: tuple[float, float] = REQUEST_TIMEOUT,
    ) -> None:
        self.api_client = api_client
        self.request_timeout = request_timeout
        self._custom = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)
        self._coordination = client.CoordinationV1Api(api_client)
        self.on_request: Callable[[str], None] | None = None
        self.on_error: Callable[[str], None] | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=API_THREADS, thread_name_prefix="sparkguard-kube"
        )
        self._lease_executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=LEASE_THREADS, thread_name_prefix="sparkguard-lease"
        )

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking client call in the client's own threads (within the request timeout)."""
        kwargs.setdefault("_request_timeout", self.request_timeout)
        return await self._run(self._executor, functools.partial(fn, *args, **kwargs))

    async def _lease_call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking Lease call in the Lease's own thread (within the request timeout)."""
        kwargs.setdefault("_request_timeout", self.request_timeout)
        return await self._run(self._lease_executor, functools.partial(fn, *args, **kwargs))

    async def _run(self, executor: concurrent.futures.Executor, call: Callable[[], T]) -> T:
        """``call`` in ``executor``; a failed request is counted (``on_error``) and re-raised."""
        try:
            return await asyncio.get_running_loop().run_in_executor(executor, call)
        except (ApiException, OSError, urllib3.exceptions.HTTPError) as exc:
            if self.on_error is not None:
                self.on_error(str(exc.status) if isinstance(exc, ApiException) else "unreachable")
            raise

    def _count(self, request: str) -> None:
        if self.on_request is not None:
            self.on_request(request)

    async def get_app(
        self, namespace: str, name: str, *, group: str = mutation.GROUP
    ) -> dict[str, Any] | None:
        """The SparkApplication (of the kind of API ``group``) as stored now, or ``None`` when
        it is gone."""
        kind = _kind(group)
        self._count("get")
        try:
            found = await self._call(
                self._custom.get_namespaced_custom_object,
                kind.group,
                kind.version,
                namespace,
                kind.plural,
                name,
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return cast(dict[str, Any], found)

    async def patch_app(
        self,
        namespace: str,
        name: str,
        patch: Mapping[str, Any],
        *,
        uid: str | None,
        resource_version: str | None,
        group: str = mutation.GROUP,
    ) -> dict[str, Any] | None:
        """Apply a JSON merge patch to the app (of API ``group``); ``None`` when it is gone.

        With ``uid`` the patch applies only to that object, never to another one created
        under the same name since; with ``resource_version`` only to that version of it, so a
        decision taken on a stale read is never written. Either mismatch raises
        :class:`errors.KubeConflictError`: read the app again.
        """
        body = dict(patch)
        if resource_version or uid:
            meta = dict(body.get("metadata") or {})
            if uid:
                meta["uid"] = uid
            if resource_version:
                meta["resourceVersion"] = resource_version
            body["metadata"] = meta
        kind = _kind(group)
        self._count("patch")
        try:
            patched = await self._call(
                self._custom.patch_namespaced_custom_object,
                kind.group,
                kind.version,
                namespace,
                kind.plural,
                name,
                body,
                _content_type="application/merge-patch+json",
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            if exc.status == 409 or (exc.status == 422 and "metadata.uid" in str(exc.body)):
                raise errors.KubeConflictError(
                    f"SparkApplication {namespace}/{name} changed (or was replaced) while "
                    "sparkguard acted on it; reading it again"
                ) from exc
            raise
        return cast(dict[str, Any], patched)

    async def create_app(self, namespace: str, app: Mapping[str, Any]) -> dict[str, Any] | None:
        """Create ``app`` (its kind from its ``apiVersion``); ``None`` when one of its name
        exists already (409)."""
        kind = _kind(str(app.get("apiVersion") or "").partition("/")[0])
        self._count("create")
        try:
            created = await self._call(
                self._custom.create_namespaced_custom_object,
                kind.group,
                kind.version,
                namespace,
                kind.plural,
                dict(app),
            )
        except ApiException as exc:
            if exc.status == 409:
                return None
            raise
        return cast(dict[str, Any], created)

    async def delete_app(self, namespace: str, name: str, *, uid: str, group: str) -> bool:
        """Delete exactly the app with ``uid`` (a precondition); ``False`` when it is gone or
        replaced by another of the same name."""
        kind = _kind(group)
        self._count("delete")
        try:
            await self._call(
                self._custom.delete_namespaced_custom_object,
                kind.group,
                kind.version,
                namespace,
                kind.plural,
                name,
                body={"preconditions": {"uid": uid}},
            )
        except ApiException as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

    async def pod_names(self, namespace: str, selector: str) -> list[str]:
        """The names of the pods with labels ``selector``."""
        self._count("pods")
        listed = await self._call(
            self._core.list_namespaced_pod, namespace, label_selector=selector
        )
        return [p.metadata.name for p in listed.items if p.metadata and p.metadata.name]

    async def create_config_map(self, namespace: str, body: Mapping[str, Any]) -> bool:
        """Create a ConfigMap; ``False`` when one of its name exists already."""
        self._count("configmap-create")
        try:
            await self._call(
                self._core.create_namespaced_config_map, namespace, cast(Any, dict(body))
            )
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    async def delete_config_map(self, namespace: str, name: str) -> None:
        """Delete a ConfigMap (gone already is fine)."""
        self._count("configmap-delete")
        try:
            await self._call(self._core.delete_namespaced_config_map, name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def read_config_map(self, namespace: str, name: str) -> dict[str, str] | None:
        """A ConfigMap's data, or ``None`` when it does not exist."""
        self._count("configmap-get")
        try:
            found = await self._call(self._core.read_namespaced_config_map, name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return dict(found.data or {})

    async def post_event(
        self,
        app: Mapping[str, Any],
        *,
        type: str,
        reason: str,
        message: str,
        name: str | None = None,
    ) -> None:
        """Record a Kubernetes Event about ``app`` (its uid, so it never names a successor).

        With ``name``, an Event of that name that exists already is the same Event posted
        before (by this or another operator): nothing is posted twice, and that is no error.
        """
        meta = app.get("metadata") or {}
        now = datetime.datetime.now(datetime.UTC)
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": name or f"{meta.get('name')}.{secrets.token_hex(8)}",
                "namespace": meta["namespace"],
            },
            "involvedObject": {
                "apiVersion": app.get("apiVersion") or f"{mutation.GROUP}/{mutation.VERSION}",
                "kind": app.get("kind") or "SparkApplication",
                "name": meta.get("name"),
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "reason": reason,
            "message": message[:1000],
            "type": type,
            "source": {"component": "sparkguard"},
            "reportingComponent": "sparkguard",
            "firstTimestamp": now.isoformat(),
            "lastTimestamp": now.isoformat(),
            "count": 1,
        }
        self._count("event")
        event = cast(client.CoreV1Event, body)  # the client serialises a plain dict as it is

        def create(**request: Any) -> None:
            # The created Event is of no use: skip decoding and validating it (in a burst of
            # recoveries that was a good part of the client's CPU). Errors still raise.
            raw: Any = self._core.create_namespaced_event(
                meta["namespace"], event, _preload_content=False, **request
            )  # the raw urllib3 response, typed as the Event
            try:
                raw.drain_conn()
            finally:
                raw.release_conn()

        try:
            await self._call(create)
        except ApiException as exc:
            if name is None or exc.status != 409:
                raise

    async def get_lease(self, namespace: str, name: str) -> client.V1Lease | None:
        """The Lease, or ``None`` when it does not exist."""
        self._count("lease-get")
        try:
            lease = await self._lease_call(
                self._coordination.read_namespaced_lease, name, namespace
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return lease

    async def create_lease(self, namespace: str, lease: client.V1Lease) -> client.V1Lease | None:
        """Create the Lease; ``None`` when another process created it first."""
        self._count("lease-create")
        try:
            created = await self._lease_call(
                self._coordination.create_namespaced_lease, namespace, lease
            )
        except ApiException as exc:
            if exc.status == 409:
                return None
            raise
        return created

    async def replace_lease(self, namespace: str, lease: client.V1Lease) -> client.V1Lease | None:
        """Write the Lease if it is still at ``lease.metadata.resource_version``, else ``None``."""
        assert lease.metadata is not None
        assert lease.metadata.name
        self._count("lease-update")
        try:
            replaced = await self._lease_call(
                self._coordination.replace_namespaced_lease,
                lease.metadata.name,
                namespace,
                lease,
            )
        except ApiException as exc:
            if exc.status in (404, 409):
                return None
            raise
        return replaced

    async def get_crd(self, name: str) -> dict[str, Any] | None:
        """The CustomResourceDefinition ``name``, or ``None`` when it is not installed."""
        self._count("crd-get")
        try:
            found = await self._call(
                client.ApiextensionsV1Api(self.api_client).read_custom_resource_definition, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return cast(dict[str, Any], self.api_client.sanitize_for_serialization(found))  # type: ignore[no-untyped-call]

    async def read_secret(self, namespace: str, name: str) -> Mapping[str, str] | None:
        """The (still base64-encoded) data of a Secret, or ``None`` when it does not exist."""
        self._count("secret")
        try:
            secret = await self._call(self._core.read_namespaced_secret, name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return cast(Mapping[str, str], secret.data or {})


def load_api_client(*, kubeconfig: str | None = None) -> client.ApiClient:
    """An ApiClient for the operator: in-cluster, else ``kubeconfig`` (or the default one)."""
    import kubernetes.config as kube_config

    configuration = client.Configuration()
    configuration.connection_pool_maxsize = API_THREADS + LEASE_THREADS
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


def read_application(namespace: str, name: str, *, kubeconfig: str | None = None) -> Any:
    """The SparkApplication ``namespace/name`` (Kubeflow's kind, else Apache's), read through
    ``kubeconfig`` (default: in-cluster, else ``~/.kube/config``) as kubectl reads it; for
    commands run by hand. Raises :class:`LookupError` when no kind has it (naming a kind the
    user may not read, which RBAC refuses before it looks: a hand-runner is often granted
    only the kind the cluster runs), and the client's ``ApiException`` on any other refusal
    (403 when the user may read neither kind)."""
    api = client.CustomObjectsApi(load_api_client(kubeconfig=kubeconfig))
    refused: list[ApiException] = []
    for kind in mutation.KINDS:
        try:
            return api.get_namespaced_custom_object(
                kind.group, kind.version, namespace, kind.plural, name
            )
        except ApiException as exc:
            if exc.status == 403:
                refused.append(exc)
            elif exc.status != 404:
                raise
    if len(refused) == len(mutation.KINDS):
        raise refused[0]
    kinds = " or ".join(kind.api_version for kind in mutation.KINDS)
    unread = "".join(f"; not checked: {api_message(exc)}" for exc in refused)
    raise LookupError(f"no SparkApplication {namespace}/{name} ({kinds}) in that cluster{unread}")


def api_message(exc: ApiException) -> str:
    """The API server's own reason for ``exc`` (its Status ``message``: for a 403, the user,
    verb, resource, group and namespace), else the HTTP status and reason."""
    try:
        status = json.loads(exc.body or "")
    except (TypeError, ValueError):
        status = None
    message = status.get("message") if isinstance(status, dict) else None
    return str(message) if message else f"{exc.status} {exc.reason}"


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


def _kind(group: str) -> mutation.AppKind:
    """The SparkApplication kind of API ``group``."""
    for kind in mutation.KINDS:
        if kind.group == group:
            return kind
    raise ValueError(f"no SparkApplication kind has API group {group!r}")
