"""The operator against a real kube-apiserver: admission, the recovery *protocol*, restarts, HA.

What is real here: the apiserver (resourceVersion and uid preconditions, the status
subresource, webhooks, Leases), kopf, and every patch, claim and Event of the operator. What is
not: the rollback is a stand-in (``FakeRollback`` in-process, ``tests/operator/replica.py``'s
in the replica processes) that records its calls, so these tests prove *when* and *how often*
the operator rolls back and resubmits, not what a rollback does to storage. The end-to-end
recovery with the library's real rollback and a real Spark job is
``tests/e2e/test_recovery_scenario.py``.

The in-process operator runs kopf in a background thread with its own event loop; its webhook
listens on 127.0.0.1 with a certificate from the bench's CA, and kopf manages the
MutatingWebhookConfiguration that points the apiserver at it. The HA tests run two (or more)
replicas as separate processes (``replica.py``), so a leader can be SIGKILLed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import kopf
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sparkguard.operator import appmeta, finalizers, kube, main, recovery
from sparkguard.operator import config as config_
from sparkguard.operator import runtime as runtime_
from tests.kubebench.bench import KubeBench
from tests.operator.apps import GROUP, PLURAL, VERSION, failed_status, spark_app
from tests.operator.kmocking import Decisions, FakeRollback

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

    def event_reasons(self, name: str, *, uid: str | None = None) -> list[str]:
        selector = f"involvedObject.name={name}" + (f",involvedObject.uid={uid}" if uid else "")
        events = client.CoreV1Api(self.api).list_namespaced_event(
            self.namespace, field_selector=selector
        )
        return [e.reason for e in sorted(events.items, key=lambda e: e.metadata.creation_timestamp)]

    def exists(self, name: str) -> bool:
        try:
            self.get(name)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def delete(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)

    def release(self, name: str) -> None:
        """Remove sparkguard's finalizer by hand (as docs/operator.md says), keeping others."""
        held = list(self.get(name)["metadata"].get("finalizers") or [])
        index = held.index(finalizers.FINALIZER)
        path = f"/metadata/finalizers/{index}"
        self.custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            PLURAL,
            name,
            [
                {"op": "test", "path": path, "value": finalizers.FINALIZER},
                {"op": "remove", "path": path},
            ],
            _content_type="application/json-patch+json",
        )

    def lease_holder(self, name: str) -> str:
        lease = client.CoordinationV1Api(self.api).read_namespaced_lease(name, self.namespace)
        return str(lease.spec.holder_identity or "")


class OperatorThread:
    """The operator in a background thread; ``stop()`` ends it like a pod termination."""

    def __init__(
        self, cluster: Cluster, rollback: FakeRollback, decisions: Decisions | None = None
    ) -> None:
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
            on_decision=decisions,
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


def bench_config(namespace: str) -> config_.OperatorConfig:
    """The operator's settings for tests watching ``namespace`` of the bench (a managed webhook
    of its own; the sidecar mode decided from the cluster)."""
    return config_.OperatorConfig(
        namespaces=(namespace,),
        webhook_mode=config_.WebhookMode.MANAGED,
        webhook_config_name=f"{namespace}.sparkguard.io",
        image="registry.example/sparkguard:test",
        journal_root="s3://warehouse/_journal",
        metrics_port=0,
        liveness_port=0,
        error_backoff_seconds=1.0,
    )


@contextlib.contextmanager
def bench_cluster(kube_bench: KubeBench, *, prefix: str = "sg") -> Iterator[Cluster]:
    """A fresh namespace ``<prefix>-<random>`` of the bench with the operator's settings for it
    (:func:`bench_config`); its managed webhook configuration is deleted afterwards."""
    namespace = f"{prefix}-{uuid.uuid4().hex[:8]}"
    kube_bench.ensure_namespace(namespace)
    api = kube_bench.api_client()
    config = bench_config(namespace)
    try:
        yield Cluster(kube_bench, api, namespace, config.webhook_config_name, config)
    finally:
        with contextlib.suppress(ApiException):
            client.AdmissionregistrationV1Api(api).delete_mutating_webhook_configuration(
                config.webhook_config_name
            )
        api.close()


