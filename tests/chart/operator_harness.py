"""The chart installed on the kube-apiserver bench, and the operator run in-process as its SA.

Used by ``test_rbac.py``: the operator gets exactly the identity, the RBAC and the environment
the chart gives its Deployment; only what a bench without pods can't provide is swapped (the
webhook listens on 127.0.0.1 with a bench-CA certificate, and a webhook configuration points
the apiserver at that URL instead of the in-cluster Service).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import dataclasses
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sparkguard.operator import config as config_
from sparkguard.operator import kube, main
from sparkguard.operator import runtime as runtime_
from tests.chart.conftest import CHART
from tests.kubebench.bench import KubeBench
from tests.operator.apps import GROUP, PLURAL, VERSION
from tests.operator.kmocking import FakeRollback
from tests.support import yamlfast

T = TypeVar("T")

#: (apiGroup, resource[/subresource], verb); the core group is ""
Permission = tuple[str, str, str]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def eventually(check: Callable[[], T], *, what: str, timeout: float = 30.0) -> T:
    """Poll ``check`` until it returns something truthy; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            value = check()
        except (ApiException, AssertionError, KeyError) as exc:
            last = exc
        else:
            if value:
                return value
        if time.monotonic() > deadline:
            detail = f"; last error: {last!r}" if last is not None else ""
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")
        time.sleep(0.1)


# -- the chart ------------------------------------------------------------------------------


