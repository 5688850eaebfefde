"""Recovery of Apache Spark operator apps, end to end on the kube bench.

The chart is installed, its operator runs as the chart's ServiceAccount; the Apache operator's
CRD is installed only **after** the operator started (the operator serves it without a restart,
``operator/crdwatch.py``). Each app is opted in with the label and annotations, mutated by the
chart's Apache webhook, and run by the Apache stand-in (``apache_standin.py``, a model of
upstream) with the light driver (sparkguard's Python writer, one lingering executor):

* ``restart-mid-write``: admission mapped ``max-retries 2``/``backoff 1s`` onto
  ``restartConfig`` (OnFailure, 2 restarts, fixed 1 s). The first driver is SIGKILLed
  mid-write; the Apache operator restarts it itself (``<name>-1-driver``), whose rollback
  initContainer cleans the dead attempt; sparkguard only marks the app Succeeded.
* ``budget``: ``max-retries 1``: both drivers killed; the final failure (ResourceReleased after
  Failed, attempt 1) is rolled back by the operator and given up (Exhausted).
* ``resubmit``: the user's own ``restartConfig`` (OnFailure, 1 restart), ``max-retries 2``:
  both drivers killed, the operator's restart counted; sparkguard rolls back and **recreates**
  the app (new uid, same owner, ``resubmitted-from``), whose first driver completes.

Every case: every row exactly once, nothing uncommitted or temporary left, restarts and
resubmissions as expected.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from sparkguard.operator import appmeta, finalizers
from sparkguard.spark_lib.storage import timeline
from tests.chart import operator_harness as harness
from tests.e2e import apache_standin as apache
from tests.e2e.conftest import LIGHT_ROWS, leftovers, light_standin, rows_once, states_of
from tests.e2e.test_recovery_scenario import ChartOperator, installed_chart_operator
from tests.kubebench.bench import APACHE_SPARK_OPERATOR_CRD, KubeBench
from tests.operator.apps import apache_app, spark_app
from tests.support import yamlfast

pytestmark = [pytest.mark.kube]
CRD_NAME = f"{apache.PLURAL}.{apache.GROUP}"
CRD_PATH = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}"


APPS_PATH = f"/apis/{apache.GROUP}/{apache.VERSION}"


def _release_leftover_apps(kube_bench: KubeBench) -> None:
    """Take the finalizers off Apache apps other modules left on the shared bench: their
    operators (sparkguard's, the stand-in's) are gone, and the CRD's deletion waits for every
    app of it to go."""
    with contextlib.suppress(Exception):
        _, listed = kube_bench.request("GET", f"{APPS_PATH}/{apache.PLURAL}")
        for app in listed.get("items") or []:
            meta = app.get("metadata") or {}
            if meta.get("finalizers"):
                kube_bench.request(
                    "PATCH",
                    f"{APPS_PATH}/namespaces/{meta['namespace']}/{apache.PLURAL}/{meta['name']}",
                    {"metadata": {"finalizers": None}},
                    content_type="application/merge-patch+json",
                )


def _crd_absent(kube_bench: KubeBench) -> None:
    """Delete the Apache CRD (another module may have installed it) and wait until gone."""
    with contextlib.suppress(Exception):
        kube_bench.request("DELETE", CRD_PATH)

    def gone() -> bool:
        try:
            kube_bench.request("GET", CRD_PATH)
        except Exception:
            return True
        _release_leftover_apps(kube_bench)
        return False

    harness.eventually(gone, what=f"the CRD {CRD_NAME} to be deleted", timeout=60)


@pytest.fixture(scope="module")
def cluster(kube_bench: KubeBench, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The chart's operator, started without the Apache CRD; the CRD installed after."""
    _crd_absent(kube_bench)
    workdir = tmp_path_factory.mktemp("e2e-apache")
    env = {"SPARKGUARD_CRD_CHECK_INTERVAL": "1s"}
    with installed_chart_operator(kube_bench, workdir, env) as chart:
        kube_bench.apply_manifest(yamlfast.load_all(APACHE_SPARK_OPERATOR_CRD.read_text()))
        kube_bench.wait_for_crd(CRD_NAME)
        yield Apache(chart)


