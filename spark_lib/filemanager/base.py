"""The atomic file manager: SPARK-23966's CheckpointFileManager, in Python, over fsspec.

One interface, :meth:`FileManager.create_atomic`, returns a stream that publishes the whole file
on ``close()`` (or a clean ``with`` exit) and leaves nothing visible on ``cancel()`` (or an
exception). The rest (open, list, exists, delete, mkdirs) is shared. Backends implement only the
primitives of publication, chosen by the fsspec protocol and overridable by configuration:

* :class:`RenameFileManager` (local, and HDFS-like stores whose rename is atomic): the bytes go to
  a temp file *in the target directory*, which is fsynced and renamed into place; with
  ``overwrite=False`` the rename refuses to replace (``renameat2(RENAME_NOREPLACE)`` or a hard
  link), then the directory is fsynced.
* :class:`DirectPutFileManager` (object stores): the bytes go straight to the key; the object
  appears only when the upload completes; ``cancel()`` aborts the multipart upload; with
  ``overwrite=False`` the upload is conditional (``If-None-Match: *``).
* :class:`MemoryFileManager` (fsspec's in-memory filesystem) for fast tests.

A killed writer leaves a temp file ``.<name>.sg-tmp-<12 hex>`` next to its target (rename
backends) or an incomplete multipart upload of the target's key (direct put). Nothing removes
them on its own: a rollback of the instant that marked ``<name>`` does
(:meth:`FileManager.find_leftovers` / :meth:`FileManager.remove_leftovers`, only for names that
instant marked, so a live writer of another name is never touched). Temp names start with
``.``, which Spark's file listing skips anyway.
"""

from __future__ import annotations

import abc
import asyncio
import builtins
import contextlib
import ctypes
import ctypes.util
import dataclasses
import datetime
import enum
import errno
import functools
import inspect
import logging
import os
import re
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from types import TracebackType
from typing import IO, Any, Final, Self

import fsspec
import fsspec.asyn
from fsspec.spec import AbstractFileSystem

from sparkguard.spark_lib.base import errors, paths

logger = logging.getLogger(__name__)

TEMP_MARKER: Final = ".sg-tmp-"
_TEMP_NAME = re.compile(r"^\..+\.sg-tmp-[0-9a-f]{12}$")
_TEMP_PARTS = re.compile(r"^\.(?P<target>.+)\.sg-tmp-[0-9a-f]{12}$")
#: at or above this many names in one directory, one listing is cheaper than a HEAD per name
LIST_THRESHOLD: Final = 100
#: keys per S3 DeleteObjects request (the API's limit)
BULK_DELETE_KEYS: Final = 1000
#: independent requests a file manager keeps in flight at once (HEADs, listings, bulk deletes)
CONCURRENCY: Final = 32
#: the error codes a conditional delete (``ETag: *``) of an absent key gets back
_ABSENT_CODES: Final = frozenset({"NoSuchKey", "PreconditionFailed", "404", "412"})


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


#: fsspec protocols and the backend that serves them by default.
DEFAULT_KINDS: Final[Mapping[str, Kind]] = {
    "file": Kind.RENAME,
    "local": Kind.RENAME,
    "hdfs": Kind.RENAME,
    "viewfs": Kind.RENAME,
    "arrow_hdfs": Kind.RENAME,
    "s3": Kind.DIRECT_PUT,
    "s3a": Kind.DIRECT_PUT,
    "gs": Kind.DIRECT_PUT,
    "gcs": Kind.DIRECT_PUT,
    "abfs": Kind.DIRECT_PUT,
    "az": Kind.DIRECT_PUT,
    "memory": Kind.MEMORY,
}

#: Object stores known to honour ``If-None-Match: *`` on put (conditional create).
CONDITIONAL_PUT_PROTOCOLS: Final = frozenset({"s3", "s3a"})


def make_temp_name(name: str) -> str:
    """A recognisable, unique, hidden temp name for ``name`` in the same directory."""
    return f".{name}{TEMP_MARKER}{uuid.uuid4().hex[:12]}"


def is_temp_name(name: str) -> bool:
    """Whether a file name is a temp file left by :class:`RenameFileManager`."""
    return bool(_TEMP_NAME.match(paths.basename(name)))


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


class AtomicStream(abc.ABC):
    """A writable stream whose content becomes visible at its path only on :meth:`close`.

    ``close()`` publishes (and raises :class:`~sparkguard.spark_lib.base.errors.AlreadyExistsError`
    when ``overwrite=False`` lost a race: nothing is then visible from this writer).
    ``cancel()`` discards everything. Used as a context manager it publishes on a clean exit and
    cancels on an exception. After either, the stream is closed; closing twice is a no-op.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._position = 0
        self._state = "open"

    # -- primitives implemented by backends --------------------------------------------------
    @abc.abstractmethod
    def _write(self, data: bytes | memoryview) -> None: ...

    @abc.abstractmethod
    def _publish(self) -> None: ...

    @abc.abstractmethod
    def _discard(self) -> None: ...

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
        try:
            self._publish()
        except BaseException as exc:
            self._state = "cancelled"
            with contextlib.suppress(Exception):
                self._discard()
            if isinstance(exc, OSError) and not isinstance(exc, errors.SparkguardError):
                self._name(exc)
            raise
        self._state = "published"

    def _name(self, exc: OSError) -> None:
        """Make ``exc`` name this stream's path when it names no file (``os.write``'s errors,
        ENOSPC among them, name none): an error message can then say where it happened."""
        if exc.filename is None:
            exc.filename = self.path

    def cancel(self) -> None:
        """Discard everything written; nothing becomes visible. Safe to call more than once."""
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
        in it: a writer that created a file there meanwhile keeps its directory.
        """
        try:
            self.fs.rmdir(path)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True

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


# --------------------------------------------------------------------------------------------
# Rename-based: local filesystem and stores with an atomic rename.
# --------------------------------------------------------------------------------------------

_RENAME_NOREPLACE: Final = 1
_AT_FDCWD: Final = -100


