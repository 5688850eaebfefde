"""The marker batcher: queues marker requests and writes them durably in batches.

Per marker directory it keeps the acknowledged names and the content of each ``MARKERS<i>``
file. A flush takes every queued name of a directory, appends them to a free ``MARKERS<i>``
(one of ``batch_threads`` files, see :func:`pick_batch_file`) and rewrites that file atomically
through the file manager; ``MARKERS.type`` is written before the first batch file. Only once the
write has returned are the requests answered, so an acknowledged marker is on storage.

The state of a directory loads lazily from its files on first use: a restarted sidecar appends
to what its predecessor wrote and acknowledges a re-created marker without writing it again.

**Decided instants are fenced.** Markers of an instant whose ``<instant>.outcome`` exists
(committed, or claimed by a rollback) are refused with :class:`~sparkguard.sidecar.errors.
InstantDecidedError` (409). The sidecar reads the outcome when it loads a directory, before and
after it creates a batch file, and after a conditional rewrite lost. Rewriting a batch file it
created or read is conditional on that version (S3 ``If-Match``; local disk an atomic exchange,
see :meth:`~sparkguard.spark_lib.filemanager.FileManager.write_versioned`) and needs no read: a
rollback that claimed the instant since lists that file (R4) and deletes it only conditionally
on a version it read (R7), so either it reads the new version or the rewrite fails and the
outcome is read. On stores without versioned writes the outcome is read before and after every
flush, as before. A re-sent, already durable marker is checked once before its 200.

**The commit seals its directory.** The commit's read of its markers (W8, :meth:`MarkerBatcher.
seal`) is the last moment a marker can count: from then on the sidecar acknowledges none for
that directory (409 at once, no storage read; queued names and flushes still running are
refused too), so a straggler of a committed write fails before it writes its data file, with
no lookup per flush.

Three flush policies (:class:`~sparkguard.sidecar.config.FlushMode`). ``adaptive`` (the
default) starts a directory's flush once ``batch_size`` names are queued, once its oldest queued
name has waited ``batch_interval_ms``, once no name has arrived for a fifth of that (the
arrivals paused: waiting longer would only delay the ones queued), or once every client
answered before that sent lately waits for an ack (no name is coming); ``interval`` starts a flush
of every directory with queued names each ``batch_interval_ms``; ``group-commit`` starts a
directory's flush as soon as a name is queued and none is running, so names that arrive during a
write ride on the next one. Up to ``batch_threads`` flushes of one directory run at a time
(group-commit: one), each on its own file: the first free file still under
:data:`FILE_FULL_BYTES`, so a directory holds few files and few are created (each creation
costs two outcome reads).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import json
import logging
import re
import time
from collections.abc import Callable, Collection, Mapping
from typing import Final, TypeVar

from sparkguard.sidecar import config, errors, metrics, validation
from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors as lib_errors
from sparkguard.spark_lib.base import paths
from sparkguard.spark_lib.storage import markers, timeline

logger = logging.getLogger(__name__)

_BATCH_FILE: Final = re.compile(r"^MARKERS(0|[1-9][0-9]{0,5})$")
_DIRECT_MARKER: Final = re.compile(r"\.marker\.(CREATE|MERGE|APPEND)$")
_TYPE_CONTENT: Final = markers.MarkerType.TIMELINE_SERVER_BASED.value.encode()
_LOCAL_PROTOCOLS: Final = frozenset({"file", "local", "memory"})
_T = TypeVar("_T")
#: conditional writes of one flush before it gives up (each loss re-reads the file)
_WRITE_ATTEMPTS: Final = 3
#: a batch file this large takes no more appends while another file can (bounds each rewrite)
FILE_FULL_BYTES: Final = 64 * 1024
#: adaptive mode: a queue that got no new name for ``batch_interval_ms / _PAUSE_DIVISOR`` flushes
#: (unless names come fast enough to fill a batch within the interval: then a gap is a stall)
_PAUSE_DIVISOR: Final = 5
#: adaptive mode: weight of the newest batch in the directory's arrival rate (names per second)
_RATE_WEIGHT: Final = 0.25
#: adaptive mode: a client that sent nothing for this many intervals no longer counts as one
#: that may send the next name (forgotten at the next flush)
_CLIENT_MEMORY_INTERVALS: Final = 2


@dataclasses.dataclass
class _Progress:
    """What a flush got done before it ended (answered or failed)."""

    wrote: bool = False


@dataclasses.dataclass(frozen=True)
class LoadedDir:
    """What a marker directory holds on storage."""

    names: set[str]
    files: dict[int, bytes]
    type_written: bool
    #: the version of each batch file as read (``None`` where the store has no versions)
    versions: dict[int, str | None] = dataclasses.field(default_factory=dict)


def load_marker_dir(manager: filemanager.FileManager, path: str) -> LoadedDir:
    """Read a marker directory's batch files (and any direct markers) from storage.

    Temp files of an interrupted rewrite are ignored: the rewrite never published, so its
    requests were never acknowledged. Raises :class:`CorruptMarkerDirError` on unknown files.
    """
    names: set[str] = set()
    files: dict[int, bytes] = {}
    versions: dict[int, str | None] = {}
    type_written = False
    nested = False
    try:
        for info in manager.list(path):
            base = info.name
            if info.is_dir:
                nested = True  # direct markers of nested data files
            elif filemanager.is_temp_name(base):
                continue
            elif base == markers.TYPE_FILE:
                type_written = bool(manager.read_bytes(info.path).strip())
            elif match := _BATCH_FILE.match(base):
                content, version = manager.read_versioned(info.path)
                parsed = markers.parse_batch_content(content, source=info.path)
                names.update(parsed.names)
                if parsed.torn is not None:
                    # A crash mid-append left a partial last line: it was never acknowledged.
                    # Drop it, or the next append would bury it as a garbage middle line.
                    logger.warning("dropping the torn last line of %s", info.path)
                content = _whole_lines(content)
                files[int(match.group(1))] = content
                versions[int(match.group(1))] = version
            elif _DIRECT_MARKER.search(base):
                names.add(base)
            else:
                raise lib_errors.CorruptFileError(f"unexpected file {info.path}")
        if nested:
            names |= markers.read_marker_names(manager, path)
    except lib_errors.CorruptFileError as exc:
        raise errors.CorruptMarkerDirError(
            f"marker directory {path} cannot be read ({exc}); the sidecar will not append to "
            "it. Move the offending file away, or roll the instant back"
        ) from None
    return LoadedDir(names=names, files=files, type_written=type_written, versions=versions)


def _whole_lines(content: bytes) -> bytes:
    """``content`` without a torn last line (never acknowledged), and ending in a newline."""
    lines = content.split(b"\n")
    tail = lines.pop()
    if tail and markers.parse_batch_content(tail, source="", lenient=True).names:
        lines.append(tail)  # a whole name whose newline is missing
    return b"".join(line + b"\n" for line in lines)


def read_batch_file(
    manager: filemanager.FileManager, path: str, index: int
) -> tuple[bytes, str | None] | None:
    """``MARKERS<index>``'s whole lines and version, or ``None`` when it does not exist."""
    try:
        content, version = manager.read_versioned(
            paths.join(path, f"{markers.BATCH_PREFIX}{index}")
        )
    except FileNotFoundError:
        return None
    return _whole_lines(content), version


