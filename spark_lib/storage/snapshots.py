"""Timeline snapshots and the archive: reads whose cost does not grow with a table's history.

docs/storage-contract.md, "Snapshots and the archive", is the specification. In short:

* ``<table>/_sparkguard/snapshots/<n:012d>.snapshot`` (put-if-absent) records the committed
  state that the decided instants it covers produced (visible files with size and rows,
  superseded names, per-job write identities and rolled-back names, stream batches);
* ``<table>/_sparkguard/archive/<n:012d>.archive`` (put-if-absent, JSON lines) keeps the
  documents of the instants snapshot ``n`` newly covered, which are then deleted from
  ``timeline/``;
* ``snapshots/LATEST`` is a hint for tools; nothing here depends on it.

:func:`load_view` is what readers, writers and rollback use: the newest valid snapshot plus
the uncovered instants (:class:`TimelineView`). :func:`compact` runs steps C1-C7. A damaged
snapshot or archive is skipped with a warning, never fatal, unless history would be lost.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors, formats, paths
from sparkguard.spark_lib.storage import reader, timeline

logger = logging.getLogger(__name__)

SNAPSHOTS_DIR: Final = "snapshots"
ARCHIVE_DIR: Final = "archive"
MARKERS_DIR: Final = "markers"
LATEST_NAME: Final = "LATEST"
SNAPSHOT_KIND: Final = "sparkguard.timeline.snapshot"
ARCHIVE_KIND: Final = "sparkguard.timeline.archive"
VERSION: Final = 1
#: snapshots kept by C7 (older ones are deleted)
KEEP_SNAPSHOTS: Final = 3
#: a rolled-back instant's ``marked`` names stay in snapshots this long (late-file sweeps)
LATE_FILE_RETENTION: Final = datetime.timedelta(days=7)
#: how often a read starts again when a compaction moved instants under it
MAX_RESTARTS: Final = 5
DEFAULT_SNAPSHOT_EVERY: Final = 10

_SNAPSHOT_NAME: Final = re.compile(r"^([0-9]{12})\.snapshot$")
_ARCHIVE_NAME: Final = re.compile(r"^([0-9]{12})\.archive$")
_ORDER: Final = re.compile(r"^[0-9]*$")


def snapshots_dir(table: str) -> str:
    """``<table>/_sparkguard/snapshots``."""
    return paths.join(table, timeline.SPARKGUARD_DIR, SNAPSHOTS_DIR)


def archive_dir(table: str) -> str:
    """``<table>/_sparkguard/archive``."""
    return paths.join(table, timeline.SPARKGUARD_DIR, ARCHIVE_DIR)


def snapshot_path(table: str, number: int) -> str:
    """The snapshot file of number ``number``."""
    return paths.join(snapshots_dir(table), f"{number:012d}.snapshot")


def archive_path(table: str, number: int) -> str:
    """The archive file of snapshot ``number``."""
    return paths.join(archive_dir(table), f"{number:012d}.archive")


# --------------------------------------------------------------------------------------------
# Documents.
# --------------------------------------------------------------------------------------------


def _require_str_list(doc: Mapping[str, Any], key: str, *, source: str) -> tuple[str, ...]:
    value = formats.require(doc, key, list, source=source)
    if not all(isinstance(v, str) for v in value):
        raise errors.CorruptFileError(f"{source} field {key!r} should be a list of strings")
    return tuple(value)


def _int(value: Any, *, what: str, source: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise errors.CorruptFileError(f"{source} field {what!r} should be an int")
    return value


def _obj(value: Any, *, what: str, source: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise errors.CorruptFileError(f"{source} field {what!r} should be an object")
    return value


def _opt_str(value: Any, *, what: str, source: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise errors.CorruptFileError(f"{source} field {what!r} should be a string or null")
    return value


def commit_to_json(commit: reader.Commit) -> dict[str, Any]:
    """A :class:`reader.Commit` as a snapshot's ``commits`` entry."""
    return {
        "order": commit.order,
        "source": commit.source,
        "jobId": commit.job_id,
        "operation": commit.operation.value,
        "files": [f.to_json() for f in commit.files],
        "format": commit.format,
        "schema": commit.schema,
        "write": commit.write,
        "partitions": list(commit.partitions),
    }


def commit_from_json(value: Any, *, source: str) -> reader.Commit:
    """Parse one ``commits`` entry of a snapshot (raises CorruptFileError)."""
    entry = _obj(value, what="commits[]", source=source)
    raw_op = formats.require(entry, "operation", str, source=source)
    try:
        operation = reader.Operation(raw_op)
    except ValueError:
        raise errors.CorruptFileError(
            f"{source}: a commit has unknown operation {raw_op!r}; upgrade sparkguard"
        ) from None
    order = formats.require(entry, "order", str, source=source)
    if not _ORDER.fullmatch(order):
        raise errors.CorruptFileError(f"{source}: commit order {order!r} is not digits")
    partitions = _require_str_list(entry, "partitions", source=source)
    if not all(p and reader.is_data_path(p) for p in partitions):
        raise errors.CorruptFileError(f"{source}: a commit lists bad partitions {partitions!r}")
    return reader.Commit(
        order=order,
        source=formats.require(entry, "source", str, source=source),
        job_id=formats.require(entry, "jobId", str, source=source),
        operation=operation,
        files=tuple(
            timeline.DataFile.from_json(f, source=source)
            for f in formats.require(entry, "files", list, source=source)
        ),
        format=_opt_str(entry.get("format"), what="format", source=source),
        schema=_opt_str(entry.get("schema"), what="schema", source=source),
        write=_int(entry.get("write", 0), what="write", source=source),
        partitions=partitions,
    )


@dataclasses.dataclass(frozen=True)
class JobWrite:
    """A committed write identity of a job: write index, instant, micro-batch (JVM) or None."""

    write: int
    instant: str
    micro_batch: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"write": self.write, "instant": self.instant, "microBatch": self.micro_batch}


@dataclasses.dataclass(frozen=True)
class RolledBackInstant:
    """A covered rolled-back instant whose marked names late-file sweeps still check."""

    instant: str
    owner: str
    decided: str
    marked: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "instant": self.instant,
            "owner": self.owner,
            "decided": self.decided,
            "marked": list(self.marked),
        }


