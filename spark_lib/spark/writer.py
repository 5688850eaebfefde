"""The fsspec writer: a PySpark Python data source, ``format("sparkguard-fsspec")``.

It is also ``format("sparkguard")`` when sparkguard's jar is not on the driver's classpath; with
the jar, that name is the JVM front of the commit protocol, which hands this writer only the
locations Hadoop has no FileSystem for, and streaming writes (docs/writer.md, "Which path
writes").

One write is one instant of the table's timeline (docs/storage-contract.md, "A write"):

1. driver (``DataSource.writer``): take the write's identity (the n-th write of this job to
   this table in this driver run, :func:`next_write_index`), roll back this job's stale
   undecided instants on the table, skip the write when write n of this job already committed
   here (exactly-once re-run), else write ``<instant>.inflight`` and the job-journal entry
   before any task runs;
2. executors (``write``): for each data file, create its marker first, then write it for its
   deterministic name ``part-<partition:05d>-<jobId>-w<n:03d>-c<seq:03d>.<ext>`` through
   ``create_atomic(overwrite=True)`` and leave it **unpublished** (``hold``: a temp file in its
   directory, or an open multipart upload at its key), reporting the temp name or upload id:
   no directory reader sees a file of a write before its outcome;
3. driver (``commit``): check the winning attempts' files are there (temp file with its size,
   upload still pending), delete marked files no message lists, write the committed outcome
   put-if-absent (files, sizes, rows, temp names / upload ids), then publish the files
   (renames / upload completions, concurrently), remove every other attempt's temp files and
   uploads, and delete the markers; ``abort`` rolls the instant back. A driver that dies after
   the outcome leaves the publication to ``sparkguard rollback`` (R8a, roll forward).

Options and configuration keys are documented in docs/writer.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import fcntl
import hashlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors, paths
from sparkguard.spark_lib.spark import config, faults
from sparkguard.spark_lib.storage import (
    journal,
    lifecycle,
    markers,
    reader,
    rollback,
    snapshots,
    timeline,
)

logger = logging.getLogger(__name__)

NAME: Final = "sparkguard"
#: the name of this (fsspec) writer whatever ``NAME`` resolves to (see :func:`register`)
FSSPEC_NAME: Final = "sparkguard-fsspec"
#: the JVM front of ``NAME`` in sparkguard's jar
JVM_SOURCE_CLASS: Final = "io.sparkguard.spark.SparkguardDataSource"
HIVE_NULL: Final = "__HIVE_DEFAULT_PARTITION__"
# Row groups as large as Spark's own writer makes them (parquet.block.size 128 MiB): Arrow
# batches arrive 10k rows at a time, and a ParquetWriter call always closes a row group, so
# rows are buffered; small row groups repeat each column's dictionary (measured: 37 % larger
# files and 20 % slower writes at 128k rows per group).
ROW_GROUP_ROWS: Final = 1024 * 1024
ROW_GROUP_BYTES: Final = 128 * 1024 * 1024
#: all open files of one task together buffer at most this much before the largest is flushed
TASK_BUFFER_BYTES: Final = 256 * 1024 * 1024
_ESCAPED: Final = frozenset("\"#%'*/:=?\\{[]^\x7f") | frozenset(chr(c) for c in range(1, 32))


class FileFormat(enum.StrEnum):
    """Data file formats the writer produces."""

    PARQUET = "parquet"
    JSON = "json"


class Rerun(enum.StrEnum):
    """What a write does when the same job id already committed on the table."""

    SKIP = "skip"  # write nothing: the job's output is already there (exactly-once re-run)
    REWRITE = "rewrite"  # write again under the same names; this commit replaces the old one


# --------------------------------------------------------------------------------------------
# Names.
# --------------------------------------------------------------------------------------------


def data_file_name(*, partition: int, token: str, seq: int, ext: str) -> str:
    """``part-<partition:05d>-<token>-c<seq:03d>.<ext>``. Pure.

    The token says which write the file belongs to: :func:`batch_token` for a batch write, the
    batch and run for a streaming one.
    """
    return f"part-{partition:05d}-{token}-c{seq:03d}.{ext}"


def batch_token(job_id: str, write: int) -> str:
    """``<jobId>-w<write:03d>``: the name token of write ``write`` of a job to a table. Pure.

    Every batch name ends ``-w<digits>-c<digits>.<ext>``, so two (job id, write) pairs never
    share a name even when one job id ends like ``-w001``; a streaming name never matches it
    (its run token before ``-c`` is hex, never ``w``).
    """
    if write < 0:
        raise ValueError(f"a write index is >= 0, got {write}")
    return f"{job_id}-w{write:03d}"


# --------------------------------------------------------------------------------------------
# Write identity: the n-th write of a job to a table in this driver run.
# --------------------------------------------------------------------------------------------

#: the directory of a driver run's write counters, inside the SparkContext's own files directory
WRITE_COUNTS_DIR: Final = ".sparkguard-writes"


def write_index_of(status: timeline.InstantStatus) -> int:
    """The write index an instant's ``.inflight`` records (pure).

    Instants written before write identity existed carry none: they were write 0.
    """
    info = status.info
    return info.write if info is not None and info.write is not None else 0


def driver_run_dir() -> str | None:
    """Where this driver run keeps its write counters, or ``None`` outside a Spark driver.

    A driver run is one SparkContext. PySpark calls ``DataSource.writer`` in a Python worker on
    the driver (a fresh or reused process: no in-process state survives from one write to the
    next), and hands that worker the SparkContext's files directory (``SparkFiles``): unique
    per SparkContext, on the driver's disk, deleted when the context stops. The counters live
    there. A writer built by hand outside Spark (tests) has no driver run: every write is 0.
    """
    from pyspark.files import SparkFiles

    # Set by PySpark's worker set-up in every Python worker; the planner worker of a write
    # runs on the driver, so this is the driver's SparkContext directory.
    root = getattr(SparkFiles, "_root_directory", None)
    if not getattr(SparkFiles, "_is_running_on_worker", False) or not root:
        return None
    return os.path.join(root, WRITE_COUNTS_DIR)


def next_write_index(run_dir: str | None, *, job_id: str, table_url: str) -> int:
    """Take the next write index of ``job_id`` on ``table_url`` in this driver run: 0, 1, ...

    One small counter file per (job, table) under ``run_dir``, incremented under an exclusive
    lock, so concurrent writes of one driver (several planner workers) never share an index.
    Every write taken counts, whatever becomes of it: a rerun maps write n to write n only if
    it issues the same writes in the same order. ``run_dir=None`` (no driver run): always 0.
    """
    if run_dir is None:
        return 0
    os.makedirs(run_dir, exist_ok=True)
    key = hashlib.sha256(f"{job_id}\n{table_url}".encode()).hexdigest()[:32]
    fd = os.open(os.path.join(run_dir, key), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        raw = os.pread(fd, 32, 0).strip()
        index = int(raw) if raw else 0
        data = str(index + 1).encode()
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
        return index
    finally:
        os.close(fd)  # releases the lock


def new_driver_run(spark: Any) -> None:
    """Count writes from 0 again in ``spark``'s SparkContext, as a restarted driver does.

    For tests and notebooks that rerun a job in one session: after this call the next write of
    each (job id, table) is write 0 again, so a rerun of a committed job is skipped instead of
    appended a second time. Call it between runs, never while a write is running.
    """
    from pyspark.files import SparkFiles

    spark.sparkContext  # noqa: B018 - fails clearly when the session was stopped
    shutil.rmtree(os.path.join(SparkFiles.getRootDirectory(), WRITE_COUNTS_DIR), ignore_errors=True)


def escape_partition_value(value: Any) -> str:
    """A Hive-style directory value, escaped like Spark's ``escapePathName``. Pure."""
    if value is None:
        return HIVE_NULL
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif hasattr(value, "isoformat"):
        text = value.isoformat(sep=" ") if hasattr(value, "hour") else value.isoformat()
    else:
        text = str(value)
    if text == "":
        return HIVE_NULL
    return "".join(f"%{ord(ch):02X}" if ch in _ESCAPED else ch for ch in text)