class Apache:
    """The chart's operator with helpers for Apache apps in its app namespace."""

    def __init__(self, chart: ChartOperator) -> None:
        self.chart = chart
        self.api = chart.api
        self.namespace = chart.namespace
        self.workdir = chart.workdir
        self.custom = client.CustomObjectsApi(chart.api)

    def get(self, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self.custom.get_namespaced_custom_object(
                apache.GROUP, apache.VERSION, self.namespace, apache.PLURAL, name
            )
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return found

    def create(self, app: dict[str, Any]) -> dict[str, Any]:
        app["metadata"]["namespace"] = self.namespace
        created: dict[str, Any] = self.custom.create_namespaced_custom_object(
            apache.GROUP, apache.VERSION, self.namespace, apache.PLURAL, app
        )
        return created

    def notes(self, name: str) -> dict[str, str]:
        app = self.get(name)
        return dict((app or {}).get("metadata", {}).get("annotations") or {})

    def event_reasons(self, name: str) -> list[str]:
        events = client.CoreV1Api(self.api).list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={name}"
        )
        return [e.reason for e in events.items]

    def records(self) -> list[str]:
        found = client.CoreV1Api(self.api).list_namespaced_config_map(
            self.namespace, label_selector="sparkguard.io/resubmission=true"
        )
        return [c.metadata.name for c in found.items if c.metadata]

    def standin(self, name: str) -> apache.StandInApacheOperator:
        base = self.workdir / name
        (base / "pods").mkdir(parents=True)
        return apache.StandInApacheOperator(
            self.api,
            namespace=self.namespace,
            name=name,
            workdir=base / "pods",
            table=str(base / "table"),
            rows=LIGHT_ROWS,
            partitions=4,
        )


def _serve_until(
    standin: apache.StandInApacheOperator, done: Callable[[], bool], *, what: str
) -> None:
    stop = threading.Event()
    runner = threading.Thread(target=standin.serve, args=(stop,), daemon=True)
    runner.start()
    try:
        harness.eventually(lambda: done() and standin.executors_left() == 0, what=what, timeout=150)
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\nruns: {standin.runs}\nerrors: {standin.errors[-5:]}\n"
            f"states: {[w['currentState']['currentStateSummary'] for w in standin.writes]}"
        ) from None
    finally:
        stop.set()
        runner.join(30)
        standin.cleanup()


def _app(name: str, **notes: str) -> dict[str, Any]:
    app = apache_app(name, annotations={appmeta.BACKOFF: "1s", **notes})
    app["metadata"]["labels"] = {appmeta.ENABLED_LABEL: "true"}
    return app


def test_a_kind_installed_after_the_start_is_admitted_and_finalized(cluster: Apache) -> None:
    """The CRD came after the operator: its webhook answers and the finalizer goes on (the
    webhook may take a check interval to serve the kind: retried until it does)."""
    name = "late-crd"

    def admitted() -> bool:
        created = cluster.create(_app(name))
        mutated = "spark.sparkguard.jobId" in created["spec"]["sparkConf"]
        if not mutated:
            cluster.custom.delete_namespaced_custom_object(
                apache.GROUP, apache.VERSION, cluster.namespace, apache.PLURAL, name
            )
            harness.eventually(lambda: cluster.get(name) is None, what=f"{name} deleted")
        return mutated

    harness.eventually(admitted, what="the Apache webhook to be served", timeout=60)
    app = cluster.get(name)
    assert app is not None
    assert finalizers.FINALIZER in app["metadata"]["finalizers"]
    # max-retries (default 3) and backoff mapped; the CRD defaults the counter reset to -1 (off)
    assert app["spec"]["applicationTolerations"]["restartConfig"] == {
        "restartPolicy": "OnFailure",
        "maxRestartAttempts": 3,
        "restartBackoffMillis": 1000,
        "restartCounterResetMillis": -1,
    }
    # deleted before it ever ran: the operator lets it go (nothing to roll back)
    cluster.custom.delete_namespaced_custom_object(
        apache.GROUP, apache.VERSION, cluster.namespace, apache.PLURAL, name
    )
    harness.eventually(lambda: cluster.get(name) is None, what=f"{name} to be let go")