@dataclasses.dataclass(frozen=True)
class JobRecord:
    """What a snapshot keeps about one job id."""

    writes: tuple[JobWrite, ...] = ()
    rolled_back: tuple[RolledBackInstant, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "writes": [w.to_json() for w in self.writes],
            "rolledBack": [r.to_json() for r in self.rolled_back],
        }


@dataclasses.dataclass(frozen=True)
class StreamRecord:
    """A Python streaming sink's job in a snapshot: its registration and covered batches."""

    format: str | None
    schema: str | None
    through_batch: int

    def to_json(self) -> dict[str, Any]:
        return {"format": self.format, "schema": self.schema, "throughBatch": self.through_batch}


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """One parsed ``snapshots/<n>.snapshot`` (kind ``sparkguard.timeline.snapshot``)."""

    number: int
    previous: int | None
    created: str
    instants: tuple[str, ...]
    max_order: str
    commits: tuple[reader.Commit, ...]
    superseded: tuple[str, ...]
    streams: Mapping[str, StreamRecord]
    jobs: Mapping[str, JobRecord]

    def encode(self) -> bytes:
        """The file's bytes (versioned JSON)."""
        return formats.encode(
            SNAPSHOT_KIND,
            VERSION,
            {
                "snapshot": self.number,
                "previous": self.previous,
                "created": self.created,
                "instants": sorted(self.instants),
                "maxOrder": self.max_order,
                "commits": [commit_to_json(c) for c in self.commits],
                "superseded": sorted(self.superseded),
                "streams": {k: v.to_json() for k, v in sorted(self.streams.items())},
                "jobs": {k: v.to_json() for k, v in sorted(self.jobs.items())},
            },
        )

    @classmethod
    def decode(cls, data: bytes, *, source: str, number: int | None = None) -> Snapshot:
        """Parse and check a snapshot file; raises CorruptFileError naming ``source``."""
        try:
            doc = formats.decode(
                data, kind=SNAPSHOT_KIND, versions=frozenset({VERSION}), source=source
            )
        except errors.SparkguardError:
            raise
        except Exception as exc:
            raise errors.CorruptFileError(f"{source} is not a snapshot: {exc}") from exc
        got = _int(doc.get("snapshot"), what="snapshot", source=source)
        if got < 1 or (number is not None and got != number):
            raise errors.CorruptFileError(f"{source} says it is snapshot {got}, not {number}")
        previous = doc.get("previous")
        if previous is not None:
            previous = _int(previous, what="previous", source=source)
        instants = _require_str_list(doc, "instants", source=source)
        for instant in instants:
            timeline.job_of_instant(instant)
        max_order = formats.require(doc, "maxOrder", str, source=source)
        if not _ORDER.fullmatch(max_order):
            raise errors.CorruptFileError(f"{source}: maxOrder {max_order!r} is not digits")
        commits = tuple(
            commit_from_json(c, source=source)
            for c in formats.require(doc, "commits", list, source=source)
        )
        superseded = _require_str_list(doc, "superseded", source=source)
        streams: dict[str, StreamRecord] = {}
        for job_id, raw in formats.require(doc, "streams", dict, source=source).items():
            entry = _obj(raw, what=f"streams.{job_id}", source=source)
            streams[job_id] = StreamRecord(
                format=_opt_str(entry.get("format"), what="format", source=source),
                schema=_opt_str(entry.get("schema"), what="schema", source=source),
                through_batch=_int(entry.get("throughBatch"), what="throughBatch", source=source),
            )
        jobs: dict[str, JobRecord] = {}
        for job_id, raw in formats.require(doc, "jobs", dict, source=source).items():
            entry = _obj(raw, what=f"jobs.{job_id}", source=source)
            writes = []
            for raw_w in formats.require(entry, "writes", list, source=source):
                w = _obj(raw_w, what="writes[]", source=source)
                micro = w.get("microBatch")
                if micro is not None:
                    micro = _obj(micro, what="microBatch", source=source)
                writes.append(
                    JobWrite(
                        write=_int(w.get("write"), what="write", source=source),
                        instant=formats.require(w, "instant", str, source=source),
                        micro_batch=micro,
                    )
                )
            rolled = []
            for raw_r in formats.require(entry, "rolledBack", list, source=source):
                r = _obj(raw_r, what="rolledBack[]", source=source)
                rolled.append(
                    RolledBackInstant(
                        instant=formats.require(r, "instant", str, source=source),
                        owner=formats.require(r, "owner", str, source=source),
                        decided=formats.require(r, "decided", str, source=source),
                        marked=_require_str_list(r, "marked", source=source),
                    )
                )
            jobs[job_id] = JobRecord(writes=tuple(writes), rolled_back=tuple(rolled))
        return cls(
            number=got,
            previous=previous,
            created=formats.require(doc, "created", str, source=source),
            instants=instants,
            max_order=max_order,
            commits=commits,
            superseded=superseded,
            streams=streams,
            jobs=jobs,
        )


@dataclasses.dataclass(frozen=True)
class ArchivedInstant:
    """One instant's documents as an archive line keeps them."""

    instant: str
    inflight: Mapping[str, Any] | None
    outcome: Mapping[str, Any]
    rolledback: Mapping[str, Any] | None

    def to_json(self) -> dict[str, Any]:
        return {
            "instant": self.instant,
            "inflight": self.inflight,
            "outcome": self.outcome,
            "rolledback": self.rolledback,
        }

    def status(self) -> timeline.InstantStatus:
        """The instant as :class:`timeline.InstantStatus` (raises CorruptFileError)."""
        source = f"archived instant {self.instant}"
        info = (
            timeline.info_of_document(self.inflight, instant=self.instant, source=source)
            if self.inflight is not None
            else None
        )
        outcome, files, extra = timeline.outcome_of_document(self.outcome, source=source)
        return timeline.InstantStatus(
            instant=self.instant,
            info=info,
            outcome=outcome,
            files=files,
            rolledback=self.rolledback,
            extra=extra,
        )


def encode_archive(number: int, instants: Sequence[ArchivedInstant], *, created: str) -> bytes:
    """An archive file's bytes: a header line, then one line per instant."""
    lines = [
        json.dumps(
            {"kind": ARCHIVE_KIND, "version": VERSION, "snapshot": number, "created": created},
            sort_keys=True,
            separators=(",", ":"),
        )
    ]
    lines.extend(
        json.dumps(a.to_json(), sort_keys=True, separators=(",", ":"))
        for a in sorted(instants, key=lambda a: a.instant)
    )
    return ("\n".join(lines) + "\n").encode()