def partition_dir(columns: Sequence[str], values: Sequence[Any]) -> str:
    """``col=value/...`` for one partition of a Hive-style layout (``""`` when unpartitioned)."""
    return "/".join(
        f"{c}={escape_partition_value(v)}" for c, v in zip(columns, values, strict=True)
    )


# --------------------------------------------------------------------------------------------
# Executor side: writing files, marker first.
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class WriteMessage(WriterCommitMessage):
    """What one successful task attempt wrote (sent to the driver's commit)."""

    partition: int
    attempt: int
    task_attempt_id: int
    files: tuple[timeline.DataFile, ...]
    run: str = ""  # streaming: the query run that wrote them


class _ParquetSink:
    """The file object a ``ParquetWriter`` writes into: the data file's stream, behind a guard.

    pyarrow calls :meth:`write` from its C++ code. A stream error raised there (the upload a
    rollback aborted, a full disk) would unwind through pyarrow's C++ frames and leave the
    writer half-failed; instead the first error is kept, later writes are dropped, and
    :meth:`raise_if_failed`, called after every pyarrow call, raises it from Python.
    """

    def __init__(self, stream: filemanager.AtomicStream) -> None:
        self.stream = stream
        self.error: Exception | None = None

    def write(self, data: bytes | memoryview) -> int:
        if self.error is None:
            try:
                return self.stream.write(data)
            except Exception as exc:  # noqa: BLE001 - raised by raise_if_failed, from Python
                self.error = exc
        return memoryview(data).nbytes

    def raise_if_failed(self) -> None:
        """Raise the stream's error, if a write failed."""
        if self.error is not None:
            raise self.error

    def flush(self) -> None:
        """Nothing to flush: the stream publishes on close."""

    @property
    def closed(self) -> bool:
        return self.stream.closed

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False