def test_a_restart_by_the_apache_operator_is_rolled_back_by_its_init_container(
    cluster: Apache,
) -> None:
    """The driver killed mid-write. The other kill points (before its files, after its commit)
    change only what the init container's rollback finds, the same library code whichever
    operator restarts the driver: ``test_recovery_matrix.py``'s OnFailure cases run them (the
    restart by spark-operator), and the streaming test here restarts the driver three times."""
    kill_point = "mid-write"
    name = f"restart-{kill_point}"
    created = cluster.create(_app(name, **{appmeta.MAX_RETRIES: "2"}))
    job_id = created["spec"]["sparkConf"]["spark.sparkguard.jobId"]
    standin = cluster.standin(name)
    standin.kill_runs = {0}
    standin.kill_point = kill_point
    _serve_until(
        standin,
        lambda: cluster.notes(name).get(appmeta.PHASE) == "Succeeded",
        what=f"app {name} to succeed",
    )
    # The Apache operator restarted the driver itself; every pod ran our rollback first.
    assert [r["pod"] for r in standin.runs] == [f"{name}-0-driver", f"{name}-1-driver"]
    assert [r["ended_by"] for r in standin.runs] == ["killed", "exited"]
    for run in standin.runs:  # (initContainer, exit code) in the order they ran
        assert ("sparkguard-rollback", 0) in run["init"], run
    reasons = cluster.event_reasons(name)
    assert "RollbackStarted" not in reasons  # sparkguard's operator had nothing to do
    assert "Resubmitted" not in reasons
    table = cluster.workdir / name / "table"
    assert rows_once(table) == (LIGHT_ROWS, 0, 0)
    assert leftovers(table) == []
    # A killed first write rolled back removes the location it created ("The life of a
    # table"): the rerun's commit is the table's only instant at every kill point.
    assert states_of(table, job_id) == [timeline.State.COMMITTED]


def test_the_restart_budget_used_up_is_rolled_back_and_given_up(cluster: Apache) -> None:
    name = "budget"
    created = cluster.create(_app(name, **{appmeta.MAX_RETRIES: "1"}))
    job_id = created["spec"]["sparkConf"]["spark.sparkguard.jobId"]
    standin = cluster.standin(name)
    standin.kill_runs = {0, 1}
    _serve_until(
        standin,
        lambda: cluster.notes(name).get(appmeta.PHASE) == "Exhausted",
        what=f"app {name} to be given up",
    )
    assert [r["pod"] for r in standin.runs] == [f"{name}-0-driver", f"{name}-1-driver"]
    reasons = cluster.event_reasons(name)
    assert reasons.count("RollbackStarted") == 1
    assert reasons.count("RetriesExhausted") == 1
    assert "Resubmitted" not in reasons
    table = cluster.workdir / name / "table"
    assert rows_once(table) == (0, 0, LIGHT_ROWS)  # nothing committed, nothing left over
    assert leftovers(table) == []
    # every attempt rolled back, and the first had created the location: it is gone again
    assert states_of(table, job_id) == []
    assert not table.exists()


def test_a_final_failure_with_retries_left_is_resubmitted_by_recreating_the_app(
    cluster: Apache,
) -> None:
    name = "resubmit"
    restart = {"restartPolicy": "OnFailure", "maxRestartAttempts": 1, "restartBackoffMillis": 500}
    app = _app(name, **{appmeta.MAX_RETRIES: "2"})
    app["spec"]["applicationTolerations"] = {"restartConfig": restart}
    created = cluster.create(app)
    restart["restartCounterResetMillis"] = -1  # the CRD's default
    assert created["spec"]["applicationTolerations"]["restartConfig"] == restart  # the user's
    old_uid = created["metadata"]["uid"]
    owner = created["metadata"]["annotations"][appmeta.OWNER_ANNOTATION]
    job_id = created["spec"]["sparkConf"]["spark.sparkguard.jobId"]
    standin = cluster.standin(name)
    standin.kill_runs = {0, 1}

    def recreated_and_done() -> bool:
        app = cluster.get(name)
        return (
            app is not None
            and app["metadata"]["uid"] != old_uid
            and appmeta.of(app).get(appmeta.PHASE) == "Succeeded"
        )

    started = time.monotonic()
    _serve_until(standin, recreated_and_done, what=f"app {name} to be recreated and succeed")
    print(f"\n{name}: {time.monotonic() - started:.1f}s, runs {[r['pod'] for r in standin.runs]}")
    # attempt 0, the Apache operator's restart (attempt 1), then the recreated app's attempt 0
    assert [r["pod"] for r in standin.runs] == [
        f"{name}-0-driver",
        f"{name}-1-driver",
        f"{name}-0-driver",
    ]
    assert [r["ended_by"] for r in standin.runs] == ["killed", "killed", "exited"]
    new = cluster.get(name)
    assert new is not None
    notes = appmeta.of(new)
    assert notes[appmeta.RESUBMITTED_FROM] == old_uid
    assert notes[appmeta.OWNER_ANNOTATION] == owner  # kept: the record vouched for it
    assert notes[appmeta.ATTEMPT] == "2"  # the operator's restart + sparkguard's resubmission
    assert finalizers.FINALIZER in new["metadata"]["finalizers"]
    assert new["spec"]["applicationTolerations"]["restartConfig"] == restart
    assert "Resubmitted" in cluster.event_reasons(name)
    assert cluster.records() == []  # the record is gone once the new app exists
    table = cluster.workdir / name / "table"
    assert rows_once(table) == (LIGHT_ROWS, 0, 0)
    assert leftovers(table) == []
    assert states_of(table, job_id)[-1] == timeline.State.COMMITTED
    assert timeline.State.INFLIGHT not in states_of(table, job_id)


