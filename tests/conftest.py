"""Fixtures shared by every test tier: real S3 server, temp tables, process environment."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import jvm_options, s3server, xdist_groups

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
    os.environ["SPARK_SUBMIT_OPTS"] = jvm_options.spark_submit_opts(None)

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
    cache = Path(os.environ.get("SPARKGUARD_CACHE", Path.home() / ".cache" / "sparkguard"))
    archive, how = jvm_options.ensure_archive(cache)
    if archive is None:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"tests: Spark JVMs run without a class-data archive ({how})")
    os.environ["SPARK_SUBMIT_OPTS"] = jvm_options.spark_submit_opts(archive)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[s3server.S3Server]:
    """moto's S3 server on 127.0.0.1, one per test session."""
    with s3server.run_s3_server() as server:
        yield server


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

    The real kube-apiserver tests are one group (``tests/kubebench/fixtures.py``: one bench per
    run); so are the tests on the HDFS minicluster (marker ``hdfs``, or the ``hdfs_cluster``
    fixture: one cluster per run, started by the worker that runs them); the tests of a module
    that share its SparkSession (the module-scoped ``spark`` fixture) are one group each (one
    JVM start per module, not one per worker).
    """
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if item.get_closest_marker("hdfs") is not None or "hdfs_cluster" in fixtures:
            item.add_marker(pytest.mark.xdist_group(HDFS_GROUP))
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group(f"spark-session:{item.nodeid.split('::')[0]}"))
    xdist_groups.suffix_node_ids(config, items)
