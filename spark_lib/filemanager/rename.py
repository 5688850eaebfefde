"""The rename backend: local disk, and HDFS-like stores whose rename is atomic.

The bytes go to a temp file *in the target directory*, which is fsynced and renamed into place;
with ``overwrite=False`` the rename refuses to replace (``renameat2(RENAME_NOREPLACE)`` or a hard
link), then the directory is fsynced. On local disk, versioned rewrites exchange the new file
with the old one (``renameat2(RENAME_EXCHANGE)``) and compare-and-delete renames the file aside
first; other stores go through fsspec's ``mv``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
from collections.abc import Callable
from typing import Any, Final

from fsspec.spec import AbstractFileSystem

from sparkguard.spark_lib.base import errors, paths
from sparkguard.spark_lib.filemanager.base import (
    AtomicStream,
    FileManager,
    Held,
    Kind,
    checksum_of,
    make_temp_name,
)

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

    def _hold(self) -> Held:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        return Held(self.path, temp=self._temp)

    def _discard_held(self, held: Held) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._temp)

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

    def _hold(self) -> Held:
        self._file.close()  # HDFS: the close completes the file's blocks
        return Held(self.path, temp=self._temp)

    def _discard_held(self, held: Held) -> None:
        with contextlib.suppress(Exception):
            self._fs.rm_file(self._temp)

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

    def publish_temp(self, temp: str, path: str) -> bool:
        """Local disk: ``rename`` (atomic, replaces), Hadoop's checksum of the temp file moved
        with it or a stale one of ``path`` removed, then an fsync of the directory. Other rename
        stores: the older file is deleted, then the temp file moved (the writer that would
        race that is dead: a rollback runs after its driver)."""
        temp = paths.validate_base(temp)
        path = paths.validate_base(path)
        if self.protocol not in ("file", "local"):
            if not self.fs.exists(temp):
                return False
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(path)
            self.fs.mv(temp, path)
            return True
        if not os.path.exists(temp):
            return False  # published already: its checksum (moved with it) stays
        temp_crc = checksum_of(temp)
        if os.path.exists(temp_crc):
            os.replace(temp_crc, checksum_of(path))
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(checksum_of(path))
        try:
            os.replace(temp, path)
        except FileNotFoundError:
            return False
        fsync_directory(os.path.dirname(path) or ".")
        return True

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
