"""The recovery matrix: {restartPolicy Never, OnFailure} x {where the driver dies}.

Each case runs on the real kube-apiserver bench with the chart's operator (one per module) and
the spark-operator stand-in (``tests/e2e/standin.py``, a model of upstream) running the
*mutated* driver pod with the light driver (``light_driver.py``: sparkguard's Python writer,
no Spark JVM, one task in a lingering executor process). The first driver is SIGKILLed:

* ``before-files``: the instant is inflight, no data file yet (the executor is still to write);
* ``mid-write``: one task's file is published, the others not, nothing committed;
* ``after-commit``: the outcome is written, the driver dies before it exits.

With spark-operator's 2.x CRD (the native marker sidecar): mid-write under both policies and
after-commit under Never (:data:`MODEL_CASES`; the whole matrix runs on upstream's real operator
in ``test_recovery_on_node.py``); with the 1.x CRD (the regular sidecar) mid-write, the case
where the sidecars differ (see its test's docstring).

Never: spark-operator makes the failure FAILED, sparkguard rolls back and resubmits. After a
commit (outcome written) sparkguard resubmits too, and the rerun's writer skips the committed
write (``rerun=skip``). OnFailure (``onFailureRetries: 1``):
spark-operator itself reruns the driver (FAILING → PENDING_RERUN, FAILED never shown) and the
rerun's rollback initContainer cleans up; sparkguard does nothing. Every case: every row
exactly once, resubmissions as expected (none doubled, none missing), nothing uncommitted or
temporary left once the lingering executor is gone.
"""

from __future__ import annotations

import time
from typing import Any, Final

import pytest

from sparkguard.operator import appmeta
from sparkguard.spark_lib.storage import timeline
from tests.e2e import transitions
from tests.e2e.conftest import (
    leftovers,
    light_standin,
    model_did,
    rows_once,
    serve_until,
    states_of,
)
from tests.e2e.test_recovery_scenario import ChartOperator
from tests.operator.apps import spark_app

pytestmark = [pytest.mark.kube]

POLICIES: Final[dict[str, dict[str, Any] | None]] = {
    "Never": None,
    "OnFailure": {"type": "OnFailure", "onFailureRetries": 1, "onFailureRetryInterval": 1},
}


#: (policy, kill point) on the model: mid-write under both policies; after-commit under Never,
#: where sparkguard's resubmission meets a committed write of the Python writer (rerun=skip).
#: Every other cell of the matrix runs on upstream's real operator with real pods and the JVM
#: layer (test_recovery_on_node.py); the Python writer's kill points without an operator are
#: tests/spark_lib's.
MODEL_CASES: Final = [("Never", "mid-write"), ("OnFailure", "mid-write"), ("Never", "after-commit")]


@pytest.mark.parametrize(("policy", "kill_point"), MODEL_CASES)
def test_recovery(
    model_operator: ChartOperator, crd_version: str, policy: str, kill_point: str
) -> None:
    """The model's cells of the matrix (:data:`MODEL_CASES`), spark-operator's 2.x CRD: the
    native sidecar."""
    _recovery(model_operator, crd_version, policy, kill_point)


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("crd_version", ["1.x"], indirect=True, scope="module")
def test_recovery_with_the_regular_sidecar(
    model_operator: ChartOperator, crd_version: str, policy: str
) -> None:
    """The 1.x CRD (admission injects the regular sidecar) under both policies, mid-write:
    the CRD only decides which sidecar the pod runs, and what a kill point leaves (the writer's
    and the rollback's part) is the same under either, so 1.x's before-files and after-commit
    would run what ``test_recovery`` runs; mid-write (a published file, an executor still to
    write, the regular sidecar ending with the killed driver) is the case that tells the
    sidecars apart."""
    _recovery(model_operator, crd_version, policy, "mid-write")


