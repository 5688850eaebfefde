"""How the writer lays out a data file (no Spark needed): row groups and memory bounds."""

from __future__ import annotations

import dataclasses
import os
import traceback
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.filemanager import rename
from sparkguard.spark_lib.spark import config, faults, writer
from sparkguard.spark_lib.storage import markers


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


# --------------------------------------------------------------------------------------------
# Error paths: the Parquet writer and its stream are closed on every one. An open
# pyarrow.parquet.ParquetWriter left to the garbage collector is closed by its destructor,
# possibly at interpreter teardown (the exception's traceback keeps it alive), where it writes
# into a dead stream: the worker then aborted ("terminate called without an active exception").
# --------------------------------------------------------------------------------------------


class _Recorder:
    """Every ParquetWriter and atomic stream the writer creates; streams fail on demand."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail: str) -> None:
        self.writers: list[pq.ParquetWriter] = []
        self.streams: list[filemanager.AtomicStream] = []
        self.fail = fail  # "", or which writes fail: a key of ERROR_PATHS
        self.finishing = False
        recorder = self
        real_write = rename._LocalAtomicStream._write
        real_publish = rename._LocalAtomicStream._publish
        real_init = rename._LocalAtomicStream.__init__

        class RecordingWriter(pq.ParquetWriter):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                recorder.writers.append(self)

            def close(self) -> None:
                recorder.finishing = True
                super().close()

        def init(stream: rename._LocalAtomicStream, *args: Any, **kwargs: Any) -> None:
            real_init(stream, *args, **kwargs)
            if "/_sparkguard/" not in stream.path:  # data files, not markers
                recorder.streams.append(stream)

        def write(stream: rename._LocalAtomicStream, data: bytes | memoryview) -> None:
            # A rollback aborted the upload (object stores) of this marked name: writes fail.
            # Past the magic bytes the writer opens a data file with.
            started = stream.tell() > 0 and stream in recorder.streams
            if started and (
                (self.fail == "row-group" and not self.finishing)
                or (self.fail == "finish-flush" and not self.finishing)
                or (self.fail == "footer" and self.finishing)
                or self.fail == "every-write"
            ):
                raise OSError(f"NoSuchUpload: the upload of {stream.path} was aborted")
            real_write(stream, data)

        def publish(stream: rename._LocalAtomicStream) -> None:
            if self.fail == "publish" and stream in recorder.streams:
                # A rollback removed the temp file of this marked name (rename stores).
                os.unlink(stream._temp)
            real_publish(stream)

        monkeypatch.setattr(pq, "ParquetWriter", RecordingWriter)
        monkeypatch.setattr(rename._LocalAtomicStream, "__init__", init)
        monkeypatch.setattr(rename._LocalAtomicStream, "_write", write)
        monkeypatch.setattr(rename._LocalAtomicStream, "_publish", publish)

    def assert_all_closed(self) -> None:
        assert self.streams, "the test opened no file"
        assert [w.is_open for w in self.writers] == [False] * len(self.writers)
        assert [s.closed for s in self.streams] == [True] * len(self.streams)


def _spec(table: str, **changes: Any) -> writer.SinkSpec:
    spec = writer.SinkSpec(
        settings=config.parse_settings(conf={"spark.sparkguard.jobId": "j"}),
        table=table,
        table_url=table,
        marker_dir_url=markers.marker_dir(table, "20261123000000000-j"),
        fmt=writer.FileFormat.PARQUET,
        partition_by=(),
        max_records=0,
        faults=(),
    )
    return dataclasses.replace(spec, **changes)


ERROR_PATHS = {
    # the stream fails while a full row group is flushed mid-file (write_table raises)
    "row-group": ({"ROW_GROUP_ROWS": 1000}, {}),
    # the stream fails mid-file and on every write after (cancel's close of the writer too)
    "every-write": ({"ROW_GROUP_ROWS": 1000}, {}),
    # the stream fails in the file's last flush, inside finish() (the file is no longer "open")
    "finish-flush": ({}, {}),
    # the stream fails while ParquetWriter.close() writes the footer, inside finish()
    "footer": ({}, {}),
    # publication fails (the temp file is gone), after the writer closed cleanly
    "publish": ({}, {}),
    # a failure that is not the stream's, with a partly written file open
    "other": ({"ROW_GROUP_ROWS": 1000}, {"faults": (faults.Fault(faults.Point.TASK_MID_FILE),)}),
    # one of two open files (a partitioned write) fails in finish(): both are closed
    "partitioned": ({}, {"partition_by": ("k",)}),
}


@pytest.mark.parametrize("path", list(ERROR_PATHS))
def test_every_error_path_closes_the_parquet_writer_and_its_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    constants, changes = ERROR_PATHS[path]
    for name, value in constants.items():
        monkeypatch.setattr(writer, name, value)
    fail = {"other": "", "partitioned": "finish-flush"}.get(path, path)
    recorder = _Recorder(monkeypatch, fail)
    table = str(tmp_path / "t")
    spec = _spec(table, **changes)
    batches = _batches(3, 2000)
    if spec.partition_by:
        batches = [
            b.append_column("k", pa.array([i % 2 for i in range(b.num_rows)])) for b in batches
        ]
    files = writer._TaskFiles(spec, partition=0, attempt=0, token="j")
    with pytest.raises((OSError, faults.InjectedFaultError)) as failure:
        files.write_all(batches)
    recorder.assert_all_closed()
    # The stream's error never unwound through pyarrow (its C++ frames, and its Python frames
    # that would keep the writer alive in the traceback): it is raised from sparkguard's code.
    frames = [frame.filename for frame in traceback.extract_tb(failure.value.__traceback__)]
    assert not [f for f in frames if f"{os.sep}pyarrow{os.sep}" in f], frames
    assert len(recorder.streams) == (2 if spec.partition_by else 1)
    # Nothing partial is visible, and no temp file is left behind.
    left = [p.name for p in Path(table).rglob("*") if p.is_file() and "_sparkguard" not in p.parts]
    assert left == [], left
