"""Fixtures of the e2e tier's light tests: one chart operator per module, the CRD axis."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkguard.spark_lib.storage import reader, timeline
from tests.chart import operator_harness as harness
from tests.e2e import transitions
from tests.e2e.standin import StandInSparkOperator
from tests.e2e.test_recovery_scenario import ChartOperator, installed_chart_operator
from tests.kubebench.bench import KubeBench

#: the light driver's rows per app (ids 0..ROWS-1, 4 partitions)
LIGHT_ROWS = 4_000


@pytest.fixture(scope="module", params=["2.x"])
def crd_version(request: pytest.FixtureRequest) -> str:
    """The spark-operator CRD the bench serves while a module's operator runs: "2.x" unless the
    module parametrizes it (``indirect``, module scope), as the recovery matrix does with
    {"2.x", "1.x"}."""
    return str(request.param)


@pytest.fixture(scope="module")
def model_operator(
    kube_bench: KubeBench, tmp_path_factory: pytest.TempPathFactory, crd_version: str
) -> Iterator[ChartOperator]:
    """The chart's operator for a whole module of light tests (installing it per test would
    cost more than a light case), started after spark-operator ``crd_version``'s CRD is in
    effect (the operator reads it to choose a native or regular sidecar); the bench's own CRD
    is put back afterwards. ``SPARKGUARD_RESUBMIT_TIMEOUT`` is 3 s, so a dropped rerun is
    nudged within the test."""
    from tests.operator.test_crd_roundtrip import use_crd

    before = kube_bench.spark_operator
    probe = "sg-crd-probe"  # where use_crd creates its probe apps
    kube_bench.ensure_namespace(probe)
    if crd_version != before:
        use_crd(kube_bench, crd_version, probe)
    workdir = tmp_path_factory.mktemp("e2e-light")
    env = {"SPARKGUARD_RESUBMIT_TIMEOUT": "3s"}
    try:
        with installed_chart_operator(kube_bench, workdir, env) as cluster:
            yield cluster
    finally:
        if crd_version != before:
            use_crd(kube_bench, before, probe)


def light_standin(cluster: ChartOperator, name: str, **kwargs: Any) -> StandInSparkOperator:
    """A stand-in running app ``name``'s driver pods with the light driver, its table and pods
    under ``<workdir>/<name>/``."""
    base = cluster.workdir / name
    (base / "pods").mkdir(parents=True)
    return StandInSparkOperator(
        cluster.api,
        namespace=cluster.namespace,
        name=name,
        workdir=base / "pods",
        table=str(base / "table"),
        rows=LIGHT_ROWS,
        partitions=4,
        job="light",
        **kwargs,
    )


def model_did(cluster: ChartOperator, standin: StandInSparkOperator) -> transitions.Trace:
    """The differential test's model side: the states ``standin`` wrote to its app's status
    (the bench's audit log, read as upstream's is) and its driver pod actions."""
    events = cluster.bench.audit_events()
    states = transitions.written_states(events, cluster.namespace, standin.name)
    return transitions.Trace(tuple(states), tuple(standin.driver_pods))


def serve_until(
    standin: StandInSparkOperator, done: Callable[[], bool], *, what: str, timeout: float = 120
) -> None:
    """Run the stand-in's controller until ``done()`` and its lingering executors are gone."""
    stop = threading.Event()
    runner = threading.Thread(target=standin.serve, args=(stop,), daemon=True)
    runner.start()
    try:
        harness.eventually(
            lambda: done() and standin.executors_left() == 0, what=what, timeout=timeout
        )
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\nruns: {standin.runs}\nstates: {standin.states}\n"
            f"errors: {standin.errors[-5:]}\nevents: {standin.events}"
        ) from None
    finally:
        stop.set()
        runner.join(30)
        standin.cleanup()


def rows_once(table: Path, *, rows: int = LIGHT_ROWS) -> tuple[int, int, int]:
    """(rows read, duplicates, missing ids) of the committed files of ``table``."""
    import pyarrow.parquet as pq

    ids: list[int] = []
    for path in reader.committed_paths(str(table)):
        ids.extend(pq.read_table(path, columns=["id"]).column("id").to_pylist())
    counts = collections.Counter(ids)
    duplicates = sum(n - 1 for n in counts.values() if n > 1)
    return len(ids), duplicates, len(set(range(rows)) - set(ids))


def leftovers(table: Path) -> list[str]:
    """Data files no committed instant lists, and temp files: what must never stay."""
    if not table.exists():
        return []
    committed = {Path(p).name for p in reader.committed_paths(str(table))}
    return sorted(
        p.name
        for p in table.rglob("*")
        if p.is_file()
        and timeline.SPARKGUARD_DIR not in p.relative_to(table).parts
        and (p.name not in committed or ".sg-tmp-" in p.name)
    )


def states_of(table: Path, job_id: str) -> list[timeline.State]:
    """The job's instants on ``table``, oldest first."""
    if not table.exists():
        return []
    return [s.state for s in timeline.timeline_for(str(table)).statuses(job_id=job_id)]


def wait_for(condition: Callable[[], bool], *, what: str, timeout: float = 60) -> None:
    """Poll ``condition`` every 20 ms until true, or fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.02)
