"""Spark fixtures and table checks for the writer, streaming and rollback tests.

Import the fixtures into a test module with ``from tests.spark_lib.spark_conftest import spark``.
One SparkSession per test module (``local[2,4]``: two cores, up to four attempts per task).
"""

from __future__ import annotations

import collections
import os
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow.json as pajson
import pyarrow.parquet as pq
import pytest

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import paths
from sparkguard.spark_lib.storage import reader, timeline

os.environ["PYTHONSAFEPATH"] = "1"
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


def new_session(app: str) -> Any:
    """A small local SparkSession with task retries."""
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master("local[2,4]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", "2")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """One SparkSession for the whole test module."""
    session = new_session("sparkguard-tests")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def ids_df(spark: Any, ids: range, *, partitions: int = 4) -> Any:
    """A DataFrame with an int id, a partition key, a double and a string per row."""
    return spark.range(ids.start, ids.stop, numPartitions=partitions).selectExpr(
        "id", "cast(id % 3 as int) as k", "cast(id as double) * 0.5 as d", "concat('v', id) as s"
    )


def _fs(url: str, options: Mapping[str, Any]) -> Any:
    manager, _ = filemanager.resolve(url, storage_options=options)
    return manager.fs


def committed_ids(url: str, options: Mapping[str, Any] | None = None) -> list[int]:
    """Every id in the committed files of ``url`` (read with pyarrow, not Spark)."""
    options = options or {}
    fs = _fs(url, options)
    result: list[int] = []
    for path in reader.committed_paths(url, storage_options=options):
        plain = fs._strip_protocol(path)
        with fs.open(plain, "rb") as handle:
            table = pajson.read_json(handle) if path.endswith(".json") else pq.read_table(handle)
        result.extend(table.column("id").to_pylist())
    return result


def assert_exactly_once(
    url: str, expected: range, options: Mapping[str, Any] | None = None
) -> None:
    """Each expected id appears exactly once in the committed data (0 lost, 0 duplicated)."""
    ids = committed_ids(url, options)
    counts = collections.Counter(ids)
    duplicated = {i: c for i, c in counts.items() if c > 1}
    missing = set(expected) - set(counts)
    extra = set(counts) - set(expected)
    assert not duplicated, f"duplicated ids: {sorted(duplicated)[:10]}"
    assert not missing, f"lost ids: {sorted(missing)[:10]} ({len(missing)} in all)"
    assert not extra, f"unexpected ids: {sorted(extra)[:10]}"


def data_files_on_storage(url: str, options: Mapping[str, Any] | None = None) -> set[str]:
    """Relative paths of every data file under the table (outside ``_sparkguard``)."""
    manager, base = filemanager.resolve(url, storage_options=options or {})
    root = base.rstrip("/")
    relative = (info.path[len(root) + 1 :] for info in manager.list_files(root))
    # Spark's own listing skips names starting with "_" or "." at every level.
    return {rel for rel in relative if not any(p.startswith(("_", ".")) for p in rel.split("/"))}


def unpublished_leftovers(url: str, options: Mapping[str, Any] | None = None) -> list[str]:
    """Temp files (rename stores) or pending multipart uploads (S3) under the table's data
    directories: what a write leaves unpublished until its driver or a rollback decides."""
    manager, base = filemanager.resolve(url, storage_options=options or {})
    root = base.rstrip("/")
    if isinstance(manager, filemanager.DirectPutFileManager):
        return sorted(u["Key"] for u in manager.list_pending_uploads(root + "/"))
    return sorted(
        info.path
        for info in manager.list_files(root)
        if filemanager.is_temp_name(paths.basename(info.path))
        and f"/{timeline.SPARKGUARD_DIR}/" not in info.path
    )


def assert_no_strays(url: str, options: Mapping[str, Any] | None = None) -> None:
    """Every data file on storage is a committed one (failed writes left nothing behind)."""
    committed = set(reader.committed_files(url, storage_options=options or {}))
    on_storage = data_files_on_storage(url, options)
    stray = on_storage - committed
    assert not stray, f"uncommitted files left on storage: {sorted(stray)[:10]}"
    assert committed <= on_storage, f"committed files missing: {sorted(committed - on_storage)}"


def undecided(url: str, options: Mapping[str, Any] | None = None) -> list[str]:
    """Instants of ``url`` that are neither committed nor fully rolled back."""
    tl = timeline.timeline_for(url, storage_options=options or {})
    return [
        s.instant
        for s in tl.statuses()
        if s.state not in (timeline.State.COMMITTED, timeline.State.ROLLED_BACK)
    ]


def fired(signal: Path) -> collections.Counter[str]:
    """How many times each fault point fired: one line per firing in the ``signal`` file."""
    if not signal.exists():
        return collections.Counter()
    return collections.Counter(line.split()[0] for line in signal.read_text().splitlines())


def injected(point: str) -> str:
    """A ``pytest.raises(match=...)`` pattern for the fault injected at ``point``."""
    return re.escape(f"sparkguard injected fault at {point} ")


def visible_ids(url: str, options: Mapping[str, Any] | None = None) -> list[int]:
    """What a reader sees now: the committed ids, or none before the table has a timeline."""
    manager, base = filemanager.resolve(url, storage_options=options or {})
    if not manager.exists(paths.join(base, timeline.SPARKGUARD_DIR)):
        return []
    return committed_ids(url, options)
