"""pytest plugin: the session-scoped ``kube_bench`` fixture (a started :class:`KubeBench`).

Register from the root conftest with ``pytest_plugins = ["tests.kubebench.fixtures"]``.

* Tests that request ``kube_bench`` get the ``kube`` marker automatically (``-m "not kube"``
  deselects them); mark tests that reach the bench indirectly with ``@pytest.mark.kube``.
* The binaries are built right after collection, when at least one selected test needs them,
  so a cold build (minutes) never counts against a test's ``pytest-timeout``. A failed build is
  reported at that point and then makes every bench test *error* with the build's output;
  nothing is skipped.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.kubebench.bench import KubeBench, KubeBenchError, ensure_binaries

_BUILD_ERROR = pytest.StashKey[KubeBenchError]()
BENCH_GROUP = "kube-bench"


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
    return "kube_bench" in fixturenames or item.get_closest_marker("kube") is not None


@pytest.hookimpl(tryfirst=True)  # before `-m` deselection reads the markers
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    for item in items:
        if "kube_bench" in getattr(item, "fixturenames", ()) and not item.get_closest_marker(
            "kube"
        ):
            item.add_marker(pytest.mark.kube)
        if _needs_bench(item):
            # Under pytest-xdist's loadgroup every bench test runs on one worker: one
            # kube-apiserver + etcd per run, not one per worker.
            item.add_marker(pytest.mark.xdist_group(BENCH_GROUP))


def pytest_collection_finish(session: pytest.Session) -> None:
    config = session.config
    if config.option.collectonly or not any(_needs_bench(i) for i in session.items):
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    start = time.monotonic()
    try:
        bin_dir = ensure_binaries()
    except KubeBenchError as exc:
        config.stash[_BUILD_ERROR] = exc
        if reporter is not None:
            reporter.write_line(f"kubebench: BUILD FAILED, kube tests will error:\n{exc}", red=True)
        return
    took = time.monotonic() - start
    if reporter is not None and took > 5:
        reporter.write_line(f"kubebench: built kube-apiserver + etcd in {took:.0f}s -> {bin_dir}")


@pytest.fixture(scope="session")
def kube_bench(request: pytest.FixtureRequest) -> Iterator[KubeBench]:
    """A running kube-apiserver + etcd with the SparkApplication CRD installed."""
    build_error = request.config.stash.get(_BUILD_ERROR, None)
    if build_error is not None:
        raise build_error
    bench = KubeBench()
    try:
        bench.start()
        yield bench
    finally:
        bench.stop()


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
            self.outcomes[report.outcome] = self.outcomes.get(report.outcome, 0) + 1

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
