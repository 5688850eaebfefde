"""A marker directory's files as the sidecar writes them, and how it reads them back.

The sidecar writes ``MARKERS.type`` (``TIMELINE_SERVER_BASED``) before the first batch file,
then appends names to the batch files ``MARKERS0`` .. ``MARKERS<batch_threads - 1>``, each
rewritten whole and atomically through the file manager (conditionally on the version it last
wrote or read, where the store has versioned writes). Reading a directory back, as a
restarted sidecar does, keeps what was acknowledged: a temp file of an interrupted rewrite is
ignored and a torn last line dropped (neither was ever acknowledged); direct markers count
too; any other file makes the directory unreadable rather than guessed at.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Final

from sparkguard.sidecar import errors
from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors as lib_errors
from sparkguard.spark_lib.base import paths
from sparkguard.spark_lib.storage import markers

logger = logging.getLogger(__name__)

_BATCH_FILE: Final = re.compile(r"^MARKERS(0|[1-9][0-9]{0,5})$")
_DIRECT_MARKER: Final = re.compile(r"\.marker\.(CREATE|MERGE|APPEND)$")
_TYPE_CONTENT: Final = markers.MarkerType.TIMELINE_SERVER_BASED.value.encode()


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


def write_batch_file(  # noqa: PLR0917 - positional: MarkerBatcher._run(func, *args) passes them
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
