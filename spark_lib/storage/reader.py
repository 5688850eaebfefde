"""What a table holds: the committed, non-superseded data files, and how to read only them.

Readers of a sparkguard table must not list its directory (that would show in-flight and failed
writes); they ask the table's commits instead:

* batch writes: committed instants of the timeline (``<table>/_sparkguard/timeline``);
* streaming writes: decided micro-batches of each stream's commit log
  (``<table>/_sparkguard/streams/<jobId>/commits/<batchId>/<slot>``, see :class:`StreamLog`).

Commits apply in commit order. An ``append`` adds its files; an ``overwrite`` first drops every
file committed before it (they become *superseded*: still on storage, no longer part of the
table); an ``overwrite-partitions`` (Spark's dynamic partition overwrite, or a static overwrite
of some partitions, through the JVM commit protocol) drops the files committed before it under
the partition directories it lists (``extra.partitions``); a ``rewrite`` (a re-run of the same
job with ``rerun=rewrite``) drops the files of the same job's earlier commits of the same
write (write identity: the n-th write of the job to the table in its driver run).
:func:`visible_files` and :func:`superseded_files` are purely computational functions with no
side-effects over :class:`Commit` values. Superseded files stay on storage for the Python
writer; the JVM commit protocol deletes them right after the superseding commit (W9b).
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors, formats, paths
from sparkguard.spark_lib.storage import timeline

logger = logging.getLogger(__name__)

STREAMS_DIR: Final = "streams"
STREAM_ENTRY_KIND: Final = "sparkguard.stream.batch"
STREAM_VERSION: Final = 1
_BATCH_DIR: Final = re.compile(r"^[0-9]{20}$")
_SLOT_NAME: Final = re.compile(r"^[0-9]{3}$")
MAX_SLOTS: Final = 1000


class Operation(enum.StrEnum):
    """What a commit does to the files committed before it."""

    APPEND = "append"
    OVERWRITE = "overwrite"
    OVERWRITE_PARTITIONS = "overwrite-partitions"  # replaces the files under extra.partitions
    REWRITE = "rewrite"  # same job re-run with rerun=rewrite: replaces that write's files
    STREAM_BATCH = "stream-batch"
    STREAM_REGISTER = "stream-register"  # empty commit that records a stream in the journal


def now_key() -> str:
    """A sortable UTC timestamp (``yyyyMMddHHmmssSSSSSS``) used to order commits."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y%m%d%H%M%S%f")


@dataclasses.dataclass(frozen=True)
class Commit:
    """One decided commit of data files, from the timeline or a stream log."""

    order: str  # sortable: when it was committed
    source: str  # the instant id, or "stream:<jobId>:<batchId>"
    job_id: str
    operation: Operation
    files: tuple[timeline.DataFile, ...]
    format: str | None = None
    schema: str | None = None  # Spark schema JSON of the written DataFrame
    write: int = 0  # the write identity of a batch commit (0 for old instants and streams)
    partitions: tuple[str, ...] = ()  # overwrite-partitions: the replaced partition directories


def in_partitions(path: str, partitions: Iterable[str]) -> bool:
    """Whether the relative ``path`` lies under one of the partition directories (pure)."""
    return any(path.startswith(f"{partition}/") for partition in partitions)


def is_data_path(relative: str) -> bool:
    """Whether Spark's file listing reads ``relative``: no segment starts with ``_`` or ``.``
    (pure)."""
    return all(s and not s.startswith(("_", ".")) for s in relative.split("/"))


def visible_files(commits: Iterable[Commit]) -> dict[str, timeline.DataFile]:
    """Relative path -> file for the files a reader sees after ``commits``.

    A purely computational function with no side-effects. Commits apply in ``order``.
    """
    visible: dict[str, timeline.DataFile] = {}
    owner: dict[str, tuple[str, int]] = {}  # path -> (job id, write) that committed it
    for commit in sorted(commits, key=lambda c: (c.order, c.source)):
        if commit.operation is Operation.OVERWRITE:
            visible.clear()
            owner.clear()
        elif commit.operation is Operation.OVERWRITE_PARTITIONS:
            for path in [p for p in visible if in_partitions(p, commit.partitions)]:
                del visible[path]
                del owner[path]
        elif commit.operation is Operation.REWRITE:
            rewritten = (commit.job_id, commit.write)
            for path in [p for p, by in owner.items() if by == rewritten]:
                del visible[path]
                del owner[path]
        for data_file in commit.files:
            visible[data_file.path] = data_file
            owner[data_file.path] = (commit.job_id, commit.write)
    return visible


