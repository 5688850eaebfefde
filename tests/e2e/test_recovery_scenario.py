"""The product as a user meets it, on the real kube-apiserver bench.

The chart is installed with helm and its operator runs with the Deployment's environment and
the chart's ServiceAccount (webhook on 127.0.0.1); a SparkApplication opted in with
``sparkguard.io/enabled`` is mutated at admission; a stand-in for spark-operator runs the
*mutated* driver pod locally (initContainers, marker sidecar, driver with the injected conf)
and reports status like spark-operator. The first run is killed mid-write; the operator rolls
back with the real library and resubmits; the second run completes; the table holds every row
exactly once. Where the claim is about the operator (its replicas), the driver is the light
one (``tests/e2e/light_driver.py``: sparkguard's Python writer without a JVM);
``test_driver_pod.py`` runs the demo's Spark job in the mutated pod.

An **unchanged job's** first ``saveAsTable`` (the JVM layer) killed mid-save runs here on the
stand-in. Its ``df.write.parquet`` killed at each point under both restart policies, and
spark-operator's own OnFailure restart, run on upstream's spark-operator with real pods
(``test_recovery_on_node.py``), which replaced their stand-in versions here.

The main scenario runs the chart's two replicas as ``sparkguard operator`` processes and
SIGKILLs the leader in the middle of the recovery: the other replica takes the Lease and the
claim over and finishes it, once.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sparkguard.operator import appmeta
from sparkguard.spark_lib.storage import reader, timeline
from tests.chart import operator_harness as harness
from tests.e2e.standin import StandInSparkOperator
from tests.kubebench.bench import KubeBench
from tests.operator.apps import (
    APACHE_GROUP,
    APACHE_VERSION,
    GROUP,
    PLURAL,
    VERSION,
    apache_app,
    spark_app,
)

pytestmark = [pytest.mark.kube, pytest.mark.spark]
ROWS = 12_000


class RealRollback:
    """The library's rollback, recording its summaries (the operator calls it in a thread)."""

    def __init__(self) -> None:
        from sparkguard.spark_lib.storage import rollback

        self._rollback = rollback
        self.summaries: list[dict[str, Any]] = []

    def __call__(self, job_id: str, journal: str, **kwargs: Any) -> Any:
        summary = self._rollback.rollback_job(job_id, journal, **kwargs)
        self.summaries.append(summary.to_json())
        return summary


@dataclasses.dataclass
class ChartOperator:
    """The chart installed on the bench and its operator running as the chart's SA."""

    bench: KubeBench
    api: client.ApiClient
    namespace: str
    rollback: RealRollback
    #: where tables and journals may go (the sidecar's allowed root)
    workdir: Path = dataclasses.field(default=Path(), kw_only=True)

    def get(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = client.CustomObjectsApi(self.api).get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name
        )
        return found

    def create(self, app: dict[str, Any]) -> dict[str, Any]:
        app["metadata"]["namespace"] = self.namespace
        created: dict[str, Any] = client.CustomObjectsApi(self.api).create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, app
        )
        return created

    def notes(self, name: str) -> dict[str, str]:
        return dict(self.get(name)["metadata"].get("annotations") or {})

    def state(self, name: str) -> str | None:
        state: str | None = (
            self.get(name).get("status", {}).get("applicationState", {}).get("state")
        )
        return state

    def event_reasons(self, name: str) -> list[str]:
        events = client.CoreV1Api(self.api).list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={name}"
        )
        return [e.reason for e in events.items]