class _OpenFile:
    def __init__(self, rel: str, stream: filemanager.AtomicStream, fmt: FileFormat) -> None:
        self.rel = rel
        self.stream = stream
        self.sink = _ParquetSink(stream)
        self.fmt = fmt
        self.rows = 0
        self.buffered: list[pa.RecordBatch] = []
        self.buffered_rows = 0
        self.buffered_bytes = 0
        self.parquet: pq.ParquetWriter | None = None

    def add(self, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows
        if self.fmt is FileFormat.JSON:
            lines = []
            for row in batch.to_pylist():
                clean = {k: v for k, v in row.items() if v is not None}
                lines.append(json.dumps(clean, default=str, separators=(",", ":")))
            self.stream.write(("\n".join(lines) + "\n").encode())
            return
        self.buffered.append(batch)
        self.buffered_rows += batch.num_rows
        self.buffered_bytes += batch.nbytes
        if self.buffered_rows >= ROW_GROUP_ROWS or self.buffered_bytes >= ROW_GROUP_BYTES:
            self.flush()

    def flush(self) -> None:
        if not self.buffered:
            return
        table = pa.Table.from_batches(self.buffered)
        if self.parquet is None:
            self.parquet = pq.ParquetWriter(self.sink, table.schema)
        self.parquet.write_table(table, row_group_size=max(table.num_rows, 1))
        self.sink.raise_if_failed()
        self.buffered = []
        self.buffered_rows = 0
        self.buffered_bytes = 0

    def finish(self, schema: pa.Schema, *, hold: bool = False) -> timeline.DataFile:
        """Close the file and publish it, or with ``hold`` leave it unpublished (a temp file
        or an open upload the returned entry names, for the driver to publish after the
        outcome); on any error, cancel it (see :meth:`cancel`)."""
        try:
            if self.fmt is FileFormat.PARQUET:
                self.flush()
                if self.parquet is None:
                    self.parquet = pq.ParquetWriter(self.sink, schema)
                self.parquet.close()
                self.parquet = None
                self.sink.raise_if_failed()
            size = self.stream.tell()
            if not hold:
                self.stream.close()  # publishes atomically
                return timeline.DataFile(path=self.rel, size=size, rows=self.rows)
            held = self.stream.hold()
        except BaseException:
            self.cancel()
            raise
        temp = None
        if held.temp is not None:
            name = paths.basename(held.temp)
            directory = paths.parent(self.rel) if "/" in self.rel else ""
            temp = f"{directory}/{name}" if directory else name
        return timeline.DataFile(
            path=self.rel, size=size, rows=self.rows, temp=temp, upload=held.upload
        )

    def cancel(self) -> None:
        """Discard the file: close the Parquet writer, then cancel the stream. Safe to repeat.

        Both are closed here, on the error path, never left to the garbage collector: an open
        ``ParquetWriter`` closes itself in its destructor, whenever that runs (the exception's
        traceback keeps it alive, so possibly at interpreter teardown), writing into a stream
        that is gone; the task's process then aborted (``terminate called without an active
        exception``) after the task had already failed cleanly.
        """
        parquet, self.parquet = self.parquet, None
        self.buffered = []
        try:
            if parquet is not None:
                _close_quietly(parquet, self.rel)
        finally:
            self.stream.cancel()


def _close_quietly(parquet: pq.ParquetWriter, rel: str) -> None:
    """Close ``parquet`` on an error path: a failure is logged, and the writer is marked closed
    either way so that its destructor never tries again (the C++ writer does not retry a close
    that failed; pyarrow's Python wrapper would)."""
    try:
        parquet.close()
    except Exception as exc:  # noqa: BLE001 - the task is failing already; keep its error
        logger.debug("closing the Parquet writer of %s after an error failed too: %s", rel, exc)
    finally:
        parquet.is_open = False


@dataclasses.dataclass(frozen=True)
class SinkSpec:
    """Where and how a task writes its files (picklable: it travels to executors)."""

    settings: config.WriteSettings
    table: str  # path in the manager's filesystem
    table_url: str
    marker_dir_url: str
    fmt: FileFormat
    partition_by: tuple[str, ...]
    max_records: int
    faults: tuple[faults.Fault, ...]
    #: the write index (batch writes; streaming names carry the batch and run instead)
    write: int = 0
    #: tasks leave each file unpublished (a temp file, an open upload) for the driver to
    #: publish after the outcome (batch writes); False: published at task end (streaming)
    publish_after_outcome: bool = False


class _TaskFiles:
    """The files one task attempt writes: marker first, then the atomically published file."""

    def __init__(self, spec: SinkSpec, *, partition: int, attempt: int, token: str) -> None:
        self.spec = spec
        self.partition = partition
        self.attempt = attempt
        self.token = token
        self.manager, _ = spec.settings.resolve(spec.table_url)
        self.client = config.marker_client_for(spec.settings, self.manager)
        self.open_files: dict[str, _OpenFile] = {}
        #: files closed unpublished (``publish_after_outcome``): discarded if the task fails
        self.held: list[_OpenFile] = []
        self.next_seq: dict[str, int] = {}
        self.written: list[timeline.DataFile] = []
        self.data_schema: pa.Schema | None = None
        #: bytes buffered by all open files, kept up to date (summing per piece of a batch
        #: would cost O(open files) in the hot path of a partitioned write)
        self.buffered_bytes = 0

    def fault(self, point: faults.Point) -> None:
        faults.fire(self.spec.faults, point, partition=self.partition, attempt=self.attempt)

    def open_file(self, directory: str) -> _OpenFile:
        seq = self.next_seq.get(directory, 0)
        self.next_seq[directory] = seq + 1
        name = data_file_name(
            partition=self.partition, token=self.token, seq=seq, ext=self.spec.fmt.value
        )
        rel = f"{directory}/{name}" if directory else name
        self.fault(faults.Point.TASK_BEFORE_MARKER)
        self.client.create(self.spec.marker_dir_url, rel)
        self.fault(faults.Point.TASK_AFTER_MARKER)
        stream = self.manager.create_atomic(paths.join(self.spec.table, rel), overwrite=True)
        handle = _OpenFile(rel, stream, self.spec.fmt)
        self.open_files[directory] = handle
        return handle

    def close_file(self, directory: str) -> None:
        handle = self.open_files.pop(directory)
        self.buffered_bytes -= handle.buffered_bytes
        assert self.data_schema is not None
        hold = self.spec.publish_after_outcome
        # cancels itself on an error
        self.written.append(handle.finish(self.data_schema, hold=hold))
        if hold:
            self.held.append(handle)
        self.fault(faults.Point.TASK_AFTER_FILE)

    def add(self, directory: str, batch: pa.RecordBatch) -> None:
        limit = self.spec.max_records
        offset = 0
        while offset < batch.num_rows:
            handle = self.open_files.get(directory) or self.open_file(directory)
            room = batch.num_rows - offset
            if limit > 0:
                room = min(room, limit - handle.rows)
            before = handle.buffered_bytes
            handle.add(batch.slice(offset, room))  # may flush the file's own buffer
            self.buffered_bytes += handle.buffered_bytes - before
            offset += room
            self.bound_buffers()
            self.fault(faults.Point.TASK_MID_FILE)
            if limit > 0 and handle.rows >= limit:
                self.close_file(directory)

    def bound_buffers(self) -> None:
        """Flush the largest buffers while the task's open files hold too much in memory."""
        while self.buffered_bytes > TASK_BUFFER_BYTES and len(self.open_files) > 1:
            largest = max(self.open_files.values(), key=lambda h: h.buffered_bytes)
            self.buffered_bytes -= largest.buffered_bytes
            largest.flush()

    def write_all(self, batches: Iterable[pa.RecordBatch]) -> tuple[timeline.DataFile, ...]:
        parts = self.spec.partition_by
        try:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                if not parts:
                    self.data_schema = batch.schema
                    self.add("", batch)
                    continue
                keep = [n for n in batch.schema.names if n not in parts]
                self.data_schema = pa.schema([batch.schema.field(n) for n in keep])
                for directory, part in _split_by_partition(batch, parts):
                    self.add(directory, part.select(keep))
            for directory in sorted(self.open_files):
                self.close_file(directory)
            self.fault(faults.Point.TASK_END)
        except BaseException:
            # Open files, and the files this attempt closed unpublished: a failed attempt
            # leaves no temp file or open upload (the driver's W8 and R6 remove any it could not).
            for handle in [*self.open_files.values(), *self.held]:
                with contextlib.suppress(Exception):
                    handle.cancel()
            raise
        finally:
            self.client.close()
        return tuple(self.written)


def write_partition(
    spec: SinkSpec,
    batches: Iterable[pa.RecordBatch],
    *,
    partition: int,
    attempt: int,
    token: str,
) -> tuple[timeline.DataFile, ...]:
    """Write one task's rows as data files: for each file, marker first, then the file.

    Returns the files written. On any error every open file is cancelled (nothing partial is
    ever visible) and the error propagates; markers stay so a rollback finds what was written.
    """
    files = _TaskFiles(spec, partition=partition, attempt=attempt, token=token)
    return files.write_all(batches)


def _split_by_partition(
    batch: pa.RecordBatch, columns: Sequence[str]
) -> Iterator[tuple[str, pa.RecordBatch]]:
    table = pa.Table.from_batches([batch])
    keys = table.select(list(columns)).group_by(list(columns)).aggregate([]).to_pylist()
    for key in keys:
        mask = None
        for column in columns:
            value = key[column]
            arr = table.column(column)
            cond = pc.is_null(arr) if value is None else pc.equal(arr, pa.scalar(value, arr.type))
            cond = pc.fill_null(cond, False)
            mask = cond if mask is None else pc.and_(mask, cond)
        part = table.filter(mask)
        directory = partition_dir(columns, [key[c] for c in columns])
        for piece in part.combine_chunks().to_batches():
            yield directory, piece


#: the local properties Spark's micro-batch execution sets while it runs a batch (tasks inherit
#: them): in a task of the streaming sink, and of a write made inside ``foreachBatch``
QUERY_ID_PROPERTY: Final = "sql.streaming.queryId"
BATCH_ID_PROPERTY: Final = "streaming.sql.batchId"


def refuse_inside_micro_batch() -> None:
    """Fail a task of a batch write (``df.write.format("sparkguard")``) made inside
    ``foreachBatch``.

    This writer identifies a write by its rank in the driver run. A restarted query begins with
    the batch that failed, so that rank changes: its first write would match batch 0's
    committed write 0 and be skipped, a lost batch (docs/storage-contract.md, "Writes inside a
    micro-batch"). Until the Python writer knows the batch, it refuses rather than lose one.
    Only tasks carry the batch (the planner worker that builds the writer does not see the
    driver thread's local properties), so the refusal comes from the first task; the write's
    job then fails and its instant is rolled back: nothing is committed.
    """
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None or (batch := ctx.getLocalProperty(BATCH_ID_PROPERTY)) is None:
        return
    query = ctx.getLocalProperty(QUERY_ID_PROPERTY)
    raise errors.ConfigError(
        f"df.write.format('sparkguard') inside foreachBatch (query {query}, batch {batch}) is "
        "not supported: this writer counts writes per driver run, so a restarted query would "
        "skip a batch. Inside foreachBatch write through sparkguard's JVM layer, which "
        "identifies the write by (query, batch): put sparkguard's jar on the classpath "
        "(sparkguard spark-conf prints it), then df.write.format('sparkguard') is the JVM "
        "front (docs/writer.md, 'Which path writes'), as is df.write.parquet(url) under "
        "sparkguard spark-conf; or replace foreachBatch with writeStream.format('sparkguard')"
    )


def _task_identity() -> tuple[int, int, int]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return 0, 0, 0
    return ctx.partitionId(), ctx.attemptNumber(), ctx.taskAttemptId()


# --------------------------------------------------------------------------------------------
# Driver side.
# --------------------------------------------------------------------------------------------


def files_from_messages(
    messages: Sequence[WriterCommitMessage | None],
) -> tuple[timeline.DataFile, ...]:
    """The files of the winning attempts, one entry per path (pure)."""
    by_path: dict[str, timeline.DataFile] = {}
    for message in messages:
        if message is None:
            continue
        if not isinstance(message, WriteMessage):
            raise errors.SparkguardError(f"unexpected commit message {message!r}")
        for data_file in message.files:
            by_path[data_file.path] = data_file
    return tuple(by_path[p] for p in sorted(by_path))


def verify_present(
    manager: filemanager.FileManager, table: str, files: Sequence[timeline.DataFile]
) -> None:
    """Raise unless every file is on storage with its recorded size, under its temp name when
    it has one (one listing per directory), or is still a pending upload when it is one (one
    listing of the uploads under the table: S3 tells no size before the completion)."""
    by_dir: dict[str, list[timeline.DataFile]] = {}
    uploads = {f.upload: f for f in files if f.upload is not None}
    for data_file in files:
        if data_file.upload is None:
            by_dir.setdefault(paths.parent(data_file.path), []).append(data_file)
    for directory, expected in by_dir.items():
        listed = {
            info.name: info.size
            for info in manager.list(paths.join(table, directory) if directory else table)
        }
        for data_file in expected:
            size = listed.get(paths.basename(data_file.temp or data_file.path))
            if size != data_file.size:
                raise errors.SparkguardError(
                    f"{data_file.temp or data_file.path} is "
                    f"{'missing' if size is None else f'{size} B'} where its task wrote "
                    f"{data_file.size} B; refusing to commit. A concurrent rollback or a zombie "
                    "executor touched it: re-run the job"
                )
    if uploads:
        if not isinstance(manager, filemanager.DirectPutFileManager):
            raise errors.SparkguardError(f"{table}: a task reported an upload on a rename store")
        pending = rollback.pending_uploads(manager, table, files)
        for upload, data_file in sorted(uploads.items()):
            if upload not in pending:
                raise errors.SparkguardError(
                    f"the upload {upload} of {data_file.path} is no longer pending (aborted by "
                    "a concurrent rollback or a lifecycle rule?); refusing to commit: re-run "
                    "the job"
                )


def publish_committed(
    manager: filemanager.FileManager, table: str, files: Sequence[timeline.DataFile]
) -> int:
    """W9a: publish the files the tasks left unpublished (rename each temp file onto its name,
    complete each upload), concurrently (:func:`rollback.publish_files`); returns how many.
    Raises naming the files neither published now nor already there (the outcome stands: a
    reader through the timeline fails on them, ``sparkguard rollback`` warns)."""
    published, missing = rollback.publish_files(manager, table, files)
    if missing:
        raise errors.SparkguardError(
            f"committed files neither published nor pending: {', '.join(missing[:10])} (their "
            "temp files or uploads were removed after the commit verified them)"
        )
    return published


def delete_unlisted(
    manager: filemanager.FileManager,
    table: str,
    marked: Iterable[str],
    keep: Iterable[str],
) -> int:
    """Delete the marked files not in ``keep``; returns how many were deleted."""
    keep_set = set(keep)
    doomed = sorted(set(marked) - keep_set)
    manager.delete_many(paths.join(table, rel) for rel in doomed)
    return len(doomed)


@dataclasses.dataclass(frozen=True)
class Target:
    """A table a write goes to, opened on the driver."""

    url: str
    manager: filemanager.FileManager
    path: str
    timeline: timeline.Timeline


def open_target(url: str, settings: config.WriteSettings) -> Target:
    """Resolve the table URL under ``settings``.

    Refuses the in-memory store: it lives in one process, and Spark writes from several (tasks
    run in Python workers, the commit in another).
    """
    normalised = reader.table_url(url)
    manager, path = settings.resolve(normalised)
    if isinstance(manager, filemanager.MemoryFileManager):
        raise errors.ConfigError(
            f"table {url!r}: the in-memory store lives inside one process, and Spark's tasks and "
            "commit run in other processes; write to a local path or an object store instead"
        )
    return Target(normalised, manager, path, timeline.Timeline(manager, path))


def record_journal(settings: config.WriteSettings, *, table_url: str, instant: str) -> None:
    """Record the instant in the job journal (when one is configured)."""
    if not settings.journal:
        return
    jmanager, jpath = filemanager.resolve(
        settings.journal,
        storage_options=settings.storage_options,
        kind=settings.file_manager,
        create_mode=settings.create_mode,
    )
    journal.Journal(jmanager, jpath, settings.job_id).record(
        table=table_url, instant=instant, attempt=settings.attempt
    )


def roll_back_stale(target: Target, settings: config.WriteSettings) -> rollback.WriteGuard:
    """Roll back this job's undecided instants on the table: an earlier attempt's leftovers;
    then claim the job for this owner (O4a). Returns what :func:`rollback.confirm_sole_writer`
    checks once the instant is open.

    Runs before a new attempt writes anything, so the old attempt's rollback can never delete
    files the new attempt writes under the same names; it also fences the old driver.
    """
    # Only this owner's instants; another owner's undecided instant refuses the write.
    guard = rollback.guard_write(
        target.timeline,
        job_id=settings.job_id,
        owner=settings.instant_owner,
        table_label=target.url,
        skip_operations=[reader.Operation.STREAM_REGISTER.value],
    )
    roll_forward_job(target, settings.job_id)
    return guard


def roll_forward_job(target: Target, job_id: str) -> int:
    """R8a at W1: publish the files of every COMMITTED instant of the job whose marker
    directory survived (its driver died between the outcome and the end of its publication),
    before the rerun check: a skipped rerun then leaves the committed rows readable, and a
    rewrite never writes a name whose committed temp file a later roll forward would rename
    over it. One listing of ``markers/``; markers and the rest stay with ``sparkguard
    rollback`` (R8b). Returns how many files were published."""
    tl = target.timeline
    listed = target.manager.list(
        paths.join(target.path, timeline.SPARKGUARD_DIR, markers.MARKERS_DIR)
    )
    surviving = {
        paths.basename(info.path)
        for info in listed
        if info.is_dir and paths.basename(info.path).endswith("-" + job_id)
    }
    published = 0
    for instant in sorted(surviving):
        if tl.status(instant).state is timeline.State.COMMITTED:
            count, warnings = rollback.roll_forward(tl, instant)
            published += count
            for warning in warnings:
                logger.warning("%s: %s", target.url, warning)
    return published


class SparkguardDataSource(DataSource):
    """The ``sparkguard`` data source. Use :func:`register` to make it available."""

    #: ``spark.sparkguard.*`` conf captured by :func:`register` on the driver.
    conf: Mapping[str, str] = {}
    #: the format name Spark knows it by (:func:`register`)
    source_name: str = NAME

    @classmethod
    def name(cls) -> str:
        return cls.source_name

    def _option(self, key: str, default: str | None = None) -> str | None:
        for k, v in self.options.items():
            if k.lower() == key.lower():
                return str(v)
        return default

    def sink_options(
        self,
    ) -> tuple[str, FileFormat, tuple[str, ...], int, tuple[faults.Fault, ...]]:
        """path, format, partition columns, maxRecordsPerFile and faults from the options."""
        url = self._option("path")
        if not url:
            raise errors.ConfigError(
                "the sparkguard writer needs a table location: .save('<url>') or "
                ".option('path', '<url>')"
            )
        raw_format = (self._option("format") or FileFormat.PARQUET.value).lower()
        try:
            fmt = FileFormat(raw_format)
        except ValueError:
            raise errors.ConfigError(
                f"option 'format'={raw_format!r} is not supported; use parquet or json"
            ) from None
        raw_parts = self._option("partitionBy") or ""
        if raw_parts.startswith("["):
            parts = tuple(json.loads(raw_parts))
        else:
            parts = tuple(p.strip() for p in raw_parts.split(",") if p.strip())
        raw_max = self._option("maxRecordsPerFile") or "0"
        max_records = config.parse_non_negative_int(
            raw_max,
            error=f"option 'maxRecordsPerFile'={raw_max!r} must be an integer >= 0 (0: no limit)",
        )
        return url, fmt, parts, max_records, faults.parse(self._option(faults.OPTION))

    def settings(self) -> config.WriteSettings:
        """Write settings: registered conf overridden by this write's options."""
        return config.parse_settings(conf=self.conf, options=dict(self.options.items()))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        settings = self.settings()
        url, fmt, parts, max_records, injected = self.sink_options()
        _check_partition_columns(schema, parts)
        raw_rerun = (self._option("rerun") or Rerun.SKIP.value).lower()
        try:
            rerun = Rerun(raw_rerun)
        except ValueError:
            raise errors.ConfigError(
                f"option 'rerun'={raw_rerun!r} is not valid; use skip (default) or rewrite"
            ) from None
        target = open_target(url, settings)
        # Before W1 creates _sparkguard/ (the owner claim): a rollback of a write that created
        # the location removes it again (docs/storage-contract.md, "The life of a table").
        created_location = not target.manager.exists(target.path)
        write = next_write_index(driver_run_dir(), job_id=settings.job_id, table_url=target.url)
        guard = roll_back_stale(target, settings)
        committed = committed_write(target, settings.job_id, write)
        if committed is not None and rerun is Rerun.SKIP:
            logger.warning(
                "job %s already committed write %d on %s as %s: skipping it (rerun=skip); pass "
                ".option('rerun', 'rewrite') to write again",
                settings.job_id,
                write,
                target.url,
                committed,
            )
            return SkipWriter(settings.job_id, target.url, committed)
        if overwrite:
            operation = reader.Operation.OVERWRITE
        elif committed is not None:
            operation = reader.Operation.REWRITE
        else:
            operation = reader.Operation.APPEND
        instant = target.timeline.start(
            settings.job_id,
            owner=settings.instant_owner,
            attempt=settings.attempt,
            marker_type=settings.marker_type.value,
            operation=operation.value,
            extra={
                "format": fmt.value,
                "partitionBy": list(parts),
                "ownerClaim": guard.claim.epoch,
                **({lifecycle.CREATED_LOCATION: True} if created_location else {}),
            },
            write=write,
        )
        record_journal(settings, table_url=target.url, instant=instant)
        rollback.confirm_sole_writer(
            target.timeline, guard, instant=instant, table_label=target.url
        )
        mdir = markers.marker_dir(target.path, instant)
        if settings.marker_type is markers.MarkerType.DIRECT:
            markers.DirectMarkerClient(target.manager).write_type(mdir)
        faults.fire(injected, faults.Point.DRIVER_AFTER_INFLIGHT)
        spec = SinkSpec(
            settings=settings,
            table=target.path,
            table_url=target.url,
            marker_dir_url=markers.marker_dir(target.url, instant),
            fmt=fmt,
            partition_by=parts,
            max_records=max_records,
            faults=injected,
            write=write,
            publish_after_outcome=True,
        )
        return BatchWriter(spec, instant=instant, operation=operation, schema_json=schema.json())

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802
        from sparkguard.spark_lib.spark import streaming

        return streaming.stream_writer_for(self, schema, overwrite=overwrite)


def committed_write(target: Target, job_id: str, write: int) -> str | None:
    """The instant that committed write ``write`` (a plain write) of ``job_id`` on the table,
    hot or archived in a snapshot; None when it did not commit."""
    hot = [
        s.instant
        for s in target.timeline.statuses(job_id=job_id)
        if s.state is timeline.State.COMMITTED
        and not str(s.extra.get("operation", "")).startswith("stream-")
        and snapshots.micro_batch_of(s) is None
        and write_index_of(s) == write
    ]
    if hot:
        return hot[-1]
    # After the hot listing: an instant archived meanwhile is in the snapshot read now.
    history = snapshots.job_history(target.manager, target.path, job_id)
    archived = [
        s.instant
        for s in history.archived
        if s.state is timeline.State.COMMITTED
        and not str(s.extra.get("operation", "")).startswith("stream-")
        and snapshots.micro_batch_of(s) is None
        and write_index_of(s) == write
    ]
    archived += [w.instant for w in history.writes if w.micro_batch is None and w.write == write]
    return max(archived) if archived else None


def _check_partition_columns(schema: StructType, parts: Sequence[str]) -> None:
    names = schema.fieldNames()
    for column in parts:
        if column not in names:
            raise errors.ConfigError(
                f"option 'partitionBy' names {column!r}, which is not a column; use one of "
                f"{', '.join(names)}"
            )
    if parts and len(parts) == len(names):
        raise errors.ConfigError(
            "option 'partitionBy' lists every column; keep at least one data column"
        )


class SkipWriter(DataSourceArrowWriter):
    """Writes nothing: the job already committed on this table (``rerun=skip``)."""

    def __init__(self, job_id: str, table_url: str, instant: str) -> None:
        self.job_id = job_id
        self.table_url = table_url
        self.instant = instant

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteMessage:
        refuse_inside_micro_batch()  # the skip is where a restarted query would lose a batch
        partition, attempt, task_id = _task_identity()
        return WriteMessage(partition=partition, attempt=attempt, task_attempt_id=task_id, files=())

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        logger.info("job %s: nothing written, %s already committed", self.job_id, self.instant)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing was written."""


class BatchWriter(DataSourceArrowWriter):
    """One instant: executors write marked files, the driver commits or rolls back."""

    def __init__(
        self,
        spec: SinkSpec,
        *,
        instant: str,
        operation: reader.Operation,
        schema_json: str,
    ) -> None:
        self.spec = spec
        self.instant = instant
        self.operation = operation
        self.schema_json = schema_json

    @property
    def token(self) -> str:
        """The name token of this write's files (:func:`batch_token`)."""
        return batch_token(self.spec.settings.job_id, self.spec.write)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteMessage:
        refuse_inside_micro_batch()
        partition, attempt, task_id = _task_identity()
        files = write_partition(
            self.spec, iterator, partition=partition, attempt=attempt, token=self.token
        )
        return WriteMessage(
            partition=partition, attempt=attempt, task_attempt_id=task_id, files=files
        )

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit_instant(
            self.spec,
            self.instant,
            messages,
            operation=self.operation,
            schema_json=self.schema_json,
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        from sparkguard.spark_lib.storage import rollback

        faults.fire(self.spec.faults, faults.Point.ABORT_START)
        manager, table = self.spec.settings.resolve(self.spec.table_url)
        result = rollback.rollback_instant(
            timeline.Timeline(manager, table),
            self.instant,
            force=True,  # our own instant
        )
        logger.warning(
            "write %s aborted: %s (deleted %d files)",
            self.instant,
            result.action.value,
            result.files_deleted,
        )


def commit_instant(
    spec: SinkSpec,
    instant: str,
    messages: Sequence[WriterCommitMessage | None],
    *,
    operation: reader.Operation,
    schema_json: str,
) -> tuple[timeline.DataFile, ...]:
    """The driver's commit: verify, reconcile against the markers, decide, clean the markers.

    Raises :class:`~sparkguard.spark_lib.base.errors.InstantDecidedError` when a rollback claimed
    the instant first (a zombie driver): nothing is published then.
    """
    faults.fire(spec.faults, faults.Point.COMMIT_START)
    if any(m is None for m in messages):
        raise errors.SparkguardError(f"commit of {instant} got a missing task message; aborting")
    manager, table = spec.settings.resolve(spec.table_url)
    tl = timeline.Timeline(manager, table)
    client = config.marker_client_for(spec.settings, manager)
    try:
        decided = tl.read_outcome(instant)
        if decided is not None:  # fail early and clearly; the outcome write below is the fence
            raise errors.InstantDecidedError(
                f"instant {instant} of {spec.table_url} was already decided as "
                f"{decided[0].value} (a rollback claimed it); this commit publishes nothing",
                instant=instant,
                outcome=decided[0].value,
            )
        files = files_from_messages(messages)
        verify_present(manager, table, files)
        # W8's read seals the directory: the sidecar acknowledges no marker after it.
        marked = client.seal(spec.marker_dir_url)
        unlisted = set(marked) - {f.path for f in files}
        if unlisted:
            # Failed attempts' leftovers; names an earlier commit lists are kept (rerun case).
            keep = set(tl.committed_files(instants=tl.instant_ids(job_id=spec.settings.job_id)))
            keep |= snapshots.job_history(manager, table, spec.settings.job_id).names
            deleted = delete_unlisted(manager, table, unlisted, keep)
            logger.info("commit %s: deleted %d files of failed attempts", instant, deleted)
        from sparkguard.spark_lib.storage import rollback

        # Late files of this job's rolled-back instants (a zombie task published them after
        # the rollback): gone before this commit (docs/storage-contract.md, "Late files").
        rollback.sweep_late_files(
            tl, job_id=spec.settings.job_id, instant=instant, keep=[f.path for f in files]
        )
        faults.fire(spec.faults, faults.Point.COMMIT_BEFORE_OUTCOME)
        tl.commit(
            instant,
            files,
            extra={
                "operation": operation.value,
                "format": spec.fmt.value,
                "partitionBy": list(spec.partition_by),
                "schema": schema_json,
                "committedAt": reader.now_key(),
                "attempt": spec.settings.attempt,
                "rows": sum(f.rows for f in files),
            },
            write=spec.write,
        )
        faults.fire(spec.faults, faults.Point.COMMIT_AFTER_OUTCOME)
        publish_committed(manager, table, files)
        # Other attempts' temp files and uploads of the marked names (failed, retried,
        # speculative): never published; the outcome now lists the accepted ones, kept here.
        rollback.remove_unlisted_leftovers(tl, marked, job_id=spec.settings.job_id)
        client.delete_dir(spec.marker_dir_url)
    finally:
        client.close()
    logger.info("committed %s: %d files", instant, len(files))
    maybe_compact(manager, table, spec.settings)
    return files


def maybe_compact(
    manager: filemanager.FileManager, table: str, settings: config.WriteSettings
) -> snapshots.CompactResult | None:
    """After a commit (W10 done): compact the timeline when ``settings.snapshot_every`` decided
    instants are uncovered. Best effort: an error is a warning, never the write's failure."""
    if settings.snapshot_every <= 0:
        return None
    try:
        if snapshots.uncovered_decided(manager, table) < settings.snapshot_every:
            return None
        result = snapshots.compact(
            manager, table, archive_retention_days=settings.archive_retention_days
        )
    except Exception as exc:  # noqa: BLE001 - compaction never fails the write
        logger.warning("timeline compaction of %s failed (the write is committed): %s", table, exc)
        return None
    logger.info("timeline compaction of %s: %s", table, result.to_json())
    return result


def source_class(conf: Mapping[str, str], *, name: str = NAME) -> type[SparkguardDataSource]:
    """A :class:`SparkguardDataSource` subclass carrying ``conf`` (pickled by value), known to
    Spark as ``name``."""
    cls_name = f"SparkguardDataSource_{uuid.uuid4().hex[:8]}"
    cls = type(
        cls_name,
        (SparkguardDataSource,),
        {"conf": dict(conf), "source_name": name, "__module__": __name__},
    )
    cls.__qualname__ = cls_name
    return cls


def jvm_front_available(spark: Any) -> bool:
    """Whether ``format("sparkguard")`` is the JVM front in ``spark`` (sparkguard's jar on the
    driver's classpath): then Spark resolves the name to :data:`JVM_SOURCE_CLASS` before any
    Python data source, and refuses a Python source of the same name."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:  # Spark Connect: no driver JVM in this process; Spark answers for the name
        return False
    try:
        return bool(jvm.org.apache.spark.util.Utils.classIsLoadable(JVM_SOURCE_CLASS))
    except Exception:  # noqa: BLE001 - py4j errors mean "not loadable" here
        return False


def register(spark: Any, *, conf: Mapping[str, str] | None = None) -> type[SparkguardDataSource]:
    """Register the fsspec writer on ``spark`` (call on the driver); returns its class.

    It is always ``format("sparkguard-fsspec")``. ``format("sparkguard")`` is the JVM front
    (sparkguard's commit protocol, no Python in the data path) when sparkguard's jar is on the
    driver's classpath, and this writer otherwise (docs/writer.md, "Which path writes"); the
    JVM front hands this writer the locations Hadoop has no FileSystem for, and
    ``writeStream.format("sparkguard")`` (the streaming sink).

    Captures the session's ``spark.sparkguard.*`` conf (and ``spark.driver.host``) now; later
    changes need another call. ``conf`` entries are added on top (tests, notebooks).
    """
    captured = config.conf_from_spark(spark)
    captured.update(conf or {})
    fsspec = source_class(captured, name=FSSPEC_NAME)
    spark.dataSource.register(fsspec)
    if jvm_front_available(spark):
        return fsspec
    cls = source_class(captured)
    spark.dataSource.register(cls)
    return cls