@dataclasses.dataclass
class Release:
    """A release installed with helm, and its manifest as objects."""

    name: str
    namespace: str
    objects: list[dict[str, Any]]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o.get("kind") == kind]

    def one(self, kind: str) -> dict[str, Any]:
        found = self.of_kind(kind)
        assert len(found) == 1, f"expected one {kind} in release {self.name}, found {len(found)}"
        return found[0]

    @property
    def service_account(self) -> str:
        spec = self.one("Deployment")["spec"]["template"]["spec"]
        return str(spec["serviceAccountName"])

    @property
    def username(self) -> str:
        """The operator's identity as the apiserver sees it."""
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"

    def operator_env(self, *, pod_name: str = "operator-0") -> dict[str, str]:
        """The environment the chart's Deployment gives the operator container.

        The one value the kubelet fills in (the downward API's ``metadata.name``) becomes
        ``pod_name``: each replica on the bench gets its own.
        """
        pod = self.one("Deployment")["spec"]["template"]["spec"]
        (container,) = [c for c in pod["containers"] if c["name"] == "operator"]
        env: dict[str, str] = {}
        for var in container.get("env") or []:
            field = ((var.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
            if field == "metadata.name":
                env[var["name"]] = f"{self.name}-{pod_name}"
                continue
            assert "value" in var, f"env {var['name']} is not a plain value: {var}"
            env[var["name"]] = str(var["value"])
        return env

    def granted(self) -> set[Permission]:
        """Every (apiGroup, resource, verb) the release's ClusterRole and Roles grant."""
        granted: set[Permission] = set()
        for role in self.of_kind("ClusterRole") + self.of_kind("Role"):
            for rule in role.get("rules") or []:
                # resourceNames narrow a rule further; the (group, resource, verb) is granted
                assert not rule.get("nonResourceURLs"), f"nonResourceURLs not handled: {rule}"
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        for verb in rule["verbs"]:
                            granted.add((group, resource, verb))
        return granted


def _helm(bench: KubeBench, namespace: str) -> Any:
    import helm_python as helm

    return helm.Config(kubeconfig_path=bench.kubeconfig_path, namespace=namespace)


def install(bench: KubeBench, *, name: str, namespace: str, values: dict[str, Any]) -> Release:
    bench.ensure_namespace(namespace)
    release = _helm(bench, namespace).install(
        str(CHART), name, values, namespace=namespace, timeout=120
    )
    objects = [doc for doc in yamlfast.load_all(release["manifest"]) if doc]
    return Release(name=name, namespace=namespace, objects=objects)


def uninstall(bench: KubeBench, release: Release) -> None:
    _helm(bench, release.namespace).uninstall(release.name, timeout=60, ignore_not_found=True)


def operator_env_on_bench(
    release: Release,
    *,
    webhook_port: int,
    cert_file: str,
    key_file: str,
    pod_name: str = "operator-0",
) -> dict[str, str]:
    """The environment the chart gives the operator's Deployment, adapted to the bench.

    What must differ without a pod: the webhook listens on loopback with a bench-CA
    certificate (instead of the chart's Secret mounted at /etc/sparkguard/webhook), metrics
    on a free loopback port, no liveness port, and failed steps retried within a test's waits.
    """
    env = release.operator_env(pod_name=pod_name)
    env.update(
        {
            "SPARKGUARD_WEBHOOK_ADDR": "127.0.0.1",
            "SPARKGUARD_WEBHOOK_PORT": str(webhook_port),
            "SPARKGUARD_WEBHOOK_CERT_FILE": cert_file,
            "SPARKGUARD_WEBHOOK_KEY_FILE": key_file,
            "SPARKGUARD_METRICS_ADDR": "127.0.0.1",
            "SPARKGUARD_METRICS_PORT": str(free_port()),
            "SPARKGUARD_LIVENESS_PORT": "0",
            "SPARKGUARD_ERROR_BACKOFF": "1",
        }
    )
    return env


def bench_webhook_configuration(
    chart_config: Mapping[str, Any], *, name: str, url: str, ca_pem: bytes
) -> dict[str, Any]:
    """The chart's MutatingWebhookConfiguration, but calling ``url`` (trusting ``ca_pem``).

    Same webhooks, rules, failurePolicy, timeouts and selectors; only ``clientConfig`` differs,
    because the chart's in-cluster Service has no pod behind it on the bench. Each webhook
    keeps its own path (one per SparkApplication kind): ``url``'s path is replaced by it.
    """
    config = copy.deepcopy(dict(chart_config))
    config["metadata"] = {"name": name}
    base = urllib.parse.urlsplit(url)
    for hook in config["webhooks"]:
        path = ((hook.get("clientConfig") or {}).get("service") or {}).get("path") or base.path
        hook["clientConfig"] = {
            "url": urllib.parse.urlunsplit(base._replace(path=path)),
            "caBundle": base64.b64encode(ca_pem).decode(),
        }
    return config


@contextlib.contextmanager
def foreign_spark_webhooks_set_aside(bench: KubeBench, *, keep: str) -> Iterator[list[str]]:
    """Remove other MutatingWebhookConfigurations on SparkApplications; restore them after.

    Another test's release (``sg`` of test_install.py) leaves a webhook that calls its
    in-cluster Service: on the bench that call fails, and with failurePolicy Fail it denies
    every SparkApplication. Names starting with ``keep`` are left alone. Yields the names set
    aside; they are re-created (same webhooks, labels and annotations) on exit.
    """
    collection = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
    _, listed = bench.request("GET", collection)
    foreign = [
        config
        for config in listed["items"]
        if not config["metadata"]["name"].startswith(keep)
        and any(
            "sparkapplications" in rule.get("resources", ())
            for hook in config.get("webhooks") or ()
            for rule in hook.get("rules") or ()
        )
    ]
    for config in foreign:
        bench.request("DELETE", f"{collection}/{config['metadata']['name']}")
    try:
        yield [c["metadata"]["name"] for c in foreign]
    finally:
        for config in foreign:
            meta = config["metadata"]
            kept = ("name", "labels", "annotations")
            config["metadata"] = {k: meta[k] for k in kept if k in meta}
            bench.request("POST", collection, config)


# -- SparkApplications as the admin (and as spark-operator) sees them -------------------------


@dataclasses.dataclass
class Apps:
    """SparkApplications and their Events in one namespace, through the admin's client."""

    api: client.ApiClient
    namespace: str

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    def create(self, app: dict[str, Any]) -> dict[str, Any]:
        app["metadata"]["namespace"] = self.namespace
        created = self.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, app
        )
        return cast(dict[str, Any], created)

    def get(self, name: str) -> dict[str, Any]:
        found = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name
        )
        return cast(dict[str, Any], found)

    def delete(self, name: str) -> None:
        with contextlib.suppress(ApiException):
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, name
            )

    def exists(self, name: str) -> bool:
        """Whether the app is stored (one being deleted, held by a finalizer, counts)."""
        try:
            self.get(name)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def set_status(self, name: str, status: dict[str, Any]) -> None:
        """As spark-operator does: through the /status subresource."""
        self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, self.namespace, PLURAL, name, {"status": status}
        )

    def notes(self, name: str) -> dict[str, str]:
        return dict(self.get(name)["metadata"].get("annotations") or {})

    def events(self, name: str) -> list[client.CoreV1Event]:
        found = client.CoreV1Api(self.api).list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={name}"
        )
        return list(found.items)

    def event_reasons(self, name: str) -> list[str]:
        return sorted(str(e.reason) for e in self.events(name))