@contextlib.contextmanager
def installed_chart_operator(
    kube_bench: KubeBench, workdir: Path, env_extra: dict[str, str] | None = None
) -> Iterator[ChartOperator]:
    """``helm install`` of the chart, then its operator with the Deployment's env and SA, plus
    ``env_extra`` (e.g. ``SPARKGUARD_SIDECAR_NATIVE``); tables and journals go under
    ``workdir``."""
    suffix = uuid.uuid4().hex[:6]
    app_namespace = f"e2e-{suffix}"
    kube_bench.ensure_namespace(app_namespace)
    values = {
        "operator": {"journalRoot": str(workdir / "journal")},
        "sidecar": {"port": harness.free_port(), "allowedRoots": [str(workdir)]},
    }
    release = harness.install(
        kube_bench, name=f"e2e-{suffix}", namespace=f"sparkguard-e2e-{suffix}", values=values
    )
    api = kube_bench.api_client()
    admission = client.AdmissionregistrationV1Api(api)
    chart_hook = release.one("MutatingWebhookConfiguration")
    bench_hook = f"{chart_hook['metadata']['name']}.bench"
    # The chart's webhook calls an in-cluster Service with no pod behind it on the bench:
    # replace it by the same configuration calling the operator on 127.0.0.1 (bench CA).
    admission.delete_mutating_webhook_configuration(chart_hook["metadata"]["name"])
    port = harness.free_port()
    cert = kube_bench.issue_certificate(f"webhook-{suffix}", ip_addresses=("127.0.0.1",))
    env = harness.operator_env_on_bench(
        release, webhook_port=port, cert_file=str(cert.cert_file), key_file=str(cert.key_file)
    )
    env.update(env_extra or {})
    # No Secret in the app's namespace: each app carries its own marker token (annotation).
    sa_kubeconfig = kube_bench.service_account_kubeconfig(
        release.namespace, release.service_account
    )
    rollback = RealRollback()
    try:
        with harness.operator_as(sa_kubeconfig, env, rollback) as operator:  # type: ignore[arg-type]
            assert operator.ready_flag.wait(30), "the operator did not get ready within 30s"
            kube_bench.request(
                "POST",
                "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
                harness.bench_webhook_configuration(
                    chart_hook,
                    name=bench_hook,
                    url=f"https://127.0.0.1:{port}/sparkapplications",
                    ca_pem=kube_bench.ca_pem,
                ),
            )
            cluster = ChartOperator(kube_bench, api, app_namespace, rollback, workdir=workdir)
            _wait_for_webhook(cluster)
            yield cluster
    finally:
        with contextlib.suppress(client.ApiException):
            admission.delete_mutating_webhook_configuration(bench_hook)
        harness.uninstall(kube_bench, release)
        api.close()


