"""Rollback: delete exactly the files of failed writes, found through their markers.

The contract is docs/storage-contract.md ("Rollback"). For each undecided instant *of the owner
asked about* (``owner=None``: ``job:<jobId>``): first decide its fate with ``claim_rollback``
(put-if-absent; if a commit won, the instant is left alone), only then read its markers (direct
or batched; a missing, empty or wrong ``MARKERS.type`` is fine), record the marked names in
``<instant>.rolledback``, delete every marked file that no committed instant lists (and the temp
files or incomplete uploads a killed writer of those names left), then the markers it read.

* Undecided instants of another owner are reported (``instantsOtherOwner``) and never touched,
  unless ``force=True``; the names they marked are never deleted while they are undecided.
* ROLLING_BACK instants (claimed, cleanup interrupted) are resumed, whoever owns them.
* ROLLED_BACK instants are checked again: a name they marked that exists again (a zombie task
  that was mid-upload published it after the pass) is deleted, and a marker directory that
  reappeared is cleaned. :func:`sweep_late_files` does the same before a commit of the job.
* A committed file is never deleted, even when a failed re-run overwrote a name an earlier
  commit lists: the name is kept (its content is the last complete write of that name).
* A torn last line of a ``MARKERS<i>`` file is tolerated (its file is looked up by name prefix
  in one directory and reported as a warning); other damage raises one
  :class:`~sparkguard.spark_lib.base.errors.CorruptFileError` naming the file, the instant and
  the fix, after every other instant was handled; the instant stays resumable.
* Stream marker directories of the job (``_sparkguard/streams/<jobId>/markers``) are handled the
  same way, with the batch's slot in the stream log as the decision (see ``reader.StreamLog``).

Every step is idempotent, so an interrupted rollback is finished by running it again. The cost
grows with the job's instants and markers, never with the number of files in the table.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import enum
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, NoReturn

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors, paths
from sparkguard.spark_lib.storage import journal as job_journal
from sparkguard.spark_lib.storage import (
    lifecycle,
    markers,
    owners,
    reader,
    sinklog,
    snapshots,
    timeline,
)

logger = logging.getLogger(__name__)

#: progress(phase, done, total): phase is "instants" or "delete"
Progress = Callable[[str, int, int], None]
DELETE_CHUNK: Final = 1000
RECORDED_NAMES_LIMIT: Final = 1000


class Action(enum.StrEnum):
    """What rollback did to one instant (or stream batch)."""

    ROLLED_BACK = "rolled_back"  # claimed (now or earlier) and cleaned
    COMMITTED = "committed"  # a commit decided it: left alone (only stale markers cleaned)
    NOTHING = "nothing"  # already rolled back, nothing reappeared
    WOULD_ROLL_BACK = "would_roll_back"  # dry run
    OTHER_OWNER = "other_owner"  # undecided, started by another owner: reported, untouched
    MISSING = "missing"  # the journal names it, but the table has no trace of it


@dataclasses.dataclass(frozen=True)
class InstantRollback:
    """The result of rolling back one instant or one stream batch execution."""

    table: str
    instant: str
    action: Action
    files_deleted: int
    files_kept: int
    markers_deleted: int
    owner: str = ""
    temp_files_removed: int = 0
    warnings: tuple[str, ...] = ()
    #: committed files this rollback published from their temp names (roll forward, R8a)
    files_published: int = 0


@dataclasses.dataclass(frozen=True)
class RollbackSummary:
    """What a rollback of a job (or a table) did."""

    job_id: str
    instants_rolled_back: tuple[str, ...]
    instants_committed: tuple[str, ...]
    files_deleted: int
    files_kept: int
    dry_run: bool
    tables: tuple[str, ...] = ()
    markers_deleted: int = 0
    details: tuple[InstantRollback, ...] = ()
    owner: str | None = None
    forced: bool = False
    #: undecided instants of other owners, left alone
    instants_other_owner: tuple[InstantRollback, ...] = ()
    #: tables the journal names that no longer have a timeline
    tables_missing: tuple[str, ...] = ()
    temp_files_removed: int = 0
    warnings: tuple[str, ...] = ()
    #: tables whose location the rollback removed: the rolled-back write created it and left
    #: nothing else (docs/storage-contract.md, "The life of a table"); a dry run: would remove
    tables_removed: tuple[str, ...] = ()
    #: committed files published from their temp names (roll forward, R8a); a dry run: would
    files_published: int = 0

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable form (for ``--json`` output and operator events)."""
        return {
            "jobId": self.job_id,
            "owner": self.owner,
            "force": self.forced,
            "dryRun": self.dry_run,
            "tables": list(self.tables),
            "tablesMissing": list(self.tables_missing),
            "tablesRemoved": list(self.tables_removed),
            "instantsRolledBack": list(self.instants_rolled_back),
            "instantsCommitted": list(self.instants_committed),
            "instantsOtherOwner": [
                {"instant": r.instant, "table": r.table, "owner": r.owner}
                for r in self.instants_other_owner
            ],
            "filesDeleted": self.files_deleted,
            "filesKept": self.files_kept,
            "filesPublished": self.files_published,
            "markersDeleted": self.markers_deleted,
            "tempFilesRemoved": self.temp_files_removed,
            "warnings": list(self.warnings),
            "details": [
                {
                    "table": d.table,
                    "instant": d.instant,
                    "owner": d.owner,
                    "action": d.action.value,
                    "filesDeleted": d.files_deleted,
                    "filesKept": d.files_kept,
                    "filesPublished": d.files_published,
                    "markersDeleted": d.markers_deleted,
                    "tempFilesRemoved": d.temp_files_removed,
                    "warnings": list(d.warnings),
                }
                for d in self.details
            ],
        }


def summarise(
    job_id: str,
    results: Iterable[InstantRollback],
    *,
    dry_run: bool,
    owner: str | None = None,
    force: bool = False,
    tables_missing: Iterable[str] = (),
) -> RollbackSummary:
    """Fold per-instant results into a summary (a purely computational function)."""
    items = tuple(results)
    rolled = [
        r.instant
        for r in items
        if r.action in (Action.ROLLED_BACK, Action.WOULD_ROLL_BACK)
        or (r.action is Action.NOTHING and r.files_deleted)
    ]
    return RollbackSummary(
        job_id=job_id,
        instants_rolled_back=tuple(rolled),
        instants_committed=tuple(r.instant for r in items if r.action is Action.COMMITTED),
        files_deleted=sum(r.files_deleted for r in items),
        files_kept=sum(r.files_kept for r in items),
        dry_run=dry_run,
        tables=tuple(sorted({r.table for r in items})),
        markers_deleted=sum(r.markers_deleted for r in items),
        details=items,
        owner=owner,
        forced=force,
        instants_other_owner=tuple(r for r in items if r.action is Action.OTHER_OWNER),
        tables_missing=tuple(sorted(set(tables_missing))),
        temp_files_removed=sum(r.temp_files_removed for r in items),
        warnings=tuple(f"{r.instant}: {w}" for r in items for w in r.warnings),
        files_published=sum(r.files_published for r in items),
    )


# --------------------------------------------------------------------------------------------
# What is committed, and what is protected.
# --------------------------------------------------------------------------------------------


