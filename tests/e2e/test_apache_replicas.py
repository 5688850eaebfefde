"""An Apache app's final failure with the chart's two replicas, the leader SIGKILLed mid-recovery.

The replicas run as ``sparkguard operator`` processes (``chart_replicas`` of
``test_recovery_scenario.py``); the Apache stand-in runs the app with the light driver. The
user's ``restartConfig`` is Never and ``max-retries`` 1: the first driver is killed mid-write, the
failure is final at once; the leader claims and rolls it back and is killed before its
recreation (backoff 4 s); the other replica takes the Lease and the claim over and recreates the
app, once: one recreation, one ``Resubmitted``, every row once.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest
from kubernetes import client

from sparkguard.operator import appmeta
from sparkguard.spark_lib.storage import timeline
from tests.chart import operator_harness as harness
from tests.e2e import apache_standin as apache
from tests.e2e.conftest import LIGHT_ROWS, leftovers, rows_once, states_of
from tests.e2e.test_recovery_scenario import ChartReplicas, chart_replicas
from tests.kubebench.bench import APACHE_SPARK_OPERATOR_CRD, KubeBench
from tests.operator.apps import apache_app
from tests.support import yamlfast

pytestmark = [pytest.mark.kube]
__all__ = ["chart_replicas"]  # the fixture, used here


@pytest.fixture(scope="module")
def apache_crd(kube_bench: KubeBench) -> None:
    """The Apache CRD, installed before the replicas start (and left: another group's CRD)."""
    kube_bench.apply_manifest(yamlfast.load_all(APACHE_SPARK_OPERATOR_CRD.read_text()))
    kube_bench.wait_for_crd(f"{apache.PLURAL}.{apache.GROUP}")


def test_the_leader_killed_mid_recovery_the_other_replica_recreates_once(
    apache_crd: None, chart_replicas: ChartReplicas, tmp_path: Path
) -> None:
    cluster = chart_replicas
    custom = client.CustomObjectsApi(cluster.api)
    name = "orders"

    def get() -> dict[str, object] | None:
        try:
            found: dict[str, object] = custom.get_namespaced_custom_object(
                apache.GROUP, apache.VERSION, cluster.namespace, apache.PLURAL, name
            )
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return found

    def notes() -> dict[str, str]:
        return dict(appmeta.of(get() or {}))

    app = apache_app(name, annotations={appmeta.BACKOFF: "4s", appmeta.MAX_RETRIES: "1"})
    app["spec"]["applicationTolerations"] = {"restartConfig": {"restartPolicy": "Never"}}
    app["metadata"]["namespace"] = cluster.namespace

    def admitted() -> bool:  # replica b's webhook serves the kind (CRD just installed)
        created = custom.create_namespaced_custom_object(
            apache.GROUP, apache.VERSION, cluster.namespace, apache.PLURAL, app
        )
        if "spark.sparkguard.jobId" in created["spec"]["sparkConf"]:
            return True
        custom.delete_namespaced_custom_object(
            apache.GROUP, apache.VERSION, cluster.namespace, apache.PLURAL, name
        )
        harness.eventually(lambda: get() is None, what="the unadmitted app to go")
        return False

    harness.eventually(admitted, what="the Apache webhook", timeout=60)
    created = get()
    assert created is not None
    old_uid = str(created["metadata"]["uid"])  # type: ignore[index]
    job_id = str(created["spec"]["sparkConf"]["spark.sparkguard.jobId"])  # type: ignore[index]
    (tmp_path / "pods").mkdir()
    standin = apache.StandInApacheOperator(
        cluster.api, namespace=cluster.namespace, name=name, workdir=tmp_path / "pods",
        table=str(tmp_path / "table"), rows=LIGHT_ROWS, partitions=4,
    )  # fmt: skip
    standin.kill_runs = {0}
    killed_in: list[str] = []
    done = threading.Event()

    def kill_the_leader() -> None:
        while not done.is_set():
            phase = notes().get(appmeta.PHASE)
            if phase in ("Recovering", "RolledBack"):
                cluster.processes["a"].send_signal(signal.SIGKILL)
                killed_in.append(phase)
                return
            time.sleep(0.02)

    def recreated_and_done() -> bool:
        found = get()
        return (
            found is not None
            and found["metadata"]["uid"] != old_uid  # type: ignore[index]
            and appmeta.of(found).get(appmeta.PHASE) == "Succeeded"
            and standin.executors_left() == 0
        )

    killer = threading.Thread(target=kill_the_leader, daemon=True)
    killer.start()
    stop = threading.Event()
    runner = threading.Thread(target=standin.serve, args=(stop,), daemon=True)
    runner.start()
    try:
        harness.eventually(recreated_and_done, what="the app to be recreated", timeout=180)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nruns: {standin.runs}\n{cluster.output()}") from exc
    finally:
        done.set()
        stop.set()
        killer.join(10)
        runner.join(30)
        standin.cleanup()
    assert cluster.processes["a"].poll() == -signal.SIGKILL
    assert killed_in[0] in ("Recovering", "RolledBack")
    assert cluster.lease_holder().startswith(f"{cluster.release.name}-operator-b-")
    assert [r["ended_by"] for r in standin.runs] == ["killed", "exited"]
    reasons = cluster.event_reasons(name)
    assert reasons.count("Resubmitted") == 1, reasons
    assert appmeta.of(get() or {})[appmeta.RESUBMITTED_FROM] == old_uid
    table = tmp_path / "table"
    assert rows_once(table) == (LIGHT_ROWS, 0, 0)
    assert leftovers(table) == []
    # the killed first write had created the location: its rollback removes it ("The life of
    # a table"), also when the killed leader left a temp file of the instant's .rolledback
    assert states_of(table, job_id) == [timeline.State.COMMITTED]