def decode_archive(data: bytes, *, source: str, number: int | None = None) -> list[ArchivedInstant]:
    """Parse an archive file (raises CorruptFileError naming ``source``)."""
    try:
        text = data.decode("utf-8")
        lines = [line for line in text.split("\n") if line.strip()]
        if not lines:
            raise errors.CorruptFileError(f"{source} is empty")
        header = json.loads(lines[0])
        if not isinstance(header, dict) or header.get("kind") != ARCHIVE_KIND:
            raise errors.CorruptFileError(f"{source} is not a sparkguard archive")
        if header.get("version") != VERSION:
            raise errors.CorruptFileError(
                f"{source} has archive version {header.get('version')!r}; upgrade sparkguard"
            )
        got = _int(header.get("snapshot"), what="snapshot", source=source)
        if number is not None and got != number:
            raise errors.CorruptFileError(f"{source} says it is archive {got}, not {number}")
        result = []
        for line in lines[1:]:
            entry = _obj(json.loads(line), what="line", source=source)
            instant = formats.require(entry, "instant", str, source=source)
            timeline.job_of_instant(instant)
            inflight = entry.get("inflight")
            rolledback = entry.get("rolledback")
            archived = ArchivedInstant(
                instant=instant,
                inflight=None
                if inflight is None
                else _obj(inflight, what="inflight", source=source),
                outcome=_obj(entry.get("outcome"), what="outcome", source=source),
                rolledback=None
                if rolledback is None
                else _obj(rolledback, what="rolledback", source=source),
            )
            archived.status()  # checks the documents
            result.append(archived)
        return result
    except errors.CorruptFileError:
        raise
    except (ValueError, UnicodeDecodeError, errors.SparkguardError) as exc:
        raise errors.CorruptFileError(f"{source} is damaged: {exc}") from exc


# --------------------------------------------------------------------------------------------
# Loading: the newest valid snapshot and the uncovered instants.
# --------------------------------------------------------------------------------------------


class _MovedError(Exception):
    """A compaction moved instants while they were read: start the read again."""


@dataclasses.dataclass(frozen=True)
class SnapshotState:
    """The newest valid snapshot (or none) and the instants of archives it must add."""

    snapshot: Snapshot | None
    #: the highest snapshot number the listing showed (valid or damaged; 0 when none)
    newest_number: int
    #: instants that newer damaged snapshots (or, with no valid snapshot, any) archived: hot
    archived: Mapping[str, ArchivedInstant]
    damaged: tuple[int, ...] = ()

    @property
    def covered(self) -> frozenset[str]:
        """Hot instants the snapshot covers (its ``instants``)."""
        return frozenset(self.snapshot.instants) if self.snapshot is not None else frozenset()


def _numbers(
    infos: Iterable[filemanager.FileInfo], pattern: re.Pattern[str]
) -> dict[int, filemanager.FileInfo]:
    found: dict[int, filemanager.FileInfo] = {}
    for info in infos:
        match = pattern.fullmatch(info.name)
        if match and not info.is_dir:
            found[int(match.group(1))] = info
    return found


def list_snapshots(manager: filemanager.FileManager, table: str) -> dict[int, filemanager.FileInfo]:
    """Snapshot number -> listing entry (one listing; other names are ignored)."""
    infos = manager.list(snapshots_dir(table))
    for info in infos:
        name = info.name
        if (
            not _SNAPSHOT_NAME.fullmatch(name)
            and name != LATEST_NAME
            and not filemanager.is_temp_name(name)
        ):
            logger.warning("ignoring unexpected file %s in %s", info.path, snapshots_dir(table))
    return _numbers(infos, _SNAPSHOT_NAME)


def read_snapshot(manager: filemanager.FileManager, table: str, number: int) -> Snapshot:
    """Read and check snapshot ``number`` (FileNotFoundError, CorruptFileError)."""
    path = snapshot_path(table, number)
    return Snapshot.decode(manager.read_bytes(path), source=path, number=number)


def read_archive(
    manager: filemanager.FileManager, table: str, number: int
) -> list[ArchivedInstant] | None:
    """The instants of archive ``number``; None when it does not exist (CorruptFileError)."""
    path = archive_path(table, number)
    try:
        data = manager.read_bytes(path)
    except FileNotFoundError:
        return None
    return decode_archive(data, source=path, number=number)


def _load_snapshot(
    manager: filemanager.FileManager, table: str
) -> tuple[Snapshot | None, int, list[int]]:
    """(newest valid snapshot, highest number listed, damaged numbers newer than the valid one)."""
    numbers = list_snapshots(manager, table)
    newest = max(numbers, default=0)
    damaged: list[int] = []
    for number in sorted(numbers, reverse=True):
        try:
            return read_snapshot(manager, table, number), newest, damaged
        except FileNotFoundError:
            raise _MovedError from None  # C7 deleted it: newer snapshots exist now
        except errors.CorruptFileError as exc:
            logger.warning("skipping damaged snapshot %s: %s", snapshot_path(table, number), exc)
            damaged.append(number)
    return None, newest, damaged


def _load_archives(
    manager: filemanager.FileManager,
    table: str,
    snapshot: Snapshot | None,
    damaged: Sequence[int],
) -> dict[str, ArchivedInstant]:
    """The instants that the damaged snapshots newer than ``snapshot`` archived (all archives
    when there is no valid snapshot), less those ``snapshot`` covers."""
    result: dict[str, ArchivedInstant] = {}
    if snapshot is not None:
        numbers = sorted(damaged)
    else:
        numbers = sorted(_numbers(manager.list(archive_dir(table)), _ARCHIVE_NAME))
        # Snapshots below the lowest one listed were deleted by C7; without a valid snapshot
        # the history they covered is only in their archives. None left: it is lost.
        if damaged and min(damaged) > 1 and (not numbers or min(numbers) > 1):
            raise errors.CorruptFileError(
                f"{table}: no valid snapshot (the newest, {snapshot_path(table, max(damaged))}, "
                "is damaged) and the archives of the history before it are gone (retention "
                "deleted them): restore the snapshot file from a backup"
            )
    covered = frozenset(snapshot.instants) if snapshot is not None else frozenset()
    for number in numbers:
        try:
            archived = read_archive(manager, table, number)
        except errors.CorruptFileError as exc:
            if snapshot is None or number in damaged:
                raise errors.CorruptFileError(
                    f"{archive_path(table, number)} is damaged and its snapshot is damaged too: "
                    f"the instants it archived cannot be read ({exc}); restore either file"
                ) from exc
            raise
        for entry in archived or ():
            if entry.instant not in covered:
                result.setdefault(entry.instant, entry)
    return result