def committed_names(
    tl: timeline.Timeline,
    *,
    job_id: str,
    marked: Iterable[str],
    histories: dict[str, snapshots.JobHistory] | None = None,
) -> set[str]:
    """Paths (relative) that a committed instant or stream batch lists, among ``marked``.

    Data file names embed the job id, so the committed instants of the same job suffice; a
    marked name that does not embed it (never written by sparkguard's writer) falls back to
    every committed instant of the table, so the answer is right either way. Files Spark's
    file-sink manifest (``_spark_metadata``) lists count as committed too: for a streaming
    file sink that manifest is the commit. ``histories``: where the archived history read
    here is left for the rest of the pass (job id -> history; R9 of archived instants).
    """
    marked_set = set(marked)
    if not marked_set:
        return set()
    tag = f"-{job_id}-"
    own = all(tag in paths.basename(name) for name in marked_set)
    instants = tl.instant_ids(job_id=job_id) if own else None
    listed = set(tl.committed_files(instants=instants))
    jobs = [job_id] if own else reader.stream_jobs(tl.manager, tl.table)
    for stream_job in jobs:
        log = reader.StreamLog(tl.manager, tl.table, stream_job)
        for entry in log.committed():  # no stream log: one listing, empty
            listed.update(f.path for f in entry.files)
    listed.update(sinklog.listed_files(tl.manager, tl.table))
    # Commits archived in a snapshot (read after the hot timeline above: an instant archived
    # in between is in it).
    history = snapshots.job_history(tl.manager, tl.table, job_id)
    if histories is not None:
        histories[job_id] = history
    listed |= history.names if own else history.all_names
    return marked_set & listed


def _sink_committed_batch(tl: timeline.Timeline, status: timeline.InstantStatus) -> int | None:
    """The batch id of a streaming file-sink instant whose batch Spark's manifest committed;
    None for any other instant (docs/storage-contract.md, "The streaming file sink")."""
    info = status.info
    if info is None or info.operation != reader.Operation.STREAM_BATCH.value:
        return None
    batch = info.extra.get("batchId")
    if not isinstance(batch, int) or isinstance(batch, bool):
        return None
    latest = sinklog.latest_batch(tl.manager, tl.table)
    return batch if latest is not None and latest >= batch else None


def _settle_sink_batch(
    tl: timeline.Timeline,
    status: timeline.InstantStatus,
    mdir: str,
    *,
    label: str,
    dry_run: bool,
    protected: set[str],
) -> InstantRollback | None:
    """An INFLIGHT file-sink instant whose batch Spark's manifest committed is committed, never
    rolled back: record it so and clean its stale markers. None for any other instant."""
    if status.state is not timeline.State.INFLIGHT:
        return None
    batch = _sink_committed_batch(tl, status)
    if batch is None:
        return None
    if dry_run:
        return InstantRollback(label, status.instant, Action.COMMITTED, 0, 0, 0, status.owner)
    if not _record_sink_commit(tl, status, batch):
        return None  # a rollback claimed it first (cannot happen after the manifest: reported)
    return _clean_committed(
        tl, status.instant, mdir, label=label, dry_run=False, protected=protected
    )


def _record_sink_commit(tl: timeline.Timeline, status: timeline.InstantStatus, batch: int) -> bool:
    """Record a file-sink instant whose batch the manifest committed (its driver died between
    the manifest and the outcome) as committed, with the marked files the manifest lists.
    True when it is committed now (by this call or a racing one)."""
    mdir = markers.marker_dir(tl.table, status.instant)
    marked = markers.snapshot_marker_dir(tl.manager, mdir).marked_files
    listed = sinklog.listed_files(tl.manager, tl.table)
    files = [
        timeline.DataFile(path=p, size=listed[p], rows=-1) for p in sorted(marked & set(listed))
    ]
    extra = dict(status.info.extra) if status.info is not None else {}
    extra.update(
        {
            "operation": reader.Operation.STREAM_BATCH.value,
            "batchId": batch,
            "recorded": "rollback",
            "committedAt": reader.now_key(),
        }
    )
    try:
        tl.commit(status.instant, files, extra=extra)
    except errors.InstantDecidedError:
        decided = tl.read_outcome(status.instant)
        return decided is not None and decided[0] is timeline.Outcome.COMMITTED
    logger.warning(
        "instant %s: Spark's manifest committed its batch %s; recorded it as committed",
        status.instant,
        batch,
    )
    return True


def owns(status: timeline.InstantStatus, owner: str | None) -> bool:
    """Whether a rollback asked about ``owner`` (None: ``job:<jobId>``) may touch ``status``."""
    wanted = owner if owner is not None else timeline.default_owner(status.job_id)
    return status.owner == wanted


def marked_by_live_instants(
    tl: timeline.Timeline, statuses: Iterable[timeline.InstantStatus]
) -> set[str]:
    """Data files the undecided instants among ``statuses`` marked: a live writer's names.

    They are never deleted while those instants are undecided. A damaged marker directory of
    such an instant raises :class:`CorruptFileError`: its names cannot be known.
    """
    protected: set[str] = set()
    for status in statuses:
        if status.state is not timeline.State.INFLIGHT:
            continue
        mdir = markers.marker_dir(tl.table, status.instant)
        snapshot = markers.snapshot_marker_dir(tl.manager, mdir)
        protected |= snapshot.marked_files
        for _, prefix in snapshot.torn:
            protected |= _files_by_prefix(tl, prefix, job_id=status.job_id)
    return protected


def _files_by_prefix(tl: timeline.Timeline, prefix: str, *, job_id: str) -> set[str]:
    """Data files of ``job_id`` whose relative path starts with ``prefix`` (a torn marker
    line): one listing of the directory the prefix points into, deeper only under
    sub-directories that match the prefix."""
    data_prefix = prefix.split(".marker.", 1)[0]
    if not data_prefix or data_prefix.startswith(("/", ".", "_")) or ".." in data_prefix:
        return set()
    relative_dir = data_prefix.rpartition("/")[0]
    root = tl.table.rstrip("/")
    directory = paths.join(root, relative_dir) if relative_dir else root
    tag = f"-{job_id}-"
    found: set[str] = set()
    for info in tl.manager.list(directory):
        relative = info.path[len(root) + 1 :]
        if relative.startswith("_") or filemanager.is_temp_name(info.name):
            continue
        if info.is_dir:
            if relative.startswith(data_prefix) or data_prefix.startswith(relative + "/"):
                candidates = [i.path[len(root) + 1 :] for i in tl.manager.list_files(info.path)]
            else:
                continue
        else:
            candidates = [relative]
        found.update(
            c
            for c in candidates
            if c.startswith(data_prefix)
            and tag in paths.basename(c)
            and not filemanager.is_temp_name(paths.basename(c))
        )
    return found


# --------------------------------------------------------------------------------------------
# Deleting.
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Deleted:
    files: int = 0
    temp_files: int = 0
    #: the relative names whose files this call actually removed (not those already absent)
    names: set[str] = dataclasses.field(default_factory=set)

    def add(self, other: _Deleted) -> None:
        """Add what another delete call removed."""
        self.files += other.files
        self.temp_files += other.temp_files
        self.names |= other.names