@pytest.fixture
def chart_operator(
    kube_bench: KubeBench, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[ChartOperator]:
    """``helm install`` of the chart, then its operator with the Deployment's env and SA.

    Parametrized indirectly, the parameter is a dict of environment variables set on top of
    the Deployment's (e.g. ``SPARKGUARD_SIDECAR_NATIVE``).
    """
    with installed_chart_operator(
        kube_bench, tmp_path, getattr(request, "param", None) or {}
    ) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def scenario_operator(
    kube_bench: KubeBench, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ChartOperator]:
    """One install of the chart and its operator for this module's single-operator tests (each
    app has its own name, job id and directory under the operator's allowed root)."""
    with installed_chart_operator(kube_bench, tmp_path_factory.mktemp("scenario")) as cluster:
        yield cluster


def _app_dir(cluster: ChartOperator, name: str) -> Path:
    """App ``name``'s directory (table, pods) under the operator's allowed root."""
    base = cluster.workdir / name
    base.mkdir()
    return base


@dataclasses.dataclass
class ChartReplicas(ChartOperator):
    """The chart installed on the bench, its two replicas as ``sparkguard operator`` processes."""

    release: harness.Release
    killed_in: str | None = None
    processes: dict[str, subprocess.Popen[bytes]] = dataclasses.field(default_factory=dict)
    logs: dict[str, Path] = dataclasses.field(default_factory=dict)

    def lease_holder(self) -> str:
        lease_name = self.release.operator_env()["SPARKGUARD_LEASE_NAME"]
        lease = client.CoordinationV1Api(self.api).read_namespaced_lease(
            lease_name, self.release.namespace
        )
        return str(lease.spec.holder_identity or "")

    def output(self) -> str:
        return "\n".join(f"--- {n}\n{p.read_text()[-4000:]}" for n, p in self.logs.items())


@pytest.fixture
def chart_replicas(kube_bench: KubeBench, tmp_path: Path) -> Iterator[ChartReplicas]:
    """:func:`installed_chart_replicas` on ``tmp_path``."""
    with installed_chart_replicas(kube_bench, tmp_path) as cluster:
        yield cluster


@contextlib.contextmanager
def installed_chart_replicas(
    kube_bench: KubeBench,
    tmp_path: Path,
    *,
    operator: Mapping[str, Any] | None = None,
    apache: bool = False,
) -> Iterator[ChartReplicas]:
    """``helm install`` (2 replicas), then both replicas as processes with the chart's env + SA
    (``sparkguard operator``, the product's own command); tables and journals under
    ``tmp_path``; ``operator``: more of the chart's ``operator`` values; ``apache``: the bench
    serves the Apache operator's kind only (the webhook is probed with one of those).

    Replica ``a`` starts first and becomes the leader; the webhook configuration points at
    replica ``b`` (one URL: the bench has no Service to spread admission over both), which
    survives the test's kill of the leader.
    """
    suffix = uuid.uuid4().hex[:6]
    app_namespace = f"e2e-{suffix}"
    kube_bench.ensure_namespace(app_namespace)
    values = {
        "operator": {
            "journalRoot": str(tmp_path / "journal"),
            # short, so the test's takeover after the kill is quick
            "leaderElection": {"leaseDuration": "2s"},
            "claimTtl": "3s",
            **(operator or {}),
        },
        "sidecar": {"port": harness.free_port(), "allowedRoots": [str(tmp_path)]},
    }
    release = harness.install(
        kube_bench, name=f"e2e-{suffix}", namespace=f"sparkguard-e2e-{suffix}", values=values
    )
    assert release.one("Deployment")["spec"]["replicas"] == 2
    api = kube_bench.api_client()
    admission = client.AdmissionregistrationV1Api(api)
    chart_hook = release.one("MutatingWebhookConfiguration")
    bench_hook = f"{chart_hook['metadata']['name']}.bench"
    admission.delete_mutating_webhook_configuration(chart_hook["metadata"]["name"])
    cert = kube_bench.issue_certificate(f"webhook-{suffix}", ip_addresses=("127.0.0.1",))
    sa_kubeconfig = kube_bench.service_account_kubeconfig(
        release.namespace, release.service_account
    )
    cluster = ChartReplicas(
        kube_bench, api, app_namespace, RealRollback(), release=release, workdir=tmp_path
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("SPARKGUARD_")}
    ports = {}
    try:
        for name in ("a", "b"):
            ports[name] = harness.free_port()
            env = harness.operator_env_on_bench(
                release,
                webhook_port=ports[name],
                cert_file=str(cert.cert_file),
                key_file=str(cert.key_file),
                pod_name=f"operator-{name}",
            )
            command = [str(Path(sys.executable).parent / "sparkguard"), "--log-level", "INFO"]
            command += ["operator", "--kubeconfig", sa_kubeconfig]
            cluster.logs[name] = tmp_path / f"operator-{name}.log"
            with cluster.logs[name].open("wb") as log:
                cluster.processes[name] = subprocess.Popen(  # the product's own command
                    command, env={**base, **env}, stdout=log, stderr=log
                )
            if name == "a":
                harness.eventually(
                    lambda: cluster.lease_holder().startswith(f"{release.name}-operator-a-"),
                    what=f"replica a to take the Lease\n{cluster.output()}",
                )
        kube_bench.request(
            "POST",
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
            harness.bench_webhook_configuration(
                chart_hook,
                name=bench_hook,
                url=f"https://127.0.0.1:{ports['b']}/sparkapplications",
                ca_pem=kube_bench.ca_pem,
            ),
        )
        _wait_for_webhook(cluster, apache=apache)
        yield cluster
    finally:
        for process in cluster.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in cluster.processes.values():
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        with contextlib.suppress(client.ApiException):
            admission.delete_mutating_webhook_configuration(bench_hook)
        harness.uninstall(kube_bench, release)
        api.close()


def _wait_for_webhook(cluster: ChartOperator, *, apache: bool = False) -> None:
    """Until the API server calls the operator's webhook for a new app (of Kubeflow's kind, or
    the Apache operator's)."""
    probe = f"probe-{uuid.uuid4().hex[:6]}"
    kind = (APACHE_GROUP, APACHE_VERSION, cluster.namespace, PLURAL)
    if not apache:
        kind = (GROUP, VERSION, cluster.namespace, PLURAL)
    custom = client.CustomObjectsApi(cluster.api)

    def mutated() -> bool:
        app = apache_app(probe, namespace=cluster.namespace) if apache else spark_app(probe)
        app["metadata"]["namespace"] = cluster.namespace
        created = custom.create_namespaced_custom_object(*kind, app)
        custom.delete_namespaced_custom_object(*kind, probe)
        return "spark.sparkguard.jobId" in created["spec"]["sparkConf"]

    harness.eventually(mutated, what="the apiserver to call the operator's webhook")


def _exactly_once(table: str, *, rows: int = ROWS, column: str = "id") -> tuple[int, int, int]:
    import pyarrow.parquet as pq

    ids: list[int] = []
    for path in reader.committed_paths(table):
        ids.extend(pq.read_table(path, columns=[column]).column(column).to_pylist())
    counts = collections.Counter(ids)
    duplicates = sum(n - 1 for n in counts.values() if n > 1)
    missing = len(set(range(rows)) - set(ids))
    return len(ids), duplicates, missing


def _uncommitted_files(table: Path) -> list[str]:
    committed = {Path(p).name for p in reader.committed_paths(str(table))}
    return sorted(
        p.name
        for p in table.rglob("part-*")
        if timeline.SPARKGUARD_DIR not in p.parts and p.name not in committed
    )


def _run_until_completed(
    cluster: ChartOperator,
    name: str,
    *,
    table: Path,
    workdir: Path,
    job: str = "demo",
    rows: int = ROWS,
    partitions: int = 4,
    kill_when: Callable[[], bool] | None = None,
) -> StandInSparkOperator:
    """Serve app ``name`` with the stand-in (first run killed mid-write) until COMPLETED and
    its lingering executors (the light driver's) are gone."""
    workdir.mkdir()
    standin = StandInSparkOperator(
        cluster.api, namespace=cluster.namespace, name=name, workdir=workdir, table=str(table),
        rows=rows, partitions=partitions, job=job,
    )  # fmt: skip
    standin.kill_runs = {0}
    standin.kill_when = kill_when
    stop = threading.Event()
    runner = threading.Thread(target=standin.serve, args=(stop,), daemon=True)
    runner.start()
    try:
        harness.eventually(
            lambda: cluster.state(name) == "COMPLETED" and standin.executors_left() == 0,
            what=f"app {name} to complete (runs so far: {standin.runs})",
            timeout=420,
        )
    finally:
        stop.set()
        runner.join(30)
        standin.cleanup()
    return standin


def _kill_the_leader_mid_recovery(cluster: ChartReplicas, name: str, done: threading.Event) -> None:
    """SIGKILL replica ``a`` (the leader) once it is recovering app ``name``."""
    while not done.is_set():
        phase = cluster.notes(name).get(appmeta.PHASE)
        if phase in ("Recovering", "RolledBack"):
            cluster.processes["a"].send_signal(signal.SIGKILL)
            cluster.killed_in = phase
            return
        time.sleep(0.02)


def test_killed_run_is_rolled_back_resubmitted_and_exactly_once(
    chart_replicas: ChartReplicas, tmp_path: Path
) -> None:
    """The leader is SIGKILLed mid-recovery; the other replica finishes it, exactly once."""
    cluster = chart_replicas
    table = tmp_path / "orders"
    # A backoff long enough that the kill lands before the resubmission, whatever the timing.
    created = cluster.create(spark_app("orders", annotations={appmeta.BACKOFF: "4s"}))
    conf = created["spec"]["sparkConf"]
    assert conf["spark.sparkguard.markers.type"] == "TIMELINE_SERVER_BASED"
    job_id = conf["spark.sparkguard.jobId"]
    done = threading.Event()
    killer = threading.Thread(
        target=_kill_the_leader_mid_recovery, args=(cluster, "orders", done), daemon=True
    )
    killer.start()
    try:
        standin = _run_until_completed(
            cluster, "orders", table=table, workdir=tmp_path / "pods", job="light"
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{cluster.output()}") from exc
    finally:
        done.set()
        killer.join(10)
    notes = cluster.notes("orders")
    reasons = cluster.event_reasons("orders")
    # The leader died mid-recovery; the follower holds the Lease and finished it.
    assert cluster.processes["a"].poll() == -signal.SIGKILL
    assert cluster.killed_in in ("Recovering", "RolledBack")
    assert cluster.lease_holder().startswith(f"{cluster.release.name}-operator-b-")

    # The first run was killed mid-write, the second completed after one resubmission.
    assert len(standin.runs) == 2
    assert standin.runs[0]["exit"] != 0
    assert standin.runs[1]["exit"] == 0
    assert standin.runs[1]["generation"] == standin.runs[0]["generation"] + 1
    assert [name for name, _ in standin.runs[0]["init"]] == [
        "sparkguard-lib",
        "sparkguard-rollback",
    ]
    assert all(code == 0 for _, code in standin.runs[1]["init"])
    # Event trail and the rollback summary the operator recorded: the rollback may have been
    # done (in part) by the killed leader and finished by the other replica (idempotent).
    assert reasons.count("Resubmitted") == 1
    assert {"RollbackStarted", "RolledBack", "Resubmitted"} <= set(reasons)
    assert notes[appmeta.ATTEMPT] == "1"
    last = json.loads(notes[appmeta.LAST_ROLLBACK])
    assert last["committed"] == 0
    assert last["attempt"] == 0
    # The table: every row exactly once, nothing uncommitted left.
    rows, duplicates, missing = _exactly_once(str(table))
    assert (rows, duplicates, missing) == (ROWS, 0, 0)
    assert _uncommitted_files(table) == []
    # The killed run was the table's first write: its rollback removed the location it created
    # (docs/storage-contract.md, "The life of a table"); the rerun's commit is all there is.
    # With the leader killed while it replaced the instant's .rolledback, the temp file it left
    # in timeline/ goes with the location (it kept the location before lifecycle handled it).
    states = [s.state for s in timeline.timeline_for(str(table)).statuses(job_id=job_id)]
    assert states == [timeline.State.COMMITTED]


PLAIN_ROWS = 2_000_000
PLAIN_PARTITIONS = 8


def _mid_write(table: Path) -> bool:
    """Some of the write's files are written (under their hidden temp names: the JVM protocol
    publishes them only after its outcome), not all, and nothing is committed yet."""
    written = len(list(table.glob(".part-*.sg-tmp-*")))
    outcomes = list((table / timeline.SPARKGUARD_DIR / "timeline").glob("*.outcome"))
    return 0 < written < PLAIN_PARTITIONS and not outcomes


def test_new_managed_table_killed_mid_save_as_table_is_removed_and_created_by_the_resubmission(
    scenario_operator: ChartOperator,
) -> None:
    """An unchanged job's first ``saveAsTable("orders")`` (a new managed table in the warehouse)
    is SIGKILLed mid-write; the operator's rollback removes the location the write created, so
    the resubmitted run creates the table instead of failing with LOCATION_ALREADY_EXISTS."""
    cluster = scenario_operator
    base = _app_dir(cluster, "managed")
    warehouse = base / "warehouse"
    table = warehouse / "orders"
    created = cluster.create(spark_app("managed", annotations={appmeta.BACKOFF: "1s"}))
    job_id = created["spec"]["sparkConf"]["spark.sparkguard.jobId"]
    standin = _run_until_completed(
        cluster, "managed", table=warehouse, workdir=base / "pods", job="plain-table",
        rows=PLAIN_ROWS, partitions=PLAIN_PARTITIONS, kill_when=lambda: _mid_write(table),
    )  # fmt: skip
    assert [run["exit"] for run in standin.runs] == [128 + signal.SIGKILL, 0]
    assert standin.runs[1]["generation"] == standin.runs[0]["generation"] + 1
    summary = next(s for s in cluster.rollback.summaries if s["jobId"] == job_id)
    assert len(summary["instantsRolledBack"]) == 1
    assert summary["tablesRemoved"] == [str(table)]
    # The rerun created the table (its driver read it back with spark.table: every row once).
    rows, duplicates, missing = _exactly_once(str(table), rows=PLAIN_ROWS, column="n")
    assert (rows, duplicates, missing) == (PLAIN_ROWS, 0, 0)
    assert _uncommitted_files(table) == []
    committed = sorted(Path(p).name for p in reader.committed_paths(str(table)))
    assert committed == sorted(p.name for p in table.glob("part-*"))
    states = [s.state for s in timeline.timeline_for(str(table)).statuses(job_id=job_id)]
    assert states == [timeline.State.COMMITTED]
