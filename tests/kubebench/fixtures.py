"""pytest plugin: the session-scoped ``kube_bench`` fixture (a started :class:`KubeBench`) and
``kube_cluster`` (a started :class:`~tests.kubebench.cluster.KubeCluster`: a bench of its own with
kube-controller-manager, kube-scheduler and upstream's spark-operator), and the module-scoped
``apache_operator_bench`` (a started :class:`~tests.kubebench.apache.ApacheOperatorBench`: a bench
of its own with the Apache Spark Kubernetes Operator, built from its release source) and
``kube_node_cluster`` (the same as ``kube_cluster`` with a node: the real kubelet and the
bench's runtime), and ``apache_node_bench`` (``apache_operator_bench`` with such a node).

Register from the root conftest with ``pytest_plugins = ["tests.kubebench.fixtures"]``.

* Tests that request any of them get the ``kube`` marker automatically
  (``-m "not kube"`` deselects them); mark tests that reach the bench indirectly with
  ``@pytest.mark.kube``.
* The binaries are built by the first bench fixture of the run (under pytest-xdist: on the one
  worker that runs the bench tests, while the other runs the rest). Until then a bench test's
  ``pytest-timeout`` is longer by the build's budget, so a cold build (minutes) never counts
  against it. A failed build makes every bench test *error* with the build's output; nothing
  is skipped.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Final, TypeVar

import pytest

from tests.kubebench.apache import ApacheOperatorBench
from tests.kubebench.bench import KubeBench, KubeBenchError
from tests.kubebench.cluster import KubeCluster
from tests.kubebench.node import host_sysctls

#: the prefix of the bench modules' xdist groups (:func:`bench_group`)
BENCH_GROUP = "kube"
#: the fixtures that start a bench (their tests are marked ``kube``)
BENCH_FIXTURES = (
    "kube_bench",
    "kube_cluster",
    "kube_node_cluster",
    "apache_operator_bench",
    "apache_node_bench",
)
#: the fixtures that start a node (one at a time: they share its bridge and pod network)
NODE_FIXTURES = frozenset({"kube_node_cluster", "apache_node_bench"})
#: the namespace where ``kube_cluster``'s spark-operator watches SparkApplications
CLUSTER_JOB_NAMESPACE = "spark-jobs"
#: the namespace where ``apache_operator_bench``'s operator watches SparkApplications
APACHE_JOB_NAMESPACE = "spark-apps"
#: JOSDK's rate limiter at upstream's defaults (5 reconciles per app in 15 s) holds an app's
#: reconciles back by up to 15 s in a restart; the tests' apps reconcile more often
APACHE_RATE: Final = {"spark.kubernetes.operator.reconciler.rateLimiter.maxLoopForPeriod": "50"}


def pytest_configure(config: pytest.Config) -> None:
    # Also registered by the project's pytest config; repeating it is harmless and keeps this
    # plugin usable on its own (--strict-markers).
    config.addinivalue_line(
        "markers", "kube: needs the real kube-apiserver test bench (tests.kubebench)"
    )
    if not config.pluginmanager.has_plugin("kubebench-tally"):
        config.pluginmanager.register(_KubeTally(), "kubebench-tally")


def _needs_bench(item: pytest.Item) -> bool:
    fixturenames = getattr(item, "fixturenames", ())
    uses_bench = any(f in fixturenames for f in BENCH_FIXTURES)
    return uses_bench or item.get_closest_marker("kube") is not None


@pytest.hookimpl(tryfirst=True)  # before `-m` deselection reads the markers
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    for item in items:
        fixturenames = getattr(item, "fixturenames", ())
        if any(f in fixturenames for f in BENCH_FIXTURES) and not item.get_closest_marker("kube"):
            item.add_marker(pytest.mark.kube)
        if _needs_bench(item):
            item.add_marker(pytest.mark.xdist_group(bench_group(item)))


def bench_group(item: pytest.Item) -> str:
    """The xdist group of a bench test (``--dist loadgroup``): every test of a cluster that
    costs minutes to start shares its group (one cluster per run: ``kube-node`` for the
    node's modules, which also share the node's bridge and pod network, ``kube-apache``,
    ``kube-cluster``); the tests on the session's plain bench are grouped by module
    (``kube:<file>``), so both workers take bench modules and each starts a bench of its own
    (kube-apiserver + etcd: seconds) once. Namespaces and names are per test, so two benches
    share nothing."""
    fixturenames = set(getattr(item, "fixturenames", ()))
    if NODE_FIXTURES & fixturenames:
        return "kube-node"
    if "apache_operator_bench" in fixturenames:
        return "kube-apache"
    if "kube_cluster" in fixturenames:
        return "kube-cluster"
    return f"{BENCH_GROUP}:{item.nodeid.split('::', 1)[0]}"


#: the extra time the first bench test of a process may take while it builds kube-apiserver
#: and etcd (a cold build takes 8 to 20 minutes on 2 cores; build.sh's own limit is 3 hours)
BUILD_BUDGET_SECONDS: Final = 3 * 3600.0
#: a bench started in this process: the binaries are there
_STARTED = pytest.StashKey[bool]()
#: a cluster started in this process: the spark-operator is built too
_CLUSTER_STARTED = pytest.StashKey[bool]()
#: an Apache operator bench started in this process: that operator is built too
_APACHE_STARTED = pytest.StashKey[bool]()


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    """pytest-timeout's timer of a bench test, longer by the build's budget until this process
    has the binaries. The build runs in the bench fixture of the one worker that runs the bench
    tests (loadgroup), so the other worker runs every other test meanwhile, instead of both
    waiting for the build at collection; and the build never counts against a test's limit."""
    built = item.config.stash.get(_STARTED, False)
    if {"kube_cluster", "kube_node_cluster"} & set(getattr(item, "fixturenames", ())):
        built = item.config.stash.get(_CLUSTER_STARTED, False)
    if {"apache_operator_bench", "apache_node_bench"} & set(getattr(item, "fixturenames", ())):
        built = item.config.stash.get(_APACHE_STARTED, False)
    if built or not _needs_bench(item):
        return None
    import pytest_timeout

    longer = settings._replace(timeout=settings.timeout + BUILD_BUDGET_SECONDS)
    result: bool | None = pytest_timeout.pytest_timeout_set_timer(item=item, settings=longer)
    return result


