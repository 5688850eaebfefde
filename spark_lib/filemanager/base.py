"""The atomic file manager's contract and the behaviour every backend shares.

SPARK-23966's CheckpointFileManager, in Python, over fsspec. One interface,
:meth:`FileManager.create_atomic`, returns a stream that publishes the whole file on ``close()``
(or a clean ``with`` exit) and leaves nothing visible on ``cancel()`` (or an exception). The rest
(open, list, exists, delete, mkdirs, leftovers) is shared here. A backend implements only the
primitives of publication: :meth:`FileManager._open_atomic` and its :class:`AtomicStream`'s
``_write``, ``_publish`` and ``_discard``; it overrides a shared operation only where its store
does it better or exactly (versioned writes, compare-and-delete, listings).

A killed writer leaves a temp file ``.<name>.sg-tmp-<12 hex>`` next to its target (rename
backends) or an incomplete multipart upload of the target's key (direct put). Nothing removes
them on its own: a rollback of the instant that marked ``<name>`` does
(:meth:`FileManager.find_leftovers` / :meth:`FileManager.remove_leftovers`, only for names that
instant marked, so a live writer of another name is never touched). Temp names start with
``.``, which Spark's file listing skips anyway.
"""

from __future__ import annotations

import abc
import builtins
import contextlib
import dataclasses
import datetime
import enum
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import IO, Any, Final, Self, TypeVar

from fsspec.spec import AbstractFileSystem

from sparkguard.spark_lib.base import errors, paths

_T = TypeVar("_T")

TEMP_MARKER: Final = ".sg-tmp-"
_TEMP_NAME = re.compile(r"^\..+\.sg-tmp-[0-9a-f]{12}$")
_TEMP_PARTS = re.compile(r"^\.(?P<target>.+)\.sg-tmp-[0-9a-f]{12}$")
#: at or above this many names in one directory, one listing is cheaper than a HEAD per name
LIST_THRESHOLD: Final = 100


class Kind(enum.StrEnum):
    """How a backend publishes a file atomically."""

    RENAME = "rename"
    DIRECT_PUT = "direct-put"
    MEMORY = "memory"


class CreateMode(enum.StrEnum):
    """How ``overwrite=False`` is enforced on an object store."""

    #: A conditional put (``If-None-Match: *``); a store that lacks it is refused.
    CONDITIONAL = "conditional"
    #: Check then put: racy (two writers can both win). Only when the user opts in.
    CHECK_THEN_PUT = "check-then-put"


def make_temp_name(name: str) -> str:
    """A recognisable, unique, hidden temp name for ``name`` in the same directory."""
    return f".{name}{TEMP_MARKER}{uuid.uuid4().hex[:12]}"


#: the name prefix of the key a conditional-create probe puts twice beside the first
#: create-if-absent of a process in a bucket, then deletes (``require_conditional_create``;
#: the JVM's ``ConditionalCreateProbe`` names it the same)
CREATE_PROBE_PREFIX: Final = ".sg-create-probe-"


def is_create_probe(name: str) -> bool:
    """Whether a file name is a conditional-create probe (:data:`CREATE_PROBE_PREFIX`)."""
    return paths.basename(name).startswith(CREATE_PROBE_PREFIX)


def is_temp_name(name: str) -> bool:
    """Whether a file name is a transient file of a writer: a temp file of a put in progress
    (:func:`make_temp_name`), or a conditional-create probe (:data:`CREATE_PROBE_PREFIX`: a
    concurrent listing sees it for a moment, and a process killed between its puts and its
    delete leaves it). Readers of a directory of the contract skip such names; neither has a
    target (:func:`temp_target`)."""
    return bool(_TEMP_NAME.match(paths.basename(name))) or is_create_probe(name)


def temp_target(name: str) -> str | None:
    """The file name a temp file was going to publish (``None`` if not a temp name)."""
    match = _TEMP_PARTS.match(paths.basename(name))
    return match.group("target") if match else None


def checksum_of(path: str) -> str:
    """Hadoop's checksum of the file ``path``: ``.<name>.crc`` beside it (pure)."""
    return paths.join(paths.parent(path), f".{paths.basename(path)}.crc")


def checksum_owner(name: str) -> str | None:
    """The file whose Hadoop checksum ``name`` is (``.<file>.crc`` beside it: Hadoop's local
    filesystem writes one for each file, temp files included), or ``None`` (pure)."""
    base = paths.basename(name)
    if base.startswith(".") and base.endswith(".crc") and len(base) > len("..crc"):
        return base[1 : -len(".crc")]
    return None


