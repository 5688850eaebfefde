"""Rollback: delete exactly the files of failed writes, found through their markers.

For each undecided instant (DESIGN.md, "Rollback"): first decide its fate with
``claim_rollback`` (put-if-absent; if a commit won, the instant is left alone), only then read
its markers (direct or batched; a missing or empty ``MARKERS.type`` is fine), delete every
marked file that no committed instant lists, then the markers, then write ``.rolledback``.

* Instants in state ROLLING_BACK (claimed, cleanup interrupted) are resumed.
* ROLLED_BACK instants whose marker directory reappeared (a zombie executor marked and wrote a
  file after the first pass) are cleaned again: a second pass catches late files.
* A committed file is never deleted, even when a failed re-run overwrote a name an earlier
  commit lists: the name is kept (its content is the last complete write of that name).
* Stream marker directories of the job (``_sparkguard/streams/<jobId>/markers``) are handled the
  same way, with the batch's slot in the stream log as the decision (see ``reader.StreamLog``).

Every step is idempotent, so an interrupted rollback is finished by running it again. The cost
grows with the job's instants and markers, never with the number of files in the table.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from sparkguard.spark_lib import filemanager, markers, paths, reader, timeline
from sparkguard.spark_lib import journal as job_journal

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


@dataclasses.dataclass(frozen=True)
class InstantRollback:
    """The result of rolling back one instant or one stream batch execution."""

    table: str
    instant: str
    action: Action
    files_deleted: int
    files_kept: int
    markers_deleted: int


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

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable form (for ``--json`` output and operator events)."""
        return {
            "jobId": self.job_id,
            "dryRun": self.dry_run,
            "tables": list(self.tables),
            "instantsRolledBack": list(self.instants_rolled_back),
            "instantsCommitted": list(self.instants_committed),
            "filesDeleted": self.files_deleted,
            "filesKept": self.files_kept,
            "markersDeleted": self.markers_deleted,
            "details": [
                {
                    "table": d.table,
                    "instant": d.instant,
                    "action": d.action.value,
                    "filesDeleted": d.files_deleted,
                    "filesKept": d.files_kept,
                    "markersDeleted": d.markers_deleted,
                }
                for d in self.details
            ],
        }


def summarise(job_id: str, results: Iterable[InstantRollback], *, dry_run: bool) -> RollbackSummary:
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
    )


# --------------------------------------------------------------------------------------------
# What is committed.
# --------------------------------------------------------------------------------------------


