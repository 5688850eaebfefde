"""``recovery.py --real-operator``: a driver's death to the next driver's first task, on
upstream's own spark-operator with real pods.

On ``KubeCluster(node=True)`` (tests/kubebench: upstream's Kubeflow spark-operator v2.5.2,
controller and webhook; the real kubelet behind the bench's runtime) with sparkguard's chart
operator, the namespace and volume of ``tests/e2e/test_recovery_on_node.py``. The same job (the
demo's unchanged PySpark job, cluster mode, one executor pod) runs as three apps, one after
another, each round in a new order:

* ``upstream``: not opted in, ``restartPolicy: OnFailure`` (one retry, 1 s apart): what a
  platform has today, spark-operator's own restart, no rollback;
* ``sparkguard``: opted in, ``restartPolicy: Never``: spark-operator makes the app FAILED and
  sparkguard rolls the write back and resubmits it (its backoff set to the same 1 s);
* ``sparkguard-onfailure``: opted in, OnFailure as ``upstream``: spark-operator's restart, the
  next driver's rollback initContainer undoing the write.

Each first driver's JVM is SIGKILLed once its first task runs (its executor's log says
``Running task``: the demo job quiets the driver's own log). Timed: from the kill to the first
``Running task`` of the next driver's executor (the container log's own timestamps, written by
the bench's runtime as a kubelet's CRI does), so everything sparkguard adds is in it: its wait
for FAILED, the rollback, the resubmission, the extra initContainers. Reported per mode
(median over ``--rounds``) and the ratio of each sparkguard mode to ``upstream``.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

from _common import log

from sparkguard.operator import appmeta
from tests.e2e import test_recovery_on_node as node
from tests.e2e.test_spark_on_node import get
from tests.kubebench.cluster import KubeCluster

#: mode → (opted in, restartPolicy)
MODES: dict[str, tuple[bool, str]] = {
    "upstream": (False, "OnFailure"),
    "sparkguard": (True, "Never"),
    "sparkguard-onfailure": (True, "OnFailure"),
}
EXECUTOR_CONTAINER = "spark-kubernetes-executor"
FIRST_TASK = "Running task "


def first_task_at(log_text: str) -> float | None:
    """The time (epoch seconds) of the first ``Running task`` line of an executor's CRI
    container log (``<RFC 3339 nano> <stream> <tag> <line>``), or None. A purely computational
    function."""
    for line in log_text.splitlines():
        stamp, _, rest = line.partition(" ")
        if FIRST_TASK in rest:
            return _epoch(stamp)
    return None


def _epoch(stamp: str) -> float:
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    at = datetime.datetime.fromisoformat(whole).replace(tzinfo=datetime.UTC)
    return at.timestamp() + (float(f"0.{fraction}") if fraction else 0.0)


def _first_task(cluster: KubeCluster, name: str, driver_uid: str) -> float | None:
    """When the executor of app ``name``'s driver pod ``driver_uid`` ran its first task."""
    assert cluster.node is not None
    selector = f"spark-role=executor,sparkoperator.k8s.io/app-name={name}"
    for pod in node.pods(cluster, selector):
        meta = pod["metadata"]
        if not any(r.get("uid") == driver_uid for r in meta.get("ownerReferences") or []):
            continue
        pattern = f"{node.NAMESPACE}_{meta['name']}_{meta['uid']}/{EXECUTOR_CONTAINER}/*.log"
        logs = sorted(cluster.node.pod_logs.glob(pattern))
        at = first_task_at("\n".join(p.read_text(errors="replace") for p in logs))
        if at is not None:
            return at
    return None


def _app(protected: node.Protected, name: str, mode: str) -> dict[str, Any]:
    opted_in, policy = MODES[mode]
    app = node.protected_app(name, protected.data, protected.data / name, policy=policy)
    if not opted_in:
        del app["metadata"]["labels"][appmeta.ENABLED]
        del app["metadata"]["annotations"][appmeta.BACKOFF]
    return app


def restart_seconds(protected: node.Protected, name: str, mode: str) -> float:
    """Run app ``name`` in ``mode``, kill its first driver's JVM at its first task, and return
    the seconds until the next driver's first task; the app is deleted after."""
    cluster = protected.cluster
    pod = f"{name}-driver"
    protected.chart.create(_app(protected, name, mode))
    try:

        def first_driver_working() -> dict[str, Any] | None:
            found = get(cluster, f"{node.PODS}/{pod}")
            if found and _first_task(cluster, name, found["metadata"]["uid"]):
                return found
            return None

        first = node.wait_for(
            f"{name}'s first task", first_driver_working, timeout=600, report=lambda: ""
        )
        pid = node.driver_jvm()
        assert pid is not None, f"no driver JVM of {name}"
        os.kill(pid, signal.SIGKILL)
        killed = time.time()

        def next_driver_working() -> float | None:
            found = get(cluster, f"{node.PODS}/{pod}")
            if not found or found["metadata"]["uid"] == first["metadata"]["uid"]:
                return None
            return _first_task(cluster, name, found["metadata"]["uid"])

        started = node.wait_for(
            f"{name}'s next driver's first task",
            next_driver_working,
            timeout=600,
            report=lambda: node.node_report(cluster, name),
        )
        return float(started) - killed
    finally:
        cluster.request("DELETE", f"{node.APPS}/{name}")
        node.wait_for(
            f"{name}'s pods to go",
            lambda: not node.pods(cluster, f"sparkoperator.k8s.io/app-name={name}"),
            timeout=180,
            report=lambda: "",
        )


@contextlib.contextmanager
def _protected() -> Iterator[node.Protected]:
    with (
        KubeCluster(job_namespaces=[node.NAMESPACE], node=True) as cluster,
        node.protected_namespace(cluster) as protected,
    ):
        yield protected


def run(rounds: int) -> str:
    """``rounds`` rounds of the three modes; the summary line."""
    # a SIGTERM (timeout, Ctrl-C's kin) unwinds the cluster's context: no node left behind
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
    order = list(MODES)
    with _protected() as protected:
        for n in range(rounds):
            for mode in order:
                took = restart_seconds(protected, f"restart-{n}-{mode}", mode)
                seconds[mode].append(took)
                log(f"round {n} {mode}: {took:.1f}s from the kill to the next driver's first task")
            order = order[1:] + order[:1]
    median = {mode: statistics.median(values) for mode, values in seconds.items()}
    for mode in MODES:
        log(f"{mode}: median {median[mode]:.1f}s, rounds {[round(v, 1) for v in seconds[mode]]}")
    ratio = median["sparkguard"] / median["upstream"]
    ratio_onfailure = median["sparkguard-onfailure"] / median["upstream"]
    return (
        f"restart on the real spark-operator: upstream={median['upstream']:.1f}s "
        f"sparkguard={median['sparkguard']:.1f}s "
        f"sparkguard-onfailure={median['sparkguard-onfailure']:.1f}s "
        f"sparkguard/upstream={ratio:.2f} sparkguard-onfailure/upstream={ratio_onfailure:.2f}"
    )