@dataclasses.dataclass(frozen=True)
class Leftover:
    """What a killed writer of :attr:`target` left: a temp file, or an incomplete upload; or
    (``checksum``) Hadoop's ``.crc`` of such a temp file or of :attr:`target` itself, which
    goes with the file (docs/storage-contract.md) and is not counted as a leftover."""

    target: str
    path: str  # the temp file; for an upload, the key's path
    upload_id: str | None = None
    checksum: bool = False


def _by_directory(file_paths: Iterable[str]) -> dict[str, set[str]]:
    grouped: dict[str, set[str]] = {}
    for path in file_paths:
        grouped.setdefault(paths.parent(path), set()).add(path)
    return grouped


@dataclasses.dataclass(frozen=True)
class FileInfo:
    """One entry of a directory listing."""

    path: str
    size: int
    is_dir: bool
    #: seconds since the epoch of the last change, where the listing tells (else None)
    modified: float | None = None

    @property
    def name(self) -> str:
        """The last segment of :attr:`path`."""
        return paths.basename(self.path)


def _modified_of(entry: Mapping[str, Any]) -> float | None:
    """The modification time an fsspec listing entry carries (local ``mtime``, S3
    ``LastModified``), in seconds since the epoch; None when it has none."""
    for key in ("mtime", "LastModified", "last_modified", "created"):
        value = entry.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, datetime.datetime):
            return value.timestamp()
    return None


@dataclasses.dataclass(frozen=True)
class Held:
    """A file :meth:`AtomicStream.hold` closed without publishing it: whole (and durable where
    the store publishes durably) under ``temp`` (rename stores: a temp name in its directory), or
    as the open multipart upload ``upload`` at ``path`` (object stores). Both None: the store
    cannot hold a file, and ``hold`` published it at ``path``. :meth:`FileManager.publish_temp`
    or :meth:`FileManager.complete_uploads` publishes it (the writer, after the outcome:
    ``rollback.publish_files``)."""

    path: str
    temp: str | None = None
    upload: str | None = None


class AtomicStream(abc.ABC):
    """A writable stream whose content becomes visible at its path only on :meth:`close`.

    ``close()`` publishes (and raises :class:`~sparkguard.spark_lib.base.errors.AlreadyExistsError`
    when ``overwrite=False`` lost a race: nothing is then visible from this writer).
    ``hold()`` closes without publishing (see :class:`Held`): publication after an outcome.
    ``cancel()`` discards everything, also what ``hold()`` left. Used as a context manager it
    publishes on a clean exit and cancels on an exception. After either, the stream is closed;
    closing twice is a no-op.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._position = 0
        self._state = "open"
        self._held: Held | None = None

    # -- primitives implemented by backends --------------------------------------------------
    @abc.abstractmethod
    def _write(self, data: bytes | memoryview) -> None: ...

    @abc.abstractmethod
    def _publish(self) -> None: ...

    @abc.abstractmethod
    def _discard(self) -> None: ...

    def _hold(self) -> Held:
        """Close without publishing; backends that cannot hold a file publish it instead."""
        self._publish()
        return Held(self.path)

    def _discard_held(self, held: Held) -> None:  # noqa: B027 - nothing held by default
        """Remove what :meth:`_hold` left (a temp file, an open upload)."""

    # -- shared behaviour ----------------------------------------------------------------------
    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Append ``data``; returns the number of bytes written."""
        if self._state != "open":
            raise ValueError(f"write to a {self._state} atomic stream for {self.path}")
        # No copy: pyarrow hands over large buffers; every backend consumes them before
        # returning (file write, bytearray append, or bytes() where it keeps them).
        view = memoryview(data).cast("B")
        try:
            self._write(view)
        except OSError as exc:
            self._name(exc)
            raise
        self._position += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        """Bytes written so far."""
        return self._position

    def flush(self) -> None:  # noqa: B027 - deliberately a no-op for every backend
        """Nothing becomes visible before :meth:`close`; flushing is a no-op."""

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    @property
    def closed(self) -> bool:
        return self._state != "open"

    def close(self) -> None:
        """Publish the file atomically. Nothing is visible at the path until this returns."""
        if self._state != "open":
            return
        self._end(self._publish)
        self._state = "published"

    def hold(self) -> Held:
        """Close the stream **without** publishing it: the file stays whole where no directory
        reader lists it, for the caller to publish later (see :class:`Held`) or
        discard (:meth:`cancel`). A store that cannot hold a file publishes it here (the
        returned :class:`Held` names neither a temp file nor an upload)."""
        if self._state != "open":
            raise ValueError(f"hold of a {self._state} atomic stream for {self.path}")
        held = self._end(self._hold)
        self._state = "held"
        self._held = held
        return held

    def _end(self, step: Callable[[], _T]) -> _T:
        """Run the closing ``step``; if it fails, discard everything and re-raise (an
        ``OSError`` naming this stream's path)."""
        try:
            return step()
        except BaseException as exc:
            self._state = "cancelled"
            with contextlib.suppress(Exception):
                self._discard()
            if isinstance(exc, OSError) and not isinstance(exc, errors.SparkguardError):
                self._name(exc)
            raise

    def _name(self, exc: OSError) -> None:
        """Make ``exc`` name this stream's path when it names no file (``os.write``'s errors,
        ENOSPC among them, name none): an error message can then say where it happened."""
        if exc.filename is None:
            exc.filename = self.path

    def cancel(self) -> None:
        """Discard everything written, also what :meth:`hold` left; nothing becomes visible.
        Safe to call more than once."""
        if self._held is not None and self._state == "held":
            self._state = "cancelled"
            self._discard_held(self._held)
            return
        if self._state != "open":
            return
        self._state = "cancelled"
        self._discard()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.cancel()