def test_both_kinds_opted_in_at_once_in_one_namespace_share_nothing(cluster: Apache) -> None:
    """A Kubeflow app and an Apache app opted in side by side in one namespace, each driver
    killed mid-write at once: each is recovered by its own path (Kubeflow: sparkguard rolls
    back and resubmits; Apache: its operator restarts, the init container rolls back), with
    its own job id, owner, table and finalizer; admission refuses the Apache app the job id
    the Kubeflow app holds."""
    kubeflow = cluster.chart.create(spark_app("pair-kf", annotations={appmeta.BACKOFF: "1s"}))
    # The bench's pods share the host network: two marker sidecars at once would compete for
    # the chart's one port (in a cluster each pod has its own); the Apache app records its
    # markers directly instead.
    other = cluster.create(
        _app("pair-ap", **{appmeta.MAX_RETRIES: "2", appmeta.MARKER_TYPE: "direct"})
    )
    apps = (kubeflow, other)
    job_ids = [a["spec"]["sparkConf"]["spark.sparkguard.jobId"] for a in apps]
    owners = [a["metadata"]["annotations"][appmeta.OWNER_ANNOTATION] for a in apps]
    assert len(set(job_ids)) == 2, job_ids
    assert len(set(owners)) == 2, owners
    for app in apps:
        assert finalizers.FINALIZER in app["metadata"]["finalizers"]
    with pytest.raises(client.ApiException) as refused:
        cluster.create(_app("pair-copy", **{appmeta.JOB_ID: job_ids[0]}))
    assert "already the job id of SparkApplication" in str(refused.value.body)

    kf = light_standin(cluster.chart, "pair-kf")
    ap = cluster.standin("pair-ap")
    kf.kill_runs = ap.kill_runs = {0}
    stop = threading.Event()
    runners = [threading.Thread(target=s.serve, args=(stop,), daemon=True) for s in (kf, ap)]
    for runner in runners:
        runner.start()

    def both_done() -> bool:
        return (
            cluster.chart.notes("pair-kf").get(appmeta.PHASE) == "Succeeded"
            and cluster.notes("pair-ap").get(appmeta.PHASE) == "Succeeded"
            and kf.executors_left() == 0
            and ap.executors_left() == 0
        )

    try:
        harness.eventually(both_done, what="both apps to succeed", timeout=180)
    finally:
        stop.set()
        for runner in runners:
            runner.join(30)
        kf.cleanup()
        ap.cleanup()
    assert cluster.chart.event_reasons("pair-kf").count("Resubmitted") == 1
    assert "RollbackStarted" not in cluster.event_reasons("pair-ap")
    assert [r["pod"] for r in ap.runs] == ["pair-ap-0-driver", "pair-ap-1-driver"], ap.runs
    for name, job_id in zip(("pair-kf", "pair-ap"), job_ids, strict=True):
        table = cluster.workdir / name / "table"
        assert rows_once(table) == (LIGHT_ROWS, 0, 0), name
        assert leftovers(table) == [], name
        assert states_of(table, job_id) == [timeline.State.COMMITTED], name


