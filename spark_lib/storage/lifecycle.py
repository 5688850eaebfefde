"""The life of a table: a rollback of the write that created its location removes it again.

docs/storage-contract.md, "The life of a table". A write whose table location did not exist
records ``"createdLocation": true`` in its ``.inflight`` ``extra`` (:data:`CREATED_LOCATION`).
After a rollback, :func:`remove_created_location` returns such a table to not existing when
nothing else is there: every instant of the table is decided rolled back (no committed, no
undecided instant), one of them is the job's and created the location, ``_sparkguard/`` holds
nothing but ``timeline/``, ``markers/`` and ``owners/`` (a ``snapshots/``, ``archive/`` or
``streams/`` directory means history this module does not read: the table is kept), and no
file outside ``_sparkguard/`` is left but leftovers Spark's listing skips and that no data
file owns (:func:`is_leftover`) or late files of the rolled-back instants (names their
``.rolledback`` records, or their direct markers in the same listing name). A rerun of
``saveAsTable``/CTAS then creates the table instead of failing with ``LOCATION_ALREADY_EXISTS``.

The removal deletes only what it listed, in an order where a crash at any step leaves a state
the next rollback finishes: leftovers and late files, then the bookkeeping files, the timeline
files of the other instants, then those of the creating instant; of each instant ``.inflight``
first and its rolled-back ``.outcome`` last (it stays decided, and fenced, to the end; a
rolled-back instant of the job left without ``.inflight`` is a creator for the next rollback of
the job); then the directories, deepest first, each with a non-recursive ``rmdir`` (a writer
that started on the location after the listing keeps its files, its directories and the
location). A location holding only empty directories, or files named by the job (late files
of a zombie task published after the removal), is removed by the next rollback of a job whose
journal names the table.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection
from typing import Final

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors, paths
from sparkguard.spark_lib.storage import markers, owners, timeline

logger = logging.getLogger(__name__)

#: the ``.inflight`` ``extra`` key of a write whose table location did not exist
CREATED_LOCATION: Final = "createdLocation"
#: the only directories of ``_sparkguard/`` a removal deletes; anything else keeps the table
REMOVABLE_BOOKKEEPING: Final = frozenset(
    {timeline.TIMELINE_DIR, markers.MARKERS_DIR, owners.OWNERS_DIR}
)
#: files Spark leaves that are no data: its job-success marker (and its checksum)
_SPARK_LEFTOVERS: Final = frozenset({"_SUCCESS", "._SUCCESS.crc"})
_TIMELINE_SUFFIXES: Final = (".inflight", ".outcome", ".rolledback")
#: per instant, the order its timeline files are deleted in: ``.inflight`` first (as a
#: compactor archives, C6), the rolled-back ``.outcome`` last: it fences a zombie committer and
#: the marker sidecar until the instant is gone
_DELETION_ORDER: Final = (".inflight", ".rolledback", ".outcome")


@dataclasses.dataclass(frozen=True)
class Removal:
    """What :func:`remove_created_location` did to one table."""

    table: str
    #: the location is gone (a dry run: would be removed)
    removed: bool
    #: every file deleted (bookkeeping, leftovers, late data files)
    files_deleted: int = 0
    #: of those, data files: late files of the rolled-back writes (R9's, found here)
    data_files_deleted: int = 0
    warnings: tuple[str, ...] = ()


def is_leftover(relative: str, files: Collection[str]) -> bool:
    """Whether ``relative`` (a file outside ``_sparkguard/``) is a leftover no reader reads:
    Spark's ``_SUCCESS`` (and its checksum), a conditional-create probe a killed process left,
    or a Hadoop checksum ``.<name>.crc`` whose data file ``<name>`` is not in ``files`` (both
    relative to the table). A purely computational
    function with no side-effects."""
    name = paths.basename(relative)
    if name in _SPARK_LEFTOVERS or filemanager.is_create_probe(name):
        return True
    owner = filemanager.checksum_owner(name)
    if owner is None:
        return False
    directory = relative[: -len(name)]
    return directory + owner not in files


def _instant_file(relative: str) -> tuple[str, str] | None:
    """``(instant, suffix)`` of a timeline file (relative to the table), else ``None``."""
    prefix = f"{timeline.SPARKGUARD_DIR}/{timeline.TIMELINE_DIR}/"
    if not relative.startswith(prefix) or "/" in relative[len(prefix) :]:
        return None
    name = relative[len(prefix) :]
    for suffix in _TIMELINE_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)], suffix
    return None


@dataclasses.dataclass(frozen=True)
class _Listing:
    """One listing of a table: files by relative path, directories, instants' timeline files."""

    root: str
    files: frozenset[str]
    directories: tuple[str, ...]
    by_instant: dict[str, set[str]]
    #: per instant, the data files its direct markers in the listing name: a zombie task's
    #: marker put after the rollback read the directory (R7 leaves it) names its late file
    direct_marked: dict[str, set[str]] = dataclasses.field(default_factory=dict)

    @property
    def data(self) -> list[str]:
        """Files outside ``_sparkguard/``."""
        return sorted(r for r in self.files if not r.startswith(timeline.SPARKGUARD_DIR + "/"))