def _load_renameat2() -> Any:
    libc_name = ctypes.util.find_library("c")
    if not libc_name:
        return None
    try:
        libc = ctypes.CDLL(libc_name, use_errno=True)
        func = libc.renameat2
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    func.restype = ctypes.c_int
    return func


_renameat2 = _load_renameat2()


def rename_noreplace(src: str, dst: str) -> None:
    """Rename ``src`` to ``dst`` atomically unless ``dst`` exists (then FileExistsError).

    Uses ``renameat2(RENAME_NOREPLACE)`` where the kernel and filesystem support it, else a hard
    link (atomic create-if-absent on POSIX) followed by unlinking ``src``.
    """
    if _renameat2 is not None:
        rc = _renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE)
        if rc == 0:
            return
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)
        if err not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
            raise OSError(err, os.strerror(err), dst)
    os.link(src, dst)
    os.unlink(src)


_RENAME_EXCHANGE: Final = 2
_UNSUPPORTED_ERRNOS: Final = frozenset(
    {errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP}
)


def rename_exchange(src: str, dst: str) -> None:
    """Swap ``src`` and ``dst`` atomically (``renameat2(RENAME_EXCHANGE)``): both must exist.

    :class:`FileNotFoundError` when either is missing; :class:`~sparkguard.spark_lib.base.errors.
    UnsupportedStoreError` where the kernel or the filesystem has no exchange.
    """
    if _renameat2 is not None:
        rc = _renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_EXCHANGE)
        if rc == 0:
            return
        err = ctypes.get_errno()
        if err == errno.ENOENT:
            raise FileNotFoundError(err, os.strerror(err), dst)
        if err not in _UNSUPPORTED_ERRNOS:
            raise OSError(err, os.strerror(err), dst)
    raise errors.UnsupportedStoreError(
        f"renameat2(RENAME_EXCHANGE) is not available for {dst} (kernel or filesystem)"
    )


def _local_version(st: os.stat_result) -> str:
    """A local file's version: its inode, size and mtime. A rewrite is a new inode (written
    beside the old one, which still exists at that moment), renames keep it."""
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


def fsync_directory(path: str) -> None:
    """Make a rename in directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _LocalAtomicStream(AtomicStream):
    def __init__(self, path: str, *, overwrite: bool) -> None:
        super().__init__(path)
        self._overwrite = overwrite
        self._dir = os.path.dirname(path) or "."
        os.makedirs(self._dir, exist_ok=True)
        self._temp = os.path.join(self._dir, make_temp_name(os.path.basename(path)))
        fd = os.open(self._temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self._file = os.fdopen(fd, "wb")

    def _write(self, data: bytes | memoryview) -> None:
        self._file.write(data)

    def _publish(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        if self._overwrite:
            os.replace(self._temp, self.path)
        else:
            try:
                rename_noreplace(self._temp, self.path)
            except FileExistsError:
                raise errors.AlreadyExistsError(
                    f"{self.path} already exists; nothing was written (create-if-absent lost)"
                ) from None
        fsync_directory(self._dir)

    def _discard(self) -> None:
        with contextlib.suppress(Exception):
            self._file.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._temp)


class _FsspecRenameStream(AtomicStream):
    """Temp file in the target directory, then the store's rename (HDFS-like stores)."""

    def __init__(self, fs: AbstractFileSystem, path: str, *, overwrite: bool) -> None:
        super().__init__(path)
        self._fs = fs
        self._overwrite = overwrite
        self._temp = paths.join(paths.parent(path), make_temp_name(paths.basename(path)))
        self._file = fs.open(self._temp, "wb")

    def _write(self, data: bytes | memoryview) -> None:
        self._file.write(data)

    def _publish(self) -> None:
        self._file.close()
        if not self._overwrite and self._fs.exists(self.path):
            # HDFS's rename refuses an existing target by itself; this check only gives the
            # clearer error before trying.
            raise errors.AlreadyExistsError(f"{self.path} already exists; nothing was written")
        if self._overwrite:
            with contextlib.suppress(FileNotFoundError):
                self._fs.rm_file(self.path)
        self._fs.mv(self._temp, self.path)

    def _discard(self) -> None:
        with contextlib.suppress(Exception):
            self._file.close()
        with contextlib.suppress(Exception):
            self._fs.rm_file(self._temp)


