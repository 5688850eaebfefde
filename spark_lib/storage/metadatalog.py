"""A metadata log: batch id -> document, each written once (Spark's HDFSMetadataLog, in Python).

Each batch is one file named by its decimal id in the log directory, written through the atomic
file manager with put-if-absent: of several writers adding the same batch id, exactly one wins.
Payloads are versioned JSON; unknown versions and corrupt files are rejected with a clear error.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors, formats, paths

KIND: Final = "sparkguard.metadata-log"
VERSION: Final = 1
_BATCH_NAME = re.compile(r"^(0|[1-9][0-9]{0,18})$")


def _check_batch_id(batch_id: int) -> int:
    if not isinstance(batch_id, int) or isinstance(batch_id, bool) or batch_id < 0:
        raise errors.ConfigError(f"batch_id must be a non-negative integer, got {batch_id!r}")
    return batch_id


class MetadataLog:
    """Put-if-absent log of JSON payloads keyed by non-negative batch ids."""

    def __init__(self, manager: filemanager.FileManager, directory: str) -> None:
        self.manager = manager
        self.directory = paths.validate_base(directory, what="metadata log directory")

    def _path(self, batch_id: int) -> str:
        return paths.join(self.directory, str(_check_batch_id(batch_id)))

    def add(self, batch_id: int, payload: Mapping[str, Any]) -> bool:
        """Record ``payload`` for ``batch_id`` unless one exists; returns whether this call won."""
        path = self._path(batch_id)  # validates before anything is written
        data = formats.encode(KIND, VERSION, {"batchId": batch_id, "payload": dict(payload)})
        self.manager.mkdirs(self.directory)
        return self.manager.put_if_absent(path, data)

    def get(self, batch_id: int) -> dict[str, Any] | None:
        """The payload of ``batch_id``, or ``None`` when it was never added."""
        path = self._path(batch_id)
        try:
            data = self.manager.read_bytes(path)
        except FileNotFoundError:
            return None
        document = formats.decode(data, kind=KIND, versions=frozenset({VERSION}), source=path)
        if formats.require(document, "batchId", int, source=path) != batch_id:
            raise errors.CorruptFileError(
                f"{path} says batchId={document['batchId']}; it was copied or renamed by hand"
            )
        payload: dict[str, Any] = formats.require(document, "payload", dict, source=path)
        return payload

    def list(self) -> list[int]:
        """All batch ids in ascending order. A file that is not a batch is an error."""
        ids = []
        for info in self.manager.list(self.directory):
            if filemanager.is_temp_name(info.name):
                continue  # a killed writer's leftover: never a batch
            if not _BATCH_NAME.match(info.name):
                raise errors.CorruptFileError(
                    f"unexpected file {info.path} in metadata log {self.directory}; only batch "
                    "ids belong there. Move it elsewhere"
                )
            ids.append(int(info.name))
        return sorted(ids)

    def get_latest(self) -> tuple[int, dict[str, Any]] | None:
        """The highest batch id and its payload, or ``None`` for an empty log."""
        ids = self.list()
        if not ids:
            return None
        latest = ids[-1]
        payload = self.get(latest)
        if payload is None:  # purged between list and get
            return None
        return latest, payload

    def purge(self, before: int) -> int:
        """Delete batches with ids below ``before``; returns how many were deleted."""
        _check_batch_id(before)
        doomed = [self._path(i) for i in self.list() if i < before]
        return self.manager.delete_many(doomed)