def _read(table: str, entries: list[filemanager.FileInfo]) -> _Listing | None:
    """Classify one listing; ``None`` when ``_sparkguard/`` holds something this module does
    not read (snapshots, streams, a temp file of an instant being published): keep the table.
    A temp file of an instant's ``.outcome`` or ``.rolledback`` counts as that instant's."""
    root = table.rstrip("/") + "/"
    files = frozenset(e.path[len(root) :] for e in entries if not e.is_dir)
    directories = tuple(e.path for e in entries if e.is_dir)
    by_instant: dict[str, set[str]] = {}
    direct_marked: dict[str, set[str]] = {}
    for relative in [*files, *(d[len(root) :] for d in directories)]:
        parts = relative.split("/")
        if parts[0] != timeline.SPARKGUARD_DIR or len(parts) < 2:
            continue
        if parts[1] not in REMOVABLE_BOOKKEEPING or (len(parts) == 2 and relative in files):
            return None
        if parts[1] == markers.MARKERS_DIR and len(parts) > 3 and relative in files:
            marked = _direct_marked("/".join(parts[3:]))
            if marked is not None:
                direct_marked.setdefault(parts[2], set()).add(marked)
            continue
        if parts[1] == timeline.TIMELINE_DIR and relative in files:
            if filemanager.is_create_probe(parts[-1]):
                continue  # a killed process's conditional-create probe: goes first
            found = _instant_file(relative)
            if found is not None:
                by_instant.setdefault(found[0], set()).add(found[1])
                continue
            instant = _decision_temp_instant(relative)
            if instant is None:
                return None
            # Its instant is judged like the others (decided rolled back, or the table stays);
            # the temp file goes first, with the other files that are no timeline file.
            by_instant.setdefault(instant, set())
    return _Listing(root, files, directories, by_instant, direct_marked)


def _direct_marked(name: str) -> str | None:
    """The data file (relative) a direct marker ``name`` (relative to its instant's marker
    directory) names, else ``None`` (a batch file, ``MARKERS.type``). A purely computational
    function."""
    try:
        return markers.parse_marker_name(name)[0]
    except (errors.CorruptFileError, errors.InvalidPathError):
        return None


#: the timeline files only decisions about an existing instant write (the claim or a commit's
#: outcome, a rollback's record): a temp file of one never belongs to a writer starting now
_DECISION_SUFFIXES: Final = (".outcome", ".rolledback")


def _decision_temp_instant(relative: str) -> str | None:
    """The instant whose ``.outcome`` or ``.rolledback`` the timeline temp file ``relative``
    was going to publish (or Hadoop's checksum of such a temp file), else ``None``.

    A rollback killed while it replaced ``.rolledback`` (R5a, R8), or a put of an outcome that
    died before its publish, leaves such a temp file; it is the rolled-back instant's own
    bookkeeping and goes with it. A temp file of an ``.inflight`` (a writer publishing a new
    instant now) is not one: the table stays. A purely computational function."""
    name = paths.basename(relative)
    name = filemanager.checksum_owner(name) or name
    target = filemanager.temp_target(name)
    if target is None:
        return None
    for suffix in _DECISION_SUFFIXES:
        if target.endswith(suffix) and len(target) > len(suffix):
            return target[: -len(suffix)]
    return None