@dataclasses.dataclass(frozen=True)
class TimelineView:
    """A table's timeline as seen through its newest valid snapshot.

    ``statuses`` are the decided instants the snapshot does not cover (hot ones with both
    ``.inflight`` and ``.outcome``, and those of archives of newer damaged snapshots), read at
    one moment; ``undecided`` are hot instants with an ``.inflight`` and no ``.outcome``.
    """

    table: str
    state: SnapshotState
    statuses: tuple[timeline.InstantStatus, ...]
    undecided: tuple[str, ...]
    void: tuple[str, ...]
    stream_entries: Mapping[str, tuple[reader.StreamEntry, ...]]
    #: the hot listing the view was built from: instant -> suffixes of its files
    hot: Mapping[str, frozenset[str]] = dataclasses.field(default_factory=dict)

    @property
    def snapshot(self) -> Snapshot | None:
        return self.state.snapshot

    def commits(self) -> list[reader.Commit]:
        """Every commit a reader applies: the snapshot's, then the uncovered ones (a commit
        ordered below the snapshot's ``maxOrder`` is applied after it, with a warning)."""
        snap = self.snapshot
        max_order = snap.max_order if snap is not None else ""
        commits: list[reader.Commit] = list(snap.commits) if snap is not None else []
        stream_meta: dict[str, tuple[str | None, str | None]] = {}
        if snap is not None:
            stream_meta = {k: (v.format, v.schema) for k, v in snap.streams.items()}
        for status in self.statuses:
            commit = reader.commit_of_status(status)
            if commit is None:
                continue
            if commit.operation is reader.Operation.STREAM_REGISTER:
                stream_meta[commit.job_id] = (commit.format, commit.schema)
                continue
            if max_order and commit.order <= max_order:
                logger.warning(
                    "commit %s is ordered %s, before snapshot %s's last covered commit (%s): "
                    "applied after the snapshot (drivers' clocks disagree?)",
                    commit.source,
                    commit.order,
                    snap.number if snap is not None else 0,
                    max_order,
                )
                commit = dataclasses.replace(commit, order=f"{max_order}~{commit.order}")
            commits.append(commit)
        for job_id, entries in sorted(self.stream_entries.items()):
            fmt, schema = stream_meta.get(job_id, (None, None))
            for entry in entries:
                order = entry.order
                if max_order and order <= max_order:
                    order = f"{max_order}~{order}"
                commits.append(
                    reader.Commit(
                        order=order,
                        source=f"stream:{job_id}:{entry.batch_id}",
                        job_id=job_id,
                        operation=reader.Operation.STREAM_BATCH,
                        files=entry.files,
                        format=fmt,
                        schema=schema,
                    )
                )
        return commits

    def superseded(self) -> set[str]:
        """Every name some commit listed that is no longer visible."""
        commits = self.commits()
        covered = set(self.snapshot.superseded) if self.snapshot is not None else set()
        return covered | reader.superseded_files(commits)

    # -- what writers and rollback ask about a job ---------------------------------------------
    def job_record(self, job_id: str) -> JobRecord:
        """The snapshot's record of ``job_id`` (empty without a snapshot)."""
        snap = self.snapshot
        return snap.jobs.get(job_id, JobRecord()) if snap is not None else JobRecord()


def _read_uncovered(
    tl: timeline.Timeline,
    listing: Mapping[str, set[str]],
    state: SnapshotState,
    *,
    full: bool,
) -> tuple[list[timeline.InstantStatus], list[str], list[str]]:
    """Read the uncovered decided instants (outcome only unless ``full``), the undecided ids,
    and the void ids (no ``.inflight``). Raises :class:`_MovedError` when one vanished."""
    statuses: dict[str, timeline.InstantStatus] = {}
    undecided: list[str] = []
    void: list[str] = []
    covered = state.covered
    for instant, entry in state.archived.items():
        statuses[instant] = entry.status()
    for instant, suffixes in sorted(listing.items()):
        if instant in covered or instant in statuses:
            continue
        if ".inflight" not in suffixes:
            void.append(instant)
            continue
        if ".outcome" not in suffixes:
            undecided.append(instant)
            continue
        doc = tl.read_outcome_document(instant)
        if doc is None:
            raise _MovedError
        source = paths.join(tl.directory, instant + ".outcome")
        outcome, files, extra = timeline.outcome_of_document(doc, source=source)
        info: timeline.InstantInfo | None = None
        write = doc.get("write")
        needs_info = full or (
            outcome is timeline.Outcome.COMMITTED
            and write is None
            and not str(extra.get("operation", "")).startswith("stream-")
        )
        rolledback = None
        if needs_info or full:
            info = tl.read_info(instant)
            if info is None:
                raise _MovedError
        if full and ".rolledback" in suffixes:
            rolledback = tl.read_rolledback(instant)
        if info is None and isinstance(write, int) and not isinstance(write, bool):
            info = timeline.InstantInfo(
                instant=instant,
                job_id=timeline.job_of_instant(instant),
                attempt=0,
                marker_type="",
                operation=str(extra.get("operation", "")),
                started="",
                write=write,
            )
        statuses[instant] = timeline.InstantStatus(
            instant=instant,
            info=info,
            outcome=outcome,
            files=files,
            rolledback=rolledback,
            extra=extra,
        )
    return [statuses[i] for i in sorted(statuses)], undecided, void


def _stream_entries(
    manager: filemanager.FileManager, table: str, snapshot: Snapshot | None
) -> dict[str, tuple[reader.StreamEntry, ...]]:
    result: dict[str, tuple[reader.StreamEntry, ...]] = {}
    for job_id in reader.stream_jobs(manager, table):
        through = -1
        if snapshot is not None and job_id in snapshot.streams:
            through = snapshot.streams[job_id].through_batch
        log = reader.StreamLog(manager, table, job_id)
        entries = []
        for batch_id in log.batch_ids():
            if batch_id <= through:
                continue
            winner = log.winner_of(log.slots(batch_id))
            if winner is not None:
                entries.append(winner)
        result[job_id] = tuple(entries)
    return result