def committed_names(tl: timeline.Timeline, *, job_id: str, marked: Iterable[str]) -> set[str]:
    """Paths (relative) that a committed instant or stream batch lists, among ``marked``.

    Data file names embed the job id, so the committed instants of the same job suffice; a
    marked name that does not embed it (never written by sparkguard's writer) falls back to
    every committed instant of the table, so the answer is right either way.
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
        if not tl.manager.exists(log.directory):
            continue
        for entry in log.committed():
            listed.update(f.path for f in entry.files)
    return marked_set & listed


def _delete(
    manager: filemanager.FileManager,
    table: str,
    relative: list[str],
    progress: Progress | None,
) -> None:
    total = len(relative)
    for start in range(0, total, DELETE_CHUNK):
        chunk = relative[start : start + DELETE_CHUNK]
        manager.delete_many(paths.join(table, rel) for rel in chunk)
        if progress is not None:
            progress("delete", start + len(chunk), total)


# --------------------------------------------------------------------------------------------
# One instant.
# --------------------------------------------------------------------------------------------


def rollback_instant(
    tl: timeline.Timeline,
    instant: str,
    *,
    dry_run: bool = False,
    progress: Progress | None = None,
    table_label: str | None = None,
) -> InstantRollback:
    """Roll back one instant of ``tl`` unless it is committed (see the module docstring).

    Idempotent and resumable: run it again after any interruption.
    """
    manager = tl.manager
    label = table_label or tl.table
    status = tl.status(instant)
    mdir = markers.marker_dir(tl.table, instant)
    state = status.state
    if state is timeline.State.ROLLED_BACK and not manager.exists(mdir):
        return InstantRollback(label, instant, Action.NOTHING, 0, 0, 0)
    if state is timeline.State.COMMITTED:
        return _clean_committed(tl, instant, mdir, label=label, dry_run=dry_run)
    if dry_run:
        marked = markers.read_marked_files(manager, mdir)
        kept = committed_names(tl, job_id=status.job_id, marked=marked)
        return InstantRollback(
            label, instant, Action.WOULD_ROLL_BACK, len(marked - kept), len(kept), 0
        )
    if state is timeline.State.INFLIGHT and not tl.claim_rollback(instant):
        logger.info("instant %s was committed before rollback could claim it", instant)
        return InstantRollback(label, instant, Action.COMMITTED, 0, 0, 0)
    # Claimed: the instant can no longer commit. Now read the markers and clean up: exactly
    # the markers read here, so a late marker survives for the next pass.
    snapshot = markers.snapshot_marker_dir(manager, mdir)
    marked = snapshot.marked_files
    kept = committed_names(tl, job_id=status.job_id, marked=marked)
    doomed = sorted(marked - kept)
    _delete(manager, tl.table, doomed, progress)
    markers_deleted = markers.delete_snapshot(manager, snapshot)
    previous = status.rolledback or {}
    tl.record_rolled_back(
        instant,
        {
            "filesDeleted": int(previous.get("filesDeleted", 0)) + len(doomed),
            "filesKept": sorted(kept)[:RECORDED_NAMES_LIMIT],
            "deleted": doomed[:RECORDED_NAMES_LIMIT],
            "passes": int(previous.get("passes", 0)) + 1,
        },
    )
    if kept:
        logger.warning(
            "instant %s: kept %d marked files that a committed instant lists", instant, len(kept)
        )
    action = Action.ROLLED_BACK if state is not timeline.State.ROLLED_BACK else Action.NOTHING
    return InstantRollback(label, instant, action, len(doomed), len(kept), markers_deleted)


def _clean_committed(
    tl: timeline.Timeline, instant: str, mdir: str, *, label: str, dry_run: bool
) -> InstantRollback:
    """A committed instant whose markers survived (the driver died after deciding)."""
    manager = tl.manager
    if not manager.exists(mdir):
        return InstantRollback(label, instant, Action.COMMITTED, 0, 0, 0)
    snapshot = markers.snapshot_marker_dir(manager, mdir)
    marked = snapshot.marked_files
    kept = committed_names(tl, job_id=timeline.job_of_instant(instant), marked=marked)
    doomed = sorted(marked - kept)
    if dry_run:
        return InstantRollback(label, instant, Action.COMMITTED, len(doomed), len(kept), 0)
    _delete(manager, tl.table, doomed, None)
    count = markers.delete_snapshot(manager, snapshot)
    return InstantRollback(label, instant, Action.COMMITTED, len(doomed), len(kept), count)


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
            results.append(
                InstantRollback(label, name, Action.WOULD_ROLL_BACK, len(marked - listed), 0, 0)
            )
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
    _delete(tl.manager, tl.table, doomed, progress)
    count = markers.delete_snapshot(tl.manager, snapshot)
    action = Action.COMMITTED if winner and winner.run == run else Action.ROLLED_BACK
    name = f"stream:{log.job_id}:{batch_id}:{run}"
    return InstantRollback(label or tl.table, name, action, len(doomed), len(kept), count)


# --------------------------------------------------------------------------------------------
# Tables and jobs.
# --------------------------------------------------------------------------------------------


def _rollback_in_table(
    tl: timeline.Timeline,
    *,
    job_id: str | None,
    extra_instants: Iterable[str],
    dry_run: bool,
    progress: Progress | None,
    label: str,
) -> list[InstantRollback]:
    statuses_ids = set(tl.instant_ids(job_id=job_id)) | set(extra_instants)
    ordered = sorted(statuses_ids)
    results = []
    for index, instant in enumerate(ordered, start=1):
        results.append(
            rollback_instant(tl, instant, dry_run=dry_run, progress=progress, table_label=label)
        )
        if progress is not None:
            progress("instants", index, len(ordered))
    jobs = [job_id] if job_id is not None else reader.stream_jobs(tl.manager, tl.table)
    for stream_job in jobs:
        log = reader.StreamLog(tl.manager, tl.table, stream_job)
        if tl.manager.exists(log.markers_directory):
            results.extend(
                rollback_stream(
                    tl, stream_job, dry_run=dry_run, progress=progress, table_label=label
                )
            )
    # Committed instants are reported only when rollback had something to decide about them.
    return [r for r in results if not (r.action is Action.COMMITTED and not r.files_deleted)]


def rollback_table(
    url: str,
    *,
    job_id: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    file_manager: str | filemanager.Kind | None = None,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> RollbackSummary:
    """Roll back every undecided instant of the table at ``url`` (of ``job_id`` only, if given).

    Reads one listing of the timeline plus each instant's markers; never lists data files.
    """
    if job_id is not None:
        timeline.validate_job_id(job_id)
    manager, path = filemanager.resolve(url, storage_options=storage_options, kind=file_manager)
    tl = timeline.Timeline(manager, path)
    results = _rollback_in_table(
        tl,
        job_id=job_id,
        extra_instants=(),
        dry_run=dry_run,
        progress=progress,
        label=reader.table_url(url),
    )
    return summarise(job_id or "*", results, dry_run=dry_run)


def rollback_job(
    job_id: str,
    journal: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    dry_run: bool = False,
    progress: Callable[[str, int, int], None] | None = None,
) -> RollbackSummary:
    """Roll back everything job ``job_id`` left undecided, on every table its journal names.

    Cheap when there is nothing to do: one journal listing, then one timeline listing and a
    few small reads per table. Idempotent: run it again to resume or to catch late files.
    """
    timeline.validate_job_id(job_id)
    jmanager, jpath = filemanager.resolve(journal, storage_options=storage_options)
    entries = job_journal.Journal(jmanager, jpath, job_id).entries()
    by_table: dict[str, list[str]] = collections.defaultdict(list)
    for entry in entries:
        by_table[entry.table].append(entry.instant)
    results: list[InstantRollback] = []
    for table_url in sorted(by_table):
        manager, path = filemanager.resolve(table_url, storage_options=storage_options)
        tl = timeline.Timeline(manager, path)
        results.extend(
            _rollback_in_table(
                tl,
                job_id=job_id,
                extra_instants=by_table[table_url],
                dry_run=dry_run,
                progress=progress,
                label=table_url,
            )
        )
    summary = summarise(job_id, results, dry_run=dry_run)
    return dataclasses.replace(summary, tables=tuple(sorted(by_table)))