def _surely_kept(tl: timeline.Timeline, rolled_back: Collection[str]) -> bool:
    """Whether the table stays whatever the rest of its location holds: an instant of its
    timeline is not decided rolled back (undecided, committed or damaged; ``rolled_back``
    count as decided). One listing of the timeline, then the outcomes in the order
    :func:`_creators` reads them, up to the first that is not rolled back (a table with a
    commit: one read). A shortcut to keeping only: False falls through to the full check."""
    try:
        for instant, suffixes in sorted(tl.files_by_instant().items()):
            if instant in rolled_back:
                continue
            decided = tl.read_outcome(instant) if ".outcome" in suffixes else None
            if decided is None or decided[0] is not timeline.Outcome.ROLLED_BACK:
                return True
    except errors.CorruptFileError:
        return True  # _read/_creators keep such a table too
    except NotADirectoryError:
        return False  # a file stands where the table was: the full check reports it
    return False


def remove_created_location(
    tl: timeline.Timeline,
    *,
    job_id: str | None,
    journal_named: bool,
    dry_run: bool,
    label: str,
    rolled_back: Collection[str] = (),
    rolled_back_files: Collection[str] = (),
) -> Removal | None:
    """Remove the table of ``tl`` if a rolled-back write of ``job_id`` (None: any job) created
    its location and nothing else is there (see the module docstring); ``None`` when the table
    stays (or is already gone).

    ``journal_named``: the job's journal names this table, so a location holding only empty
    directories under ``_sparkguard/`` (an interrupted removal) is removed too.
    ``rolled_back``: instants a dry run would roll back, judged as if it had;
    ``rolled_back_files``: the data files (relative) the dry run would delete.
    """
    if _surely_kept(tl, rolled_back):
        return None  # without listing the table: its cost follows the instants, not the files
    return _remove_if_nothing_else(
        tl,
        job_id=job_id,
        journal_named=journal_named,
        dry_run=dry_run,
        label=label,
        rolled_back=rolled_back,
        rolled_back_files=rolled_back_files,
    )


def _remove_if_nothing_else(
    tl: timeline.Timeline,
    *,
    job_id: str | None,
    journal_named: bool,
    dry_run: bool,
    label: str,
    rolled_back: Collection[str],
    rolled_back_files: Collection[str],
) -> Removal | None:
    """:func:`remove_created_location` after the shortcut: one listing of the whole location."""
    manager, table = tl.manager, tl.table
    entries = manager.list_tree(table)
    if not entries:  # nothing but the location itself
        if not (journal_named and manager.exists(table)):
            return None
        return Removal(label, removed=dry_run or _finish_directories(manager, table, []))
    listing = _read(table, entries)
    if listing is None:
        return None
    if rolled_back_files:
        listing = dataclasses.replace(
            listing, files=_without(listing.files, frozenset(rolled_back_files))
        )
    judged = _judge(
        tl,
        listing,
        job_id=job_id,
        journal_named=journal_named,
        rolled_back=rolled_back,
        label=label,
    )
    if judged is None or isinstance(judged, Removal):
        return judged
    if dry_run:
        return Removal(
            label, removed=True, files_deleted=len(listing.files), data_files_deleted=_late(listing)
        )
    return _remove(manager, table, listing, judged, label=label)


def _without(files: frozenset[str], deleted: frozenset[str]) -> frozenset[str]:
    """``files`` without ``deleted`` and their temp files and checksums (what a rollback of
    those names removes: R5, R6). A purely computational function."""

    def of_deleted(relative: str) -> bool:
        name = paths.basename(relative)
        directory = relative[: -len(name)]
        owner = filemanager.checksum_owner(name) or name
        target = filemanager.temp_target(owner) or owner
        return relative in deleted or directory + target in deleted

    return frozenset(r for r in files if not of_deleted(r))


def _judge(
    tl: timeline.Timeline,
    listing: _Listing,
    *,
    job_id: str | None,
    journal_named: bool,
    rolled_back: Collection[str],
    label: str,
) -> list[str] | Removal | None:
    """The creating instants when the location may be removed (none: a bare skeleton the
    journal names); a kept :class:`Removal` with a warning; ``None`` to keep it silently."""
    creators: list[str] = []
    if listing.by_instant:
        creators, late = _creators(
            tl,
            listing.by_instant,
            listing.direct_marked,
            job_id=job_id,
            rolled_back=rolled_back,
            journal_named=journal_named,
        )
        if not creators:
            return None
        data = _without(frozenset(listing.data), late)  # late files of rolled-back instants
    elif journal_named and job_id is not None:
        # No timeline left (an interrupted or finished removal): files named by this job can
        # only be late files of its rolled-back writes (a commit always leaves a timeline).
        tag = f"-{job_id}-"
        data = frozenset(r for r in listing.data if tag not in paths.basename(r))
    else:
        return None
    kept = sorted(r for r in data if not is_leftover(r, listing.files))
    if kept and not creators:
        return None
    if kept:  # data no instant lists (e.g. plain files put there after the write started)
        return Removal(label, removed=False, warnings=(_kept_warning(label, creators, kept),))
    return creators


