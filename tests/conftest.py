"""Fixtures shared by every test tier: real S3 server, temp tables, process environment."""

from __future__ import annotations

import functools
import os
import zlib
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import (
    cached_jars,
    hdfs,
    jvm_options,
    netguard,
    run_tmp,
    s3faults,
    s3server,
    schedule,
    xdist_groups,
)

# The run's own temp directory (tests/support/run_tmp.py): TMPDIR for this process, the xdist
# workers and everything they start, java.io.tmpdir of the test JVMs; made by the process
# that starts the run, removed when it exits.
RUN_TMP = run_tmp.enter()
#: what the run still left directly in the temp directory (checked at the session's end)
_LITTER = run_tmp.LitterCheck(RUN_TMP) if RUN_TMP.owned else None

# Spark's Python workers run `python -m pyspark.daemon` in the driver's cwd; the repo's
# top-level operator/ folder would shadow the stdlib module there. Never prepend the cwd.
os.environ["PYTHONSAFEPATH"] = "1"
# The writer's test-only fault hook (spark_lib/spark/faults.py) is refused without this switch; the
# Spark JVMs and Python workers the tests start inherit it.
os.environ["SPARKGUARD_ENABLE_FAULTS"] = "1"
# Every Spark driver a test starts (in-process sessions, job processes, the stand-in's drivers)
# gets the test JVM options (tests/support/jvm_options.py): C1 only, the serial collector and,
# once pytest_configure has it, a class-data-sharing archive. xdist workers inherit them.
if jvm_options.COMPILER_AND_GC not in os.environ.get("SPARK_SUBMIT_OPTS", ""):
    os.environ["SPARK_SUBMIT_OPTS"] = jvm_options.spark_submit_opts(None, tmpdir=RUN_TMP.path)

pytest_plugins = ["tests.kubebench.fixtures"]

#: the xdist group of the tests on the HDFS minicluster (one cluster per run)
HDFS_GROUP = "hdfs-cluster"


def pytest_collection_finish(session: pytest.Session) -> None:
    """When the run starts Spark: the test JVMs' class-data-sharing archive (dumped once per
    machine under ~/.cache/sparkguard/cds/, a lock serialising the xdist workers), put into
    ``SPARK_SUBMIT_OPTS`` before any test runs. The dump never counts against a test's timeout."""
    if session.config.option.collectonly:
        return
    if not any(item.get_closest_marker("spark") for item in session.items):
        return
    archive, how = jvm_options.ensure_archive(cached_jars.cache_root())
    if archive is None:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"tests: Spark JVMs run without a class-data archive ({how})")
    os.environ["SPARK_SUBMIT_OPTS"] = jvm_options.spark_submit_opts(archive, tmpdir=RUN_TMP.path)


@functools.cache
def _litter_report() -> tuple[str, bool] | None:
    """What the run left directly in the temp directory (once every worker is gone): the
    line to print, and whether it fails the run. ``None``: nothing, or not the run's owner.

    It fails the run unless another process that makes such files (a JVM, a pytest, a
    benchmark) ran beside it on this machine: then the names are only printed (they may be
    theirs)."""
    found = _LITTER.finish() if _LITTER is not None else []
    if _LITTER is None or not found:
        return None
    listed = ", ".join(found)
    if _LITTER.foreign:
        pid, command = next(iter(_LITTER.foreign.items()))
        return (
            f"tests: new in {RUN_TMP.root} during the run: {listed} (not failing the run: "
            f"{len(_LITTER.foreign)} other process(es) that make such files ran beside it, "
            f"e.g. {pid}: {command[:120]})",
            False,
        )
    return (
        f"tests: the run left {listed} in {RUN_TMP.root}: something it started ignored "
        f"TMPDIR or java.io.tmpdir ({run_tmp.ENV}={RUN_TMP.path}; tests/README.md)",
        True,
    )


