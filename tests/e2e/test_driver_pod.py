"""The marker sidecar never keeps the driver pod alive (issue 11, item 8).

The chart's operator admits an opted-in app on the kube-apiserver bench (v1.37, so the marker
sidecar is injected as a native sidecar); the stand-in for spark-operator runs the mutated
driver pod as the kubelet would: a native sidecar starts among the initContainers and is
stopped once the driver container ended, while a regular sidecar container keeps the pod
Running. The pod must reach a terminal phase and the app COMPLETED.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client

from sparkguard.operator import mutation
from tests.e2e.standin import DriverPodStillRunningError, StandInSparkOperator
from tests.e2e.test_recovery_scenario import ChartOperator, chart_operator  # noqa: F401
from tests.operator.apps import GROUP, PLURAL, VERSION, spark_app

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
    )
    assert standin.run_driver_pod() == "COMPLETED"
    (run,) = standin.runs
    assert run["native_sidecars"] == [mutation.SIDECAR_NAME]
    assert run["exit"] == 0
    assert run["pod_phase"] == "Succeeded"
    assert cluster.state("short") == "COMPLETED"


def test_a_regular_sidecar_container_would_keep_the_pod_running(
    chart_operator: ChartOperator,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    """What the native sidecar avoids, shown with the same stand-in: the pre-1.29 injection."""
    cluster = chart_operator
    created = cluster.create(spark_app("legacy"))
    driver = created["spec"]["driver"]
    (sidecar,) = [c for c in driver["initContainers"] if c["name"] == mutation.SIDECAR_NAME]
    regular = {k: v for k, v in sidecar.items() if k not in ("restartPolicy", "startupProbe")}
    inits = [c for c in driver["initContainers"] if c["name"] != mutation.SIDECAR_NAME]
    client.CustomObjectsApi(cluster.api).patch_namespaced_custom_object(
        GROUP,
        VERSION,
        cluster.namespace,
        PLURAL,
        "legacy",
        {"spec": {"driver": {"initContainers": inits, "sidecars": [regular]}}},
    )
    assert cluster.get("legacy")["spec"]["driver"]["sidecars"] == [regular]  # kept there

    workdir = tmp_path / "pods"
    workdir.mkdir()
    standin = StandInSparkOperator(
        cluster.api,
        namespace=cluster.namespace,
        name="legacy",
        workdir=workdir,
        table=str(tmp_path / "legacy"),
        rows=2_000,
    )
    with pytest.raises(DriverPodStillRunningError, match="stays Running"):
        standin.run_driver_pod()
    assert standin.runs[0]["pod_phase"] == "Running"
    assert cluster.state("legacy") == "RUNNING"