def merge_batch(current: bytes, previous: bytes) -> bytes:
    """``current`` followed by the lines of ``previous`` it lacks (names this sidecar
    acknowledged in a version that someone removed without deciding the instant)."""
    have = set(markers.parse_batch_content(current, source="", lenient=True).names)
    lost = [
        name
        for name in markers.parse_batch_content(previous, source="", lenient=True).names
        if name not in have
    ]
    return current + markers.render_batch_file(lost)


def write_type_file(manager: filemanager.FileManager, path: str) -> None:
    """Write ``MARKERS.type`` = ``TIMELINE_SERVER_BASED`` atomically (rewriting is harmless)."""
    manager.mkdirs(path)
    manager.write_bytes(paths.join(path, markers.TYPE_FILE), _TYPE_CONTENT, overwrite=True)


def outcome_path(marker_dir_path: str, instant: str) -> str:
    """``<table>/_sparkguard/timeline/<instant>.outcome`` for a marker directory's path."""
    table = marker_dir_path.rstrip("/").rsplit("/", 3)[0]
    return paths.join(table, timeline.SPARKGUARD_DIR, timeline.TIMELINE_DIR, instant + ".outcome")


def is_decided(manager: filemanager.FileManager, path: str) -> bool:
    """Whether the outcome file at ``path`` exists, asked of the store (no listing cache).

    A one-byte ranged read: one request on object stores whether the file exists or not
    (``info`` would add a listing on a miss, to look for a directory of that name).
    """
    try:
        manager.fs.cat_file(path, start=0, end=1)
    except FileNotFoundError:
        return False
    return True


def read_outcome(manager: filemanager.FileManager, path: str) -> str | None:
    """The ``outcome`` field of the outcome file at ``path`` (``None`` when it is missing;
    ``"unreadable"`` when it cannot be parsed, which callers treat as not committed)."""
    try:
        raw = manager.read_bytes(path)
    except FileNotFoundError:
        return None
    try:
        return str(json.loads(raw)["outcome"])
    except (ValueError, KeyError, TypeError):
        return "unreadable"


def is_gone(manager: filemanager.FileManager, path: str) -> bool:
    """Whether the instant of the outcome file at ``path`` was decided and then removed: its
    ``.inflight`` does not exist. A writer puts ``.inflight`` before any marker (W2), and only a
    rollback that removed the location its decided write created deletes it
    (docs/storage-contract.md, "The life of a table"; a compactor archiving a decided instant
    too). One read, when a directory's state is loaded."""
    return not is_decided(manager, path[: -len(".outcome")] + ".inflight")


def pick_batch_file(sizes: Mapping[int, int], busy: Collection[int], threads: int) -> int:
    """The index of the batch file a flush appends to, among ``threads`` files of which those in
    ``busy`` are being written; ``sizes`` maps the files that exist (or are known) to their size.

    The lowest free file under :data:`FILE_FULL_BYTES`, else the lowest free index not created
    yet, else the smallest free file. A purely computational function with no side-effects; at
    least one index must be free.
    """
    free = [index for index in range(threads) if index not in busy]
    for index in free:
        if index in sizes and sizes[index] < FILE_FULL_BYTES:
            return index
    for index in free:
        if index not in sizes:
            return index
    return min(free, key=lambda index: (sizes[index], index))


