"""The guarded streaming sink: ``df.writeStream.format("sparkguard")`` (append mode).

Each micro-batch execution is identified by the batch id and the query *run* (a restart from the
checkpoint is a new run). Executors write marked files named
``part-<partition:05d>-<jobId>-b<batchId:010d>-<run>-c<seq:03d>.<ext>``, markers under
``<table>/_sparkguard/streams/<jobId>/markers/b<batchId>-<run>/``. The driver's commit decides the
batch in the stream log (``reader.StreamLog``): the first run to commit a batch id wins, put-if-
absent. A batch re-executed after a restart (Spark replays the same rows under the same batch id
when the previous commit did not reach the checkpoint) finds the batch already decided and
deletes its own copy instead: every batch is visible once, and never half (files are published
atomically and become visible to readers only through the log entry).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Iterator
from typing import Any, Final

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from sparkguard.spark_lib.base import errors, paths
from sparkguard.spark_lib.spark import faults, writer
from sparkguard.spark_lib.storage import reader, rollback, timeline

logger = logging.getLogger(__name__)

#: where a task finds its query run id (Spark sets the run id as the stream's job group)
RUN_ID_PROPERTIES: Final = ("sql.streaming.runId", "spark.jobGroup.id")
_RUN_IN_DESCRIPTION: Final = re.compile(r"runId = ([0-9a-fA-F-]{32,36})")
REGISTRATION: Final = "registration"


def run_token(run_id: str | None) -> str:
    """A short, name-safe token of a query run id (pure)."""
    if not run_id:
        raise errors.SparkguardError(
            "the task carries no streaming run id (spark.jobGroup.id); the sparkguard sink "
            "needs micro-batch execution"
        )
    return run_id.replace("-", "").lower()[:16]


def task_run_id(ctx: Any) -> str | None:
    """The streaming query run id a task belongs to, from its local properties."""
    for key in RUN_ID_PROPERTIES:
        value = ctx.getLocalProperty(key)
        if value:
            return str(value)
    match = _RUN_IN_DESCRIPTION.search(ctx.getLocalProperty("spark.job.description") or "")
    return match.group(1) if match else None


def ensure_registered(target: writer.Target, settings: Any, *, fmt: str, schema_json: str) -> None:
    """Record the stream in the timeline and the job journal once per (job, table).

    The registration is an instant committed at once with no files: it carries the format and
    schema for readers and makes the table known to a rollback by job id.
    """
    log = reader.StreamLog(target.manager, target.path, settings.job_id)
    marker = paths.join(paths.parent(log.directory), REGISTRATION)
    if target.manager.exists(marker):
        return
    instant = target.timeline.start(
        settings.job_id,
        owner=settings.instant_owner,
        attempt=settings.attempt,
        marker_type=settings.marker_type.value,
        operation=reader.Operation.STREAM_REGISTER.value,
    )
    writer.record_journal(settings, table_url=target.url, instant=instant)
    target.timeline.commit(
        instant,
        [],
        extra={
            "operation": reader.Operation.STREAM_REGISTER.value,
            "format": fmt,
            "schema": schema_json,
            "committedAt": reader.now_key(),
        },
    )
    target.manager.mkdirs(paths.parent(marker))
    target.manager.put_if_absent(marker, instant.encode())


def stream_writer_for(
    source: writer.SparkguardDataSource, schema: StructType, *, overwrite: bool
) -> StreamWriter:
    """Build the stream writer for ``source``'s options (driver side)."""
    if overwrite:
        raise errors.ConfigError(
            "the sparkguard sink supports outputMode('append') only; complete/update would "
            "rewrite the table every batch"
        )
    settings = source.settings()
    url, fmt, parts, max_records, injected = source.sink_options()
    target = writer.open_target(url, settings)
    ensure_registered(target, settings, fmt=fmt.value, schema_json=schema.json())
    spec = writer.SinkSpec(
        settings=settings,
        table=target.path,
        table_url=target.url,
        marker_dir_url="",
        fmt=fmt,
        partition_by=parts,
        max_records=max_records,
        faults=injected,
    )
    return StreamWriter(spec)