def load_view(
    manager: filemanager.FileManager,
    table: str,
    *,
    full: bool = False,
    streams: bool = True,
) -> TimelineView:
    """The timeline of ``table`` through its newest valid snapshot (reading steps 1-5).

    ``full`` also reads the ``.inflight`` and ``.rolledback`` of the uncovered decided
    instants (compaction, inspect). Starts again (at most :data:`MAX_RESTARTS` times) when a
    compaction moved instants under the read.
    """
    tl = timeline.Timeline(manager, table)
    for _ in range(MAX_RESTARTS):
        try:
            snapshot, newest, damaged = _load_snapshot(manager, tl.table)
            listing = tl.files_by_instant()
            archived = _load_archives(manager, tl.table, snapshot, damaged)
            # Instants archived between the snapshot's listing and the timeline's were covered
            # by a newer snapshot: if one exists now, start again.
            if manager.exists(snapshot_path(tl.table, newest + 1)):
                raise _MovedError
            state = SnapshotState(
                snapshot=snapshot, newest_number=newest, archived=archived, damaged=tuple(damaged)
            )
            statuses, undecided, void = _read_uncovered(tl, listing, state, full=full)
            entries = _stream_entries(manager, tl.table, snapshot) if streams else {}
            return TimelineView(
                table=tl.table,
                state=state,
                statuses=tuple(statuses),
                undecided=tuple(undecided),
                void=tuple(void),
                stream_entries=entries,
                hot={k: frozenset(v) for k, v in listing.items()},
            )
        except _MovedError:
            logger.info("a compaction moved instants of %s during a read; reading again", table)
            continue
    raise errors.SparkguardError(
        f"the timeline of {table} changed under {MAX_RESTARTS} reads in a row (compactions "
        "running without pause?); retry"
    )


def load_commits(manager: filemanager.FileManager, table: str) -> list[reader.Commit]:
    """Every commit a reader of ``table`` applies (snapshot + uncovered + stream batches)."""
    return load_view(manager, table).commits()


def committed_writes(view: TimelineView) -> dict[str, list[int]]:
    """Job id -> the sorted write identities of its committed batch writes (snapshot and
    uncovered instants; stream operations have none)."""
    found: dict[str, set[int]] = {}
    snap = view.snapshot
    if snap is not None:
        for job_id, record in snap.jobs.items():
            found.setdefault(job_id, set()).update(w.write for w in record.writes)
    for status in view.statuses:
        operation = str(status.extra.get("operation", ""))
        if status.state is timeline.State.COMMITTED and not operation.startswith("stream-"):
            found.setdefault(status.job_id, set()).add(write_index(status))
    return {job_id: sorted(writes) for job_id, writes in sorted(found.items())}


# --------------------------------------------------------------------------------------------
# What writers and rollback ask about one job (hot statuses are read by the caller first).
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class JobHistory:
    """What the snapshot (and archives of newer damaged snapshots) know about one job."""

    job_id: str
    writes: tuple[JobWrite, ...]
    rolled_back: tuple[RolledBackInstant, ...]
    #: names that covered commits of the job listed (visible or superseded)
    names: frozenset[str]
    #: every name any covered commit listed (for marked names that do not embed the job id)
    all_names: frozenset[str]
    #: archived statuses of the job (archives of damaged snapshots)
    archived: tuple[timeline.InstantStatus, ...] = ()


def job_history(manager: filemanager.FileManager, table: str, job_id: str) -> JobHistory:
    """The archived history of ``job_id`` on ``table``. Call it **after** listing the hot
    timeline: an instant archived in between is then in the snapshot read here."""
    tl = timeline.Timeline(manager, table)
    for _ in range(MAX_RESTARTS):
        try:
            snapshot, _newest, damaged = _load_snapshot(manager, tl.table)
            archived = _load_archives(manager, tl.table, snapshot, damaged)
            break
        except _MovedError:
            continue
    else:
        raise errors.SparkguardError(f"the snapshots of {table} changed under {MAX_RESTARTS} reads")
    tag = f"-{job_id}-"
    writes: list[JobWrite] = []
    rolled: list[RolledBackInstant] = []
    names: set[str] = set()
    all_names: set[str] = set()
    if snapshot is not None:
        record = snapshot.jobs.get(job_id, JobRecord())
        writes.extend(record.writes)
        rolled.extend(record.rolled_back)
        for commit in snapshot.commits:
            for f in commit.files:
                all_names.add(f.path)
                if commit.job_id == job_id:
                    names.add(f.path)
        all_names.update(snapshot.superseded)
        names.update(p for p in snapshot.superseded if tag in paths.basename(p))
    statuses = []
    for entry in archived.values():
        status = entry.status()
        if status.outcome is timeline.Outcome.COMMITTED:
            all_names.update(f.path for f in status.files)
        if status.job_id != job_id:
            continue
        statuses.append(status)
        if status.outcome is timeline.Outcome.COMMITTED:
            names.update(f.path for f in status.files)
    return JobHistory(
        job_id=job_id,
        writes=tuple(writes),
        rolled_back=tuple(rolled),
        names=frozenset(names),
        all_names=frozenset(all_names),
        archived=tuple(sorted(statuses, key=lambda s: s.instant)),
    )


def write_index(status: timeline.InstantStatus) -> int:
    """The write identity of a committed instant (outcome's ``write``, else ``.inflight``'s)."""
    if status.info is not None and status.info.write is not None:
        return status.info.write
    return 0


def micro_batch_of(status: timeline.InstantStatus) -> Mapping[str, Any] | None:
    """``extra.microBatch`` of an instant (outcome, else ``.inflight``), or None."""
    for extra in (status.extra, status.info.extra if status.info is not None else {}):
        value = extra.get("microBatch")
        if isinstance(value, dict):
            return value
    return None


