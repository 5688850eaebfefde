"""Fixtures shared by every test tier: real S3 server, temp tables, process environment."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import s3server, xdist_groups

# Spark's Python workers run `python -m pyspark.daemon` in the driver's cwd; the repo's
# top-level operator/ folder would shadow the stdlib module there. Never prepend the cwd.
os.environ["PYTHONSAFEPATH"] = "1"
# The writer's test-only fault hook (spark_lib/faults.py) is refused without this switch; the
# Spark JVMs and Python workers the tests start inherit it.
os.environ["SPARKGUARD_ENABLE_FAULTS"] = "1"
# Every Spark driver a test starts (in-process sessions, job processes, the stand-in's drivers)
# is a short-lived JVM on a 2-core machine shared by two pytest workers: most of its CPU goes
# to C2 compiling code it will run for seconds, and to G1's concurrent threads. The C1 compiler
# alone and the serial collector halve a small job's wall time here (tests/README.md). Tests
# only: the demo, the benchmarks and users' jobs keep the JVM's defaults.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
if TEST_JVM_OPTIONS not in os.environ.get("SPARK_SUBMIT_OPTS", ""):  # xdist workers inherit it
    os.environ["SPARK_SUBMIT_OPTS"] = " ".join(
        filter(None, [os.environ.get("SPARK_SUBMIT_OPTS", ""), TEST_JVM_OPTIONS])
    )

pytest_plugins = ["tests.kubebench.fixtures"]


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
    run); the tests of a module that share its SparkSession (the module-scoped ``spark``
    fixture) are one group each (one JVM start per module, not one per worker).
    """
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group(f"spark-session:{item.nodeid.split('::')[0]}"))
    xdist_groups.suffix_node_ids(config, items)