def _delete(
    manager: filemanager.FileManager,
    table: str,
    relative: list[str],
    progress: Progress | None,
    *,
    dry_run: bool = False,
) -> _Deleted:
    """Delete the files of ``relative`` that exist, and the leftovers a killed writer of those
    names left; counts what was actually removed (or, dry run, what would be)."""
    result = _Deleted()
    if not relative:
        return result
    full = [paths.join(table, rel) for rel in relative]
    # Leftovers first (one listing per directory): a temp file or upload of a name published
    # meanwhile is then gone with it, or fails to publish.
    leftovers = manager.find_leftovers(full)
    if dry_run:
        result.files = len(manager.existing_files(full))
        result.temp_files = sum(1 for leftover in leftovers if not leftover.checksum)
        return result
    result.temp_files = manager.remove_leftovers(leftovers)
    relative_of = dict(zip(full, relative, strict=True))
    total = len(full)
    for start in range(0, total, DELETE_CHUNK):
        removed = manager.delete_existing(full[start : start + DELETE_CHUNK])
        result.files += len(removed)
        result.names.update(relative_of[path] for path in removed)
        if progress is not None:
            progress("delete", min(start + DELETE_CHUNK, total), total)
    return result


# --------------------------------------------------------------------------------------------
# One instant.
# --------------------------------------------------------------------------------------------


def rollback_instant(
    tl: timeline.Timeline,
    instant: str,
    *,
    owner: str | None = None,
    force: bool = False,
    dry_run: bool = False,
    progress: Progress | None = None,
    table_label: str | None = None,
    protected: Iterable[str] | None = None,
    settled: set[str] | None = None,
    status: timeline.InstantStatus | None = None,
    histories: dict[str, snapshots.JobHistory] | None = None,
) -> InstantRollback:
    """Roll back one instant of ``tl`` unless it is committed (see the module docstring).

    An undecided instant whose owner is not ``owner`` (None: ``job:<jobId>``) is left alone
    (:attr:`Action.OTHER_OWNER`) unless ``force``. ``protected`` are names a live instant
    marked (never deleted); when None they are read from the timeline. ``settled``: names a
    pass over several instants already deleted (or found absent); they are not checked again,
    and this call adds its own. ``status``: the instant's status, read by the caller just
    before (nothing of the pass ran in between); None: read here. ``histories``: see
    :func:`committed_names`. Idempotent and resumable: run it again after any interruption.
    """
    if status is None or status.instant != instant:
        status = tl.status(instant)
    label = table_label or tl.table
    if status.info is None:
        # Nothing of it, or void remains of an archived instant (a zombie's outcome, a stray
        # .rolledback): a compaction deletes those; there is nothing to decide here.
        return InstantRollback(label, instant, Action.MISSING, 0, 0, 0)
    if status.state is timeline.State.INFLIGHT and not force and not owns(status, owner):
        return InstantRollback(label, instant, Action.OTHER_OWNER, 0, 0, 0, owner=status.owner)
    if protected is None:
        others = [
            s
            for s in tl.statuses(job_id=status.job_id)
            if s.instant != instant and not (force or owns(s, owner))
        ]
        protected = marked_by_live_instants(tl, others)
    mdir = markers.marker_dir(tl.table, instant)
    sink = _settle_sink_batch(
        tl, status, mdir, label=label, dry_run=dry_run, protected=set(protected)
    )
    if sink is not None:  # Spark's file-sink manifest committed it: never rolled back
        return sink
    return _roll_back(
        tl,
        status,
        dry_run=dry_run,
        progress=progress,
        label=label,
        protected=set(protected),
        settled=settled if settled is not None else set(),
        histories=histories,
    )


def _roll_back(
    tl: timeline.Timeline,
    status: timeline.InstantStatus,
    *,
    dry_run: bool,
    progress: Progress | None,
    label: str,
    protected: set[str],
    settled: set[str],
    histories: dict[str, snapshots.JobHistory] | None = None,
) -> InstantRollback:
    manager = tl.manager
    instant = status.instant
    state = status.state
    mdir = markers.marker_dir(tl.table, instant)
    if state is timeline.State.COMMITTED:
        return _clean_committed(
            tl, instant, mdir, label=label, dry_run=dry_run, protected=protected
        )
    if state is timeline.State.INFLIGHT and not dry_run and not tl.claim_rollback(instant):
        logger.info("instant %s was committed before rollback could claim it", instant)
        return InstantRollback(label, instant, Action.COMMITTED, 0, 0, 0, owner=status.owner)
    # Claimed: the instant can no longer commit. Now read its markers (exactly these are
    # deleted later, so a late marker survives for the next pass).
    snapshot = markers.snapshot_marker_dir(manager, mdir)
    marked = set(snapshot.marked_files)
    warnings = list(snapshot.warnings)
    for source, prefix in snapshot.torn:
        matches = _files_by_prefix(tl, prefix, job_id=status.job_id)
        marked |= matches
        warnings.append(
            f"torn last line {prefix!r} in {source} (a crash mid-append) tolerated; "
            f"{len(matches)} file(s) of the job start with it"
        )
    recorded = set(status.rolled_back_names)
    names = recorded | marked
    kept = committed_names(tl, job_id=status.job_id, marked=names, histories=histories)
    doomed = sorted(names - kept - protected)
    previous: Mapping[str, Any] = status.rolledback or {}
    passes = int(previous.get("passes", 0))

    def record(deleted: _Deleted, absent: Iterable[str], *, done: bool) -> None:
        tl.record_rolled_back(
            instant,
            {
                "owner": status.owner,
                "marked": sorted(names),
                "filesDeleted": int(previous.get("filesDeleted", 0)) + deleted.files,
                "tempFilesRemoved": int(previous.get("tempFilesRemoved", 0)) + deleted.temp_files,
                "filesKept": sorted(kept)[:RECORDED_NAMES_LIMIT],
                "deleted": sorted(deleted.names)[:RECORDED_NAMES_LIMIT],
                "absent": sorted(absent)[:RECORDED_NAMES_LIMIT],
                "passes": passes + (1 if done else 0),
                "complete": done,
                "warnings": warnings[:RECORDED_NAMES_LIMIT],
            },
        )

    if dry_run:
        would = _delete(
            manager, tl.table, [n for n in doomed if n not in settled], None, dry_run=True
        )
        settled.update(doomed)
        action = (
            Action.WOULD_ROLL_BACK if state is not timeline.State.ROLLED_BACK else Action.NOTHING
        )
        return InstantRollback(
            label,
            instant,
            action,
            would.files,
            len(kept),
            0,
            status.owner,
            would.temp_files,
            tuple(warnings),
        )
    if names - recorded:
        # The names must stay findable before their markers go: a zombie task may still
        # publish one of them after this pass (docs/storage-contract.md, "Late files").
        record(_Deleted(), (), done=False)
    # Instants of one job mark the same names again and again (reruns): check each once.
    deleted = _delete(manager, tl.table, [n for n in doomed if n not in settled], progress)
    settled.update(doomed)
    late: set[str] = set()

    def delete_late(new_files: set[str]) -> None:
        # A batch file was rewritten after the snapshot: its new names are doomed too.
        nonlocal names
        names |= new_files
        record(deleted, (), done=False)
        extra = sorted(new_files - committed_names(tl, job_id=status.job_id, marked=new_files))
        extra = [n for n in extra if n not in protected]
        deleted.add(_delete(manager, tl.table, extra, None))
        late.update(extra)

    markers_deleted = 0
    if snapshot.files:
        markers_deleted = markers.delete_snapshot(manager, snapshot, on_new_names=delete_late)
    deleted.temp_files += _remove_outcome_temps(tl, instant)
    deleted.temp_files += remove_unlisted_leftovers(tl, kept - protected, job_id=status.job_id)
    changed = (
        deleted.files
        or deleted.temp_files
        or markers_deleted
        or names - recorded
        or state is not timeline.State.ROLLED_BACK
        or warnings
    )
    if changed:
        # Doomed names this pass found no file of (never written, or already gone, also when
        # another instant of this run deleted it) are "absent", not "deleted".
        record(deleted, (set(doomed) | late) - deleted.names, done=True)
    if kept:
        logger.warning(
            "instant %s: kept %d marked files that a committed instant lists", instant, len(kept)
        )
    action = Action.ROLLED_BACK if state is not timeline.State.ROLLED_BACK else Action.NOTHING
    return InstantRollback(
        label,
        instant,
        action,
        deleted.files,
        len(kept),
        markers_deleted,
        status.owner,
        deleted.temp_files,
        tuple(warnings),
    )