def superseded_files(commits: Sequence[Commit]) -> set[str]:
    """Relative paths committed at some point but no longer visible (safe to clean up).

    A purely computational function with no side-effects. A cleanup may delete these once no
    reader still uses a snapshot taken before the superseding commit.
    """
    listed = {f.path for c in commits for f in c.files}
    return listed - set(visible_files(commits))


# --------------------------------------------------------------------------------------------
# Stream commit logs.
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StreamEntry:
    """One slot of a batch's decision: a commit by one run, or a fence against some runs."""

    batch_id: int
    slot: int
    run: str
    committed: bool  # False: a fence written by a rollback
    fenced_runs: tuple[str, ...]
    files: tuple[timeline.DataFile, ...]
    order: str

    def to_json(self) -> dict[str, Any]:
        """The JSON body stored in the slot file."""
        return {
            "batchId": self.batch_id,
            "slot": self.slot,
            "run": self.run,
            "decision": "committed" if self.committed else "fenced",
            "fencedRuns": list(self.fenced_runs),
            "files": [f.to_json() for f in self.files],
            "order": self.order,
        }


class StreamLog:
    """The decisions about the micro-batches one job's stream wrote to one table.

    Each batch id owns a directory of numbered slots, each written put-if-absent. The batch's
    winner is its first *committed* slot; slots before it are fences written by rollbacks, each
    naming the runs it forbids to commit that batch. A committer writes only the first free slot
    after re-reading the ones before it, so at most one run ever commits a batch, a fenced run
    never does, and a restarted query (a new run) can still commit a batch a rollback fenced.
    """

    def __init__(self, manager: filemanager.FileManager, table: str, job_id: str) -> None:
        self.manager = manager
        self.table = paths.validate_base(table, what="table path")
        self.job_id = timeline.validate_job_id(job_id)
        self.directory = paths.join(
            self.table, timeline.SPARKGUARD_DIR, STREAMS_DIR, job_id, "commits"
        )
        self.markers_directory = paths.join(
            self.table, timeline.SPARKGUARD_DIR, STREAMS_DIR, job_id, "markers"
        )

    def _batch_dir(self, batch_id: int) -> str:
        if batch_id < 0:
            raise errors.ConfigError(f"batch id must be >= 0, got {batch_id}")
        return paths.join(self.directory, f"{batch_id:020d}")

    def _read_slot(self, path: str) -> StreamEntry:
        doc = formats.decode(
            self.manager.read_bytes(path),
            kind=STREAM_ENTRY_KIND,
            versions=frozenset({STREAM_VERSION}),
            source=path,
        )
        decision = formats.require(doc, "decision", str, source=path)
        if decision not in ("committed", "fenced"):
            raise errors.CorruptFileError(f"{path} has unknown decision {decision!r}")
        return StreamEntry(
            batch_id=formats.require(doc, "batchId", int, source=path),
            slot=formats.require(doc, "slot", int, source=path),
            run=formats.require(doc, "run", str, source=path),
            committed=decision == "committed",
            fenced_runs=tuple(formats.require(doc, "fencedRuns", list, source=path)),
            files=tuple(
                timeline.DataFile.from_json(f, source=path)
                for f in formats.require(doc, "files", list, source=path)
            ),
            order=formats.require(doc, "order", str, source=path),
        )

    def slots(self, batch_id: int) -> list[StreamEntry]:
        """Every slot of ``batch_id``, in slot order."""
        entries = []
        for info in self.manager.list(self._batch_dir(batch_id)):
            if filemanager.is_temp_name(info.name):
                continue
            if not _SLOT_NAME.match(info.name):
                raise errors.CorruptFileError(
                    f"unexpected file {info.path} in stream log {self.directory}; move it away"
                )
            entries.append(self._read_slot(info.path))
        return sorted(entries, key=lambda e: e.slot)

    @staticmethod
    def winner_of(entries: Sequence[StreamEntry]) -> StreamEntry | None:
        """The committed slot that decides a batch, if any (purely computational)."""
        for entry in entries:
            if entry.committed:
                return entry
        return None

    def _decide(self, batch_id: int, entry_for_slot: Any) -> StreamEntry:
        for _ in range(MAX_SLOTS):
            entries = self.slots(batch_id)
            winner = self.winner_of(entries)
            if winner is not None:
                return winner
            proposed: StreamEntry | None = entry_for_slot(entries)
            if proposed is None:  # the caller is fenced
                return entries[-1]
            data = formats.encode(STREAM_ENTRY_KIND, STREAM_VERSION, proposed.to_json())
            directory = self._batch_dir(batch_id)
            self.manager.mkdirs(directory)
            if self.manager.put_if_absent(paths.join(directory, f"{proposed.slot:03d}"), data):
                return proposed
        raise errors.SparkguardError(f"batch {batch_id} of {self.directory} has too many slots")

    def commit(self, batch_id: int, *, run: str, files: Sequence[timeline.DataFile]) -> StreamEntry:
        """Try to commit ``batch_id`` for ``run``; returns the batch's deciding entry.

        The returned entry is ours when ``entry.committed and entry.run == run``; a committed
        entry of another run means the batch was already committed (a re-executed batch); an
        uncommitted entry is the fence that forbids ``run`` to commit.
        """
        return self._propose(batch_id, run=run, commit=True, files=files)

    def fence(self, batch_id: int, *, run: str) -> StreamEntry | None:
        """Forbid ``run`` to commit ``batch_id`` unless a commit already decided the batch.

        Returns the batch's committed entry when one exists (then nothing is fenced), else None.
        """
        decided = self._propose(batch_id, run=run, commit=False, files=())
        return decided if decided.committed else None

    def _propose(
        self, batch_id: int, *, run: str, commit: bool, files: Sequence[timeline.DataFile]
    ) -> StreamEntry:
        """Add ``run``'s commit (or, ``commit=False``, a fence against it) as the batch's next
        slot unless ``run`` is already fenced; returns the deciding entry."""

        def propose(entries: list[StreamEntry]) -> StreamEntry | None:
            if any(run in e.fenced_runs for e in entries):
                return None
            return StreamEntry(
                batch_id=batch_id,
                slot=len(entries),
                run=run if commit else "rollback",
                committed=commit,
                fenced_runs=() if commit else (run,),
                files=tuple(files),
                order=now_key(),
            )

        return self._decide(batch_id, propose)

    def batch_ids(self) -> list[int]:
        """Batch ids that have at least one slot."""
        ids = [int(i.name) for i in self.manager.list(self.directory) if _BATCH_DIR.match(i.name)]
        return sorted(ids)

    def committed(self) -> list[StreamEntry]:
        """The winning entry of every committed batch, in batch order."""
        result = []
        for batch_id in self.batch_ids():
            winner = self.winner_of(self.slots(batch_id))
            if winner is not None:
                result.append(winner)
        return result

    def marker_dirs(self) -> list[tuple[int, str, str]]:
        """(batch id, run, path) of every stream marker directory still on storage."""
        result = []
        for info in self.manager.list(self.markers_directory):
            match = re.match(r"^b([0-9]{10})-([0-9a-z]+)$", info.name)
            if match and info.is_dir:
                result.append((int(match.group(1)), match.group(2), info.path))
        return sorted(result)

    def marker_dir(self, batch_id: int, run: str) -> str:
        """The marker directory of one run's execution of ``batch_id``."""
        return paths.join(self.markers_directory, f"b{batch_id:010d}-{run}")