class RenameFileManager(FileManager):
    """Publication by rename of a temp file written in the target directory."""

    kind = Kind.RENAME

    def __init__(self, fs: AbstractFileSystem, *, protocol: str) -> None:
        super().__init__(fs, protocol=protocol)
        #: the filesystem refused RENAME_EXCHANGE once (then never asked again)
        self._no_exchange = False

    def _open_atomic(self, path: str, *, overwrite: bool) -> AtomicStream:
        if self.protocol in ("file", "local"):
            return _LocalAtomicStream(path, overwrite=overwrite)
        return _FsspecRenameStream(self.fs, path, overwrite=overwrite)

    @property
    def versioned_writes(self) -> bool:
        return (
            self.protocol in ("file", "local")
            and _renameat2 is not None
            and not (self._no_exchange)
        )

    def read_versioned(self, path: str) -> tuple[bytes, str | None]:
        if not self.versioned_writes:
            return super().read_versioned(path)
        with open(path, "rb") as handle:
            version = _local_version(os.fstat(handle.fileno()))
            return handle.read(), version

    def write_versioned(self, path: str, data: bytes, expected: str | None) -> str:
        """Local disk: the new version is written to a temp file beside ``path`` and fsynced;
        a create renames it into place unless ``path`` exists; a rewrite *exchanges* it with
        ``path`` (atomic: ``path`` is never missing), then checks that the file it took out is
        ``expected``. A rollback's R7 renames ``path`` aside before it compares and deletes, so
        a rewrite that comes after finds no ``path`` and fails: nothing is published."""
        if not self.versioned_writes:
            return super().write_versioned(path, data, expected)
        path = paths.validate_base(path)
        directory = os.path.dirname(path) or "."
        temp, fd = _open_versioned_temp(path, directory, create=expected is None)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
                version = _local_version(os.fstat(handle.fileno()))
            if expected is None:
                try:
                    rename_noreplace(temp, path)
                except FileExistsError:
                    raise errors.AlreadyExistsError(
                        f"{path} already exists; nothing was written (create-if-absent lost)"
                    ) from None
                fsync_directory(directory)
                return version
            try:
                rename_exchange(temp, path)
            except FileNotFoundError:
                raise errors.VersionConflictError(
                    f"{path} is gone (deleted or taken aside by a rollback); nothing was written"
                ) from None
            except errors.UnsupportedStoreError:
                self._no_exchange = True
                raise
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
            raise
        # ``temp`` now holds the file that was at ``path``.
        try:
            taken = _local_version(os.lstat(temp))
        except FileNotFoundError:  # a rollback deleted the temp name it listed meanwhile
            raise errors.VersionConflictError(
                f"could not confirm which version of {path} was replaced (a rollback removed "
                "it); the new version is published but must not be trusted"
            ) from None
        if taken != expected:
            # Another writer's version was there: put it back, ours was never acknowledged.
            try:
                rename_exchange(temp, path)
            except (OSError, errors.UnsupportedStoreError):
                pass  # leave it under the temp name: readers read temp copies too
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temp)
            raise errors.VersionConflictError(
                f"{path} was rewritten by another writer (expected version {expected}, found "
                f"{taken}); nothing was written"
            )
        fsync_directory(directory)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)  # the previous version: every line of it is in the new one
        return version

    def mkdirs(self, path: str) -> None:
        if self.protocol in ("file", "local"):
            os.makedirs(path, exist_ok=True)
        else:
            super().mkdirs(path)

    def remove_empty_directory(self, path: str) -> bool:
        if self.protocol not in ("file", "local"):
            return super().remove_empty_directory(path)
        try:
            os.rmdir(path)  # non-recursive: fails with ENOTEMPTY if a writer put a file there
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True

    def delete_if_unchanged(
        self,
        path: str,
        expected: bytes,
        *,
        on_changed: Callable[[bytes], None] | None = None,
    ) -> bytes | None:
        """Exact on local disk: the file is renamed away first (atomic), so a rewrite that
        lands meanwhile publishes a new file instead of being deleted unread, and a versioned
        rewrite (:meth:`write_versioned`) finds no file and fails. The renamed copy has a temp
        name holding the old content, which the marker reader still reads. With
        ``on_changed``, a changed copy stays taken aside while ``on_changed`` reads it (no
        writer can change it there), then it is deleted."""
        if self.protocol not in ("file", "local"):
            return super().delete_if_unchanged(path, expected, on_changed=on_changed)
        directory = os.path.dirname(path) or "."
        aside = os.path.join(directory, make_temp_name(os.path.basename(path)))
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return None
        with open(aside, "rb") as handle:
            taken = handle.read()
        if taken == expected:
            os.unlink(aside)
            return None
        if on_changed is not None:
            on_changed(taken)  # raises: the copy stays under its temp name for the next pass
            os.unlink(aside)
            return None
        try:  # put the newer content back, unless a yet newer rewrite is already there
            rename_noreplace(aside, path)
        except FileExistsError:
            os.unlink(aside)  # superseded: a rewrite keeps every line it had
        return self.read_bytes(path) if os.path.exists(path) else taken


# --------------------------------------------------------------------------------------------
# Direct put: object stores.
# --------------------------------------------------------------------------------------------


class _DirectPutStream(AtomicStream):
    """Bytes go straight to the key: one PUT, or a multipart upload past ``block_size``.

    Nothing is visible until the PUT or the CompleteMultipartUpload succeeds. With
    ``overwrite=False`` both carry ``If-None-Match: *``, so the store itself refuses a second
    creator (412). A cancelled or refused multipart upload is aborted: no parts linger.
    """

    def __init__(
        self, fs: AbstractFileSystem, path: str, *, overwrite: bool, block_size: int
    ) -> None:
        super().__init__(path)
        self._fs = fs
        self._bucket, self._key, _ = fs.split_path(path)
        self._conditions: dict[str, str] = {} if overwrite else {"IfNoneMatch": "*"}
        self._block_size = block_size
        self._buffer = bytearray()
        self._upload_id: str | None = None
        self._parts: list[dict[str, Any]] = []

    def _call(self, method: str, **kwargs: Any) -> Any:
        return self._fs.call_s3(method, Bucket=self._bucket, Key=self._key, **kwargs)

    def _write(self, data: bytes | memoryview) -> None:
        self._buffer += data
        while len(self._buffer) >= self._block_size:
            self._upload_part(bytes(self._buffer[: self._block_size]))
            del self._buffer[: self._block_size]

    def _upload_part(self, chunk: bytes) -> None:
        if self._upload_id is None:
            self._upload_id = str(self._call("create_multipart_upload")["UploadId"])
        number = len(self._parts) + 1
        result = self._call("upload_part", UploadId=self._upload_id, PartNumber=number, Body=chunk)
        self._parts.append({"PartNumber": number, "ETag": result["ETag"]})

    def _publish(self) -> None:
        try:
            if self._upload_id is None:
                self._call("put_object", Body=bytes(self._buffer), **self._conditions)
            else:
                if self._buffer:
                    self._upload_part(bytes(self._buffer))
                self._call(
                    "complete_multipart_upload",
                    UploadId=self._upload_id,
                    MultipartUpload={"Parts": self._parts},
                    **self._conditions,
                )
                self._upload_id = None
        except (FileExistsError, OSError) as exc:
            if isinstance(exc, FileExistsError) or _is_precondition_failed(exc):
                raise errors.AlreadyExistsError(
                    f"{self.path} already exists; nothing was written (conditional put got 412)"
                ) from None
            if self._conditions and _is_not_implemented(exc):
                raise errors.UnsupportedStoreError(
                    f"the store rejected a conditional put (If-None-Match) for {self.path}; "
                    "set spark.sparkguard.createMode=check-then-put to accept a racy "
                    "create-if-absent, or use a store with conditional writes"
                ) from exc
            raise
        finally:
            self._buffer = bytearray()

    def _discard(self) -> None:
        self._buffer = bytearray()
        if self._upload_id is not None:
            upload_id, self._upload_id = self._upload_id, None
            with contextlib.suppress(FileNotFoundError):
                self._call("abort_multipart_upload", UploadId=upload_id)


