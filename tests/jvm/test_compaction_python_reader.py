"""A table written through the JVM protocol with compaction on, read by the Python
committed-only reader (both languages read the same snapshot format)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sparkguard.spark_lib.spark import sparkconf
from sparkguard.spark_lib.storage import reader
from tests.jvm.conftest import run_job

pytestmark = pytest.mark.spark

WRITES = [
    ("cj0", "append", 0),
    ("cj1", "append", 100),
    ("cj2", "overwrite", 200),
    ("cj3", "append", 300),
    ("cj4", "append", 400),
]


def test_python_reader_reads_a_table_the_jvm_compacted(tmp_path: Path) -> None:
    table = tmp_path / "t"
    result = None
    for job, mode, first in WRITES:
        conf = {
            **sparkconf.build_spark_conf(job),
            "spark.sparkguard.timeline.snapshotEvery": "2",
        }
        result = run_job("plain_write.py", str(table), "100", "2", mode, "-", str(first), conf=conf)
    # a plain Spark reader of the directory: the overwrite's W9b deleted what it superseded
    assert result == {"rows": 300, "ids": 300}
    guard = table / "_sparkguard"
    assert sorted(p.name for p in (guard / "snapshots").iterdir())[0] == "000000000001.snapshot"
    hot = sorted(p.name for p in (guard / "timeline").iterdir())
    assert len(hot) == 2, hot  # cj4's instant; cj0-cj3 are archived
    ids: list[int] = []
    for relative in reader.committed_files(str(table)):
        ids.extend(pq.read_table(table / relative).column("n").to_pylist())
    assert sorted(ids) == list(range(200, 500))