def stream_jobs(manager: filemanager.FileManager, table: str) -> list[str]:
    """Job ids that have a stream directory in the table."""
    directory = paths.join(table, timeline.SPARKGUARD_DIR, STREAMS_DIR)
    return sorted(info.name for info in manager.list(directory) if info.is_dir)


# --------------------------------------------------------------------------------------------
# Loading commits.
# --------------------------------------------------------------------------------------------


def commit_of_status(status: timeline.InstantStatus) -> Commit | None:
    """The :class:`Commit` of a committed instant; None for any other state (pure)."""
    if status.state is not timeline.State.COMMITTED:
        return None
    extra: Mapping[str, Any] = status.extra
    raw_op = str(extra.get("operation", Operation.APPEND.value))
    try:
        operation = Operation(raw_op)
    except ValueError:
        raise errors.CorruptFileError(
            f"instant {status.instant} has unknown operation {raw_op!r}; upgrade sparkguard"
        ) from None
    partitions = extra.get("partitions", [])
    if operation is Operation.OVERWRITE_PARTITIONS and (
        not isinstance(partitions, list)
        or not all(isinstance(p, str) and p and is_data_path(p) for p in partitions)
    ):
        raise errors.CorruptFileError(
            f"instant {status.instant} is an overwrite-partitions without a valid "
            f"extra.partitions list ({partitions!r}); repair or remove its outcome"
        )
    return Commit(
        order=str(extra.get("committedAt") or status.instant[:17]),
        source=status.instant,
        job_id=status.job_id,
        operation=operation,
        files=status.files,
        format=extra.get("format"),
        schema=extra.get("schema"),
        write=status.info.write if status.info is not None and status.info.write else 0,
        partitions=tuple(partitions) if operation is Operation.OVERWRITE_PARTITIONS else (),
    )


