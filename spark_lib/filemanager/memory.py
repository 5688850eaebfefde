"""The in-memory backend: fsspec's memory filesystem, atomic within one process (fast tests)."""

from __future__ import annotations

import threading

from fsspec.spec import AbstractFileSystem

from sparkguard.spark_lib.base import errors, paths
from sparkguard.spark_lib.filemanager.base import (
    AtomicStream,
    FileManager,
    Held,
    Kind,
    make_temp_name,
)

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

    def _hold(self) -> Held:
        temp = paths.join(paths.parent(self.path), make_temp_name(paths.basename(self.path)))
        self._fs.pipe_file(temp, b"".join(self._chunks))
        self._chunks.clear()
        return Held(self.path, temp=temp)

    def _discard_held(self, held: Held) -> None:
        if held.temp is not None and self._fs.isfile(held.temp):
            self._fs.rm_file(held.temp)

    def _discard(self) -> None:
        self._chunks.clear()


class MemoryFileManager(FileManager):
    """fsspec's in-memory filesystem; atomic within one process."""

    kind = Kind.MEMORY

    def _open_atomic(self, path: str, *, overwrite: bool) -> AtomicStream:
        return _MemoryStream(self.fs, path, overwrite=overwrite)

    def publish_temp(self, temp: str, path: str) -> bool:
        """Move ``temp`` onto ``path`` (tests of the roll forward)."""
        if not self.fs.isfile(temp):
            return False
        self.fs.mv(temp, path)
        return True