@pytest.fixture
def cluster(kube_bench: KubeBench) -> Iterator[Cluster]:
    with bench_cluster(kube_bench) as created:
        yield created


@contextlib.contextmanager
def operating(
    cluster: Cluster, rollback: FakeRollback, decisions: Decisions | None = None
) -> Iterator[OperatorThread]:
    operator = OperatorThread(cluster, rollback, decisions).start()
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
        # The bench's apiserver runs native sidecars: the marker sidecar is an initContainer
        # with restartPolicy Always (so it never keeps the driver pod alive).
        init = {c["name"]: c for c in created["spec"]["driver"]["initContainers"]}
        assert {"sparkguard-lib", "sparkguard-rollback", "sparkguard-markers"} <= set(init)
        assert init["sparkguard-markers"].get("restartPolicy") == "Always"
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
    # Claims that expire 2 s after their last renewal (default 30 s): the successor below
    # waits that long, and the test's waits are 30 s.
    cluster.config = dataclasses.replace(cluster.config, claim_ttl_seconds=2.0)
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
    # The first operator's claim outlives it (a crash cannot release it): its successor waits
    # for the claim to expire, then takes over.
    with operating(cluster, healthy):
        _eventually(lambda: cluster.notes("crashy").get(appmeta.PHASE) == "Resubmitted")
    decisions = Decisions()
    with operating(cluster, healthy, decisions):
        # The signal: a further restart read the handled failure and only waits for the rerun.
        _eventually(lambda: decisions.count("crashy", "wait", containing="resubmitted attempt 1"))
    app = cluster.get("crashy")
    assert app["metadata"]["generation"] == generation + 1
    assert app["spec"]["sparkConf"]["spark.sparkguard.attempt"] == "1"
    assert len(healthy.calls) == 1
    assert cluster.event_reasons("crashy").count("Resubmitted") == 1


# -- HA: several replicas, leader election, claims ----------------------------------------------


REPLICA = Path(__file__).with_name("replica.py")


@dataclasses.dataclass
class Replica:
    name: str
    process: subprocess.Popen[bytes]
    log: Path