def remove_unlisted_leftovers(tl: timeline.Timeline, kept: Iterable[str], *, job_id: str) -> int:
    """The temp files (with their checksums) and, on object stores, the incomplete uploads of
    the names ``kept`` that no committed outcome of the job lists; never a committed file or
    its checksum. Returns how many temp files or uploads went.

    R6 for the marked names a committed instant lists: a rolled-back instant's tasks left them
    (a failed ``rerun=rewrite`` of the JVM protocol on a rename store writes committed names
    under temp names; a rerun writes the names its killed run left pending), while a listed
    one is not published yet (R8a publishes it). And the Python writer's W8, after its
    publication, for every name its instant marked: the failed, retried and speculative
    attempts' files, never published."""
    manager = tl.manager
    names = sorted(kept)
    if not names:
        return 0
    found = [
        left
        for left in manager.find_leftovers(paths.join(tl.table, name) for name in names)
        if left.path != filemanager.checksum_of(left.target)
    ]
    if not found:
        return 0
    listed: set[str] = set()
    for other in tl.instant_ids(job_id=job_id):
        commit = reader.commit_of_status(tl.status(other))
        if commit is not None:
            listed.update(paths.join(tl.table, f.temp) for f in commit.files if f.temp is not None)
            listed.update(f.upload for f in commit.files if f.upload is not None)
    if isinstance(manager, filemanager.DirectPutFileManager):
        return manager.remove_leftovers(left for left in found if left.upload_id not in listed)

    def temp_of(left: filemanager.Leftover) -> str:
        owner = filemanager.checksum_owner(left.path) if left.checksum else None
        return paths.join(paths.parent(left.path), owner) if owner else left.path

    return manager.remove_leftovers(left for left in found if temp_of(left) not in listed)


def _remove_outcome_temps(tl: timeline.Timeline, instant: str) -> int:
    """Remove the temp files of ``instant``'s ``.outcome`` in ``timeline/`` (and their Hadoop
    checksums), once the instant is decided rolled back; returns how many temp files went.

    A committer killed while it published the outcome (W9: temp file, then a put-if-absent
    rename) leaves its temp file beside the timeline. The instant is decided now, so such a put
    can only lose: the temp file is garbage, and a kept table would keep it for ever. Stores
    that publish with a conditional PUT write no temp file (no listing there). A temp file of a
    ``.rolledback`` is left alone: another rollback pass may be replacing that record now."""
    manager = tl.manager
    if isinstance(manager, filemanager.DirectPutFileManager):
        return 0
    target = paths.join(tl.directory, instant + ".outcome")
    own_checksum = "." + paths.basename(target) + ".crc"  # the outcome's own: it stays
    leftovers = [
        left
        for left in manager.find_leftovers([target])
        if paths.basename(left.path) != own_checksum
    ]
    return manager.remove_leftovers(leftovers)


def _clean_committed(
    tl: timeline.Timeline,
    instant: str,
    mdir: str,
    *,
    label: str,
    dry_run: bool,
    protected: set[str],
) -> InstantRollback:
    """A committed instant whose markers survived (the driver died after deciding): finish its
    publication (R8a), its deletes of superseded files (W9b), then delete its markers (R8b)."""
    manager = tl.manager
    if not manager.exists(mdir):
        return InstantRollback(label, instant, Action.COMMITTED, 0, 0, 0)
    snapshot = markers.snapshot_marker_dir(manager, mdir)
    marked = snapshot.marked_files
    published, publish_warnings = roll_forward(tl, instant, dry_run=dry_run)
    kept = committed_names(tl, job_id=timeline.job_of_instant(instant), marked=marked)
    doomed = sorted(marked - kept - protected)
    # An overwrite's driver may have died before it deleted what the commit superseded (W9b
    # runs before W10, so surviving markers say it may be unfinished): finish it first.
    superseded = sorted(superseded_on_storage(tl, instant) - protected)
    if dry_run:
        would = _delete(manager, tl.table, doomed, None, dry_run=True)
        would_superseded = len(manager.existing_files(paths.join(tl.table, s) for s in superseded))
        return InstantRollback(
            label,
            instant,
            Action.COMMITTED,
            would.files + would_superseded,
            len(kept),
            0,
            warnings=publish_warnings,
            files_published=published,
        )
    deleted = _delete(manager, tl.table, doomed, None)
    # Uploads of the committed names that the outcome does not list (a failed attempt's, or a
    # zombie task's after W8): none may stay pending for ever.
    job_id = timeline.job_of_instant(instant)
    deleted.temp_files += remove_unlisted_leftovers(tl, kept - protected, job_id=job_id)
    deleted.files += delete_superseded(tl, superseded)
    count = markers.delete_snapshot(manager, snapshot)
    return InstantRollback(
        label,
        instant,
        Action.COMMITTED,
        deleted.files,
        len(kept),
        count,
        temp_files_removed=deleted.temp_files,
        warnings=snapshot.warnings + publish_warnings,
        files_published=published,
    )


#: files published at once after an outcome (W9a, R8a): renames on a thread each; uploads
#: go through the object store's own concurrent gather
PUBLISH_CONCURRENCY: Final = 16