# --------------------------------------------------------------------------------------------
# Compaction (C1-C7).
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CompactResult:
    """What one compaction did."""

    snapshot: int | None  # the snapshot written, None when nothing was (or another won)
    previous: int | None
    covered: int  # instants newly covered
    archived: int  # instants written to the archive
    deleted: int  # instants whose hot files were deleted (C6), void ones included
    snapshots_deleted: int
    archives_deleted: int
    reason: str  # "written", "nothing to compact", "lost the race to snapshot n", ...

    def to_json(self) -> dict[str, Any]:
        return {
            "snapshot": self.snapshot,
            "previous": self.previous,
            "instantsCovered": self.covered,
            "instantsArchived": self.archived,
            "instantsDeleted": self.deleted,
            "snapshotsDeleted": self.snapshots_deleted,
            "archivesDeleted": self.archives_deleted,
            "result": self.reason,
        }


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _parse_time(value: str) -> datetime.datetime | None:
    try:
        parsed = datetime.datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=datetime.UTC)


def _visible_by_source(
    commits: Sequence[reader.Commit],
) -> dict[str, tuple[timeline.DataFile, str]]:
    """Path -> (file, source of the commit that made it visible), as visible_files (pure)."""
    visible = reader.visible_files(commits)
    by_source: dict[str, tuple[timeline.DataFile, str]] = {}
    for commit in sorted(commits, key=lambda c: (c.order, c.source)):
        for f in commit.files:
            if f.path in visible:
                by_source[f.path] = (f, commit.source)
    # A later commit that dropped and re-listed a path is the last one listing it.
    return by_source


def _marker_instants(manager: filemanager.FileManager, table: str) -> set[str]:
    directory = paths.join(table, timeline.SPARKGUARD_DIR, MARKERS_DIR)
    return {info.name for info in manager.list(directory) if info.is_dir}


def _is_settled(status: timeline.InstantStatus, marker_dirs: set[str]) -> bool:
    if status.info is None or status.instant in marker_dirs:
        return False
    if status.state is timeline.State.COMMITTED:
        return True
    return status.state is timeline.State.ROLLED_BACK and bool(
        (status.rolledback or {}).get("complete") is True
    )


def _choose(
    previous: Snapshot | None,
    candidates: Sequence[timeline.InstantStatus],
    *,
    forced: frozenset[str],
    marker_dirs: set[str],
    stream_entries: Mapping[str, Sequence[reader.StreamEntry]],
) -> tuple[list[timeline.InstantStatus], str | None]:
    """The instants to cover and the commit order below which commits are covered (pure)."""
    # Instants that newer damaged snapshots archived were settled and covered once: always in.
    eligible = [s for s in candidates if s.instant in forced or _is_settled(s, marker_dirs)]
    blockers = [
        reader.commit_of_status(s)
        for s in candidates
        if s.state is timeline.State.COMMITTED
        and s.instant not in forced
        and not _is_settled(s, marker_dirs)
    ]
    orders = [c.order for c in blockers if c is not None]
    # A stream batch committed after a batch that is not (yet) committed cannot be covered:
    # it blocks like an unsettled commit.
    for job_id, entries in stream_entries.items():
        old_stream = previous.streams.get(job_id) if previous is not None else None
        expected = (old_stream.through_batch if old_stream is not None else -1) + 1
        gap = False
        for entry in sorted(entries, key=lambda e: e.batch_id):
            gap = gap or entry.batch_id != expected
            if gap:
                orders.append(entry.order)
            expected = entry.batch_id + 1
    cutoff = min(orders, default=None)
    chosen: list[timeline.InstantStatus] = []
    for status in eligible:
        if status.state is timeline.State.COMMITTED and status.instant not in forced:
            commit = reader.commit_of_status(status)
            if commit is None or (cutoff is not None and commit.order >= cutoff):
                continue
        chosen.append(status)
    return chosen, cutoff


def _cover_commits(
    previous: Snapshot | None,
    chosen: Sequence[timeline.InstantStatus],
    *,
    cutoff: str | None,
    stream_entries: Mapping[str, Sequence[reader.StreamEntry]],
    stream_meta: Mapping[str, tuple[str | None, str | None]],
) -> tuple[list[reader.Commit], dict[str, StreamRecord], int]:
    """The newly covered commits (instants, then stream batches), the streams' records, and
    how many stream batches are newly covered (pure)."""
    streams: dict[str, StreamRecord] = dict(previous.streams) if previous is not None else {}
    new_commits: list[reader.Commit] = []
    for status in chosen:
        commit = reader.commit_of_status(status)
        if commit is None:
            continue
        if commit.operation is reader.Operation.STREAM_REGISTER:
            old = streams.get(commit.job_id)
            streams[commit.job_id] = StreamRecord(
                commit.format, commit.schema, old.through_batch if old else -1
            )
            continue
        new_commits.append(commit)
    covered_batches = 0
    for job_id, entries in sorted(stream_entries.items()):
        old = streams.get(job_id)
        fmt, schema = stream_meta.get(job_id, (None, None))
        if old is not None:
            fmt, schema = old.format or fmt, old.schema or schema
        through = old.through_batch if old is not None else -1
        for entry in sorted(entries, key=lambda e: e.batch_id):
            if entry.batch_id != through + 1 or (cutoff is not None and entry.order >= cutoff):
                break
            new_commits.append(
                reader.Commit(
                    order=entry.order,
                    source=f"stream:{job_id}:{entry.batch_id}",
                    job_id=job_id,
                    operation=reader.Operation.STREAM_BATCH,
                    files=entry.files,
                    format=fmt,
                    schema=schema,
                )
            )
            through = entry.batch_id
            covered_batches += 1
        if old is not None or through >= 0:
            streams[job_id] = StreamRecord(fmt, schema, through)
    return new_commits, streams, covered_batches


def fold_commits(
    commits: Sequence[reader.Commit], superseded: Iterable[str]
) -> tuple[list[reader.Commit], list[str]]:
    """The commits a snapshot keeps (only their still visible files; commits with none are
    dropped) and the superseded names, given every covered commit (pure)."""
    visible = _visible_by_source(commits)
    listed = {f.path for c in commits for f in c.files}
    gone = set(superseded) | (listed - set(visible))
    kept: list[reader.Commit] = []
    for commit in sorted(commits, key=lambda c: (c.order, c.source)):
        files = tuple(
            f for f in commit.files if visible.get(f.path, (None, ""))[1] == commit.source
        )
        if files:
            kept.append(dataclasses.replace(commit, files=files))
    return kept, sorted(gone - set(visible))