class Replicas:
    """Operator replicas as processes (``replica.py``) against the bench, with their records."""

    def __init__(self, cluster: Cluster, workdir: Path, *, leader_election: bool) -> None:
        self.cluster = cluster
        self.workdir = workdir
        self.calls = workdir / "rollbacks.jsonl"
        self.decisions = workdir / "decisions.jsonl"
        self.lease = f"sparkguard-{uuid.uuid4().hex[:6]}"
        self.env = {
            **os.environ,
            "SPARKGUARD_NAMESPACES": cluster.namespace,
            "SPARKGUARD_WEBHOOK_MODE": "disabled",  # admission is not what these tests are about
            "SPARKGUARD_JOURNAL_ROOT": "s3://warehouse/_journal",
            "SPARKGUARD_METRICS_PORT": "0",
            "SPARKGUARD_LIVENESS_PORT": "0",
            "SPARKGUARD_ERROR_BACKOFF": "1",
            "SPARKGUARD_LEADER_ELECTION": "true" if leader_election else "false",
            "SPARKGUARD_LEASE_NAMESPACE": cluster.namespace,
            "SPARKGUARD_LEASE_NAME": self.lease,
            "SPARKGUARD_LEASE_DURATION": "2",
            "SPARKGUARD_CLAIM_TTL": "3",
        }
        self.running: list[Replica] = []

    def start(
        self,
        name: str,
        *,
        gate: Path | None = None,
        rollback_seconds: float = 0,
        extra_args: tuple[str, ...] = (),
    ) -> Replica:
        log = self.workdir / f"replica-{name}.log"
        command = [sys.executable, str(REPLICA), "--kubeconfig", self.cluster.bench.kubeconfig_path]
        command += ["--calls", str(self.calls), "--decisions", str(self.decisions)]
        command += ["--rollback-seconds", str(rollback_seconds), *extra_args]
        if gate is not None:
            command += ["--gate", str(gate)]
        with log.open("wb") as out:
            process = subprocess.Popen(
                command, env={**self.env, "SPARKGUARD_POD_NAME": name}, stdout=out, stderr=out
            )
        replica = Replica(name, process, log)
        self.running.append(replica)
        return replica

    def identity(self, replica: Replica) -> str:
        """The replica's identity (``<name>-<random>``), from its first log line."""

        def announced() -> str:
            first = replica.log.read_text().split("\n", 1)[0]
            return first.split()[1] if first.startswith("replica ") else ""

        return _eventually(announced, timeout=30)

    def rollbacks(self) -> list[dict[str, Any]]:
        if not self.calls.exists():
            return []
        return [json.loads(line) for line in self.calls.read_text().splitlines() if line]

    def decided(self) -> list[dict[str, Any]]:
        if not self.decisions.exists():
            return []
        lines = self.decisions.read_text().splitlines()
        return [json.loads(line) for line in lines if line.endswith("}")]

    def stop_all(self) -> None:
        for replica in self.running:
            if replica.process.poll() is None:
                replica.process.send_signal(signal.SIGTERM)
        for replica in self.running:
            try:
                replica.process.wait(30)
            except subprocess.TimeoutExpired:
                replica.process.kill()
                replica.process.wait(10)
        self.running.clear()

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text()[-3000:]}" for p in self.workdir.glob("*.log")
        )


@pytest.fixture
def replicas_factory(cluster: Cluster, tmp_path: Path) -> Iterator[Callable[..., Replicas]]:
    made: list[Replicas] = []

    def make(*, leader_election: bool) -> Replicas:
        made.append(Replicas(cluster, tmp_path, leader_election=leader_election))
        return made[-1]

    try:
        yield make
    finally:
        for replicas in made:
            replicas.stop_all()


def _events_out(cluster: Cluster, names: list[str]) -> bool:
    """Each app's last recovery Event (``Resubmitted``) is out, and so the ones before it.

    Events go out off the recovery's path; a test that counts them waits for this before it
    stops the replicas, so that the count does not depend on how fast a stopping replica
    flushes its queue.
    """
    return all("Resubmitted" in cluster.event_reasons(name) for name in names)


def _settled_in_every_replica(replicas: Replicas, names: list[str], identities: list[str]) -> bool:
    """Each replica read each app after its resubmission (and only waits for the rerun)."""
    seen = {
        (d["replica"], d["app"])
        for d in replicas.decided()
        if d["action"] == "wait" and "resubmitted attempt 1" in d["reason"]
    }
    return all((who, name) in seen for who in identities for name in names)