@pytest.hookimpl(wrapper=True)
def pytest_sessionfinish(session: pytest.Session) -> Iterator[None]:
    """After every other finish (xdist's workers are gone): fail the run on its litter, and on
    the network guard's verdict (tests/support/netguard.py): a packet that tried to leave the
    bench namespace, and that no test announced, fails the run whatever the tests said."""
    yield
    report = _litter_report()
    if report is not None and report[1]:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: the controller judges the whole run
    where = netguard.guard_dir()
    if where is not None and netguard.unexpected(where):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Name the run's litter (:func:`_litter_report`), and where the run connected: loopback,
    the guard's own namespace, and anything else."""
    report = _litter_report()
    if report is not None:
        line, fails = report
        colour = {"red": True} if fails else {"yellow": True}
        terminalreporter.write_sep("-", "temp files beside the run's directory", **colour)
        terminalreporter.write_line(line, **colour)
    where = netguard.guard_dir()
    if where is None:
        terminalreporter.write_line(
            "network guard: off (run through scripts/test.sh, or "
            "`python tests/support/netguard.py run -- python -m pytest ...`)"
        )
        return
    for line in netguard.report(where):
        terminalreporter.write_line(line)
    if netguard.unexpected(where):
        terminalreporter.write_line(
            "network guard: a packet tried to leave the bench namespace: the run fails", red=True
        )


@pytest.fixture(scope="session")
def s3_server() -> Iterator[s3server.S3Server]:
    """moto's S3 server on 127.0.0.1, one per test session."""
    with s3server.run_s3_server() as server:
        yield server


@pytest.fixture(scope="session")
def hdfs_cluster() -> Iterator[hdfs.MiniHdfs]:
    """A real HDFS (MiniDFSCluster: a NameNode and a DataNode on 127.0.0.1), one per run: every
    test that uses it (tests/jvm/, tests/compat/) is in the xdist group ``hdfs-cluster``
    (:func:`pytest_collection_modifyitems`), so one worker starts it, once, and stops it at the
    end of its session. Its jars come from the shared cache (Maven Central the first time).
    ``hdfs://`` is served to this process's Python side over WebHDFS meanwhile
    (:func:`tests.support.hdfs.python_access`)."""
    with hdfs.run_mini_hdfs() as cluster, hdfs.python_access():
        yield cluster


@pytest.fixture
def s3_bucket(s3_server: s3server.S3Server) -> str:
    """A fresh, empty bucket; returns its ``s3://`` URL."""
    return f"s3://{s3_server.create_bucket()}"


@pytest.fixture
def s3_options(s3_server: s3server.S3Server) -> dict[str, Any]:
    """s3fs storage options that reach the test server."""
    return s3_server.storage_options


@pytest.hookimpl(trylast=True)  # after the bench plugin marks its tests, and after `-m`
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group tests for pytest-xdist's loadgroup (``scripts/test.sh`` runs two workers).

    The real kube-apiserver tests are grouped by the bench they need
    (``tests/kubebench/fixtures.py``); the tests on the HDFS minicluster are one group (marker
    ``hdfs``, or the ``hdfs_cluster`` fixture: one cluster per run, started by the worker that
    runs them); the tests of a module
    that share its SparkSession (the module-scoped ``spark`` fixture) are one group each (one
    JVM start per module, not one per worker). On an xdist worker the collection is then
    sorted longest unit first (``tests/support/schedule.py``).
    """
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if item.get_closest_marker("hdfs") is not None or "hdfs_cluster" in fixtures:
            item.add_marker(pytest.mark.xdist_group(HDFS_GROUP))
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group(f"spark-session:{item.nodeid.split('::')[0]}"))
    if getattr(config.option, "loadgroup", False):  # an xdist worker of a loadgroup run
        # the longest work units first (tests/support/schedule.py, tests/durations.json)
        schedule.order(items, schedule.load())
    xdist_groups.suffix_node_ids(config, items)


@pytest.fixture
def s3_faults(s3_server: s3server.S3Server) -> Iterator[s3faults.S3FaultFront]:
    """A fault-injecting front (``tests/support/s3faults.py``) before the session's S3 server,
    seeded by the test's name; no faults until the test sets rates or bursts. Prints the faults
    it injected when the test ends."""
    seed = zlib.crc32(os.environ.get("PYTEST_CURRENT_TEST", "").encode())
    with s3faults.S3FaultFront(s3_server.endpoint, seed=seed, delay_s=0.05) as front:
        yield front
        print(f"S3 faults injected (seed {seed}):\n{front.report()}")