class StreamWriter(DataSourceStreamArrowWriter):
    """Writes each micro-batch as marked files; commits each batch id exactly once."""

    def __init__(self, spec: writer.SinkSpec) -> None:
        self.spec = spec

    def _log(self) -> tuple[reader.StreamLog, timeline.Timeline]:
        manager, table = self.spec.settings.resolve(self.spec.table_url)
        return (
            reader.StreamLog(manager, table, self.spec.settings.job_id),
            timeline.Timeline(manager, table),
        )

    def _marker_dir_url(self, batch_id: int, run: str) -> str:
        return (
            f"{self.spec.table_url}/{timeline.SPARKGUARD_DIR}/{reader.STREAMS_DIR}/"
            f"{self.spec.settings.job_id}/markers/b{batch_id:010d}-{run}"
        )

    def write(self, iterator: Iterator[pa.RecordBatch]) -> writer.WriteMessage:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        raw_batch = ctx.getLocalProperty(writer.BATCH_ID_PROPERTY) if ctx else None
        if ctx is None or raw_batch is None:
            raise errors.SparkguardError(
                f"no {writer.BATCH_ID_PROPERTY} in the task's properties: the sparkguard sink "
                "needs micro-batch execution (no continuous trigger)"
            )
        batch_id = int(raw_batch)
        run = run_token(task_run_id(ctx))
        partition, attempt, task_id = ctx.partitionId(), ctx.attemptNumber(), ctx.taskAttemptId()
        spec = dataclasses.replace(self.spec, marker_dir_url=self._marker_dir_url(batch_id, run))
        token = f"{self.spec.settings.job_id}-b{batch_id:010d}-{run}"
        files = writer.write_partition(
            spec, iterator, partition=partition, attempt=attempt, token=token
        )
        return writer.WriteMessage(
            partition=partition, attempt=attempt, task_attempt_id=task_id, files=files, run=run
        )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        runs = {m.run for m in messages if isinstance(m, writer.WriteMessage)}
        if not runs:
            return
        if len(runs) > 1:
            raise errors.SparkguardError(f"batch {batchId} got messages of several runs: {runs}")
        run = runs.pop()
        faults.fire(self.spec.faults, faults.Point.STREAM_COMMIT_START)
        log, tl = self._log()
        files = writer.files_from_messages(messages)
        writer.verify_present(log.manager, log.table, files)
        decided = log.commit(batchId, run=run, files=files)
        if not decided.committed:
            raise errors.InstantDecidedError(
                f"batch {batchId} of run {run} was fenced by a rollback; this commit publishes "
                "nothing. Restart the query from its checkpoint",
                instant=f"stream:{log.job_id}:{batchId}",
                outcome="rolled_back",
            )
        if decided.run != run:
            logger.warning(
                "batch %s was already committed by run %s: dropping this re-execution's files",
                batchId,
                decided.run,
            )
        faults.fire(self.spec.faults, faults.Point.STREAM_AFTER_COMMIT)
        # Our own leftovers (failed attempts, or the whole copy of a duplicate), then other
        # runs' leftovers of batches that are decided by now.
        for other_batch, other_run, directory in log.marker_dirs():
            if other_batch > batchId:
                continue
            if (other_batch, other_run) != (batchId, run) and log.winner_of(
                log.slots(other_batch)
            ) is None:
                continue
            rollback.clean_stream_dir(tl, log, other_batch, other_run, directory)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        log, tl = self._log()
        for run in sorted({m.run for m in messages if isinstance(m, writer.WriteMessage)}):
            directory = log.marker_dir(batchId, run)
            if log.manager.exists(directory):
                rollback.clean_stream_dir(tl, log, batchId, run, directory)