@pytest.mark.parametrize("leader_election", [True, False], ids=["lease", "claims-only"])
def test_two_replicas_recover_a_burst_of_failures_exactly_once(
    cluster: Cluster, replicas_factory: Callable[..., Replicas], leader_election: bool
) -> None:
    """Two replicas, eight apps failing at once: one rollback and one resubmission each.

    With the lease one replica acts; without it (``claims-only``, as when a lease expired
    mid-rollback) both act on every app, and the claims and preconditions alone keep it
    exactly once.
    """
    replicas = replicas_factory(leader_election=leader_election)
    names = [f"burst-{i}" for i in range(8)]
    generations = {}
    for name in names:
        cluster.create(spark_app(name, annotations={appmeta.BACKOFF: "0"}))
        generations[name] = cluster.get(name)["metadata"]["generation"]
        cluster.set_status(name, failed_status())
    # Both replicas start on eight apps that are FAILED already: they race from the first
    # listing on.
    first, second = replicas.start("a", rollback_seconds=1), replicas.start("b", rollback_seconds=1)
    identities = [replicas.identity(first), replicas.identity(second)]
    try:
        for name in names:
            _eventually(
                lambda n=name: cluster.notes(n).get(appmeta.PHASE) == "Resubmitted", timeout=60
            )
        _eventually(lambda: _settled_in_every_replica(replicas, names, identities), timeout=60)
        _eventually(lambda: _events_out(cluster, names), timeout=60)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{replicas.logs()}") from exc
    replicas.stop_all()

    calls = replicas.rollbacks()
    for name in names:
        app = cluster.get(name)
        assert app["metadata"]["generation"] == generations[name] + 1, name  # one resubmission
        assert app["spec"]["sparkConf"]["spark.sparkguard.attempt"] == "1"
        reasons = cluster.event_reasons(name)
        assert reasons.count("Resubmitted") == 1, (name, reasons)
        assert reasons.count("RolledBack") == 1, (name, reasons)
        job = f"{cluster.namespace}.{name}"
        assert [c["job"] for c in calls].count(job) == 1, (name, calls)
    if leader_election:  # only the leader rolled back
        assert len({c["replica"] for c in calls}) == 1, calls


def test_leader_killed_mid_rollback_the_other_replica_resumes_once(
    cluster: Cluster, replicas_factory: Callable[..., Replicas], tmp_path: Path
) -> None:
    replicas = replicas_factory(leader_election=True)
    cluster.create(spark_app("victim", annotations={appmeta.BACKOFF: "0"}))
    generation = cluster.get("victim")["metadata"]["generation"]
    # The first replica's rollback never returns (the gate is never opened): it is killed in it.
    leader = replicas.start("a", gate=tmp_path / "never")
    leader_id = replicas.identity(leader)
    _eventually(lambda: cluster.lease_holder(replicas.lease) == leader_id)
    follower = replicas.start("b")
    follower_id = replicas.identity(follower)
    _eventually(lambda: any(d["replica"] == follower_id for d in replicas.decided()))
    cluster.set_status("victim", failed_status())
    try:
        _eventually(lambda: [c["replica"] for c in replicas.rollbacks()] == [leader_id])
        claim = recovery.claim_of(cluster.get("victim"))
        assert claim is not None
        assert claim.holder == leader_id
        assert cluster.notes("victim")[appmeta.PHASE] == "Recovering"
        killed_at = time.time()
        leader.process.send_signal(signal.SIGKILL)
        leader.process.wait(10)
        _eventually(lambda: cluster.notes("victim").get(appmeta.PHASE) == "Resubmitted", timeout=60)
        _eventually(lambda: _settled_in_every_replica(replicas, ["victim"], [follower_id]))
        _eventually(lambda: _events_out(cluster, ["victim"]), timeout=60)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{replicas.logs()}") from exc
    replicas.stop_all()

    calls = replicas.rollbacks()
    assert [c["replica"] for c in calls] == [leader_id, follower_id], calls
    assert calls[1]["at"] > killed_at  # the follower waited for the lease and the claim
    app = cluster.get("victim")
    assert app["metadata"]["generation"] == generation + 1
    assert cluster.event_reasons("victim").count("Resubmitted") == 1


