"""The marker sidecar never keeps the driver pod alive.

The chart's operator admits an opted-in app on the kube-apiserver bench (v1.37, so the marker
sidecar is injected as a native sidecar, or, with ``SPARKGUARD_SIDECAR_NATIVE=false``, as the
regular container Kubernetes < 1.29 gets); the stand-in for spark-operator runs the mutated
driver pod as the kubelet would (see tests/e2e/standin.py): a native sidecar is stopped once
the driver container ended; a regular container is never stopped, the pod ends only when it
exits by itself. Either way the pod must reach a terminal phase and the app COMPLETED. The
native sidecar is stopped whatever the driver runs: its pod runs the light driver
(``light_driver.py``); the regular sidecar watches for the driver's JVM
(``--exit-with-process``): its pods run the demo's Spark job, both on one operator.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkguard.operator import mutation
from tests.e2e.standin import (
    DriverPodStillRunningError,
    StandInSparkOperator,
    pid_namespaces_available,
)
from tests.e2e.test_recovery_scenario import (
    ChartOperator,
    chart_operator,  # noqa: F401
    installed_chart_operator,
)
from tests.kubebench.bench import KubeBench
from tests.operator.apps import spark_app

pytestmark = [pytest.mark.kube, pytest.mark.spark]


def test_driver_pod_reaches_a_terminal_phase(
    chart_operator: ChartOperator,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    cluster = chart_operator
    created = cluster.create(spark_app("short"))
    driver = created["spec"]["driver"]
    (sidecar,) = [c for c in driver["initContainers"] if c["name"] == mutation.SIDECAR_NAME]
    assert sidecar["restartPolicy"] == "Always"
    assert not driver.get("sidecars")

    workdir = tmp_path / "pods"
    workdir.mkdir()
    standin = StandInSparkOperator(
        cluster.api,
        namespace=cluster.namespace,
        name="short",
        workdir=workdir,
        table=str(tmp_path / "short"),
        rows=2_000,
        job="light",
    )
    assert standin.run_driver_pod() == "COMPLETED"
    (run,) = standin.runs
    assert run["native_sidecars"] == [mutation.SIDECAR_NAME]
    assert run["exit"] == 0
    assert run["pod_phase"] == "Succeeded"
    assert cluster.state("short") == "COMPLETED"


@pytest.fixture(scope="module")
def regular_sidecar_operator(
    kube_bench: KubeBench, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ChartOperator]:
    """The chart's operator injecting the regular sidecar (``SPARKGUARD_SIDECAR_NATIVE=false``),
    for both tests of it."""
    workdir = tmp_path_factory.mktemp("regular-sidecar")
    with installed_chart_operator(
        kube_bench, workdir, {"SPARKGUARD_SIDECAR_NATIVE": "false"}
    ) as cluster:
        yield cluster


NEEDS_PID_NAMESPACES = pytest.mark.skipif(
    not pid_namespaces_available(),
    reason="modelling shareProcessNamespace needs PID namespaces (root or user namespaces)",
)


@NEEDS_PID_NAMESPACES
def test_a_regular_sidecar_container_ends_with_the_driver(
    regular_sidecar_operator: ChartOperator,
) -> None:
    """The pre-1.29 injection: the sidecar sees the driver JVM end (shared PID namespace)."""
    cluster = regular_sidecar_operator
    created = cluster.create(spark_app("legacy"))
    driver = created["spec"]["driver"]
    (sidecar,) = driver["sidecars"]
    assert sidecar["name"] == mutation.SIDECAR_NAME
    assert "restartPolicy" not in sidecar
    assert sidecar["command"][-2:] == ["--exit-with-process", mutation.DRIVER_PROCESS_PATTERN]
    assert driver["shareProcessNamespace"] is True
    assert mutation.SIDECAR_NAME not in [c["name"] for c in driver["initContainers"]]

    workdir = cluster.workdir / "legacy" / "pods"  # the module's operator: its allowed root
    workdir.mkdir(parents=True)
    standin = StandInSparkOperator(
        cluster.api,
        namespace=cluster.namespace,
        name="legacy",
        workdir=workdir,
        table=str(cluster.workdir / "legacy" / "table"),
        rows=2_000,
    )
    assert standin.run_driver_pod() == "COMPLETED"
    (run,) = standin.runs
    assert run["shared_processes"]
    assert run["native_sidecars"] == []
    # The stand-in never signals a regular container: the sidecar exited 0 by itself, after
    # the driver, within the stand-in's grace (its bounded wait for a driver that never
    # appears is 300 s).
    assert (run["exit"], run["sidecar_exits"]) == (0, [0])
    assert run["pod_phase"] == "Succeeded"
    assert cluster.state("legacy") == "COMPLETED"


@NEEDS_PID_NAMESPACES
def test_without_a_shared_process_namespace_the_regular_sidecar_keeps_the_pod_running(
    regular_sidecar_operator: ChartOperator,
) -> None:
    """Why the operator sets shareProcessNamespace: without it the sidecar never sees the driver.

    The app still ends (spark-operator reads the driver container's exit while the pod is
    Running); the pod, with everything it requested, does not.
    """
    cluster = regular_sidecar_operator
    mutated = cluster.create(spark_app("shared"))
    # The same driver pod without the shared namespace. Admission would put it back on any
    # opted-in app, so this copy does not opt in (the stand-in only reads the spec).
    spec = copy.deepcopy(mutated["spec"])
    del spec["driver"]["shareProcessNamespace"]
    unshared = {"apiVersion": mutated["apiVersion"], "kind": mutated["kind"], "spec": spec}
    cluster.create({**unshared, "metadata": {"name": "unshared"}})
    assert "shareProcessNamespace" not in cluster.get("unshared")["spec"]["driver"]
    assert cluster.get("unshared")["spec"]["driver"]["sidecars"] == spec["driver"]["sidecars"]

    workdir = cluster.workdir / "unshared" / "pods"  # the module's operator: its allowed root
    workdir.mkdir(parents=True)
    standin = StandInSparkOperator(
        cluster.api,
        namespace=cluster.namespace,
        name="unshared",
        workdir=workdir,
        table=str(cluster.workdir / "unshared" / "table"),
        rows=2_000,
    )
    standin.sidecar_grace_s = 5.0  # it would wait exit_with_process_wait_s (300 s) in vain
    with pytest.raises(DriverPodStillRunningError, match="stays Running"):
        standin.run_driver_pod()
    assert standin.runs[0]["pod_phase"] == "Running"
    assert not standin.runs[0]["shared_processes"]
    assert cluster.state("unshared") == "COMPLETED"