def _remove(
    manager: filemanager.FileManager,
    table: str,
    listing: _Listing,
    creators: list[str],
    *,
    label: str,
) -> Removal:
    """Delete what ``listing`` holds in :func:`_deletion_order`, then the directories."""
    ordered = _deletion_order(listing, creators)
    for path in ordered:
        manager.delete(path)
    if _finish_directories(manager, table, list(listing.directories)):
        logger.info("removed %s: the rolled-back write that created it left nothing else", label)
        return Removal(
            label, removed=True, files_deleted=len(ordered), data_files_deleted=_late(listing)
        )
    logger.warning("left %s in place: a writer started there while its rollback removed it", label)
    return Removal(
        label,
        removed=False,
        files_deleted=len(ordered),
        data_files_deleted=_late(listing),
        warnings=(
            f"{label}: a writer started on the location while the rollback removed it; its "
            "files were left alone, and so was the location",
        ),
    )


def _late(listing: _Listing) -> int:
    """How many of the listed files are data files (not leftovers): late files."""
    return sum(1 for r in listing.data if not is_leftover(r, listing.files))


def _kept_warning(label: str, creators: list[str], kept: list[str]) -> str:
    shown = ", ".join(kept[:3]) + (f" and {len(kept) - 3} more" if len(kept) > 3 else "")
    return (
        f"{label}: the rolled-back write {creators[0]} created this location, but it holds "
        f"files no instant lists ({shown}): left in place; delete them and run the rollback "
        "again to remove the location"
    )


def _creators(
    tl: timeline.Timeline,
    by_instant: dict[str, set[str]],
    direct_marked: dict[str, set[str]],
    *,
    job_id: str | None,
    rolled_back: Collection[str],
    journal_named: bool,
) -> tuple[list[str], frozenset[str]]:
    """The instants of ``job_id`` that created the location, if every instant of the table is
    decided rolled back (or in ``rolled_back``), else an empty list; and the names those
    instants marked (``.rolledback`` ``marked``: a zombie task may publish one late, R9; and
    the names of their direct markers still in the listing: a zombie task's marker put after
    the rollback read the directory, R7, names its late file).

    A rolled-back instant of the job without ``.inflight`` counts as a creator when the job's
    journal names the table: only an interrupted removal deletes an ``.inflight`` (first) on a
    table without ``snapshots/`` (compaction, the other one, needs it).
    """
    creators = []
    marked: set[str] = set()
    for instant in sorted(by_instant):
        try:
            status = tl.status(instant)
        except errors.CorruptFileError:
            return [], frozenset()
        decided = status.outcome is timeline.Outcome.ROLLED_BACK or instant in rolled_back
        if not decided:
            return [], frozenset()
        marked |= status.rolled_back_names | direct_marked.get(instant, set())
        if status.info is None:
            created = journal_named and status.outcome is timeline.Outcome.ROLLED_BACK
        else:
            created = status.info.extra.get(CREATED_LOCATION) is True
        if created and (job_id is None or status.job_id == job_id):
            creators.append(instant)
    return creators, frozenset(marked)


def _deletion_order(listing: _Listing, creators: list[str]) -> list[str]:
    """Every listed file, in the order a crash at any step leaves a state the next rollback
    finishes (see the module docstring). A purely computational function."""
    timeline_dir = f"{listing.root}{timeline.SPARKGUARD_DIR}/{timeline.TIMELINE_DIR}/"
    ordered = [listing.root + r for r in sorted(listing.files) if _instant_file(r) is None]
    for instant in [*sorted(set(listing.by_instant) - set(creators)), *creators]:
        suffixes = listing.by_instant[instant]
        ordered.extend(f"{timeline_dir}{instant}{s}" for s in _DELETION_ORDER if s in suffixes)
    return ordered


def _finish_directories(
    manager: filemanager.FileManager, table: str, directories: list[str]
) -> bool:
    """``rmdir`` each listed directory, deepest first, then the location; whether it is gone."""
    for directory in sorted(directories, key=lambda d: (-d.count("/"), d)):
        manager.remove_empty_directory(directory)
    return manager.remove_empty_directory(table)
