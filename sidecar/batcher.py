"""The marker batcher: queues marker requests and writes them durably in batches.

Per marker directory it keeps the acknowledged names and the content of each ``MARKERS<i>``
file (:mod:`~sparkguard.sidecar.dirstate`). A flush takes every queued name of a directory,
appends them to a free ``MARKERS<i>`` (one of ``batch_threads`` files, see
:func:`~sparkguard.sidecar.flushpolicy.pick_batch_file`) and rewrites that file atomically
through the file manager; ``MARKERS.type`` is written before the first batch file
(:mod:`~sparkguard.sidecar.batchfiles`). Only once the write has returned are the requests
answered, so an acknowledged marker is on storage.

The state of a directory loads lazily from its files on first use: a restarted sidecar appends
to what its predecessor wrote and acknowledges a re-created marker without writing it again.

**Decided instants are fenced.** Markers of an instant whose ``<instant>.outcome`` exists
(committed, or claimed by a rollback) are refused with :class:`~sparkguard.sidecar.errors.
InstantDecidedError` (409). The sidecar reads the outcome (:mod:`~sparkguard.sidecar.outcomes`)
when it loads a directory, before and after it creates a batch file, and after a conditional
rewrite lost. Rewriting a batch file it created or read is conditional on that version (S3
``If-Match``; local disk an atomic exchange, see :meth:`~sparkguard.spark_lib.filemanager.
FileManager.write_versioned`) and needs no read: a rollback that claimed the instant since
lists that file (R4) and deletes it only conditionally on a version it read (R7), so either it
reads the new version or the rewrite fails and the outcome is read. On stores without
versioned writes the outcome is read before and after every flush, as before. A re-sent,
already durable marker is checked once before its 200.

**The commit seals its directory.** The commit's read of its markers (W8, :meth:`MarkerBatcher.
seal`) is the last moment a marker can count: from then on the sidecar acknowledges none for
that directory (409 at once, no storage read; queued names and flushes still running are
refused too), so a straggler of a committed write fails before it writes its data file, with
no lookup per flush.

When a directory's flush starts (three flush policies) and which batch file it appends to:
:mod:`~sparkguard.sidecar.flushpolicy`.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Final, TypeVar

from sparkguard.sidecar import (
    batchfiles,
    config,
    dirstate,
    errors,
    flushpolicy,
    metrics,
    outcomes,
    validation,
)
from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors as lib_errors
from sparkguard.spark_lib.base import paths
from sparkguard.spark_lib.storage import markers

logger = logging.getLogger(__name__)

_LOCAL_PROTOCOLS: Final = frozenset({"file", "local", "memory"})
_T = TypeVar("_T")
#: conditional writes of one flush before it gives up (each loss re-reads the file)
_WRITE_ATTEMPTS: Final = 3


@dataclasses.dataclass
class _Progress:
    """What a flush got done before it ended (answered or failed)."""

    wrote: bool = False


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
        self._dirs: collections.OrderedDict[str, dirstate.DirState] = collections.OrderedDict()
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
            dirstate.disarm(state)
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
            dirstate.disarm(state)
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

    async def _delete_known(self, state: dirstate.DirState) -> int:
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

    async def _unread_files(self, state: dirstate.DirState) -> frozenset[str]:
        """Batch files a delete must leave: rewritten without a check since the last check that
        found the instant undecided, when the instant is now rolled back.

        A JVM abort claims the instant, reads the markers, deletes their files, then has the
        sidecar delete the directory: a marker acknowledged by a conditional rewrite after
        that read is in no record, so the file holding it stays for the next rollback pass
        (R9 reads a marker directory that outlived its instant's rollback). A committed
        instant's directory goes whole (W10), as before."""
        if not state.unchecked:
            return frozenset()
        outcome = await self._run(outcomes.read_outcome, state.manager, state.outcome_path)
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

    async def _state(
        self, marker_dir: validation.MarkerDir, *, load: bool = True
    ) -> dirstate.DirState:
        state = self._dirs.get(marker_dir.key)
        if state is None:
            manager = self._manager(marker_dir)
            path = marker_dir.path
            if marker_dir.protocol != "file":
                path = manager.fs._strip_protocol(f"{marker_dir.protocol}://{marker_dir.path}")
            state = dirstate.DirState(dataclasses.replace(marker_dir, path=path), manager)
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

    async def _load(self, state: dirstate.DirState) -> batchfiles.LoadedDir:
        try:
            loaded = await self._run(batchfiles.load_marker_dir, state.manager, state.path)
            if not await self._check_decided(state) and await self._run(
                outcomes.is_gone, state.manager, state.outcome_path
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

    def _consider(self, state: dirstate.DirState) -> None:
        """Adaptive mode: start a flush of ``state`` if its queue is due (``batch_size`` names,
        its oldest waited ``batch_interval_ms``, or no new name for a fifth of that while names
        come too slowly to fill a batch within the interval), else arm the timer for the moment
        it will be."""
        if not state.queue or state.starting:
            dirstate.disarm(state)
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        due = flushpolicy.flush_due(
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
            dirstate.disarm(state)
            # If no file is free (or a delete runs), the end of that flush (or delete) looks again.
            self._schedule(state)
        elif state.timer is None:
            state.timer = loop.call_at(due, self._on_due, state)

    def _on_due(self, state: dirstate.DirState) -> None:
        state.timer = None
        self._consider(state)

    def _schedule(self, state: dirstate.DirState) -> None:
        """Start a flush of ``state`` if names are queued and a batch file is free."""
        if not state.queue or state.deleting or not state.loaded:
            return
        threads = self._settings.batch_threads
        limit = 1 if self._group_commit and not self._draining else threads
        if len(state.busy) >= limit:
            return
        sizes = {index: len(content) for index, content in state.files.items()}
        index = flushpolicy.pick_batch_file(sizes, state.busy, threads)
        state.busy.add(index)
        state.idle.clear()
        state.starting = True
        task = asyncio.get_running_loop().create_task(self._flush(state, index))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush(self, state: dirstate.DirState, index: int) -> None:
        # Names are taken when the task runs, not when it was scheduled: requests that arrived
        # in between join this batch.
        batch = [(name, state.waiting[name]) for name in state.queue if name in state.waiting]
        if self._adaptive and state.queue:
            now = asyncio.get_running_loop().time()
            window = max(now - state.queued_at, 0.001)
            state.rate += flushpolicy.RATE_WEIGHT * (len(state.queue) / window - state.rate)
            dirstate.forget_idle_clients(
                state,
                now - flushpolicy.CLIENT_MEMORY_INTERVALS * self._settings.batch_interval_ms / 1000,
            )
        state.queue = []
        state.starting = False
        dirstate.disarm(state)
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
        self, state: dirstate.DirState, index: int, batch: list[tuple[str, asyncio.Future[bool]]]
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
        self, state: dirstate.DirState, index: int, new: list[str], progress: _Progress
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
        self,
        state: dirstate.DirState,
        index: int,
        content: bytes,
        versioned: bool,
        expected: str | None,
    ) -> str | None:
        """Write ``MARKERS.type`` once, then the batch file; its new version (or ``None``)."""
        async with state.type_lock:
            if not state.type_written:
                await self._run(batchfiles.write_type_file, state.manager, state.path)
                state.type_written = True
        return await self._run(
            batchfiles.write_batch_file,
            state.manager,
            state.path,
            index,
            content,
            versioned,
            expected,
        )

    async def _reread(self, state: dirstate.DirState, index: int) -> None:
        """After a lost conditional write: read the file, *then* the outcome (a version read
        before a check that found the instant undecided is one that a later claim's R4 lists,
        so rewriting it unchecked stays safe), and start again from what is there, keeping
        every name this sidecar had acknowledged in it."""
        current = await self._run(batchfiles.read_batch_file, state.manager, state.path, index)
        await self._fence(state)
        previous = state.files.get(index, b"")
        if current is None:
            state.versions.pop(index, None)
            state.files[index] = batchfiles.merge_batch(b"", previous)
        else:
            state.files[index] = batchfiles.merge_batch(current[0], previous)
            state.versions[index] = current[1]

    async def _fence(self, state: dirstate.DirState) -> None:
        """Raise the refusal if the instant is decided (asks storage unless known)."""
        if await self._check_decided(state):
            raise self._decided_error(state)

    def _fail_flush(
        self,
        state: dirstate.DirState,
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

    async def _check_decided(self, state: dirstate.DirState) -> bool:
        """Ask storage whether the instant is decided (once decided, never again)."""
        if state.decided:
            return True
        before = set(state.unchecked)
        if await self._run(outcomes.is_decided, state.manager, state.outcome_path):
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

    def _refuse_if_decided(self, state: dirstate.DirState) -> None:
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

    def _decided_error(self, state: dirstate.DirState) -> errors.InstantDecidedError:
        return errors.InstantDecidedError(
            f"instant {state.dir.instant} is already decided ({state.outcome_path} exists, or "
            "the instant is gone with the location its rolled-back write created: it was "
            "committed or rolled back); the sidecar refuses new markers for it. This task "
            "belongs to a finished write and must not write its data file",
            instant=state.dir.instant,
        )

    def _settle(
        self,
        state: dirstate.DirState,
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