def publish_files(
    manager: filemanager.FileManager, table: str, files: Iterable[timeline.DataFile]
) -> tuple[int, list[str]]:
    """Publish the files of a committed outcome listed with a ``temp`` name (rename it onto the
    name, replacing an older file of the name) or an ``upload`` (complete it with every part it
    holds), concurrently: the writer's W9a and the rollback's R8a. Idempotent: a file published
    already has no temp file or pending upload left and counts nothing. Returns how many were
    published now, and the listed files (relative) neither published now nor on storage."""
    pending = [f for f in files if f.temp is not None]
    uploads = {paths.join(table, f.path): f for f in files if f.upload is not None}
    published = 0
    missing: list[str] = []
    if pending:

        def rename(file: timeline.DataFile) -> bool:
            target = paths.join(table, file.path)
            return manager.publish_temp(paths.join(table, file.temp or ""), target)

        with concurrent.futures.ThreadPoolExecutor(min(PUBLISH_CONCURRENCY, len(pending))) as pool:
            done = list(pool.map(rename, pending))
        published += sum(done)
        missing += [f.path for f, ok in zip(pending, done, strict=True) if not ok]
    if uploads:  # (a rename store has none)
        completed = manager.complete_uploads({t: f.upload or "" for t, f in uploads.items()})
        published += len(completed)
        missing += [f.path for t, f in uploads.items() if t not in completed]
    if missing:  # published before (an earlier pass, or a driver that died after it)
        there = manager.existing_files(paths.join(table, p) for p in missing)
        missing = sorted(p for p in missing if paths.join(table, p) not in there)
    return published, missing


def roll_forward(
    tl: timeline.Timeline, instant: str, *, dry_run: bool = False
) -> tuple[int, tuple[str, ...]]:
    """R8a: publish the files the committed ``instant`` lists under a temp name (``temp`` in its
    outcome: a rename store's driver writes the outcome first, then renames) that are still
    there, by renaming each onto its name; and complete the multipart uploads it lists
    (``upload``: an object store's tasks leave them open, the driver completes them after the
    outcome) that are still pending (:func:`publish_files`). Idempotent: a file already
    published has no temp file or pending upload left, and counts nothing. Returns how many
    were published (dry run: would be) and a warning per listed file found neither published
    nor pending."""
    commit = reader.commit_of_status(tl.status(instant))
    files = commit.files if commit is not None else ()
    pending = [f for f in files if f.temp is not None]
    uploads = [f for f in files if f.upload is not None]
    if not pending and not uploads:
        return 0, ()
    manager = tl.manager
    if dry_run:
        temps = manager.existing_files(paths.join(tl.table, f.temp or "") for f in pending)
        return len(temps) + len(pending_uploads(manager, tl.table, uploads)), ()
    published, missing = publish_files(manager, tl.table, files)
    if published:
        logger.info("published %d committed files of %s after its outcome", published, instant)
    warnings = tuple(
        f"committed file {path} is neither published nor under its temp name or a pending "
        "upload (deleted or aborted by hand, or by a lifecycle rule?): a reader of the table "
        "fails on it"
        for path in missing
    )
    return published, warnings


def pending_uploads(
    manager: filemanager.FileManager, table: str, files: Iterable[timeline.DataFile]
) -> set[str]:
    """The upload ids that ``files`` list and the store still holds open at their names (one
    listing of the uploads under the table; a rename store holds none): what W7 checks and a
    dry run of R8a counts."""
    wanted = {f.upload: f for f in files if f.upload is not None}
    if not wanted or not isinstance(manager, filemanager.DirectPutFileManager):
        return set()
    return {
        u["UploadId"]
        for u in manager.list_pending_uploads(table.rstrip("/") + "/")
        if u["UploadId"] in wanted
        and paths.join(table, wanted[u["UploadId"]].path).endswith("/" + u["Key"])
    }


#: The writer that deletes what its overwrites supersede (W9b): Spark's own file writes.
JVM_PROTOCOL: Final = "io.sparkguard.spark.SparkguardCommitProtocol"


def superseded_on_storage(tl: timeline.Timeline, instant: str) -> set[str]:
    """Data files (relative) that the committed ``overwrite``/``overwrite-partitions`` instant
    of the JVM commit protocol superseded and that are still on storage (docs/storage-contract.md,
    W9b); empty for any other instant.

    In the instant's scope (the whole table, or its partition directories) every file Spark's
    listing reads, except those the instant lists, those a committed instant decided after it
    lists, and those another instant's marker directory names (a concurrent or failed write,
    decided by its own commit or rollback). The scope is listed before the markers and the
    timeline are read, so a concurrent writer's published file is always protected.
    """
    status = tl.status(instant)
    commit = reader.commit_of_status(status)
    if status.extra.get("protocol") != JVM_PROTOCOL:
        return set()  # the Python writer keeps superseded files (read through the timeline)
    if commit is None or commit.operation not in (
        reader.Operation.OVERWRITE,
        reader.Operation.OVERWRITE_PARTITIONS,
    ):
        return set()
    scopes = [""] if commit.operation is reader.Operation.OVERWRITE else list(commit.partitions)
    listed = {f.path for f in commit.files}
    prefix = tl.table.rstrip("/") + "/"
    candidates: set[str] = set()
    for scope in scopes:
        for info in tl.manager.list_files(paths.join(tl.table, scope) if scope else tl.table):
            relative = info.path[len(prefix) :] if info.path.startswith(prefix) else ""
            if relative and reader.is_data_path(relative) and relative not in listed:
                candidates.add(relative)
    if not candidates:
        return set()
    keep: set[str] = set()
    root = paths.join(tl.table, timeline.SPARKGUARD_DIR, "markers")
    for info in tl.manager.list(root):
        if info.is_dir and info.name != instant:
            keep |= markers.snapshot_marker_dir(tl.manager, info.path).marked_files
    for status in tl.statuses():
        later = reader.commit_of_status(status) if status.instant != instant else None
        if later is not None and (later.order, later.source) > (commit.order, commit.source):
            keep.update(f.path for f in later.files)
    return candidates - keep


def delete_superseded(tl: timeline.Timeline, relative: Iterable[str]) -> int:
    """Delete the superseded data files ``relative`` and Hadoop's ``.<name>.crc`` beside each;
    returns how many data files existed."""
    full = [paths.join(tl.table, rel) for rel in relative]
    existing = tl.manager.delete_existing(full)
    tl.manager.delete_many([filemanager.checksum_of(f) for f in full])
    return len(existing)


# --------------------------------------------------------------------------------------------
# Before a write, and before a commit.
# --------------------------------------------------------------------------------------------


def roll_back_before_write(
    tl: timeline.Timeline,
    *,
    job_id: str,
    owner: str,
    table_label: str | None = None,
    skip_operations: Iterable[str] = (),
) -> list[InstantRollback]:
    """Before a write of ``job_id`` by ``owner``: roll back this owner's undecided instants of
    the job on the table (an earlier attempt's leftovers; this also fences that attempt).

    Raises :class:`~sparkguard.spark_lib.base.errors.OwnerConflictError` when another owner has an
    undecided instant of the same job here: both would write the same file names. Instants
    whose operation is in ``skip_operations`` are ignored.
    """
    skipped = set(skip_operations)
    statuses = [
        s
        for s in tl.statuses(job_id=job_id)
        if s.state in (timeline.State.INFLIGHT, timeline.State.ROLLING_BACK)
        and not (s.info is not None and s.info.operation in skipped)
    ]
    for status in statuses:
        if status.state is timeline.State.INFLIGHT and status.owner != owner:
            raise errors.OwnerConflictError(
                f"instant {status.instant} of job {job_id!r} on {table_label or tl.table} is "
                f"in flight for owner {status.owner!r}, and this write's owner is {owner!r}: "
                "both would write the same file names, so this write is refused. Wait for "
                "that write to finish, give this job another job id, or, if that writer is "
                f"dead, roll it back: sparkguard rollback --job-id {job_id} --journal <its "
                f"journal> --owner '{status.owner}' (or --force)"
            )
    results = []
    # Undecided first (claimed before another instant's cleanup deletes a name they marked).
    statuses.sort(key=lambda s: (s.state is not timeline.State.INFLIGHT, s.instant))
    for status in statuses:
        logger.info("rolling back stale instant %s before writing", status.instant)
        results.append(rollback_instant(tl, status.instant, owner=owner, table_label=table_label))
    return results