def test_a_streaming_app_killed_three_times_writes_every_row_once(cluster: Apache) -> None:
    """restartPolicy Always (the user's): a streaming query of 5 micro-batches whose first three
    drivers are each killed in the middle of a micro-batch, after committing one. The Apache
    operator restarts each; the next driver's rollback initContainer rolls the dead attempt's
    micro-batch back before the driver replays the query (skipping committed batches). After
    the fourth driver's success the restart budget (3) is used up: final after Succeeded, so
    sparkguard marks the app Succeeded. Every row once, by listing the output directory."""
    import pyarrow.parquet as pq

    name, batches, rows = "stream", 5, 400
    restart = {"restartPolicy": "Always", "maxRestartAttempts": 3, "restartBackoffMillis": 500}
    app = _app(name, **{appmeta.MAX_RETRIES: "3"})
    app["spec"]["applicationTolerations"] = {"restartConfig": restart}
    created = cluster.create(app)
    job_id = created["spec"]["sparkConf"]["spark.sparkguard.jobId"]
    standin = cluster.standin(name)
    standin.rows = rows
    standin.stream_batches = batches
    standin.kill_runs = {0, 1, 2}
    _serve_until(
        standin,
        lambda: cluster.notes(name).get(appmeta.PHASE) == "Succeeded",
        what=f"app {name} to succeed",
    )
    assert [r["pod"] for r in standin.runs] == [f"{name}-{i}-driver" for i in range(4)]
    assert [r["ended_by"] for r in standin.runs] == ["killed"] * 3 + ["exited"]
    for run in standin.runs:  # each restart ran the rollback before its driver
        assert ("sparkguard-rollback", 0) in run["init"], run
    # ...and that rollback (the init container's summary, in pod order) is what cleaned each
    # dead attempt's micro-batch: nothing before the first driver, one instant before each next
    summaries = re.findall(r"rolled back: (\d+) ", standin.log.read_text())
    assert summaries == ["0", "1", "1", "1"], summaries
    reasons = cluster.event_reasons(name)
    assert "RollbackStarted" not in reasons
    assert "Resubmitted" not in reasons
    # Every row once, from the files in the output directory (sparkguard's own excluded).
    table = cluster.workdir / name / "table"
    files = sorted(
        p
        for p in table.rglob("*.parquet")
        if timeline.SPARKGUARD_DIR not in p.relative_to(table).parts
    )
    ids = [i for f in files for i in pq.read_table(f, columns=["id"]).column("id").to_pylist()]
    assert sorted(ids) == list(range(batches * rows))
    assert leftovers(table) == []
    # each killed driver's micro-batch rolled back, each batch committed once
    states = states_of(table, job_id)
    assert states.count(timeline.State.ROLLED_BACK) == 3, states
    assert states.count(timeline.State.COMMITTED) == batches, states


def test_an_app_deleted_mid_write_is_rolled_back_before_it_goes(cluster: Apache) -> None:
    """``kubectl delete`` of a running Apache app whose driver is in the middle of its write:
    the Apache operator's clean-up stops the driver (ResourceReleased "shutdown as
    requested"), sparkguard's finalizer rolls the write back first; then the app is gone and
    nothing uncommitted is left."""
    name = "deleted"
    created = cluster.create(_app(name))
    job_id = created["spec"]["sparkConf"]["spark.sparkguard.jobId"]
    standin = cluster.standin(name)
    standin.stall_runs = {0}  # stalls mid-write until its pod is deleted
    stop = threading.Event()
    runner = threading.Thread(target=standin.serve, args=(stop,), daemon=True)
    runner.start()
    stalled = standin.workdir / "run-0" / "at-mid-write"
    try:
        harness.eventually(stalled.exists, what="the driver to stall mid-write", timeout=60)
        cluster.custom.delete_namespaced_custom_object(
            apache.GROUP, apache.VERSION, cluster.namespace, apache.PLURAL, name
        )
        harness.eventually(
            lambda: cluster.get(name) is None and standin.executors_left() == 0,
            what=f"app {name} to be gone",
            timeout=90,
        )
    finally:
        stop.set()
        runner.join(30)
        standin.cleanup()
    assert "RolledBackOnDelete" in cluster.event_reasons(name)
    table = cluster.workdir / name / "table"
    assert leftovers(table) == []
    # its write had created the location: the rollback on delete removed it
    assert states_of(table, job_id) == []
    assert not table.exists()