def test_app_deleted_and_recreated_during_rollback_is_left_untouched(cluster: Cluster) -> None:
    gate = threading.Event()
    stuck = FakeRollback(gate=gate)
    with operating(cluster, stuck) as operator:
        old = cluster.create(spark_app("reborn", annotations={appmeta.BACKOFF: "0"}))
        cluster.set_status("reborn", failed_status())
        assert stuck.entered.wait(30)
        old_owner = appmeta.storage_owner(cluster.get("reborn")["metadata"])
        # Deleted and created again under the same name while its old recovery rolls back:
        # the finalizer would hold it until rolled back, so it is removed by hand (as after an
        # uninstall, or by an impatient admin).
        cluster.delete("reborn")
        cluster.release("reborn")
        _eventually(lambda: not cluster.exists("reborn"))
        new = cluster.create(spark_app("reborn", annotations={appmeta.BACKOFF: "0"}))
        assert new["metadata"]["uid"] != old["metadata"]["uid"]
        conclusions_dropped = operator.runtime.metrics.conflicts.labels(step="conclude")
        gate.set()
        # The signal: the old recovery finished its rollback and found its app gone.
        _eventually(lambda: conclusions_dropped._value.get() == 1)
        now = cluster.get("reborn")
    assert now["metadata"]["uid"] == new["metadata"]["uid"]
    assert now["metadata"]["resourceVersion"] == new["metadata"]["resourceVersion"]  # untouched
    assert now["metadata"]["annotations"] == new["metadata"]["annotations"]
    assert cluster.event_reasons("reborn", uid=new["metadata"]["uid"]) == []
    old_events = cluster.event_reasons("reborn", uid=old["metadata"]["uid"])
    assert "RolledBack" not in old_events  # the recovery of a deleted app ends quietly
    # The storage side: the old recovery rolled back only the old app's instants.
    assert stuck.owners == [old_owner]
    assert old_owner is not None
    assert old_owner != appmeta.storage_owner(new["metadata"])


def test_unanswered_resubmission_is_patched_again(cluster: Cluster) -> None:
    cluster.config = dataclasses.replace(cluster.config, resubmit_timeout_seconds=1.0)
    with operating(cluster, FakeRollback()) as operator:
        cluster.create(spark_app("dropped", annotations={appmeta.BACKOFF: "0"}))
        generation = cluster.get("dropped")["metadata"]["generation"]
        cluster.set_status("dropped", failed_status())
        # No spark-operator reruns it: after the timeout the resubmission is patched again.
        _eventually(lambda: "ResubmitRetried" in cluster.event_reasons("dropped"))
        cluster.set_status("dropped", {"applicationState": {"state": "SUBMITTED"}})
        nudges = operator.runtime.metrics.resubmit_retries._value.get()
    app = cluster.get("dropped")
    conf = app["spec"]["sparkConf"]
    assert conf["spark.sparkguard.attempt"] == "1"
    assert conf[recovery.CONF_RESUBMISSION] == f"1.{int(nudges)}"
    assert app["metadata"]["generation"] == generation + 1 + nudges  # each nudge: a spec change


def test_an_app_deleted_mid_recovery_goes_only_after_its_rollback(cluster: Cluster) -> None:
    """spark-operator's TTL deletes a FAILED app while sparkguard waits to resubmit it: the
    finalizer holds it until the rollback ran and was recorded, then lets it go (through the
    managed webhook, which sees the operator's finalizer patch and leaves it alone)."""
    rollback = FakeRollback()
    with operating(cluster, rollback):
        created = cluster.create(spark_app("expiring", annotations={appmeta.BACKOFF: "5m"}))
        assert created["metadata"]["finalizers"] == [finalizers.FINALIZER]  # at admission
        cluster.set_status("expiring", failed_status())
        _eventually(lambda: cluster.notes("expiring").get(appmeta.PHASE) == "RolledBack")
        assert len(rollback.calls) == 1
        gate = threading.Event()
        rollback.gate, rollback.entered = gate, threading.Event()
        try:
            cluster.delete("expiring")
            assert rollback.entered.wait(30)
            held = cluster.get("expiring")  # still there while its rollback runs
            assert held["metadata"]["deletionTimestamp"]
            assert held["metadata"]["finalizers"] == [finalizers.FINALIZER]
            assert "RolledBackOnDelete" not in cluster.event_reasons("expiring")
        finally:
            gate.set()
        _eventually(lambda: not cluster.exists("expiring"))
    assert len(rollback.calls) == 2
    assert rollback.owners[1] == appmeta.storage_owner(created["metadata"])
    reasons = cluster.event_reasons("expiring", uid=created["metadata"]["uid"])
    assert reasons.count("RolledBackOnDelete") == 1
    assert "Resubmitted" not in reasons