#: How long a writer that just took over a job waits for an instant another owner opened at
#: the same moment to be decided (that owner backs off within milliseconds when it sees the
#: newer claim; one still undecided after this is a running write, and this one backs off).
SETTLE_TIMEOUT: Final = 10.0
_SETTLE_POLL: Final = 0.05


@dataclasses.dataclass(frozen=True)
class WriteGuard:
    """What a writer knows before opening its instant: its owner claim and the instants of the
    job it found (:func:`guard_write`), checked again by :func:`confirm_sole_writer`."""

    claim: owners.Claim
    known: frozenset[str]
    skipped: frozenset[str] = frozenset()


def guard_write(
    tl: timeline.Timeline,
    *,
    job_id: str,
    owner: str,
    table_label: str | None = None,
    skip_operations: Iterable[str] = (),
) -> WriteGuard:
    """W1 of a batch write: :func:`roll_back_before_write` (refuses another owner's undecided
    instant, O4; rolls back this owner's), then this owner's claim on the job (O4a)."""
    # What the O4 check decides on: an instant of another owner not in here appeared after it.
    known = frozenset(tl.instant_ids(job_id=job_id))
    roll_back_before_write(
        tl, job_id=job_id, owner=owner, table_label=table_label, skip_operations=skip_operations
    )
    claim = owners.OwnerClaims(tl.manager, tl.table, job_id).acquire(owner)
    return WriteGuard(claim=claim, known=known, skipped=frozenset(skip_operations))


