"""Fixtures shared by every test tier: real S3 server, temp tables, process environment."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import s3server

# Spark's Python workers run `python -m pyspark.daemon` in the driver's cwd; the repo's
# top-level operator/ folder would shadow the stdlib module there. Never prepend the cwd.
os.environ["PYTHONSAFEPATH"] = "1"
# The writer's test-only fault hook (spark_lib/faults.py) is refused without this switch; the
# Spark JVMs and Python workers the tests start inherit it.
os.environ["SPARKGUARD_ENABLE_FAULTS"] = "1"

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