# -- the operator -----------------------------------------------------------------------------


class OperatorThread:
    """The operator (``main.run``) in a background thread; ``stop()`` ends it like a SIGTERM."""

    def __init__(self, runtime: runtime_.Runtime) -> None:
        self.runtime = runtime
        self.stop_flag = threading.Event()
        self.ready_flag = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="sparkguard-operator", daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(
                main.run(self.runtime, stop_flag=self.stop_flag, ready_flag=self.ready_flag)
            )
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def start(self) -> OperatorThread:
        self.thread.start()
        return self

    def stop(self, timeout: float = 60.0) -> None:
        self.stop_flag.set()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the operator did not stop within {timeout:.0f}s"
        assert self.error is None, f"the operator failed: {self.error!r}"


@contextlib.contextmanager
def operator_as(
    kubeconfig: str, env: Mapping[str, str], rollback: FakeRollback
) -> Iterator[OperatorThread]:
    """Run the operator with ``env`` (SPARKGUARD_*), logged in with ``kubeconfig``.

    The same calls as ``sparkguard operator --kubeconfig``: ``load_config``,
    ``kube.load_api_client`` (kopf logs in from that client's configuration), ``main.run``;
    only the rollback is a fake.
    """
    config = config_.load_config(env)
    api = kube.load_api_client(kubeconfig=kubeconfig)
    runtime = runtime_.Runtime(config=config, kube=kube.KubeClient(api), rollback=rollback)
    operator = OperatorThread(runtime).start()
    try:
        yield operator
    finally:
        try:
            operator.stop()
        finally:
            api.close()


# -- the audit log ----------------------------------------------------------------------------


def permission_of(event: Mapping[str, Any]) -> Permission | None:
    """(apiGroup, resource[/subresource], verb) of an audit event; ``None`` for a non-resource
    URL (discovery)."""
    ref = event.get("objectRef")
    if not ref or not ref.get("resource"):
        return None
    resource = ref["resource"]
    if ref.get("subresource"):
        resource = f"{resource}/{ref['subresource']}"
    return (ref.get("apiGroup") or "", resource, event["verb"])


def describe(event: Mapping[str, Any]) -> str:
    ref = event.get("objectRef") or {}
    where = "/".join(p for p in (ref.get("namespace"), ref.get("name")) if p)
    status = (event.get("responseStatus") or {}).get("code")
    path = str(event.get("requestURI", "")).split("?")[0]
    return f"{event['verb']} {path} ({where or '-'}) -> {status}"


def table(rows: Iterable[tuple[Permission, str]]) -> str:
    lines = [f"{'apiGroup':<24} {'resource':<28} {'verb':<8} status"]
    lines += [f"{g or '(core)':<24} {r:<28} {v:<8} {s}" for (g, r, v), s in sorted(rows)]
    return "\n".join(lines)