def _recovery(cluster: ChartOperator, crd_version: str, policy: str, kill_point: str) -> None:
    name = f"m{crd_version[0]}-{policy.lower()}-{kill_point}"
    extra: dict[str, Any] = {"restartPolicy": POLICIES[policy]} if POLICIES[policy] else {}
    created = cluster.create(spark_app(name, annotations={appmeta.BACKOFF: "1s"}, **extra))
    # The 1.x CRD prunes a container's restartPolicy: there the operator chose the regular
    # marker sidecar, and the pod runs with it; 2.x keeps the native one.
    driver = created["spec"]["driver"]
    native = [c for c in driver.get("initContainers", []) if c.get("restartPolicy") == "Always"]
    assert bool(native) is (crd_version == "2.x"), driver
    if crd_version == "1.x":
        assert [c["name"] for c in driver.get("sidecars", [])], driver
    job_id = created["spec"]["sparkConf"]["spark.sparkguard.jobId"]
    standin = light_standin(cluster, name)
    standin.kill_runs = {0}
    standin.kill_point = kill_point
    table = cluster.workdir / name / "table"
    committed_first = kill_point == "after-commit"
    never = policy == "Never"

    def done() -> bool:
        if never:
            return cluster.notes(name).get(appmeta.PHASE) == "Succeeded"
        return cluster.state(name) == "COMPLETED"

    started = time.monotonic()
    serve_until(standin, done, what=f"app {name} to end")
    seconds = time.monotonic() - started
    print(f"\n{name}: {seconds:.1f}s, runs {[r['ended_by'] for r in standin.runs]}")
    reasons = cluster.event_reasons(name)
    if crd_version == "2.x":
        # the differential test: the model wrote what upstream v2.5.2 writes in the same
        # scenario (test_recovery_on_node.py checks the real operator against the same table)
        did = model_did(cluster, standin)
        assert did == transitions.SCENARIOS["killed", policy], did

    # The first driver died where asked; its lingering executor is gone now. Before a commit
    # it was still to write when its driver died: its late marker was refused (the old pod's
    # sidecar is gone, or the next one refuses an instant already decided), or its file has
    # a name the rerun commits (checked below: nothing uncommitted).
    assert standin.runs[0]["ended_by"] == "killed"
    assert standin.executors_left() == 0
    trail = standin.workdir / "run-0" / "executor-3.log"
    if not committed_first:
        print(f"lingering executor: {trail.read_text()[:300]}")
        assert trail.read_text().split()[1] in ("failed:", "wrote")
    # Resubmissions: sparkguard's, only under Never.
    resubmits = 1 if never else 0
    assert reasons.count("Resubmitted") == resubmits
    if never:
        assert "RollbackStarted" in reasons
        assert len(standin.runs) == 1 + resubmits
        assert cluster.notes(name)[appmeta.ATTEMPT] == str(resubmits)
    else:
        # spark-operator reran the driver itself: FAILED was never written, sparkguard stayed
        # out, and the rerun is the same generation (no spec change).
        assert "FAILED" not in standin.states
        assert "RollbackStarted" not in reasons
        assert len(standin.runs) == 2
        assert standin.runs[1]["generation"] == standin.runs[0]["generation"]
        assert [r["executionAttempts"] for r in standin.runs] == [1, 2]
    # The table: every row exactly once, nothing uncommitted or temporary left.
    assert rows_once(table) == (4_000, 0, 0)
    assert leftovers(table) == []
    # A first write rolled back removes the location it created ("The life of a table"): the
    # rerun's commit is the table's only instant either way.
    assert states_of(table, job_id) == [timeline.State.COMMITTED]


def test_an_executor_lingering_ten_seconds_writes_nothing_into_the_rerun(
    model_operator: ChartOperator,
) -> None:
    """An executor that outlives its killed driver by 10 s (a cluster's 10 to 30 s before it
    notices or is garbage-collected): it tries its task's file after sparkguard rolled its
    write back, typically while the resubmitted driver's write of the *same file names* is in
    flight (its executor is as slow). Its
    marker names a decided instant, so it is refused and the executor writes nothing; the
    table ends with every row once and nothing uncommitted."""
    cluster = model_operator
    name = "m-linger-10s"
    created = cluster.create(spark_app(name, annotations={appmeta.BACKOFF: "1s"}))
    job_id = created["spec"]["sparkConf"]["spark.sparkguard.jobId"]
    standin = light_standin(cluster, name)
    standin.kill_runs = {0}
    standin.kill_point = "mid-write"
    standin.executor_delay_s = 10.0  # every run's executor: the rerun's writes late too
    standin.executor_linger_s = 12.0
    serve_until(
        standin,
        lambda: cluster.notes(name).get(appmeta.PHASE) == "Succeeded",
        what=f"app {name} to end",
        timeout=180,
    )
    first, rerun = standin.runs
    assert (first["ended_by"], rerun["ended_by"]) == ("killed", "exited")
    late = (standin.workdir / "run-0" / "executor-3.log").read_text()
    # The late executor tried after its driver's death and after the rollback: refused.
    assert late.split()[1] == "failed:", late
    assert "already decided" in late, late
    # When, relative to the rerun's write (opened: the driver step done; its last task done):
    # on an idle bench about 5 s after it opened and 5 s before its last task, the same file
    # name (partition 3) being the rerun's to write. Not asserted: under load the rerun may
    # start later, and the late attempt must be refused whenever it comes.
    opened = (standin.workdir / "run-1" / "writer.pickle").stat().st_mtime
    last_task = (standin.workdir / "run-1" / "executor-3.json").stat().st_mtime
    attempt = late.split()[0]
    print(f"\nrerun opened {opened:.2f}, late attempt {attempt}, rerun's task {last_task:.2f}")
    table = cluster.workdir / name / "table"
    assert rows_once(table) == (4_000, 0, 0)
    assert leftovers(table) == []
    assert states_of(table, job_id) == [timeline.State.COMMITTED]