def _job_records(
    previous: Snapshot | None, chosen: Sequence[timeline.InstantStatus], now: datetime.datetime
) -> dict[str, JobRecord]:
    """Per job: committed write identities and recent rolled-back instants (pure)."""
    horizon = now - LATE_FILE_RETENTION
    writes: dict[str, dict[tuple[Any, ...], JobWrite]] = {}
    rolled: dict[str, dict[str, RolledBackInstant]] = {}
    for job_id, record in (previous.jobs if previous is not None else {}).items():
        writes[job_id] = {_identity(w.write, w.micro_batch): w for w in record.writes}
        rolled[job_id] = {
            r.instant: r for r in record.rolled_back if (_parse_time(r.decided) or now) > horizon
        }
    for status in sorted(chosen, key=lambda s: s.instant):
        job_id = status.job_id
        operation = str(status.extra.get("operation", ""))
        if status.state is timeline.State.COMMITTED and not operation.startswith("stream-"):
            micro = micro_batch_of(status)
            writes.setdefault(job_id, {})[_identity(write_index(status), micro)] = JobWrite(
                write=write_index(status), instant=status.instant, micro_batch=micro
            )
        elif status.state is timeline.State.ROLLED_BACK:
            marked = tuple(sorted(status.rolled_back_names))
            decided = _decided_of(status)
            if marked and (_parse_time(decided) or now) > horizon:
                rolled.setdefault(job_id, {})[status.instant] = RolledBackInstant(
                    instant=status.instant, owner=status.owner, decided=decided, marked=marked
                )
    jobs: dict[str, JobRecord] = {}
    for job_id in sorted(set(writes) | set(rolled)):
        job_writes = _newest_micro_batches(list(writes.get(job_id, {}).values()))
        record = JobRecord(
            writes=tuple(sorted(job_writes, key=lambda w: (w.instant, w.write))),
            rolled_back=tuple(sorted(rolled.get(job_id, {}).values(), key=lambda r: r.instant)),
        )
        if record.writes or record.rolled_back:
            jobs[job_id] = record
    return jobs


def plan_snapshot(
    previous: Snapshot | None,
    candidates: Sequence[timeline.InstantStatus],
    carried: Iterable[str],
    *,
    forced: frozenset[str] = frozenset(),
    marker_dirs: set[str],
    stream_entries: Mapping[str, Sequence[reader.StreamEntry]],
    stream_meta: Mapping[str, tuple[str | None, str | None]],
    number: int,
    now: datetime.datetime,
) -> Snapshot | None:
    """Compute snapshot ``number`` from ``previous`` and the uncovered decided ``candidates``
    (C2, pure); None when no instant is eligible and nothing needs carrying."""
    chosen, cutoff = _choose(
        previous,
        candidates,
        forced=forced,
        marker_dirs=marker_dirs,
        stream_entries=stream_entries,
    )
    new_commits, streams, covered_batches = _cover_commits(
        previous, chosen, cutoff=cutoff, stream_entries=stream_entries, stream_meta=stream_meta
    )
    carried_set = set(carried)
    if not chosen and not covered_batches and not carried_set:
        return None
    commits = [*(previous.commits if previous is not None else ()), *new_commits]
    max_order = max(
        [previous.max_order if previous is not None else "", *(c.order for c in new_commits)]
    )
    kept, superseded = fold_commits(commits, previous.superseded if previous is not None else ())
    return Snapshot(
        number=number,
        previous=previous.number if previous is not None else None,
        created=now.isoformat(),
        instants=tuple(sorted({s.instant for s in chosen} | carried_set)),
        max_order=max_order,
        commits=tuple(kept),
        superseded=tuple(superseded),
        streams=streams,
        jobs=_job_records(previous, chosen, now),
    )


def _identity(write: int, micro: Mapping[str, Any] | None) -> tuple[Any, ...]:
    if micro is None:
        return (write,)
    return (write, str(micro.get("queryId")), micro.get("batchId"))


def _newest_micro_batches(writes: list[JobWrite]) -> list[JobWrite]:
    """Plain writes, and for each micro-batch query only the writes of its newest batch."""
    newest: dict[str, int] = {}
    for w in writes:
        if w.micro_batch is not None:
            batch = w.micro_batch.get("batchId")
            if isinstance(batch, int):
                query = str(w.micro_batch.get("queryId"))
                newest[query] = max(newest.get(query, batch), batch)
    return [
        w
        for w in writes
        if w.micro_batch is None
        or not isinstance(w.micro_batch.get("batchId"), int)
        or w.micro_batch.get("batchId") == newest.get(str(w.micro_batch.get("queryId")))
    ]


def _decided_of(status: timeline.InstantStatus) -> str:
    value = (status.rolledback or {}).get("finished")
    return value if isinstance(value, str) else _now().isoformat()


#: a hook the tests use to crash a compaction between steps ("C3", ..., "C7")
StepHook = Callable[[str], None]


def _no_hook(step: str) -> None:
    return None


def _read_full_status(tl: timeline.Timeline, instant: str) -> ArchivedInstant | None:
    """The documents of a hot instant for its archive line; None when its outcome is gone."""
    outcome = tl.read_outcome_document(instant)
    if outcome is None:
        return None
    inflight = tl.read_inflight_document(instant)
    rolledback = tl.read_rolledback(instant)
    return ArchivedInstant(
        instant=instant, inflight=inflight, outcome=outcome, rolledback=rolledback
    )


def uncovered_decided(manager: filemanager.FileManager, table: str) -> int:
    """How many decided instants the hot timeline holds (the automatic compaction's trigger):
    one listing of ``timeline/``, no snapshot read. Covered instants stay hot only after an
    interrupted archive step, which the compaction this triggers finishes."""
    tl = timeline.Timeline(manager, table)
    return sum(
        1
        for suffixes in tl.files_by_instant().values()
        if ".inflight" in suffixes and ".outcome" in suffixes
    )