class FileManager(abc.ABC):
    """Atomic publication plus the ordinary file operations, over one fsspec filesystem.

    Paths are the filesystem's own (no protocol); :func:`resolve` turns a URL into a manager and
    a path. Backends implement :meth:`_open_atomic`; everything else is shared.
    """

    kind: Kind

    def __init__(self, fs: AbstractFileSystem, *, protocol: str) -> None:
        self.fs = fs
        self.protocol = protocol

    @abc.abstractmethod
    def _open_atomic(self, path: str, *, overwrite: bool) -> AtomicStream: ...

    def create_atomic(self, path: str, *, overwrite: bool = False) -> AtomicStream:
        """Open a stream that publishes ``path`` atomically on close.

        With ``overwrite=False`` publication is create-if-absent: of several racing writers
        exactly one wins; the others get :class:`AlreadyExistsError` and leave nothing behind.
        """
        if isinstance(path, str) and path.endswith("/"):
            raise errors.InvalidPathError(f"{path!r} names a directory; give a file path")
        path = paths.validate_base(path)
        paths.validate_segment(paths.basename(path), what="file name")
        return self._open_atomic(path, overwrite=overwrite)

    def write_bytes(self, path: str, data: bytes, *, overwrite: bool = False) -> None:
        """Write ``data`` to ``path`` atomically (see :meth:`create_atomic`)."""
        with self.create_atomic(path, overwrite=overwrite) as stream:
            stream.write(data)

    def put_if_absent(self, path: str, data: bytes) -> bool:
        """Write ``data`` unless ``path`` exists; returns whether this call created it."""
        try:
            self.write_bytes(path, data, overwrite=False)
        except errors.AlreadyExistsError:
            return False
        return True

    def read_bytes(self, path: str) -> bytes:
        """The whole content of ``path``; :class:`FileNotFoundError` when it is missing."""
        data = self.fs.cat_file(path)
        return bytes(data)

    @property
    def versioned_writes(self) -> bool:
        """Whether :meth:`write_versioned` is exact here: a rewrite conditional on the version
        the writer last saw (S3: ``If-Match: <ETag>``; local disk: an atomic exchange whose
        taken-out file must be that version). ``False`` elsewhere, and for good once a store
        showed it ignores or lacks the condition."""
        return False

    def read_versioned(self, path: str) -> tuple[bytes, str | None]:
        """The content of ``path`` and its version (``None`` where :attr:`versioned_writes` is
        off); :class:`FileNotFoundError` when it is missing."""
        return self.read_bytes(path), None

    def write_versioned(self, path: str, data: bytes, expected: str | None) -> str:
        """Publish ``data`` at ``path`` only if ``path`` still is version ``expected`` (with
        ``None``: only if it does not exist); return the new version.

        Raises :class:`~sparkguard.spark_lib.base.errors.VersionConflictError` when ``path`` is gone
        or is another version, :class:`~sparkguard.spark_lib.base.errors.AlreadyExistsError` when a
        create finds it, and :class:`~sparkguard.spark_lib.base.errors.UnsupportedStoreError` where
        the store has no such write (then :attr:`versioned_writes` is ``False``); in each case
        nothing was published.
        """
        raise errors.UnsupportedStoreError(
            f"{self.protocol!r} storage has no conditional rewrite; write {path} unconditionally"
        )

    def open(self, path: str, mode: str = "rb") -> IO[bytes]:
        """Open ``path`` for reading. Writing goes through :meth:`create_atomic` only."""
        if "r" not in mode or "+" in mode:
            raise errors.ConfigError(
                f"open({path!r}, {mode!r}): only read modes are allowed; write with create_atomic"
            )
        return self.fs.open(path, mode)  # type: ignore[no-any-return]

    def exists(self, path: str) -> bool:
        """Whether a file or directory exists at ``path``."""
        return bool(self.fs.exists(path))

    def list(self, path: str) -> list[FileInfo]:
        """The entries directly under ``path`` (empty when the directory does not exist)."""
        try:
            entries = self.fs.ls(path, detail=True, refresh=True)
        except FileNotFoundError:
            return []
        result = []
        for entry in entries:
            name = str(entry["name"]).rstrip("/")
            if name == path.rstrip("/"):
                continue  # some stores list a file as itself
            result.append(
                FileInfo(
                    path=name,
                    size=int(entry.get("size") or 0),
                    is_dir=entry.get("type") == "directory",
                    modified=_modified_of(entry),
                )
            )
        return sorted(result, key=lambda info: info.path)

    def list_files(self, path: str) -> builtins.list[FileInfo]:
        """Every file below ``path``, at any depth (empty when there is none).

        One flat listing on object stores (a request per 1,000 keys, however deep the tree),
        where walking directory by directory would cost a request per directory.
        """
        root = path.rstrip("/")
        try:
            entries = self.fs.find(root, withdirs=False, detail=True)
        except FileNotFoundError:
            return []
        result = [
            FileInfo(path=str(name).rstrip("/"), size=int(entry.get("size") or 0), is_dir=False)
            for name, entry in entries.items()
            if entry.get("type") != "directory" and str(name).rstrip("/") != root
        ]
        return sorted(result, key=lambda info: info.path)

    def list_tree(self, path: str) -> builtins.list[FileInfo]:
        """Every file and directory below ``path``, at any depth (empty when there is none).

        Directories are listed where the store has them; on object stores, where a directory is
        only a prefix, a zero-byte key ending in ``/`` (a directory marker some clients write)
        is listed as a file.
        """
        root = path.rstrip("/")
        try:
            entries = self.fs.find(root, withdirs=True, detail=True)
        except FileNotFoundError:
            return []
        result = [
            FileInfo(
                path=str(name).rstrip("/"),
                size=int(entry.get("size") or 0),
                is_dir=entry.get("type") == "directory",
            )
            for name, entry in entries.items()
            if str(name).rstrip("/") != root
        ]
        return sorted(result, key=lambda info: info.path)

    def remove_empty_directory(self, path: str) -> bool:
        """Remove the directory ``path`` if it is empty (never recursively).

        Returns ``True`` when it is gone (removed now, or missing), ``False`` when something is
        in it: a writer that created a file there meanwhile keeps its directory. The answer is
        checked (one more request): an fsspec filesystem without an ``rmdir`` of its own
        inherits one that does nothing.
        """
        try:
            self.fs.rmdir(path)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return not self.fs.exists(path)

    def delete(self, path: str) -> None:
        """Delete a file; a missing file is not an error (deletes are idempotent)."""
        self.delete_many([path])

    def delete_many(self, file_paths: Iterable[str]) -> int:
        """Delete files in as few requests as the store allows; returns how many were asked.

        Missing files are not an error, so an interrupted delete can simply be repeated.
        """
        batch = [paths.validate_base(p) for p in file_paths]
        if batch:
            self._delete_files(batch)
        return len(batch)

    def _delete_files(self, file_paths: builtins.list[str]) -> None:
        for path in file_paths:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(path)

    def mkdirs(self, path: str) -> None:
        """Create ``path`` and its parents (a no-op on stores without directories)."""
        self.fs.makedirs(path, exist_ok=True)

    def find_temp_files(self, path: str) -> builtins.list[str]:
        """Temp files a killed writer left in directory ``path`` (see :func:`is_temp_name`)."""
        return [info.path for info in self.list(path) if is_temp_name(info.name)]

    def existing_files(self, file_paths: Iterable[str]) -> set[str]:
        """Which of ``file_paths`` exist now: one listing per directory, or one ``exists`` per
        name where a directory holds fewer than :data:`LIST_THRESHOLD` of them."""
        found: set[str] = set()
        for directory, wanted in _by_directory(file_paths).items():
            if len(wanted) >= LIST_THRESHOLD:
                listed = {info.path for info in self.list(directory) if not info.is_dir}
                found |= wanted & listed
            else:
                found.update(p for p in wanted if self.fs.isfile(p))
        return found

    def publish_temp(self, temp: str, path: str) -> bool:
        """Rename the temp file ``temp`` a writer left (whole and durable) onto ``path``,
        replacing an older file of the name; False when ``temp`` does not exist (published
        already, or never written). A rollback's roll forward of a committed instant
        (docs/storage-contract.md, R8a). Rename stores only: an object store has no temp file.
        """
        raise errors.UnsupportedStoreError(
            f"{type(self).__name__} cannot publish the temp file {temp}: only rename stores "
            "leave a committed file under a temp name"
        )

    def complete_uploads(self, uploads: Mapping[str, str]) -> set[str]:
        """Complete each multipart upload a writer left open (path -> upload id) with every
        part it holds, so the object appears; returns the paths completed now (the others: the
        store no longer knows the upload, completed already or aborted). A rollback's roll
        forward of a committed instant (docs/storage-contract.md, R8a). Object stores only."""
        raise errors.UnsupportedStoreError(
            f"{type(self).__name__} cannot complete the uploads of {sorted(uploads)}: only "
            "object stores leave a committed file as a pending upload"
        )

    def delete_existing(self, file_paths: Iterable[str]) -> set[str]:
        """Delete those of ``file_paths`` that exist; returns the ones actually removed.

        A missing file is not an error (deletes are idempotent) and is not counted.
        """
        removed: set[str] = set()
        for path in file_paths:
            try:
                self.fs.rm_file(paths.validate_base(path))
            except FileNotFoundError:
                continue
            removed.add(path)
        return removed

    def find_leftovers(self, file_paths: Iterable[str]) -> builtins.list[Leftover]:
        """Temp files a killed writer of one of ``file_paths`` left (one listing per directory).

        Only temp files *of these names* are returned, never another file's; with them the
        Hadoop checksums of those temp files and of the names themselves (``checksum``): the
        caller deletes the names, and a checksum must not outlive its file.
        """
        result = []
        for directory, wanted in _by_directory(file_paths).items():
            names = {paths.basename(p) for p in wanted}
            for info in self.list(directory):
                if info.is_dir:
                    continue
                owner = checksum_owner(info.name)
                # A temp file; or the checksum of a temp file, or of the data file itself.
                target = temp_target(info.name) if owner is None else temp_target(owner) or owner
                if target is not None and target in names:
                    result.append(
                        Leftover(
                            paths.join(directory, target), info.path, checksum=owner is not None
                        )
                    )
        return sorted(result, key=lambda leftover: leftover.path)

    def remove_leftovers(self, leftovers: Iterable[Leftover]) -> int:
        """Remove what :meth:`find_leftovers` found; returns how many temp files (checksums
        not counted) were removed."""
        leftovers = list(leftovers)
        removed = self.delete_existing(leftover.path for leftover in leftovers)
        return sum(1 for left in leftovers if left.path in removed and not left.checksum)

    def delete_if_unchanged(
        self,
        path: str,
        expected: bytes,
        *,
        on_changed: Callable[[bytes], None] | None = None,
    ) -> bytes | None:
        """Delete ``path`` only if it still holds ``expected``.

        Returns ``None`` when it was deleted (or is gone), else its current content (left in
        place): a writer rewrote it since ``expected`` was read, so the caller must look at
        the new content before deleting it. With ``on_changed``, that content is handed to it
        instead (the caller deals with what is new) and the delete is tried again on it, until
        it succeeds (``None``; after 100 rewrites the file is left in place). Backends make the
        compare-and-delete exact where the store allows (rename away, or a delete conditional
        on the ETag).
        """
        current = self._delete_if_same(path, expected)
        for _ in range(100):
            if current is None or on_changed is None:
                return current
            on_changed(current)
            current = self._delete_if_same(path, current)
        return current  # a writer keeps rewriting it: left in place for the next pass

    def _delete_if_same(self, path: str, expected: bytes) -> bytes | None:
        """One compare-and-delete: ``None`` once deleted or gone, else the current content."""
        try:
            current = self.read_bytes(path)
        except FileNotFoundError:
            return None
        if current != expected:
            return current
        self.delete(path)
        return None
