"""The operator against a real kube-apiserver: admission for real, recovery, restarts.

The operator runs in-process (kopf in a background thread with its own event loop); its
webhook listens on 127.0.0.1 with a certificate from the bench's CA, and kopf manages the
MutatingWebhookConfiguration that points the apiserver at it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import kopf
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sparkguard.operator import appmeta, kube, main
from sparkguard.operator import config as config_
from sparkguard.operator import runtime as runtime_
from tests.kubebench.bench import KubeBench
from tests.operator.apps import GROUP, PLURAL, VERSION, failed_status, spark_app
from tests.operator.kmocking import FakeRollback

pytestmark = pytest.mark.kube
T = TypeVar("T")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _eventually(check: Callable[[], T], *, timeout: float = 30.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except (ApiException, AssertionError, KeyError):
            if time.monotonic() > deadline:
                raise
        else:
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"condition not met within {timeout}s: {check}")
        time.sleep(0.1)


@dataclasses.dataclass
class Cluster:
    bench: KubeBench
    api: client.ApiClient
    namespace: str
    webhook_name: str
    config: config_.OperatorConfig

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    def create(self, app: dict[str, Any]) -> dict[str, Any]:
        app["metadata"]["namespace"] = self.namespace
        created: dict[str, Any] = self.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, app
        )
        return created

    def get(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name
        )
        return found

    def set_status(self, name: str, status: dict[str, Any]) -> None:
        """As spark-operator does: through the /status subresource."""
        self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, self.namespace, PLURAL, name, {"status": status}
        )

    def notes(self, name: str) -> dict[str, str]:
        return dict(self.get(name)["metadata"].get("annotations") or {})

    def event_reasons(self, name: str) -> list[str]:
        events = client.CoreV1Api(self.api).list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={name}"
        )
        return [e.reason for e in sorted(events.items, key=lambda e: e.metadata.creation_timestamp)]


class OperatorThread:
    """The operator in a background thread; ``stop()`` ends it like a pod termination."""

    def __init__(self, cluster: Cluster, rollback: FakeRollback) -> None:
        bench = cluster.bench
        cert = bench.issue_certificate("webhook", ip_addresses=("127.0.0.1",))
        server = kopf.WebhookServer(
            addr="127.0.0.1",
            host="127.0.0.1",
            port=_free_port(),
            certfile=str(cert.cert_file),
            pkeyfile=str(cert.key_file),
            cafile=bench.ca_file,
        )
        self.runtime = runtime_.Runtime(
            config=cluster.config,
            kube=kube.KubeClient(bench.api_client()),
            rollback=rollback,
            webhook_server=server,
        )
        self.stop_flag = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="sparkguard-operator", daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(main.run(self.runtime, stop_flag=self.stop_flag))
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def start(self) -> OperatorThread:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stop_flag.set()
        self.thread.join(60)
        assert not self.thread.is_alive(), "the operator did not stop within 60s"
        assert self.error is None, repr(self.error)


@pytest.fixture
def cluster(kube_bench: KubeBench) -> Iterator[Cluster]:
    namespace = f"sg-{uuid.uuid4().hex[:8]}"
    kube_bench.ensure_namespace(namespace)
    api = kube_bench.api_client()
    config = config_.OperatorConfig(
        namespaces=(namespace,),
        webhook_mode=config_.WebhookMode.MANAGED,
        webhook_config_name=f"{namespace}.sparkguard.io",
        image="registry.example/sparkguard:test",
        journal_root="s3://warehouse/_journal",
        metrics_port=0,
        liveness_port=0,
        error_backoff_seconds=1.0,
    )
    try:
        yield Cluster(kube_bench, api, namespace, config.webhook_config_name, config)
    finally:
        with contextlib.suppress(ApiException):
            client.AdmissionregistrationV1Api(api).delete_mutating_webhook_configuration(
                config.webhook_config_name
            )
        api.close()


@contextlib.contextmanager
def operating(cluster: Cluster, rollback: FakeRollback) -> Iterator[OperatorThread]:
    operator = OperatorThread(cluster, rollback).start()
    try:
        _wait_for_webhook(cluster)
        yield operator
    finally:
        operator.stop()


def _wait_for_webhook(cluster: Cluster) -> None:
    """Until kopf registered the webhook and the apiserver calls it (its config cache lags)."""
    admission = client.AdmissionregistrationV1Api(cluster.api)
    _eventually(
        lambda: admission.read_mutating_webhook_configuration(cluster.webhook_name).webhooks
    )
    probe = f"probe-{uuid.uuid4().hex[:6]}"

    def mutated() -> bool:
        with contextlib.suppress(ApiException):
            cluster.custom.delete_namespaced_custom_object(
                GROUP, VERSION, cluster.namespace, PLURAL, probe
            )
        created = cluster.create(spark_app(probe))
        return "spark.sparkguard.jobId" in created["spec"]["sparkConf"]

    _eventually(mutated)
    cluster.custom.delete_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, probe)


def test_admission_mutates_skips_and_denies(cluster: Cluster) -> None:
    with operating(cluster, FakeRollback()):
        created = cluster.create(spark_app("nightly"))
        conf = created["spec"]["sparkConf"]
        assert conf["spark.sparkguard.jobId"] == f"{cluster.namespace}.nightly"
        assert conf["spark.sparkguard.attempt"] == "0"
        assert [s["name"] for s in created["spec"]["driver"]["sidecars"]] == ["sparkguard-markers"]
        init = [c["name"] for c in created["spec"]["driver"]["initContainers"]]
        assert init == ["sparkguard-lib", "sparkguard-rollback"]
        # An update of the mutated app (e.g. a label) changes nothing more.
        cluster.custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            cluster.namespace,
            PLURAL,
            "nightly",
            {"metadata": {"labels": {"a": "b"}}},
        )
        assert cluster.get("nightly")["spec"] == created["spec"]

        plain = cluster.create(spark_app("plain", enabled=False))
        assert plain["spec"] == spark_app("plain", enabled=False)["spec"]

        with pytest.raises(ApiException) as denied:
            cluster.create(spark_app("bad", annotations={appmeta.MAX_RETRIES: "forever"}))
        assert denied.value.status in (400, 422)
        assert "sparkguard.io/max-retries" in str(denied.value.body)


def test_failed_app_is_rolled_back_and_resubmitted_once(cluster: Cluster) -> None:
    rollback = FakeRollback()
    with operating(cluster, rollback):
        cluster.create(spark_app("etl", annotations={appmeta.BACKOFF: "0"}))
        generation = cluster.get("etl")["metadata"]["generation"]
        cluster.set_status("etl", failed_status())
        _eventually(lambda: cluster.notes("etl").get(appmeta.PHASE) == "Resubmitted")
        _eventually(lambda: "Resubmitted" in cluster.event_reasons("etl"))
    app = cluster.get("etl")
    assert app["spec"]["sparkConf"]["spark.sparkguard.attempt"] == "1"
    assert app["metadata"]["generation"] == generation + 1  # exactly one spec change
    assert rollback.calls == [
        (f"{cluster.namespace}.etl", f"s3://warehouse/_journal/{cluster.namespace}", None)
    ]
    # Events carry second-granularity timestamps: compare them as a multiset.
    assert sorted(cluster.event_reasons("etl")) == ["Resubmitted", "RollbackStarted", "RolledBack"]


def test_max_retries_zero_rolls_back_and_gives_up(cluster: Cluster) -> None:
    rollback = FakeRollback()
    with operating(cluster, rollback):
        cluster.create(spark_app("once", annotations={appmeta.MAX_RETRIES: "0"}))
        generation = cluster.get("once")["metadata"]["generation"]
        cluster.set_status("once", failed_status())
        _eventually(lambda: cluster.notes("once").get(appmeta.PHASE) == "Exhausted")
        _eventually(lambda: "RetriesExhausted" in cluster.event_reasons("once"))
    assert cluster.get("once")["metadata"]["generation"] == generation
    assert len(rollback.calls) == 1


def test_operator_restarted_mid_recovery_resubmits_exactly_once(cluster: Cluster) -> None:
    gate = threading.Event()
    stuck = FakeRollback(gate=gate)
    operator = OperatorThread(cluster, stuck).start()
    try:
        _wait_for_webhook(cluster)
        cluster.create(spark_app("crashy", annotations={appmeta.BACKOFF: "0"}))
        generation = cluster.get("crashy")["metadata"]["generation"]
        cluster.set_status("crashy", failed_status())
        assert stuck.entered.wait(30)
        assert cluster.notes("crashy")[appmeta.PHASE] == "Recovering"
    finally:
        # The operator stops (a crash, a rollout) while the rollback runs: whatever that
        # rollback call does after this moment is lost with its process.
        operator.stop_flag.set()
        stuck.abandoned.set()
        gate.set()
        operator.stop()
    assert cluster.get("crashy")["metadata"]["generation"] == generation

    healthy = FakeRollback()
    with operating(cluster, healthy):
        _eventually(lambda: cluster.notes("crashy").get(appmeta.PHASE) == "Resubmitted")
    with operating(cluster, healthy):
        time.sleep(2)  # a further restart finds the failure handled
    app = cluster.get("crashy")
    assert app["metadata"]["generation"] == generation + 1
    assert app["spec"]["sparkConf"]["spark.sparkguard.attempt"] == "1"
    assert len(healthy.calls) == 1
    assert cluster.event_reasons("crashy").count("Resubmitted") == 1