def load_commits(manager: filemanager.FileManager, table: str) -> list[Commit]:
    """Every commit of the table at path ``table``: committed instants and stream batches.

    Reads the newest valid snapshot and only the instants and stream batches it does not
    cover (docs/storage-contract.md, "Reading with snapshots"), so its cost does not grow with
    the table's history.
    """
    from sparkguard.spark_lib.storage import snapshots

    return snapshots.load_commits(manager, table)


def load_commits_full(manager: filemanager.FileManager, table: str) -> list[Commit]:
    """Every commit from the hot timeline alone, ignoring snapshots (tests: the reference
    replay; only right for a table that was never compacted)."""
    tl = timeline.Timeline(manager, table)
    commits: list[Commit] = []
    stream_meta: dict[str, tuple[str | None, str | None]] = {}
    for status in tl.statuses():
        commit = commit_of_status(status)
        if commit is None:
            continue
        if commit.operation is Operation.STREAM_REGISTER:
            stream_meta[commit.job_id] = (commit.format, commit.schema)
            continue
        commits.append(commit)
    for job_id in stream_jobs(manager, tl.table):
        fmt, schema = stream_meta.get(job_id, (None, None))
        commits.extend(
            Commit(
                order=entry.order,
                source=f"stream:{job_id}:{entry.batch_id}",
                job_id=job_id,
                operation=Operation.STREAM_BATCH,
                files=entry.files,
                format=fmt,
                schema=schema,
            )
            for entry in StreamLog(manager, tl.table, job_id).committed()
        )
    return commits


def committed_files(
    url: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    file_manager: str | filemanager.Kind | None = None,
) -> dict[str, timeline.DataFile]:
    """Relative path -> committed file for every file a reader of ``url`` should see."""
    manager, table = filemanager.resolve(url, storage_options=storage_options, kind=file_manager)
    return visible_files(load_commits(manager, table))


def table_url(url: str) -> str:
    """``url`` without a trailing ``/``; local paths made absolute."""
    if filemanager.protocol_of(url) in ("file", "local"):
        path = url.split("://", 1)[1] if "://" in url else url
        return os.path.abspath(path)
    return url.rstrip("/")


def committed_paths(
    url: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    file_manager: str | filemanager.Kind | None = None,
) -> list[str]:
    """Full URLs (or absolute local paths) of the committed, non-superseded files of ``url``.

    Never lists the table directory: files of in-flight or failed writes are never returned.
    """
    base = table_url(url)
    files = committed_files(url, storage_options=storage_options, file_manager=file_manager)
    return [f"{base}/{relative}" for relative in sorted(files)]


def read_table(
    spark: Any,
    url: str,
    *,
    format: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    file_manager: str | filemanager.Kind | None = None,
) -> Any:
    """A DataFrame over exactly the committed files of ``url`` (partition columns included).

    Isolated from in-flight writes: files not yet committed, or of failed writes, are never
    read. ``format`` defaults to the one the commits recorded.
    """
    manager, table = filemanager.resolve(url, storage_options=storage_options, kind=file_manager)
    commits = load_commits(manager, table)
    visible = visible_files(commits)
    formats_seen = {c.format for c in commits if c.format}
    chosen = format or (formats_seen.pop() if len(formats_seen) == 1 else "parquet")
    base = table_url(url)
    if filemanager.protocol_of(base) in ("file", "local"):
        base = "file://" + base
    if not visible:
        from pyspark.sql.types import StructType

        schemas = [c.schema for c in commits if c.schema]
        if not schemas:
            raise errors.ConfigError(
                f"{url} has no committed data and no recorded schema; write to it first"
            )
        schema = StructType.fromJson(json.loads(schemas[-1]))
        return spark.createDataFrame([], schema)
    reader = spark.read.format(chosen).option("basePath", base)
    return reader.load([f"{base}/{relative}" for relative in sorted(visible)])