def confirm_sole_writer(
    tl: timeline.Timeline,
    guard: WriteGuard,
    *,
    instant: str,
    table_label: str | None = None,
    settle_timeout: float = SETTLE_TIMEOUT,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """W2b, after ``instant``'s ``.inflight`` and before anything else of the write (O4a): make
    sure no other owner writes this job on the table at the same time.

    Backs off (rolls ``instant`` back, then raises
    :class:`~sparkguard.spark_lib.base.errors.OwnerConflictError`) when another owner claimed the
    job after this writer did, or when an instant of another owner that appeared since
    :func:`guard_write` committed or stays undecided for ``settle_timeout`` seconds. Of writers
    racing to start, at least one backs off whenever two would write; nothing was written yet.
    """
    job_id = timeline.job_of_instant(instant)
    owner = guard.claim.owner
    label = table_label or tl.table

    def back_off(reason: str) -> NoReturn:
        rollback_instant(tl, instant, owner=owner, table_label=label)
        raise errors.OwnerConflictError(
            f"{reason}, so this write of job {job_id!r} on {label} by owner {owner!r} backed off "
            f"(its instant {instant} is rolled back; nothing was written): two owners would "
            "write the same file names. Run it again once that write has finished, or give this "
            "job another job id"
        )

    successor = owners.OwnerClaims(tl.manager, tl.table, job_id).successor(guard.claim)
    if successor is not None:
        back_off(f"owner {successor.owner!r} took over the job while this write was starting")
    deadline = clock() + settle_timeout
    while True:
        # One listing; reads only for instants in flight now or new since the O4 check (a
        # long history of decided instants costs nothing here).
        files = tl.files_by_instant(job_id=job_id)
        undecided = {i for i, suffixes in files.items() if ".outcome" not in suffixes}
        candidates = undecided | (set(files) - guard.known)
        waiting = []
        for status in (tl.status(i) for i in sorted(candidates - {instant})):
            if status.owner == owner:
                continue
            if status.info is not None and status.info.operation in guard.skipped:
                continue
            if status.state is timeline.State.INFLIGHT:
                waiting.append(status.instant)
            elif status.state is timeline.State.COMMITTED and status.instant not in guard.known:
                back_off(f"instant {status.instant} of owner {status.owner!r} committed meanwhile")
        if not waiting:
            return
        if clock() >= deadline:
            back_off(
                f"instant {waiting[0]} of another owner is in flight (opened while this write "
                "was starting)"
            )
        sleep(_SETTLE_POLL)


def archived_rolled_back_names(history: snapshots.JobHistory) -> set[str]:
    """The ``marked`` names of a job's archived rolled-back instants (late-file sweeps)."""
    names: set[str] = set()
    for entry in history.rolled_back:
        names.update(entry.marked)
    for status in history.archived:
        if status.outcome is timeline.Outcome.ROLLED_BACK:
            names |= status.rolled_back_names
    return names


def sweep_archived(
    tl: timeline.Timeline,
    job_id: str,
    *,
    hot: Iterable[str],
    protected: set[str],
    dry_run: bool,
    label: str,
    history: snapshots.JobHistory | None = None,
) -> list[InstantRollback]:
    """R9 for the job's rolled-back instants a snapshot archived: delete their ``marked``
    names that exist again and that no commit lists and no live instant protects. No
    ``.rolledback`` is written for them (their hot files are gone). ``history``: the job's
    archived history read after ``hot`` was listed (None: read here)."""
    if history is None:
        history = snapshots.job_history(tl.manager, tl.table, job_id)
    hot_set = set(hot)
    entries: dict[str, set[str]] = {}
    for entry in history.rolled_back:
        if entry.instant not in hot_set:
            entries.setdefault(entry.instant, set()).update(entry.marked)
    for status in history.archived:
        if status.outcome is timeline.Outcome.ROLLED_BACK and status.instant not in hot_set:
            entries.setdefault(status.instant, set()).update(status.rolled_back_names)
    wanted = set().union(*entries.values()) - protected if entries else set()
    if not wanted:
        return []
    kept = committed_names(tl, job_id=job_id, marked=wanted)
    removed = _delete(tl.manager, tl.table, sorted(wanted - kept), None, dry_run=dry_run)
    results: list[InstantRollback] = []
    for instant, marked in sorted(entries.items()):
        gone = marked & removed.names
        if gone:
            logger.warning(
                "archived rolled-back instant %s: removed %d late files of it", instant, len(gone)
            )
            results.append(InstantRollback(label, instant, Action.NOTHING, len(gone), 0, 0))
    if dry_run and removed.files:
        results.append(
            InstantRollback(
                label, f"archived instants of {job_id}", Action.NOTHING, removed.files, 0, 0
            )
        )
    return results


def sweep_late_files(
    tl: timeline.Timeline, *, job_id: str, instant: str, keep: Iterable[str]
) -> int:
    """Before ``instant`` commits: delete files that rolled-back instants of ``job_id`` on this
    table marked and that exist again (a zombie task published them after the rollback).

    Never deletes ``keep`` (the files this commit lists), a committed file, or a name another
    undecided instant marked. Returns how many files were removed.
    """
    statuses = tl.statuses(job_id=job_id)
    recorded: set[str] = set()
    for status in statuses:
        if status.outcome is timeline.Outcome.ROLLED_BACK:
            recorded |= status.rolled_back_names
    recorded |= archived_rolled_back_names(snapshots.job_history(tl.manager, tl.table, job_id))
    if not recorded:
        return 0
    live = [s for s in statuses if s.instant != instant]
    protected = marked_by_live_instants(tl, live) | set(keep)
    kept = committed_names(tl, job_id=job_id, marked=recorded)
    doomed = sorted(recorded - kept - protected)
    removed = _delete(tl.manager, tl.table, doomed, None)
    if removed.files or removed.temp_files:
        logger.warning(
            "before committing %s: removed %d late files (and %d temp files) of rolled-back "
            "instants of job %s",
            instant,
            removed.files,
            removed.temp_files,
            job_id,
        )
    return removed.files


# --------------------------------------------------------------------------------------------
# Streams.
# --------------------------------------------------------------------------------------------


def rollback_stream(
    tl: timeline.Timeline,
    job_id: str,
    *,
    dry_run: bool = False,
    progress: Progress | None = None,
    table_label: str | None = None,
) -> list[InstantRollback]:
    """Clean every stream marker directory of ``job_id``: fence undecided batches, delete the
    files no committed batch lists, then the markers."""
    log = reader.StreamLog(tl.manager, tl.table, job_id)
    label = table_label or tl.table
    results = []
    for batch_id, run, directory in log.marker_dirs():
        if dry_run:
            name = f"stream:{job_id}:{batch_id}:{run}"
            marked = markers.read_marked_files(tl.manager, directory)
            winner = log.winner_of(log.slots(batch_id))
            listed = {f.path for f in winner.files} if winner else set()
            would = _delete(tl.manager, tl.table, sorted(marked - listed), None, dry_run=True)
            results.append(InstantRollback(label, name, Action.WOULD_ROLL_BACK, would.files, 0, 0))
            continue
        results.append(
            clean_stream_dir(tl, log, batch_id, run, directory, progress=progress, label=label)
        )
    return results


def clean_stream_dir(
    tl: timeline.Timeline,
    log: reader.StreamLog,
    batch_id: int,
    run: str,
    directory: str,
    *,
    progress: Progress | None = None,
    label: str | None = None,
) -> InstantRollback:
    """Decide one run's execution of a batch, then delete its unlisted files and its markers.

    Unless the batch is already committed, ``run`` is fenced first (it can then never commit
    that batch); only then are its marked files read and deleted, except those the batch's
    committed entry lists.
    """
    winner = log.fence(batch_id, run=run)
    listed = {f.path for f in winner.files} if winner else set()
    snapshot = markers.snapshot_marker_dir(tl.manager, directory)
    marked = snapshot.marked_files
    kept = marked & listed
    doomed = sorted(marked - listed)
    deleted = _delete(tl.manager, tl.table, doomed, progress)

    def delete_late(new_files: set[str]) -> None:
        deleted.add(_delete(tl.manager, tl.table, sorted(new_files - listed), None))

    count = markers.delete_snapshot(tl.manager, snapshot, on_new_names=delete_late)
    action = Action.COMMITTED if winner and winner.run == run else Action.ROLLED_BACK
    name = f"stream:{log.job_id}:{batch_id}:{run}"
    return InstantRollback(
        label or tl.table,
        name,
        action,
        deleted.files,
        len(kept),
        count,
        temp_files_removed=deleted.temp_files,
        warnings=snapshot.warnings,
    )


# --------------------------------------------------------------------------------------------
# Tables and jobs.
# --------------------------------------------------------------------------------------------


class _Damage:
    """Damaged marker directories met during a pass: reported once, at the end."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def add(self, table: str, instant: str, exc: errors.CorruptFileError) -> None:
        self.messages.append(f"instant {instant} of {table}: {exc}")

    def raise_if_any(self) -> None:
        if not self.messages:
            return
        more = f" (and {len(self.messages) - 1} more: {'; '.join(self.messages[1:])})"
        raise errors.CorruptFileError(
            self.messages[0]
            + (more if len(self.messages) > 1 else "")
            + ". Every other instant was handled; the damaged one stays claimed and resumable"
        )


def _rollback_in_table(
    tl: timeline.Timeline,
    *,
    job_id: str | None,
    extra_instants: Iterable[str],
    owner: str | None,
    force: bool,
    dry_run: bool,
    progress: Progress | None,
    label: str,
    damage: _Damage,
    seen: dict[str, timeline.InstantStatus] | None = None,
) -> list[InstantRollback]:
    found = sorted(set(tl.instant_ids(job_id=job_id)) | set(extra_instants))
    statuses = {instant: tl.status(instant) for instant in found}
    if seen is not None:
        seen.update(statuses)
    # Undecided instants first: each is claimed before any other instant's cleanup deletes a
    # name it marked (reruns of a job mark the same names), so it can no longer commit one.
    ordered = sorted(found, key=lambda i: (statuses[i].state is not timeline.State.INFLIGHT, i))
    # Names that undecided instants of other owners marked: a live writer's, never deleted.
    protected: dict[str, set[str]] = collections.defaultdict(set)
    for status in statuses.values():
        if status.state is timeline.State.INFLIGHT and not (force or owns(status, owner)):
            try:
                protected[status.job_id] |= marked_by_live_instants(tl, [status])
            except errors.CorruptFileError as exc:
                damage.add(label, status.instant, exc)
    results = []
    settled: set[str] = set()
    # Archived histories read during the pass (after the listing above): R9 below reuses them.
    histories: dict[str, snapshots.JobHistory] = {}
    for index, instant in enumerate(ordered, start=1):
        status = statuses[instant]
        try:
            results.append(
                rollback_instant(
                    tl,
                    instant,
                    owner=owner,
                    force=force,
                    dry_run=dry_run,
                    progress=progress,
                    table_label=label,
                    protected=protected[status.job_id],
                    settled=settled,
                    # The first instant's status was read just before (not re-read: three
                    # requests); a later one's is read again after the cleanups before it.
                    status=status if index == 1 else None,
                    histories=histories,
                )
            )
        except errors.CorruptFileError as exc:
            damage.add(label, instant, exc)
        if progress is not None:
            progress("instants", index, len(ordered))
    # R9 for the rolled-back instants of the job(s) that a snapshot archived.
    swept_jobs = {job_id} if job_id is not None else {timeline.job_of_instant(i) for i in found}
    for swept_job in sorted(swept_jobs):
        try:
            results.extend(
                sweep_archived(
                    tl,
                    swept_job,
                    hot=found,
                    protected=protected[swept_job],
                    dry_run=dry_run,
                    label=label,
                    history=histories.get(swept_job),
                )
            )
        except errors.CorruptFileError as exc:
            damage.add(label, f"archived instants of {swept_job}", exc)
    jobs = [job_id] if job_id is not None else reader.stream_jobs(tl.manager, tl.table)
    for stream_job in jobs:
        # No stream marker directory: one listing, nothing to do.
        results.extend(
            rollback_stream(tl, stream_job, dry_run=dry_run, progress=progress, table_label=label)
        )
    for result in results:
        if result.action is Action.OTHER_OWNER:
            logger.warning(
                "left instant %s of %s alone: it is in flight for owner %r (roll back as that "
                "owner, or with force, if its writer is dead)",
                result.instant,
                label,
                result.owner,
            )
    # Committed instants are reported only when rollback had something to decide about them.
    return [
        r
        for r in results
        if not (
            r.action is Action.COMMITTED
            and not r.files_deleted
            and not r.markers_deleted
            and not r.files_published
        )
        and r.action is not Action.MISSING
    ]


def _remove_if_created(
    tl: timeline.Timeline,
    results: Iterable[InstantRollback],
    *,
    job_id: str | None,
    journal_named: bool,
    dry_run: bool,
    label: str,
    seen: Mapping[str, timeline.InstantStatus] | None = None,
) -> lifecycle.Removal | None:
    """After the pass over a table: remove its location if a rolled-back write of the job
    created it and nothing else is there (``lifecycle.remove_created_location``).

    ``seen``: the statuses the pass read of the job's instants. When each has its
    ``.inflight`` and none records ``createdLocation``, no write of the job created the
    location (a write that starts later finds it existing): kept with no request."""
    if (
        job_id is not None
        and seen
        and all(
            s.info is not None and s.info.extra.get(lifecycle.CREATED_LOCATION) is not True
            for s in seen.values()
        )
    ):
        return None
    would = [r.instant for r in results if r.action is Action.WOULD_ROLL_BACK] if dry_run else []
    try:  # a dry run deleted nothing: the names those instants marked count as deleted
        would_delete = marked_by_live_instants(tl, [tl.status(i) for i in would])
    except errors.CorruptFileError:
        return None
    return lifecycle.remove_created_location(
        tl,
        job_id=job_id,
        journal_named=journal_named,
        dry_run=dry_run,
        label=label,
        rolled_back=would,
        rolled_back_files=would_delete,
    )


def _with_removals(
    summary: RollbackSummary, removals: Iterable[lifecycle.Removal | None]
) -> RollbackSummary:
    """``summary`` with the tables removed and the removals' warnings (purely computational)."""
    done = [r for r in removals if r is not None]
    return dataclasses.replace(
        summary,
        files_deleted=summary.files_deleted + sum(r.data_files_deleted for r in done),
        tables_removed=tuple(sorted(r.table for r in done if r.removed)),
        warnings=summary.warnings + tuple(w for r in done for w in r.warnings),
    )


def rollback_table(
    url: str,
    *,
    job_id: str | None = None,
    owner: str | None = None,
    force: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    file_manager: str | filemanager.Kind | None = None,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> RollbackSummary:
    """Roll back the undecided instants of the table at ``url`` (of ``job_id`` only, if given)
    that belong to ``owner`` (None: each job's default owner ``job:<jobId>``; ``force``: all).

    Reads one listing of the timeline plus each instant's markers; never lists data files
    except the directories of marked names. A table without a timeline is reported in
    ``tables_missing`` and not touched. A table whose location the rolled-back write created,
    left with nothing else, is removed and reported in ``tables_removed``.
    """
    if job_id is not None:
        timeline.validate_job_id(job_id)
    if owner is not None:
        timeline.validate_owner(owner)
    manager, path = filemanager.resolve(url, storage_options=storage_options, kind=file_manager)
    tl = timeline.Timeline(manager, path)
    label = reader.table_url(url)
    if not tl.exists():
        return summarise(
            job_id or "*", [], dry_run=dry_run, owner=owner, force=force, tables_missing=[label]
        )
    damage = _Damage()
    seen: dict[str, timeline.InstantStatus] = {}
    results = _rollback_in_table(
        tl,
        job_id=job_id,
        extra_instants=(),
        owner=owner,
        force=force,
        dry_run=dry_run,
        progress=progress,
        label=label,
        damage=damage,
        seen=seen,
    )
    damage.raise_if_any()
    removal = _remove_if_created(
        tl, results, job_id=job_id, journal_named=False, dry_run=dry_run, label=label, seen=seen
    )
    summary = summarise(job_id or "*", results, dry_run=dry_run, owner=owner, force=force)
    return _with_removals(summary, [removal])


def rollback_job(
    job_id: str,
    journal: str,
    *,
    owner: str | None = None,
    force: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    dry_run: bool = False,
    progress: Callable[[str, int, int], None] | None = None,
) -> RollbackSummary:
    """Roll back everything job ``job_id`` left undecided, on every table its journal names.

    Only instants of ``owner`` (None: ``job:<jobId>``) are rolled back; undecided instants of
    other owners are reported in ``instants_other_owner`` and left alone unless ``force``.
    Cheap when there is nothing to do: one journal listing, then one timeline listing and a
    few small reads per table. Idempotent: run it again to resume or to catch late files.
    """
    timeline.validate_job_id(job_id)
    if owner is not None:
        timeline.validate_owner(owner)
    jmanager, jpath = filemanager.resolve(journal, storage_options=storage_options)
    entries = job_journal.Journal(jmanager, jpath, job_id).entries()
    by_table: dict[str, list[str]] = collections.defaultdict(list)
    for entry in entries:
        by_table[entry.table].append(entry.instant)
    results: list[InstantRollback] = []
    missing: list[str] = []
    removals: list[lifecycle.Removal | None] = []
    damage = _Damage()
    for table_url in sorted(by_table):
        manager, path = filemanager.resolve(table_url, storage_options=storage_options)
        tl = timeline.Timeline(manager, path)
        if not tl.exists():
            # A removal of the location interrupted among its rmdirs leaves empty directories:
            # finish it. Otherwise a deleted table: report it, never recreate its directories.
            removal = lifecycle.remove_created_location(
                tl, job_id=job_id, journal_named=True, dry_run=dry_run, label=table_url
            )
            if removal is not None and removal.removed:
                removals.append(removal)
                continue
            logger.warning("table %s of job %s has no timeline (deleted?)", table_url, job_id)
            missing.append(table_url)
            continue
        damaged = len(damage.messages)
        seen: dict[str, timeline.InstantStatus] = {}
        table_results = _rollback_in_table(
            tl,
            job_id=job_id,
            extra_instants=by_table[table_url],
            owner=owner,
            force=force,
            dry_run=dry_run,
            progress=progress,
            label=table_url,
            damage=damage,
            seen=seen,
        )
        results.extend(table_results)
        if len(damage.messages) == damaged:  # a damaged instant stays: no removal
            removals.append(
                _remove_if_created(
                    tl,
                    table_results,
                    job_id=job_id,
                    journal_named=True,
                    dry_run=dry_run,
                    label=table_url,
                    seen=seen,
                )
            )
    damage.raise_if_any()
    summary = summarise(
        job_id, results, dry_run=dry_run, owner=owner, force=force, tables_missing=missing
    )
    summary = _with_removals(summary, removals)
    return dataclasses.replace(summary, tables=tuple(sorted(by_table)))