@pytest.fixture(scope="session")
def kube_bench(request: pytest.FixtureRequest) -> Iterator[KubeBench]:
    """A running kube-apiserver + etcd with the SparkApplication CRD installed; the first one
    of a machine builds them from Go modules (``build.sh``; a failure raises
    :class:`KubeBenchError` with the build's output, and the bench tests error: never a skip)."""
    bench = KubeBench()
    try:
        bench.start()
        request.config.stash[_STARTED] = True
        yield bench
    finally:
        bench.stop()


@pytest.fixture(scope="module")
def kube_cluster(request: pytest.FixtureRequest) -> Iterator[KubeCluster]:
    """One per test module (its controllers idling through the rest of a run would cost more
    CPU than a second start: about 20 s). A cluster of its own (apiserver, etcd,
    kube-controller-manager, kube-scheduler) with
    upstream's spark-operator (controller and webhook, the chart's arguments and RBAC)
    watching ``spark-jobs``; built from Go modules and the release source the first time on a
    machine (``build.sh``, ``build-spark-operator.sh``). Apart from ``kube_bench``: its
    controllers (garbage collection, namespaces, ServiceAccounts) and upstream's CRDs would
    change what the bench's other tests see."""
    yield from _started(request, KubeCluster(job_namespaces=[CLUSTER_JOB_NAMESPACE]))


@pytest.fixture(scope="module")
def kube_node_cluster(request: pytest.FixtureRequest) -> Iterator[KubeCluster]:
    """A cluster like ``kube_cluster`` with a node: the real kubelet and the bench's container
    runtime (``tests/kubebench/node.py``), so upstream's spark-operator gets real pods. One per
    test module (it holds a kubelet, the drivers' and executors' JVMs), stopped after it with
    nothing left (no process, mount, pod network or kernel setting of its own)."""
    yield from _with_node(request, KubeCluster(job_namespaces=[CLUSTER_JOB_NAMESPACE], node=True))


