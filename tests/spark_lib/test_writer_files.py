"""How the writer lays out a data file (no Spark needed): row groups and memory bounds."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkguard.spark_lib import config, filemanager, markers, writer


def _batches(count: int, rows: int) -> list[pa.RecordBatch]:
    out = []
    for n in range(count):
        ids = pa.array(range(n * rows, (n + 1) * rows), pa.int64())
        names = pa.array([f"name-{i % 500}" for i in range(n * rows, (n + 1) * rows)])
        out.append(pa.RecordBatch.from_arrays([ids, names], names=["id", "s"]))
    return out


def test_arrow_batches_become_one_row_group_like_spark_writes(tmp_path: Path) -> None:
    # Spark hands Python 10k-row batches; one row group per batch would repeat each column's
    # dictionary in every group (larger, slower files than Spark's own writer).
    manager, _ = filemanager.resolve(str(tmp_path))
    batches = _batches(30, 10_000)
    handle = writer._OpenFile(
        "f.parquet",
        manager.create_atomic(str(tmp_path / "f.parquet"), overwrite=True),
        writer.FileFormat.PARQUET,
    )
    for batch in batches:
        handle.add(batch)
    written = handle.finish(batches[0].schema)
    parquet = pq.ParquetFile(tmp_path / "f.parquet")
    assert parquet.metadata.num_row_groups == 1
    assert written.rows == parquet.metadata.num_rows == 300_000
    assert written.size == (tmp_path / "f.parquet").stat().st_size
    assert parquet.read().column("id").to_pylist() == list(range(300_000))


def test_open_files_of_one_task_stay_within_the_memory_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = str(tmp_path / "t")
    batches = _batches(8, 10_000)
    budget = 3 * batches[0].nbytes
    monkeypatch.setattr(writer, "TASK_BUFFER_BYTES", budget)
    spec = writer.SinkSpec(
        settings=config.parse_settings(conf={"spark.sparkguard.jobId": "j"}),
        table=table,
        table_url=table,
        marker_dir_url=markers.marker_dir(table, "20261123000000000-j"),
        fmt=writer.FileFormat.PARQUET,
        partition_by=("k",),
        max_records=0,
        faults=(),
    )
    files = writer._TaskFiles(spec, partition=0, attempt=0, token="j")
    for n, batch in enumerate(batches):
        files.add(f"k={'ab'[n % 2]}", batch)  # two open files, as a partitioned write has
        buffered = sum(h.buffered_bytes for h in files.open_files.values())
        assert files.buffered_bytes == buffered
        assert buffered <= budget
    files.data_schema = batches[0].schema
    for directory in sorted(files.open_files):
        files.close_file(directory)
    assert files.buffered_bytes == 0
    total = sum(pq.ParquetFile(Path(table, f.path)).metadata.num_rows for f in files.written)
    assert total == 80_000