def compact(
    manager: filemanager.FileManager,
    table: str,
    *,
    archive_retention_days: float | None = None,
    hook: StepHook = _no_hook,
    now: datetime.datetime | None = None,
) -> CompactResult:
    """Write the next snapshot, archive and delete what it covers, prune old snapshots (C1-C7).

    Safe to run concurrently with writers, readers, rollbacks and other compactors, and to
    run again after a crash at any step.
    """
    tl = timeline.Timeline(manager, table)
    table = tl.table
    now = now or _now()
    # C1 + C2: the newest valid snapshot, the hot timeline and the marker directories.
    view = load_view(manager, table, full=True)
    state = view.state
    previous = state.snapshot
    marker_dirs = _marker_instants(manager, table)
    listing = view.hot
    carried = sorted(i for i in state.covered if i in listing)
    # Instants archived by newer damaged snapshots are folded in (and covered) now.
    candidates = list(view.statuses)
    stream_meta: dict[str, tuple[str | None, str | None]] = {}
    for status in view.statuses:
        commit = reader.commit_of_status(status)
        if commit is not None and commit.operation is reader.Operation.STREAM_REGISTER:
            stream_meta[commit.job_id] = (commit.format, commit.schema)
    number = state.newest_number + 1
    planned = plan_snapshot(
        previous,
        candidates,
        carried,
        forced=frozenset(state.archived),
        marker_dirs=marker_dirs,
        stream_entries=view.stream_entries,
        stream_meta=stream_meta,
        number=number,
        now=now,
    )
    void = [i for i in view.void if i in listing]
    if planned is None:
        deleted = _delete_void(tl, void)
        return CompactResult(
            None, previous.number if previous else None, 0, 0, deleted, 0, 0, "nothing to compact"
        )
    hook("C3")
    path = snapshot_path(table, number)
    manager.mkdirs(snapshots_dir(table))
    if not manager.put_if_absent(path, planned.encode()):
        return CompactResult(
            None,
            planned.previous,
            0,
            0,
            0,
            0,
            0,
            f"another compactor wrote snapshot {number} first",
        )
    newly = len(set(planned.instants) - set(carried))
    hook("C4")
    try:
        manager.write_bytes(
            paths.join(snapshots_dir(table), LATEST_NAME), f"{number}\n".encode(), overwrite=True
        )
    except Exception as exc:  # noqa: BLE001 - LATEST is only a hint
        logger.warning("could not update %s/LATEST: %s", snapshots_dir(table), exc)
    hook("C5")
    archived, deleted = _archive_and_delete(tl, planned, hook=hook, now=now)
    deleted += _delete_void(tl, void)
    hook("C7")
    snaps_deleted, archives_deleted = _prune(manager, table, number, archive_retention_days, now)
    return CompactResult(
        snapshot=number,
        previous=planned.previous,
        covered=newly,
        archived=archived,
        deleted=deleted,
        snapshots_deleted=snaps_deleted,
        archives_deleted=archives_deleted,
        reason="written",
    )


def _archive_and_delete(
    tl: timeline.Timeline, snap: Snapshot, *, hook: StepHook, now: datetime.datetime
) -> tuple[int, int]:
    """C5 (archive the covered instants still hot) and C6 (delete them, .inflight first)."""
    manager = tl.manager
    listing = tl.files_by_instant()
    hot = [i for i in snap.instants if i in listing]
    entries = []
    for instant in hot:
        if ".outcome" not in listing[instant]:
            continue  # half-deleted by an earlier C6: archived then
        entry = _read_full_status(tl, instant)
        if entry is not None:
            entries.append(entry)
    apath = archive_path(tl.table, snap.number)
    manager.mkdirs(archive_dir(tl.table))
    written = manager.put_if_absent(
        apath, encode_archive(snap.number, entries, created=now.isoformat())
    )
    if not written:
        logger.info("%s exists (an earlier run of this step): kept", apath)
    hook("C6")
    batches = [
        [paths.join(tl.directory, i + suffix) for i in hot if suffix in listing[i]]
        for suffix in (".inflight", ".outcome", ".rolledback")
    ]
    for index, batch in enumerate(batches):
        if batch:
            manager.delete_many(batch)
        hook(f"C6.{index + 1}")
    return (len(entries) if written else 0), len(hot)


def _delete_void(tl: timeline.Timeline, void: Sequence[str]) -> int:
    """Delete the files of void instants (no ``.inflight``), checking again just before."""
    removed = 0
    for instant in void:
        if tl.manager.exists(paths.join(tl.directory, instant + ".inflight")):
            continue
        tl.manager.delete_many(
            [paths.join(tl.directory, instant + s) for s in (".outcome", ".rolledback")]
        )
        logger.warning(
            "deleted the void outcome of %s (a zombie's commit after archiving)", instant
        )
        removed += 1
    return removed


def _prune(
    manager: filemanager.FileManager,
    table: str,
    newest: int,
    retention_days: float | None,
    now: datetime.datetime,
) -> tuple[int, int]:
    """C7: delete snapshots older than the newest 3; archives of those older than the
    retention (by the archive file's modification time), when a retention is set."""
    numbers = list_snapshots(manager, table)
    keep_from = newest - KEEP_SNAPSHOTS + 1
    old = sorted(n for n in numbers if n < keep_from)
    if old:
        manager.delete_many([snapshot_path(table, n) for n in old])
    archives_deleted = 0
    if retention_days is not None:
        limit = now.timestamp() - retention_days * 86400.0
        doomed = [
            info.path
            for n, info in _numbers(manager.list(archive_dir(table)), _ARCHIVE_NAME).items()
            if n < keep_from and info.modified is not None and info.modified < limit
        ]
        if doomed:
            manager.delete_many(doomed)
            archives_deleted = len(doomed)
    return len(old), archives_deleted


def read_archived(manager: filemanager.FileManager, table: str) -> list[timeline.InstantStatus]:
    """Every instant the archive files hold (one per instant), for ``inspect --archived``."""
    found: dict[str, timeline.InstantStatus] = {}
    for number in sorted(_numbers(manager.list(archive_dir(table)), _ARCHIVE_NAME)):
        try:
            entries = read_archive(manager, table, number) or []
        except errors.CorruptFileError as exc:
            logger.warning("skipping damaged archive: %s", exc)
            continue
        for entry in entries:
            found.setdefault(entry.instant, entry.status())
    return [found[i] for i in sorted(found)]


def read_latest(manager: filemanager.FileManager, table: str) -> int | None:
    """The number ``snapshots/LATEST`` names; None when missing or garbage (a hint only)."""
    try:
        text = manager.read_bytes(paths.join(snapshots_dir(table), LATEST_NAME)).decode()
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    text = text.strip()
    return int(text) if text.isdigit() else None


def sleep(seconds: float) -> None:
    """Indirection for tests."""
    time.sleep(seconds)