def _with_node(
    request: pytest.FixtureRequest,
    cluster: _Started,
    key: pytest.StashKey[bool] = _CLUSTER_STARTED,
) -> Iterator[_Started]:
    """:func:`_started` for a cluster with a node, which must leave nothing behind: no process,
    mount or pod network of its own, the host's kernel settings as they were."""
    sysctls = host_sysctls()
    yield from _started(request, cluster, key)
    left = _node_leftovers(cluster)
    if any(left.values()) or host_sysctls() != sysctls:
        raise KubeBenchError(
            f"the node left {left}; kernel settings before {sysctls}, after {host_sysctls()}"
        )


def _node_leftovers(cluster: KubeCluster, *, within: float = 15.0) -> dict[str, list[str]]:
    """What the stopped node left, once it stays: processes of its PID namespace SIGKILLed by
    the stop can take a moment to be gone (a busy pod's many threads), a real leak stays."""
    if cluster.node is None:
        return {}
    deadline = time.monotonic() + within
    left = cluster.node.leftovers()
    while any(left.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
        left = cluster.node.leftovers()
    return left


_Started = TypeVar("_Started", KubeCluster, ApacheOperatorBench)


def _started(
    request: pytest.FixtureRequest,
    bench: _Started,
    key: pytest.StashKey[bool] = _CLUSTER_STARTED,
) -> Iterator[_Started]:
    """Start ``bench`` (a cluster or the Apache bench), note it under ``key`` (what
    ``pytest_timeout_set_timer`` reads), yield it, stop it."""
    try:
        bench.start()
        request.config.stash[_STARTED] = True
        request.config.stash[key] = True
        yield bench
    finally:
        bench.stop()


@pytest.fixture(scope="module")
def apache_operator_bench(request: pytest.FixtureRequest) -> Iterator[ApacheOperatorBench]:
    """A bench of its own (apiserver, etcd) with the Apache release's CRDs and upstream's
    operator (the chart's properties and RBAC) watching ``spark-apps``; built from the release
    source with the bench's Maven build the first time on a machine
    (``build-apache-operator.sh``). Apart from ``kube_bench``: the release's SparkApplication
    CRD would replace the bench's (written from our model of it). Module scope: one module
    uses it, and its processes (a JVM, a control plane) are not left idling for the rest of
    the run."""
    bench = ApacheOperatorBench(job_namespaces=[APACHE_JOB_NAMESPACE], properties=APACHE_RATE)
    yield from _started(request, bench, _APACHE_STARTED)


@pytest.fixture(scope="module")
def apache_node_bench(request: pytest.FixtureRequest) -> Iterator[ApacheOperatorBench]:
    """``apache_operator_bench`` with a node (the real kubelet and the bench's runtime, as
    ``kube_node_cluster`` has): upstream's Apache operator gets real pods. One per module,
    stopped with nothing left."""
    bench = ApacheOperatorBench(
        job_namespaces=[APACHE_JOB_NAMESPACE], properties=APACHE_RATE, node=True
    )
    yield from _with_node(request, bench, _APACHE_STARTED)


class _KubeTally:
    """Counts the outcomes of real-apiserver tests; says them at the end; a skip fails the run
    (a skipped bench test would hide a missing toolchain). Bench tests left out by the
    selection (``-m "not kube"``) are counted as deselected, so a run without the real tier
    says so instead of staying silent."""

    def __init__(self) -> None:
        self.outcomes: dict[str, int] = {}

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        left_out = sum(1 for item in items if item.get_closest_marker("kube") is not None)
        if left_out:
            self.outcomes["deselected"] = self.outcomes.get("deselected", 0) + left_out

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if "kube" in report.keywords and (report.when == "call" or report.outcome != "passed"):
            # pytest reports an expected failure (xfail) as "skipped": a known gap, not a
            # missing toolchain, so it is counted apart (a strict xfail that passes fails).
            outcome = report.outcome
            if hasattr(report, "wasxfail"):
                outcome = "xfailed" if report.skipped else "xpassed"
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.outcomes:
            line = ", ".join(f"{n} {outcome}" for outcome, n in sorted(self.outcomes.items()))
            skipped = bool(self.outcomes.get("skipped"))
            partial = bool(self.outcomes.get("deselected"))
            terminalreporter.write_line(
                f"real kube-apiserver tests: {line}",
                red=skipped,
                yellow=partial and not skipped,
                green=not skipped and not partial,
            )

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.outcomes.get("skipped") and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