def flush_due(
    *, queued_at: float, arrived_at: float, rate: float, interval_s: float, batch_size: int
) -> float:
    """Adaptive mode: when a queue whose oldest name came at ``queued_at`` and newest at
    ``arrived_at`` is due for a flush (unless it reaches ``batch_size`` first).

    At ``queued_at + interval_s`` at the latest; at a pause of a fifth of the interval after the
    newest name while ``rate`` (names per second) is too slow to fill a batch within the
    interval. A purely computational function with no side-effects.
    """
    due = queued_at + interval_s
    if rate * interval_s < batch_size:
        due = min(due, arrived_at + interval_s / _PAUSE_DIVISOR)
    return due


def write_batch_file(  # noqa: PLR0917 - positional, as _run(func, *args) passes them
    manager: filemanager.FileManager,
    path: str,
    index: int,
    content: bytes,
    versioned: bool = False,
    expected: str | None = None,
) -> str | None:
    """Rewrite ``MARKERS<index>`` with ``content`` atomically; returns its new version.

    With ``versioned``, only if it is still version ``expected`` (``None``: create it only if
    absent), see :meth:`~sparkguard.spark_lib.filemanager.FileManager.write_versioned`;
    without, unconditionally (and the version is ``None``).
    """
    target = paths.join(path, f"{markers.BATCH_PREFIX}{index}")
    if versioned:
        return manager.write_versioned(target, content, expected)
    manager.write_bytes(target, content, overwrite=True)
    return None


class _DirState:
    """In-memory state of one marker directory. Touched only from the event loop."""

    def __init__(self, marker_dir: validation.MarkerDir, manager: filemanager.FileManager) -> None:
        self.dir = marker_dir
        self.manager = manager
        self.path = marker_dir.path
        self.outcome_path = outcome_path(marker_dir.path, marker_dir.instant)
        #: the instant's outcome exists (sticky: an instant is decided once and for all)
        self.decided = False
        #: the commit read the markers (W8): no marker is acknowledged from then on (sticky)
        self.sealed = False
        self.loaded = False
        self.load_lock = asyncio.Lock()
        self.type_lock = asyncio.Lock()
        self.type_written = False
        self.known: set[str] = set()
        self.files: dict[int, bytes] = {}
        #: index -> the version of ``MARKERS<index>`` this sidecar last wrote or read (absent:
        #: no such file known, the next flush to it creates it)
        self.versions: dict[int, str | None] = {}
        #: indices rewritten without a check since the last check that found the instant
        #: undecided (their newest markers may postdate a claim; see delete_dir)
        self.unchecked: set[int] = set()
        #: name -> future resolved when acknowledged (result: whether this sidecar wrote it);
        #: names queued or being written
        self.waiting: dict[str, asyncio.Future[bool]] = {}
        self.queue: list[str] = []
        #: event-loop time the oldest queued name was queued, and the newest (adaptive mode)
        self.queued_at = 0.0
        self.arrived_at = 0.0
        #: adaptive mode: the timer that considers a flush when the queue is due
        self.timer: asyncio.TimerHandle | None = None
        #: a flush was started and has not taken the queue yet (names arriving meanwhile join it)
        self.starting = False
        #: adaptive mode: names per second queued, a moving average over the recent batches
        self.rate = 0.0
        #: adaptive mode: each client (connection) answered before that sent a marker lately ->
        #: when it last did (a client's first marker does not count: at a job's start the
        #: pause rule batches the arrivals)
        self.clients: dict[object, float] = {}
        #: adaptive mode: clients waiting for an ack now -> how many of their requests wait
        self.blocked: dict[object, int] = {}
        #: adaptive mode: how many of ``clients`` are in ``blocked``
        self.clients_blocked = 0
        self.busy: set[int] = set()
        self.deleting = 0
        self.users = 0
        self.idle = asyncio.Event()
        self.idle.set()

    def sent(self, client: object, now: float) -> None:
        """Adaptive mode: ``client`` (``None``: not counted) sent a marker and waits for it."""
        if client is None:
            return
        waiting = self.blocked.get(client, 0)
        self.blocked[client] = waiting + 1
        if client in self.clients:
            self.clients[client] = now
            self.clients_blocked += not waiting

    def answered(self, client: object, now: float) -> None:
        """Adaptive mode: one request of ``client`` (``None``: not counted) was answered."""
        if client is None:
            return
        left = self.blocked.pop(client) - 1
        if left:
            self.blocked[client] = left
        elif client in self.clients:
            self.clients_blocked -= 1
        self.clients[client] = now

    def every_client_waits(self) -> bool:
        """Adaptive mode: every client answered before that sent lately waits for an ack now,
        so no name is coming that waiting longer would add to the batch."""
        return 0 < len(self.clients) == self.clients_blocked

    def evictable(self) -> bool:
        return (
            not self.waiting
            and not self.busy
            and not self.deleting
            and not self.users
            and not self.load_lock.locked()
        )