def _read_body(fs: AbstractFileSystem, body: Any) -> bytes:
    """Read an (async) streaming body of ``get_object`` on the filesystem's event loop."""

    async def read() -> bytes:
        async with body as stream:
            return bytes(await stream.read())

    return bytes(fsspec.asyn.sync(fs.loop, read))


def _error_code(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__
    response = getattr(cause, "response", None) or getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


def _is_precondition_failed(exc: BaseException) -> bool:
    return _error_code(exc) in ("PreconditionFailed", "412") or "PreconditionFailed" in str(exc)


def _is_not_implemented(exc: BaseException) -> bool:
    return _error_code(exc) in ("NotImplemented", "501") or "NotImplemented" in str(exc)


class _CheckThenPutStream(AtomicStream):
    """Racy create-if-absent for stores without conditional writes (explicit opt-in only)."""

    def __init__(self, fs: AbstractFileSystem, path: str, *, block_size: int) -> None:
        super().__init__(path)
        self._inner = _DirectPutStream(fs, path, overwrite=True, block_size=block_size)
        self._fs = fs

    def _write(self, data: bytes | memoryview) -> None:
        self._inner.write(data)

    def _publish(self) -> None:
        if self._fs.exists(self.path):
            self._inner.cancel()
            raise errors.AlreadyExistsError(f"{self.path} already exists; nothing was written")
        self._inner.close()

    def _discard(self) -> None:
        self._inner.cancel()


#: per store (filesystem class, endpoint) and bucket: whether conditional bulk deletes are
#: honoured (asked once per process)
_CONDITIONAL_BULK_DELETE: dict[tuple[str, str, str], bool] = {}


class DirectPutFileManager(FileManager):
    """Publication by a single (possibly multipart) upload straight to the key."""

    kind = Kind.DIRECT_PUT
    #: whether the store honours ``ETag: *`` per key of a bulk delete; None: ask it once
    #: (:meth:`honours_conditional_bulk_delete`)
    conditional_bulk_delete: bool | None = None

    def __init__(
        self,
        fs: AbstractFileSystem,
        *,
        protocol: str,
        create_mode: CreateMode = CreateMode.CONDITIONAL,
        block_size: int = 16 * 1024 * 1024,
    ) -> None:
        super().__init__(fs, protocol=protocol)
        self.create_mode = create_mode
        self.block_size = block_size
        #: whether the store honours ``If-Match`` on PUT: unknown (None) until the first
        #: versioned write probes it
        self._if_match: bool | None = None

    @property
    def versioned_writes(self) -> bool:
        return (
            self.protocol in CONDITIONAL_PUT_PROTOCOLS
            and self.create_mode is CreateMode.CONDITIONAL
            and self._if_match is not False
        )

    def read_versioned(self, path: str) -> tuple[bytes, str | None]:
        if not self.versioned_writes:
            return super().read_versioned(path)
        bucket, key, _ = self.fs.split_path(path)
        response = self.fs.call_s3("get_object", Bucket=bucket, Key=key)
        return _read_body(self.fs, response["Body"]), str(response["ETag"])

    def write_versioned(self, path: str, data: bytes, expected: str | None) -> str:
        """S3: one PUT with ``If-Match: <expected ETag>`` (a rewrite; answered 404 when the key
        is gone, 412 when it is another version) or ``If-None-Match: *`` (a create). The first
        call of a manager first proves that the store honours ``If-Match`` (a PUT whose ETag
        no object has must be refused); a store that ignores it gets no versioned writes."""
        if not self.versioned_writes:
            return super().write_versioned(path, data, expected)
        bucket, key, _ = self.fs.split_path(path)
        if self._if_match is None:
            written = self._probe_if_match(bucket, key, data)
            if written is not None:
                return written
        conditions = {"IfNoneMatch": "*"} if expected is None else {"IfMatch": expected}
        try:
            response = self.fs.call_s3(
                "put_object", Bucket=bucket, Key=key, Body=data, **conditions
            )
        except FileNotFoundError:
            raise errors.VersionConflictError(
                f"{path} is gone (deleted by a rollback or a cleanup); nothing was written"
            ) from None
        except OSError as exc:
            if isinstance(exc, FileExistsError) or _is_precondition_failed(exc):
                if expected is None:
                    raise errors.AlreadyExistsError(
                        f"{path} already exists; nothing was written (conditional put got 412)"
                    ) from None
                raise errors.VersionConflictError(
                    f"{path} is not version {expected} any more (rewritten by another writer); "
                    "nothing was written"
                ) from None
            if _is_not_implemented(exc):
                self._if_match = False
                raise errors.UnsupportedStoreError(
                    f"the store rejected a conditional put for {path}: {exc}"
                ) from exc
            raise
        return str(response["ETag"])

    def _probe_if_match(self, bucket: str, key: str, data: bytes) -> str | None:
        """PUT ``data`` with an ``If-Match`` no object satisfies. A store that honours it
        refuses (404 or 412): returns ``None``. One that ignores it stores ``data``: versioned
        writes are off from now on, and the new ETag is returned (the write happened,
        unconditionally, as the caller's fallback would have done it)."""
        try:
            response = self.fs.call_s3(
                "put_object", Bucket=bucket, Key=key, Body=data, IfMatch='"sparkguard-probe"'
            )
        except FileNotFoundError:
            self._if_match = True
            return None
        except OSError as exc:
            if isinstance(exc, FileExistsError) or _is_precondition_failed(exc):
                self._if_match = True
                return None
            if _is_not_implemented(exc):
                self._if_match = False
                raise errors.UnsupportedStoreError(
                    f"the store rejected a conditional put (If-Match) for {bucket}/{key}: {exc}"
                ) from exc
            raise
        self._if_match = False
        logger.warning(
            "the store ignored If-Match on PUT %s/%s: conditional rewrites are off, the marker "
            "sidecar reads the instant's outcome around every flush instead",
            bucket,
            key,
        )
        return str(response["ETag"])

    def _open_atomic(self, path: str, *, overwrite: bool) -> AtomicStream:
        if overwrite:
            return _DirectPutStream(self.fs, path, overwrite=True, block_size=self.block_size)
        if self.create_mode is CreateMode.CHECK_THEN_PUT:
            return _CheckThenPutStream(self.fs, path, block_size=self.block_size)
        if self.protocol not in CONDITIONAL_PUT_PROTOCOLS:
            raise errors.UnsupportedStoreError(
                f"sparkguard knows no conditional put for protocol {self.protocol!r}, so "
                "create-if-absent cannot be atomic there; set spark.sparkguard.createMode="
                "check-then-put to accept a racy check (single writer per path only)"
            )
        return _DirectPutStream(self.fs, path, overwrite=False, block_size=self.block_size)

    def _delete_files(self, file_paths: builtins.list[str]) -> None:
        # One bulk request per 1,000 keys on S3; missing keys are not an error there.
        self.fs.rm(file_paths)

    def read_bytes(self, path: str) -> bytes:
        """The whole content of ``path``: one GET (s3fs would HEAD first, and list the key
        as a directory when it is missing); :class:`FileNotFoundError` when it is missing."""
        bucket, key, _ = self.fs.split_path(path)
        response = self.fs.call_s3("get_object", Bucket=bucket, Key=key)
        return _read_body(self.fs, response["Body"])

    def exists(self, path: str) -> bool:
        """Whether a key ``path`` or keys under ``path/`` exist: one listing by the prefix
        (s3fs would HEAD the key, then list the directory)."""
        bucket, key, _ = self.fs.split_path(path)
        key = key.rstrip("/")
        if not key:
            return bool(self.fs.exists(path))  # a bucket
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": key, "Delimiter": "/"}
        while True:
            response = self.fs.call_s3("list_objects_v2", **kwargs)
            if any(entry["Key"] == key for entry in response.get("Contents", [])) or any(
                common["Prefix"] == key + "/" for common in response.get("CommonPrefixes", [])
            ):
                return True
            token = response.get("NextContinuationToken")
            if not response.get("IsTruncated") or not token:
                return False
            kwargs["ContinuationToken"] = token

    def list(self, path: str) -> builtins.list[FileInfo]:
        """The entries directly under ``path`` (empty when there is none): one request per
        1,000 entries, also for a missing directory (s3fs would list its parent as well)."""
        bucket, key, _ = self.fs.split_path(path.rstrip("/") + "/")
        prefix = key.rstrip("/") + "/" if key.strip("/") else ""
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "Delimiter": "/"}
        result: builtins.list[FileInfo] = []
        while True:
            response = self.fs.call_s3("list_objects_v2", **kwargs)
            for entry in response.get("Contents", []):
                if entry["Key"] == prefix:
                    continue  # the directory's own marker key
                result.append(
                    FileInfo(
                        path=f"{bucket}/{entry['Key']}".rstrip("/"),
                        size=int(entry.get("Size") or 0),
                        is_dir=False,
                        modified=_modified_of(entry),
                    )
                )
            result.extend(
                FileInfo(path=f"{bucket}/{common['Prefix']}".rstrip("/"), size=0, is_dir=True)
                for common in response.get("CommonPrefixes", [])
            )
            token = response.get("NextContinuationToken")
            if not response.get("IsTruncated") or not token:
                return sorted(result, key=lambda info: info.path)
            kwargs["ContinuationToken"] = token

    def _gather(self, coros: Iterable[Awaitable[Any]]) -> builtins.list[Any]:
        """Run independent requests concurrently on the filesystem's event loop, at most
        :data:`CONCURRENCY` in flight; their results in order."""
        pending = builtins.list(coros)
        if not pending:
            return []

        async def run() -> builtins.list[Any]:
            gate = asyncio.Semaphore(CONCURRENCY)

            async def one(coro: Awaitable[Any]) -> Any:
                async with gate:
                    return await coro

            return builtins.list(await asyncio.gather(*(one(c) for c in pending)))

        return builtins.list(fsspec.asyn.sync(self.fs.loop, run))

    async def _is_key(self, path: str) -> bool:
        bucket, key, _ = self.fs.split_path(path)
        try:
            await self.fs._call_s3("head_object", Bucket=bucket, Key=key)
        except FileNotFoundError:
            return False
        return True

    async def _names_in(self, directory: str) -> set[str]:
        """Paths of the keys directly under ``directory`` (one request per 1,000 keys)."""
        bucket, key, _ = self.fs.split_path(directory.rstrip("/") + "/")
        prefix = key.rstrip("/") + "/"
        found: set[str] = set()
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "Delimiter": "/"}
        while True:
            response = await self.fs._call_s3("list_objects_v2", **kwargs)
            found.update(f"{bucket}/{o['Key']}" for o in response.get("Contents", []))
            token = response.get("NextContinuationToken")
            if not response.get("IsTruncated") or not token:
                return found
            kwargs["ContinuationToken"] = token

    def existing_files(self, file_paths: Iterable[str]) -> set[str]:
        """Which of ``file_paths`` exist now: one listing per directory holding at least
        :data:`LIST_THRESHOLD` of them, else one HEAD per name; all of them concurrently."""
        groups = _by_directory(file_paths)
        listed = [(d, w) for d, w in groups.items() if len(w) >= LIST_THRESHOLD]
        probed = sorted(p for d, w in groups.items() if len(w) < LIST_THRESHOLD for p in w)
        answers = self._gather(
            [self._names_in(d) for d, _ in listed] + [self._is_key(p) for p in probed]
        )
        found: set[str] = set()
        for (_, wanted), names in zip(listed, answers[: len(listed)], strict=True):
            found |= wanted & names
        found.update(p for p, there in zip(probed, answers[len(listed) :], strict=True) if there)
        return found

    def honours_conditional_bulk_delete(self, sample: str) -> bool:
        """Whether the store deletes a key of a bulk delete only if it exists when asked to
        (S3's ``DeleteObjects`` with ``ETag: *`` per key: AWS S3 since 2025) and reports the
        absent ones as errors. Then one request per 1,000 names both deletes and tells which
        existed. Asked once per filesystem and bucket: a bulk delete of one absent key (a
        random hidden name beside ``sample``) with that condition; a store that reports it
        deleted (ignores the condition) or refuses the request does not honour it.
        :attr:`conditional_bulk_delete` (True/False) skips the question."""
        if self.conditional_bulk_delete is not None:
            return self.conditional_bulk_delete
        bucket, _, _ = self.fs.split_path(sample)
        endpoint = getattr(self.fs, "endpoint_url", None) or (
            getattr(self.fs, "client_kwargs", None) or {}
        ).get("endpoint_url", "")
        store = (type(self.fs).__name__, str(endpoint or ""), bucket)
        if store not in _CONDITIONAL_BULK_DELETE:
            probe = paths.join(paths.parent(sample), f".sg-absent-probe-{uuid.uuid4().hex}")
            try:
                deleted, absent = self._delete_if_present([probe])
            except OSError as exc:
                logger.info("bucket %s refused a conditional bulk delete: %s", bucket, exc)
                deleted, absent = {probe}, set()
            _CONDITIONAL_BULK_DELETE[store] = probe in absent and not deleted
            logger.info(
                "bucket %s %s conditional bulk deletes",
                bucket,
                "honours" if _CONDITIONAL_BULK_DELETE[store] else "ignores",
            )
        return _CONDITIONAL_BULK_DELETE[store]

    def _delete_if_present(self, file_paths: Iterable[str]) -> tuple[set[str], set[str]]:
        """Bulk-delete ``file_paths`` on the condition that each exists (``ETag: *``), 1,000
        keys a request, the requests concurrently: (deleted, absent) as the store reports.
        Any other per-key error is raised (:class:`OSError` naming the key and the code)."""
        by_bucket: dict[str, builtins.list[str]] = {}
        for path in sorted(set(file_paths)):
            by_bucket.setdefault(self.fs.split_path(path)[0], []).append(path)
        requests = [
            (bucket, chunk[start : start + BULK_DELETE_KEYS])
            for bucket, chunk in by_bucket.items()
            for start in range(0, len(chunk), BULK_DELETE_KEYS)
        ]

        async def delete(bucket: str, chunk: builtins.list[str]) -> Any:
            keys = [{"Key": self.fs.split_path(p)[1], "ETag": "*"} for p in chunk]
            for path in chunk:
                self.fs.invalidate_cache(paths.parent(path))
            return await self.fs._call_s3(
                "delete_objects", Bucket=bucket, Delete={"Objects": keys, "Quiet": False}
            )

        answers = self._gather(delete(bucket, chunk) for bucket, chunk in requests)
        deleted: set[str] = set()
        absent: set[str] = set()
        for (bucket, _), answer in zip(requests, answers, strict=True):
            deleted.update(f"{bucket}/{d['Key']}" for d in answer.get("Deleted", []))
            for error in answer.get("Errors", []):
                code = str(error.get("Code", ""))
                if code not in _ABSENT_CODES:
                    raise OSError(
                        f"could not delete s3://{bucket}/{error.get('Key')}: {code} "
                        f"({error.get('Message', '')}); fix the store's permissions, then run "
                        "the rollback again"
                    )
                absent.add(f"{bucket}/{error['Key']}")
        return deleted, absent

    def delete_existing(self, file_paths: Iterable[str]) -> set[str]:
        """Delete the files that exist; returns those (a name with no file is not counted).

        Where the store honours a conditional bulk delete, the delete itself tells which
        existed (one request per 1,000 names); elsewhere existence is read first
        (:meth:`existing_files`: a plain bulk delete cannot tell), then one bulk delete."""
        wanted = sorted({paths.validate_base(p) for p in file_paths})
        if not wanted:
            return set()
        if self.honours_conditional_bulk_delete(wanted[0]):
            return self._delete_if_present(wanted)[0]
        existing = self.existing_files(wanted)
        if existing:
            self._delete_files(sorted(existing))
        return existing

    def find_leftovers(self, file_paths: Iterable[str]) -> builtins.list[Leftover]:
        """Incomplete multipart uploads of exactly these keys: one listing of the uploads
        under the directory all of them share (a request per 1,000 pending uploads there,
        whatever the number of directories or of files)."""
        by_bucket: dict[str, set[str]] = {}
        for path in file_paths:
            by_bucket.setdefault(self.fs.split_path(path)[0], set()).add(path)
        result = []
        for bucket, wanted in sorted(by_bucket.items()):
            shared = os.path.commonpath([paths.parent(p) for p in wanted])
            for upload in self.list_pending_uploads(shared.rstrip("/") + "/"):
                path = f"{bucket}/{upload['Key']}"
                if path in wanted:
                    result.append(Leftover(path, path, upload["UploadId"]))
        return sorted(result, key=lambda leftover: (leftover.path, leftover.upload_id or ""))

    def remove_leftovers(self, leftovers: Iterable[Leftover]) -> int:
        """Abort the incomplete uploads (concurrently); returns how many were aborted."""

        async def abort(leftover: Leftover) -> bool:
            bucket, key, _ = self.fs.split_path(leftover.path)
            try:
                await self.fs._call_s3(
                    "abort_multipart_upload", Bucket=bucket, Key=key, UploadId=leftover.upload_id
                )
            except FileNotFoundError:
                return False
            return True

        return sum(1 for done in self._gather(abort(left) for left in leftovers) if done)

    def _delete_if_same(self, path: str, expected: bytes) -> bytes | None:
        """Exact on S3: the delete carries ``If-Match`` with the ETag of the content compared
        (a store that refuses conditional deletes gets a plain delete after the compare)."""
        bucket, key, _ = self.fs.split_path(path)
        for _ in range(100):
            try:
                response = self.fs.call_s3("get_object", Bucket=bucket, Key=key)
            except FileNotFoundError:
                return None
            current = _read_body(self.fs, response["Body"])
            if current != expected:
                return current
            try:
                self.fs.call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=response["ETag"])
            except FileNotFoundError:
                return None
            except OSError as exc:
                if _is_precondition_failed(exc):
                    continue  # rewritten between the read and the delete: compare again
                if _is_not_implemented(exc):
                    self.delete(path)
                    return None
                raise
            return None
        raise errors.SparkguardError(f"{path} keeps changing; could not delete it")

    def mkdirs(self, path: str) -> None:
        """Object stores have no directories: nothing to do."""

    def _keys(self, path: str) -> builtins.list[tuple[str, int]]:
        """(key, size) of every key under ``path/``, directory markers included."""
        bucket, key, _ = self.fs.split_path(path.rstrip("/") + "/")
        prefix = key.rstrip("/") + "/"
        found: builtins.list[tuple[str, int]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
            if token:
                kwargs["ContinuationToken"] = token
            response = self.fs.call_s3("list_objects_v2", **kwargs)
            contents = response.get("Contents", [])
            found.extend((str(o["Key"]), int(o.get("Size") or 0)) for o in contents)
            token = response.get("NextContinuationToken")
            if not response.get("IsTruncated") or not token:
                return found

    def list_tree(self, path: str) -> builtins.list[FileInfo]:
        """Every key under ``path``; a zero-byte key ending in ``/`` (a directory marker, as
        S3A's ``mkdirs`` writes) is listed as a directory, the only kind an object store has."""
        bucket, _, _ = self.fs.split_path(path.rstrip("/") + "/")
        result = [
            FileInfo(path=f"{bucket}/{key}".rstrip("/"), size=size, is_dir=key.endswith("/"))
            for key, size in self._keys(path)
        ]
        root = path.rstrip("/")
        return sorted((i for i in result if i.path != root), key=lambda info: info.path)

    def remove_empty_directory(self, path: str) -> bool:
        """Object stores have no directories: ``path`` is gone when no key is under it but
        its own directory marker (``path/``, deleted then)."""
        bucket, key, _ = self.fs.split_path(path.rstrip("/") + "/")
        marker = key.rstrip("/") + "/"
        keys = [k for k, _ in self._keys(path)]
        if any(k != marker for k in keys):
            return False
        if keys:
            with contextlib.suppress(FileNotFoundError):
                self.fs.call_s3("delete_object", Bucket=bucket, Key=marker)
        return True

    def list_pending_uploads(self, prefix: str) -> builtins.list[dict[str, str]]:
        """Multipart uploads under ``prefix`` that were never completed (a killed writer's,
        or a live writer's): a request per 1,000 of them."""
        bucket, key, _ = self.fs.split_path(prefix)
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": key}
        found: builtins.list[dict[str, str]] = []
        while True:
            response = self.fs.call_s3("list_multipart_uploads", **kwargs)
            found.extend(
                {"Key": str(u["Key"]), "UploadId": str(u["UploadId"])}
                for u in response.get("Uploads", [])
            )
            marker = response.get("NextKeyMarker")
            if not response.get("IsTruncated") or not marker:
                return found
            kwargs["KeyMarker"] = marker
            kwargs["UploadIdMarker"] = response.get("NextUploadIdMarker", "")

    def abort_pending_uploads(self, prefix: str) -> int:
        """Abort every pending multipart upload under ``prefix``; returns how many."""
        bucket, _, _ = self.fs.split_path(prefix)
        pending = self.list_pending_uploads(prefix)
        for upload in pending:
            self.fs.call_s3(
                "abort_multipart_upload",
                Bucket=bucket,
                Key=upload["Key"],
                UploadId=upload["UploadId"],
            )
        return len(pending)


# --------------------------------------------------------------------------------------------
# In memory: fast tests.
# --------------------------------------------------------------------------------------------

_MEMORY_LOCK = threading.Lock()


class _MemoryStream(AtomicStream):
    def __init__(self, fs: AbstractFileSystem, path: str, *, overwrite: bool) -> None:
        super().__init__(path)
        self._fs = fs
        self._overwrite = overwrite
        self._chunks: list[bytes] = []

    def _write(self, data: bytes | memoryview) -> None:
        self._chunks.append(bytes(data))

    def _publish(self) -> None:
        with _MEMORY_LOCK:
            if not self._overwrite and self._fs.exists(self.path):
                raise errors.AlreadyExistsError(f"{self.path} already exists; nothing was written")
            self._fs.pipe_file(self.path, b"".join(self._chunks))

    def _discard(self) -> None:
        self._chunks.clear()


class MemoryFileManager(FileManager):
    """fsspec's in-memory filesystem; atomic within one process."""

    kind = Kind.MEMORY

    def _open_atomic(self, path: str, *, overwrite: bool) -> AtomicStream:
        return _MemoryStream(self.fs, path, overwrite=overwrite)


# --------------------------------------------------------------------------------------------
# Choosing a backend.
# --------------------------------------------------------------------------------------------

_BACKENDS: Final[Mapping[Kind, type[FileManager]]] = {
    Kind.RENAME: RenameFileManager,
    Kind.DIRECT_PUT: DirectPutFileManager,
    Kind.MEMORY: MemoryFileManager,
}


def protocol_of(url: str) -> str:
    """The fsspec protocol of ``url`` (``file`` for plain paths)."""
    if "://" not in url:
        return "file"
    return url.split("://", 1)[0].lower()


def parse_kind(
    value: str | Kind | None, *, key: str = "spark.sparkguard.fileManager"
) -> Kind | None:
    """Parse a configured backend name; ``None``/empty means "by protocol"."""
    if value is None or value == "":
        return None
    try:
        return Kind(value)
    except ValueError:
        choices = ", ".join(k.value for k in Kind)
        raise errors.ConfigError(
            f"{key}={value!r} is not a file manager; use one of {choices}"
        ) from None


def parse_create_mode(
    value: str | CreateMode | None, *, key: str = "spark.sparkguard.createMode"
) -> CreateMode:
    """Parse the configured create-if-absent mode (default: conditional)."""
    if value is None or value == "":
        return CreateMode.CONDITIONAL
    try:
        return CreateMode(value)
    except ValueError:
        choices = ", ".join(m.value for m in CreateMode)
        raise errors.ConfigError(
            f"{key}={value!r} is not a create mode; use one of {choices}"
        ) from None


def resolve(
    url: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    kind: str | Kind | None = None,
    create_mode: str | CreateMode | None = None,
    options_source: str = "storage options",
) -> tuple[FileManager, str]:
    """Return the file manager for ``url`` and the path inside its filesystem.

    ``storage_options`` the filesystem does not take are refused (:func:`check_storage_options`),
    naming ``options_source`` (the setting they came from).

    The backend comes from ``kind`` when given, else from the protocol (:data:`DEFAULT_KINDS`).
    Filesystem instances are never shared through fsspec's instance cache (they may hold event
    loops and connections that must not cross forks), and object-store listings are not cached,
    so every ``list``/``exists`` sees the store as it is now.
    """
    if not isinstance(url, str) or not url.strip():
        raise errors.InvalidPathError(f"storage URL must be a non-empty string, got {url!r}")
    protocol = protocol_of(url)
    chosen = parse_kind(kind)
    if chosen is None:
        if protocol not in DEFAULT_KINDS:
            known = ", ".join(sorted(DEFAULT_KINDS))
            raise errors.UnsupportedStoreError(
                f"no atomic file manager is known for protocol {protocol!r} in {url!r}; "
                f"use one of {known}, or set spark.sparkguard.fileManager to rename or direct-put"
            )
        chosen = DEFAULT_KINDS[protocol]
    try:
        fs_class = fsspec.get_filesystem_class(protocol)
    except (ValueError, ImportError) as exc:
        raise errors.UnsupportedStoreError(
            f"cannot open storage {url!r}: {exc}. Install the fsspec backend for {protocol!r}"
        ) from exc
    check_storage_options(fs_class, protocol, storage_options or {}, source=options_source)
    options: dict[str, Any] = {"skip_instance_cache": True}
    if chosen is Kind.DIRECT_PUT:
        options["use_listings_cache"] = False
    options.update(storage_options or {})
    fs = fs_class(**options)
    path = paths.validate_base(fs._strip_protocol(url), what="storage URL")
    if protocol in ("file", "local"):
        path = os.path.abspath(path)
    backend = _BACKENDS[chosen]
    manager: FileManager
    if backend is DirectPutFileManager:
        manager = DirectPutFileManager(
            fs, protocol=protocol, create_mode=parse_create_mode(create_mode)
        )
    else:
        manager = backend(fs, protocol=protocol)
    return manager, path


#: What every fsspec filesystem takes besides its own parameters (``AbstractFileSystem``
#: hands them to its listings cache and its instance cache).
_COMMON_OPTIONS: Final = frozenset(
    {"use_listings_cache", "listings_expiry_time", "max_paths", "skip_instance_cache"}
)


def storage_option_names(fs_class: type[AbstractFileSystem]) -> frozenset[str] | None:
    """The keyword options ``fs_class`` takes: its constructor's named parameters and those of
    the constructors its ``**kwargs`` reach, plus :data:`_COMMON_OPTIONS`. ``None`` when a
    constructor cannot be inspected (then nothing is checked)."""
    names = set(_COMMON_OPTIONS)
    for klass in fs_class.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        if klass is object:
            break
        try:
            parameters = inspect.signature(init).parameters.values()
        except (TypeError, ValueError):
            return None
        names.update(
            p.name
            for p in parameters
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"
        )
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            break
    return frozenset(names)


@functools.cache
def _every_store_option() -> frozenset[str]:
    """The options of every filesystem sparkguard opens whose fsspec backend is installed."""
    names: set[str] = set()
    for protocol in DEFAULT_KINDS:
        try:
            fs_class = fsspec.get_filesystem_class(protocol)
        except (ValueError, ImportError):
            continue
        names |= storage_option_names(fs_class) or set()
    return frozenset(names)


def check_storage_options(
    fs_class: type[AbstractFileSystem],
    protocol: str,
    options: Mapping[str, Any],
    *,
    source: str = "storage options",
) -> None:
    """Refuse an option no filesystem sparkguard opens takes: fsspec filesystems swallow
    unknown keyword arguments, so a misspelt ``endpoint_url`` would be silently ignored.
    An option of another store (S3 credentials while the journal is on local disk and the
    tables on S3: one setting serves both) is left to the locations it is for. Raises
    :class:`~sparkguard.spark_lib.base.errors.ConfigError` naming the key and what ``fs_class``
    takes."""
    known = storage_option_names(fs_class)
    if known is None:
        return
    unknown = sorted(str(key) for key in options if key not in known)
    unknown = [key for key in unknown if key not in _every_store_option()]
    if unknown:
        own = sorted(known - _COMMON_OPTIONS) or ["none of its own"]
        many = len(unknown) > 1
        raise errors.ConfigError(
            f"{source}: key{'s' if many else ''} {', '.join(map(repr, unknown))} "
            f"{'are' if many else 'is'} not an option of {protocol}:// storage "
            f"({fs_class.__name__} takes {', '.join(own)}) nor of any other storage sparkguard "
            f"opens; remove {'them' if many else 'it'} from {source} or fix the spelling"
        )


@contextlib.contextmanager
def atomic_writer(
    url: str, *, overwrite: bool = False, storage_options: Mapping[str, Any] | None = None
) -> Iterator[AtomicStream]:
    """Convenience: ``with atomic_writer(url) as f: f.write(...)`` for a single file."""
    manager, path = resolve(url, storage_options=storage_options)
    with manager.create_atomic(path, overwrite=overwrite) as stream:
        yield stream


def _open_versioned_temp(path: str, directory: str, *, create: bool) -> tuple[str, int]:
    """The temp file beside ``path`` a versioned write starts with, opened for writing. A create
    makes ``directory`` if needed; a rewrite never re-creates the directory a rollback removed
    with the file: the file is gone, a version conflict."""
    if create:
        os.makedirs(directory, exist_ok=True)
    temp = os.path.join(directory, make_temp_name(os.path.basename(path)))
    try:
        return temp, os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileNotFoundError:
        if create:
            raise
        raise errors.VersionConflictError(
            f"{path} is gone with its directory (deleted by a rollback); nothing was written"
        ) from None