class MarkerBatcher:
    """Queues marker requests per directory and acknowledges them once durable."""

    def __init__(
        self,
        settings: config.SidecarConfig,
        instruments: metrics.SidecarMetrics,
        *,
        managers: Mapping[str, filemanager.FileManager] | None = None,
    ) -> None:
        """``managers`` maps protocols (``file``, ``s3``, ...) to the file manager to use for
        them; the others are resolved from the protocol on first use."""
        self._settings = settings
        self._metrics = instruments
        self._dirs: collections.OrderedDict[str, _DirState] = collections.OrderedDict()
        self._managers: dict[str, filemanager.FileManager] = dict(managers or {})
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=settings.batch_threads + 4, thread_name_prefix="sidecar-io"
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self._ticker: asyncio.Task[None] | None = None
        self._pending = 0
        self._draining = False
        self._group_commit = settings.flush_mode is config.FlushMode.GROUP_COMMIT
        # Read at each scrape rather than set at each request.
        instruments.pending.set_function(lambda: self._pending)
        self._adaptive = settings.flush_mode is config.FlushMode.ADAPTIVE
        #: keys of sealed directories, newest last (so a seal outlives its state's eviction)
        self._sealed: collections.OrderedDict[str, None] = collections.OrderedDict()

    # -- lifecycle ------------------------------------------------------------------------------
    @property
    def draining(self) -> bool:
        """Whether the batcher refuses new markers because the sidecar is stopping."""
        return self._draining

    @property
    def pending(self) -> int:
        """Markers queued or being written."""
        return self._pending

    def start(self) -> None:
        """Start the interval ticker (interval mode); the other modes need no background task."""
        if self._settings.flush_mode is config.FlushMode.INTERVAL and self._ticker is None:
            self._ticker = asyncio.get_running_loop().create_task(self._tick_forever())

    async def drain(self, timeout_s: float) -> int:
        """Refuse new markers, write what is queued within ``timeout_s``, fail the rest.

        Returns how many waiting markers were failed with :class:`ShuttingDownError` (503);
        none is ever dropped without an answer.
        """
        self._draining = True
        deadline = time.monotonic() + timeout_s
        while self._pending and time.monotonic() < deadline:
            for state in list(self._dirs.values()):
                self._schedule(state)
            if self._tasks:
                await asyncio.wait(set(self._tasks), timeout=max(0.0, deadline - time.monotonic()))
            else:
                await asyncio.sleep(0.01)
        failed = 0
        for state in self._dirs.values():
            error = errors.ShuttingDownError(
                f"the sidecar stopped before the marker could be written to {state.dir.key}; "
                "nothing was acknowledged, retry against the restarted sidecar"
            )
            for name in state.queue:
                future = state.waiting.pop(name, None)
                if future is not None and not future.done():
                    future.set_exception(error)
                    failed += 1
                    self._pending -= 1
            state.queue.clear()
            for future in state.waiting.values():
                if not future.done():
                    future.set_exception(error)
                    failed += 1
        if failed:
            logger.warning("shutdown: %s pending markers were refused with 503", failed)
        return failed

    async def close(self) -> None:
        """Stop background work and release the I/O threads (after :meth:`drain`)."""
        for state in self._dirs.values():
            _disarm(state)
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
            self._ticker = None
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=self._settings.shutdown_timeout_s)
        self._executor.shutdown(wait=False, cancel_futures=True)

    # -- operations -----------------------------------------------------------------------------
    async def create(
        self, marker_dir: validation.MarkerDir, name: str, *, client: object = None
    ) -> bool:
        """Return once ``name`` is durable in ``marker_dir``; whether this sidecar wrote it.

        ``False`` means the marker was already on storage (a retry, or a restarted sidecar):
        acknowledged without a new write. Raises :class:`~sparkguard.sidecar.errors.
        InstantDecidedError` when the instant's outcome exists (checked after the write).
        ``client`` identifies the sender (its connection) for the adaptive policy's rule that
        flushes once every recent sender is waiting; ``None``: not counted.
        """
        if self._draining:
            raise errors.ShuttingDownError("the sidecar is stopping; retry in a moment")
        if marker_dir.key in self._sealed:  # even when its state was evicted: no load
            raise self._sealed_error(marker_dir)
        state = self._dirs.get(marker_dir.key)
        if state is not None and state.loaded:
            self._dirs.move_to_end(marker_dir.key)  # what _state does for a loaded directory
        else:
            state = await self._state(marker_dir)
        state.users += 1
        sender = client if self._adaptive else None
        state.sent(sender, asyncio.get_running_loop().time())
        try:
            self._refuse_if_decided(state)
            # A known name is not written again, but it waits for the next flush all the same:
            # that flush checks the instant's outcome before the marker is acknowledged.
            future = state.waiting.get(name)
            if future is None:
                if self._pending >= self._settings.max_pending:
                    raise errors.QueueFullError(
                        f"{self._pending} markers are already waiting to be written (limit "
                        f"{self._settings.max_pending}, SPARKGUARD_SIDECAR_MAX_PENDING); retry "
                        "after a short wait",
                        retry_after_s=max(self._settings.batch_interval_ms / 1000, 0.1),
                    )
                # Awaited through shield() below at once, whose callback retrieves a failure
                # even when the request is gone: never "exception was never retrieved".
                loop = asyncio.get_running_loop()
                future = loop.create_future()
                state.waiting[name] = future
                state.arrived_at = loop.time()
                if not state.queue:
                    state.queued_at = state.arrived_at
                state.queue.append(name)
                self._pending += 1
                if self._group_commit:
                    self._schedule(state)
            if self._adaptive:  # a new name, or one more client waiting (the rule may hold)
                self._consider(state)
            written = await asyncio.shield(future)
            if written:
                self._metrics.acknowledged_written.inc()
            else:
                self._metrics.acknowledged_known.inc()
            return written
        finally:
            state.users -= 1
            state.answered(sender, asyncio.get_running_loop().time())

    async def all_names(self, marker_dir: validation.MarkerDir) -> list[str]:
        """Every acknowledged marker name of ``marker_dir`` (loaded from storage if needed)."""
        state = await self._state(marker_dir)
        return sorted(state.known)

    async def seal(self, marker_dir: validation.MarkerDir) -> list[str]:
        """The commit's read of its markers (W8): every acknowledged name, after which the
        directory acknowledges no marker (sticky; idempotent).

        A marker acknowledged after this read would not be in the commit's list: its task's
        data file would be a stray the commit neither lists nor deletes. So new requests are
        refused at once (409, no storage read), queued names are refused now, and a flush
        still running refuses its batch when it ends (the names may be on storage, which
        lists them as marked files that do not exist: harmless).

        When batch files were rewritten unchecked, the instant's outcome is looked up too:
        the commit is about to decide, so a lookup that finds the instant undecided spares its
        directory delete (W10) the lookup (see :meth:`delete_dir`). A failed lookup is only
        logged: the delete then makes it.
        """
        state = await self._state(marker_dir)
        if not state.sealed:
            state.sealed = True
            self._sealed[state.dir.key] = None
            self._sealed.move_to_end(state.dir.key)
            while len(self._sealed) > self._settings.max_cached_dirs:
                self._sealed.popitem(last=False)
            _disarm(state)
            queued, state.queue = state.queue, []
            self._settle(
                state,
                [(n, state.waiting[n]) for n in queued if n in state.waiting],
                self._sealed_error(state.dir),
            )
            logger.info("marker dir %s sealed: %s markers", state.dir.key, len(state.known))
        if state.unchecked and not state.decided:
            try:
                await self._check_decided(state)
            except OSError as exc:
                logger.warning("could not look up the outcome of %s: %s", state.dir.instant, exc)
        return sorted(state.known)

    async def dir_exists(self, marker_dir: validation.MarkerDir) -> bool:
        """Whether the marker directory exists on storage."""
        state = await self._state(marker_dir, load=False)
        return await self._run(state.manager.exists, state.path)

    def deletes_in_background(self, marker_dir: validation.MarkerDir) -> bool:
        """Whether a delete of ``marker_dir`` goes on after its answer: the directory is sealed
        (its commit read the markers, W8), so the delete is W10 after the outcome, or an abort's
        after a failed commit, and a directory left behind is what a driver killed before W10
        leaves (the next rollback pass removes it). Not while the sidecar stops."""
        return marker_dir.key in self._sealed and not self._draining

    def start_delete(self, marker_dir: validation.MarkerDir) -> None:
        """Delete ``marker_dir`` in the background (see :meth:`deletes_in_background`); the
        sidecar's stop waits for it (:meth:`close`)."""
        task = asyncio.get_running_loop().create_task(self._delete_quietly(marker_dir))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _delete_quietly(self, marker_dir: validation.MarkerDir) -> None:
        try:
            deleted = await self.delete_dir(marker_dir)
        except Exception as exc:  # noqa: BLE001 - logged: the directory stays, as documented
            logger.warning(
                "could not delete the sealed marker directory %s (%s): it stays until the next "
                "rollback pass of its table, as after a driver killed before W10",
                marker_dir.key,
                exc,
            )
        else:
            logger.debug(
                "deleted %s files of the sealed marker directory %s", deleted, marker_dir.key
            )

    async def delete_dir(self, marker_dir: validation.MarkerDir) -> int:
        """Delete the directory's files once running flushes end; returns how many were deleted.

        Names still queued are written afterwards (they were asked for after the delete began).
        """
        state = await self._state(marker_dir, load=False)
        state.deleting += 1
        state.users += 1
        try:
            await state.idle.wait()
            async with state.load_lock:
                direct = state.manager.kind is filemanager.Kind.DIRECT_PUT
                if direct and state.loaded and not state.unchecked:
                    count = await self._delete_known(state)
                else:
                    # The listing and the outcome read are independent: one round trip, then
                    # the delete of what the outcome lets go.
                    listed, keep = await asyncio.gather(
                        self._run(markers.list_marker_files, state.manager, state.path),
                        self._unread_files(state),
                    )
                    count = await self._run(
                        markers.delete_marker_dir, state.manager, state.path, keep, listed
                    )
                state.known.clear()
                state.files.clear()
                state.versions.clear()
                state.unchecked.clear()
                state.type_written = False
                state.loaded = True
        except OSError as exc:
            raise errors.StorageError(
                f"could not delete marker directory {marker_dir.key}: {exc}; retry"
            ) from exc
        finally:
            state.deleting -= 1
            state.users -= 1
        self._schedule(state)
        return count

    async def _delete_known(self, state: _DirState) -> int:
        """Object stores: delete the files this sidecar wrote or loaded while listing the
        directory (one round trip), then whatever else the listing found (a second one, only if
        there is any). Elsewhere a listing is no round trip worth saving, and a local listing
        racing the deletes could fail on a file deleted under it.

        Nothing needs keeping: no batch file was rewritten since the last lookup that found the
        instant undecided. A file another process put there before the delete began (a direct
        marker, a temp file of a killed predecessor) is in the listing, which starts after the
        request arrived, and goes in the second round; one put there after the listing started
        may stay, as with a listing made first. Returns how many files were deleted.
        """
        known = [paths.join(state.path, f"{markers.BATCH_PREFIX}{i}") for i in sorted(state.files)]
        if state.type_written:
            known.append(paths.join(state.path, markers.TYPE_FILE))  # last: see delete_marker_dir
        _, listed = await asyncio.gather(
            self._run(state.manager.delete_many, known),
            self._run(markers.list_marker_files, state.manager, state.path),
        )
        deleted = set(known)
        rest = [path for path in listed if path not in deleted]
        if rest:  # (object stores have no directories to remove)
            await self._run(markers.delete_marker_dir, state.manager, state.path, (), rest)
        return len(deleted | set(listed))

    async def _unread_files(self, state: _DirState) -> frozenset[str]:
        """Batch files a delete must leave: rewritten without a check since the last check that
        found the instant undecided, when the instant is now rolled back.

        A JVM abort claims the instant, reads the markers, deletes their files, then has the
        sidecar delete the directory: a marker acknowledged by a conditional rewrite after
        that read is in no record, so the file holding it stays for the next rollback pass
        (R9 reads a marker directory that outlived its instant's rollback). A committed
        instant's directory goes whole (W10), as before."""
        if not state.unchecked:
            return frozenset()
        outcome = await self._run(read_outcome, state.manager, state.outcome_path)
        if outcome is None or outcome == "committed":
            return frozenset()
        state.decided = True
        kept = frozenset(
            paths.join(state.path, f"{markers.BATCH_PREFIX}{index}")
            for index in sorted(state.unchecked)
        )
        logger.warning(
            "instant %s is %s: leaving %s (markers acknowledged since the last check) for the "
            "next rollback pass",
            state.dir.instant,
            outcome,
            ", ".join(sorted(kept)),
        )
        return kept

    # -- internals ------------------------------------------------------------------------------
    async def _run(self, func: Callable[..., _T], *args: object) -> _T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(func, *args))

    def _manager(self, marker_dir: validation.MarkerDir) -> filemanager.FileManager:
        # One filesystem per protocol, shared by every directory (and thread) of that store.
        protocol = marker_dir.protocol
        manager = self._managers.get(protocol)
        if manager is None:
            options = {} if protocol in _LOCAL_PROTOCOLS else dict(self._settings.storage_options)
            url = marker_dir.path if protocol == "file" else f"{protocol}://{marker_dir.path}"
            try:
                manager, _ = filemanager.resolve(url, storage_options=options)
            except lib_errors.SparkguardError as exc:
                raise errors.BadRequestError(f"markerdir {url!r} cannot be opened: {exc}") from None
            self._managers[protocol] = manager
        return manager

    async def _state(self, marker_dir: validation.MarkerDir, *, load: bool = True) -> _DirState:
        state = self._dirs.get(marker_dir.key)
        if state is None:
            manager = self._manager(marker_dir)
            path = marker_dir.path
            if marker_dir.protocol != "file":
                path = manager.fs._strip_protocol(f"{marker_dir.protocol}://{marker_dir.path}")
            state = _DirState(dataclasses.replace(marker_dir, path=path), manager)
            state.sealed = marker_dir.key in self._sealed
            self._dirs[marker_dir.key] = state
            self._evict()
        else:
            self._dirs.move_to_end(marker_dir.key)
        if load and not state.loaded:
            state.users += 1
            try:
                async with state.load_lock:
                    if not state.loaded:
                        loaded = await self._load(state)
                        state.known |= loaded.names
                        state.files = loaded.files
                        state.versions = loaded.versions
                        state.type_written = loaded.type_written
                        state.loaded = True
            finally:
                state.users -= 1
        return state

    async def _load(self, state: _DirState) -> LoadedDir:
        try:
            loaded = await self._run(load_marker_dir, state.manager, state.path)
            if not await self._check_decided(state) and await self._run(
                is_gone, state.manager, state.outcome_path
            ):
                # A lingering executor of a write whose rollback removed the table's location:
                # nothing of it may be written (not even MARKERS.type, which would re-create
                # the location).
                state.decided = True
                logger.warning(
                    "instant %s is gone (no .inflight: rolled back and removed): refusing its "
                    "markers",
                    state.dir.instant,
                )
        except OSError as exc:
            raise errors.StorageError(
                f"could not read marker directory {state.dir.key}: {exc}; retry"
            ) from exc
        logger.info(
            "loaded marker dir %s: %s markers in %s batch files",
            state.dir.key,
            len(loaded.names),
            len(loaded.files),
        )
        return loaded

    def _evict(self) -> None:
        excess = len(self._dirs) - self._settings.max_cached_dirs
        if excess > 0:
            for key in [key for key, state in self._dirs.items() if state.evictable()][:excess]:
                del self._dirs[key]
        self._metrics.cached_dirs.set(len(self._dirs))

    async def _tick_forever(self) -> None:
        interval = self._settings.batch_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            for state in list(self._dirs.values()):
                if state.queue:
                    self._schedule(state)

    def _consider(self, state: _DirState) -> None:
        """Adaptive mode: start a flush of ``state`` if its queue is due (``batch_size`` names,
        its oldest waited ``batch_interval_ms``, or no new name for a fifth of that while names
        come too slowly to fill a batch within the interval), else arm the timer for the moment
        it will be."""
        if not state.queue or state.starting:
            _disarm(state)
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        due = flush_due(
            queued_at=state.queued_at,
            arrived_at=state.arrived_at,
            rate=state.rate,
            interval_s=self._settings.batch_interval_ms / 1000,
            batch_size=self._settings.batch_size,
        )
        if (
            len(state.queue) >= self._settings.batch_size
            or now >= due
            or state.every_client_waits()
        ):
            _disarm(state)
            # If no file is free (or a delete runs), the end of that flush (or delete) looks again.
            self._schedule(state)
        elif state.timer is None:
            state.timer = loop.call_at(due, self._on_due, state)

    def _on_due(self, state: _DirState) -> None:
        state.timer = None
        self._consider(state)

    def _schedule(self, state: _DirState) -> None:
        """Start a flush of ``state`` if names are queued and a batch file is free."""
        if not state.queue or state.deleting or not state.loaded:
            return
        threads = self._settings.batch_threads
        limit = 1 if self._group_commit and not self._draining else threads
        if len(state.busy) >= limit:
            return
        sizes = {index: len(content) for index, content in state.files.items()}
        index = pick_batch_file(sizes, state.busy, threads)
        state.busy.add(index)
        state.idle.clear()
        state.starting = True
        task = asyncio.get_running_loop().create_task(self._flush(state, index))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush(self, state: _DirState, index: int) -> None:
        # Names are taken when the task runs, not when it was scheduled: requests that arrived
        # in between join this batch.
        batch = [(name, state.waiting[name]) for name in state.queue if name in state.waiting]
        if self._adaptive and state.queue:
            now = asyncio.get_running_loop().time()
            window = max(now - state.queued_at, 0.001)
            state.rate += _RATE_WEIGHT * (len(state.queue) / window - state.rate)
            _forget_idle_clients(
                state, now - _CLIENT_MEMORY_INTERVALS * self._settings.batch_interval_ms / 1000
            )
        state.queue = []
        state.starting = False
        _disarm(state)
        started = time.monotonic()
        wrote = False
        try:
            if batch:
                wrote = await self._write(state, index, batch)
        except asyncio.CancelledError:
            self._settle(state, batch, errors.ShuttingDownError("the sidecar is stopping; retry"))
            raise
        except Exception:
            logger.exception("flush of %s markers to %s failed", len(batch), state.dir.key)
            self._metrics.flush_failures.inc()
            self._settle(
                state,
                batch,
                errors.StorageError(
                    f"internal error while writing markers to {state.dir.key}; nothing was "
                    "acknowledged, retry"
                ),
            )
        finally:
            # Whatever happened above, every request of this batch has its answer by now and
            # its place in the queue is released (settling twice is a no-op).
            self._settle(state, batch, errors.StorageError("the flush ended unexpectedly; retry"))
            state.busy.discard(index)
            if not state.busy:
                state.idle.set()
            if wrote:
                self._metrics.flush_duration.observe(time.monotonic() - started)
            if self._group_commit or self._draining:
                self._schedule(state)
            elif self._adaptive:
                self._consider(state)

    async def _write(
        self, state: _DirState, index: int, batch: list[tuple[str, asyncio.Future[bool]]]
    ) -> bool:
        """Write the batch's new names to ``MARKERS<index>`` behind the fence, answer the batch.

        Where the store has versioned writes, a rewrite of a file this sidecar already wrote
        (or read) is conditional on that version and needs no outcome read: a rollback that
        claimed the instant since either reads this version before deleting the file (R7), or
        has deleted it, and then the write fails, the outcome is read and the batch refused.
        The outcome is read before and after creating a new file, after a failed conditional
        write, and around every write on stores without versioned writes.

        Returns whether a batch file was written.
        """
        new = [name for name, _ in batch if name not in state.known]
        progress = _Progress()
        try:
            if state.sealed:  # sealed while queued: nothing to write
                raise self._sealed_error(state.dir)
            if new:
                await self._publish(state, index, new, progress)
            else:
                # Re-sent names only, already durable: nothing to write, one check before 200.
                await self._fence(state)
            if state.sealed:  # sealed while the write ran: the commit's read may not list them
                raise self._sealed_error(state.dir)
        except errors.InstantDecidedError as refusal:
            self._settle(state, batch, refusal)
        except Exception as exc:  # noqa: BLE001 - any storage failure fails the batch, not the app
            self._fail_flush(state, index, batch, exc)
        else:
            self._settle(state, batch, None, written=set(new))
        return progress.wrote

    async def _publish(
        self, state: _DirState, index: int, new: list[str], progress: _Progress
    ) -> None:
        """Append ``new`` to ``MARKERS<index>``; raises the refusal when the instant is decided."""
        for _ in range(_WRITE_ATTEMPTS):
            versioned = state.manager.versioned_writes
            expected = state.versions.get(index)
            fresh = not versioned or expected is None  # a new file, or no versions: checked
            if fresh:
                await self._fence(state)  # before: never create a decided one's files
            content = state.files.get(index, b"") + markers.render_batch_file(new)
            try:
                version = await self._put(state, index, content, versioned, expected)
            except (lib_errors.VersionConflictError, lib_errors.AlreadyExistsError) as exc:
                logger.info("conditional write to %s/MARKERS%s lost: %s", state.dir.key, index, exc)
                await self._reread(state, index)
                continue
            except lib_errors.UnsupportedStoreError as exc:
                # The store showed it has no conditional rewrite (versioned_writes is off now):
                # the next attempt takes the checked path.
                logger.warning("%s: reading the outcome around every flush instead", exc)
                continue
            progress.wrote = True
            state.files[index] = content
            if version is None:
                state.versions.pop(index, None)
            else:
                state.versions[index] = version
            state.known.update(new)
            self._metrics.batch_size.observe(len(new))
            if not fresh and state.manager.versioned_writes:
                state.unchecked.add(index)
            if fresh or not state.manager.versioned_writes:
                # After: a rollback that claimed the instant during the write may have listed
                # the directory before this version existed; its task must not go on.
                await self._fence(state)
            return
        raise lib_errors.VersionConflictError(
            f"{_WRITE_ATTEMPTS} conditional writes in a row lost to another writer"
        )

    async def _put(
        self, state: _DirState, index: int, content: bytes, versioned: bool, expected: str | None
    ) -> str | None:
        """Write ``MARKERS.type`` once, then the batch file; its new version (or ``None``)."""
        async with state.type_lock:
            if not state.type_written:
                await self._run(write_type_file, state.manager, state.path)
                state.type_written = True
        return await self._run(
            write_batch_file, state.manager, state.path, index, content, versioned, expected
        )

    async def _reread(self, state: _DirState, index: int) -> None:
        """After a lost conditional write: read the file, *then* the outcome (a version read
        before a check that found the instant undecided is one that a later claim's R4 lists,
        so rewriting it unchecked stays safe), and start again from what is there, keeping
        every name this sidecar had acknowledged in it."""
        current = await self._run(read_batch_file, state.manager, state.path, index)
        await self._fence(state)
        previous = state.files.get(index, b"")
        if current is None:
            state.versions.pop(index, None)
            state.files[index] = merge_batch(b"", previous)
        else:
            state.files[index] = merge_batch(current[0], previous)
            state.versions[index] = current[1]

    async def _fence(self, state: _DirState) -> None:
        """Raise the refusal if the instant is decided (asks storage unless known)."""
        if await self._check_decided(state):
            raise self._decided_error(state)

    def _fail_flush(
        self,
        state: _DirState,
        index: int,
        batch: list[tuple[str, asyncio.Future[bool]]],
        exc: Exception,
    ) -> None:
        logger.warning(
            "flush of %s markers to %s/MARKERS%s failed: %s", len(batch), state.dir.key, index, exc
        )
        self._metrics.flush_failures.inc()
        failure = errors.StorageError(
            f"could not write markers to {state.dir.key}/MARKERS{index}: {exc}; "
            "nothing was acknowledged, retry"
        )
        self._settle(state, batch, failure)

    async def _check_decided(self, state: _DirState) -> bool:
        """Ask storage whether the instant is decided (once decided, never again)."""
        if state.decided:
            return True
        before = set(state.unchecked)
        if await self._run(is_decided, state.manager, state.outcome_path):
            state.decided = True
            logger.warning(
                "instant %s is decided (%s exists): refusing its markers from now on",
                state.dir.instant,
                state.outcome_path,
            )
        else:
            # Versions published before this check are ones a later claim's rollback reads.
            state.unchecked -= before
        return state.decided

    def _refuse_if_decided(self, state: _DirState) -> None:
        if state.decided:
            raise self._decided_error(state)
        if state.sealed:
            raise self._sealed_error(state.dir)

    def _sealed_error(self, marker_dir: validation.MarkerDir) -> errors.InstantDecidedError:
        return errors.InstantDecidedError(
            f"instant {marker_dir.instant} is being committed: its commit read the markers of "
            f"{marker_dir.key} (W8) and the sidecar takes no new marker for it. This task "
            "belongs to a finished write and must not write its data file",
            instant=marker_dir.instant,
        )

    def _decided_error(self, state: _DirState) -> errors.InstantDecidedError:
        return errors.InstantDecidedError(
            f"instant {state.dir.instant} is already decided ({state.outcome_path} exists, or "
            "the instant is gone with the location its rolled-back write created: it was "
            "committed or rolled back); the sidecar refuses new markers for it. This task "
            "belongs to a finished write and must not write its data file",
            instant=state.dir.instant,
        )

    def _settle(
        self,
        state: _DirState,
        batch: list[tuple[str, asyncio.Future[bool]]],
        failure: Exception | None,
        *,
        written: set[str] | frozenset[str] = frozenset(),
    ) -> None:
        """Answer the requests of ``batch`` not answered yet and release their places."""
        for name, future in batch:
            if state.waiting.get(name) is not future:
                continue  # answered already (a later request for the name has its own future)
            del state.waiting[name]
            self._pending -= 1
            if future.done():
                continue  # failed by drain() while the write ran
            if failure is None:
                future.set_result(name in written)
            else:
                future.set_exception(failure)


def _forget_idle_clients(state: _DirState, since: float) -> None:
    """Adaptive mode: forget the clients that sent nothing since ``since`` and wait for
    nothing (a task that ended, or one writing a long file: it is not about to send)."""
    for client in [c for c, seen in state.clients.items() if seen < since]:
        if client not in state.blocked:
            del state.clients[client]


def _disarm(state: _DirState) -> None:
    if state.timer is not None:
        state.timer.cancel()
        state.timer = None
