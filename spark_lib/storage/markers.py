"""Markers: a record, made *before* a data file is written, that the file may exist.

Rollback deletes exactly the marked files of an uncommitted instant, so its cost grows with the
markers, not with the table. Two formats live under ``<table>/_sparkguard/markers/<instant>/``
(docs/storage-contract.md, "Markers"):

* direct: one empty file per data file, ``<file>.marker.<CREATE|MERGE|APPEND>`` (``/`` in the
  data file's relative path kept as sub-directories);
* batched (written by the marker sidecar): ``MARKERS.type`` holding ``TIMELINE_SERVER_BASED``,
  and ``MARKERS0`` .. ``MARKERS<n-1>``, each a list of marker names, one per line.

:func:`snapshot_marker_dir` reads either (or both, mixed) and copes with a missing, empty or
wrong ``MARKERS.type`` (a warning, never a failure). A torn *last* line of a ``MARKERS<i>``
file (a crash mid-append: no newline, not a whole marker name) is expected and tolerated: it is
reported in :attr:`MarkerDirSnapshot.torn`, and rollback looks for its file by name prefix.
Anything else that is not a marker name raises :class:`~sparkguard.spark_lib.base.errors.
CorruptFileError` naming the file, the line and the fix.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Final, Protocol

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors, paths
from sparkguard.spark_lib.storage import timeline

MARKERS_DIR: Final = "markers"
TYPE_FILE: Final = "MARKERS.type"
BATCH_PREFIX: Final = "MARKERS"
_BATCH_FILE: Final = re.compile(r"^MARKERS(0|[1-9][0-9]{0,5})$")
_MARKER_SUFFIX: Final = re.compile(r"^(?P<file>.+)\.marker\.(?P<io>CREATE|MERGE|APPEND)$")


class MarkerType(enum.StrEnum):
    """How an instant's markers are stored."""

    DIRECT = "DIRECT"
    TIMELINE_SERVER_BASED = "TIMELINE_SERVER_BASED"


class IOType(enum.StrEnum):
    """What the marked write does to its file."""

    CREATE = "CREATE"
    MERGE = "MERGE"
    APPEND = "APPEND"


#: the marker modes as users write them everywhere (the annotation, ``spark-conf --markers``,
#: ``spark.sparkguard.markers.type``): ``sidecar`` (batched by the driver's marker sidecar) or
#: ``direct`` (written to storage by each task)
USER_SPELLING: Final[Mapping[MarkerType, str]] = {
    MarkerType.TIMELINE_SERVER_BASED: "sidecar",
    MarkerType.DIRECT: "direct",
}
#: other spellings still accepted, in any case and with ``-`` or ``_``: Hudi's names (the
#: values of ``MARKERS.type``), the annotation's former ``timeline-server``
_ALIASES: Final[Mapping[str, MarkerType]] = {
    "SIDECAR": MarkerType.TIMELINE_SERVER_BASED,
    "TIMELINE_SERVER": MarkerType.TIMELINE_SERVER_BASED,
    "TIMELINE_SERVER_BASED": MarkerType.TIMELINE_SERVER_BASED,
    "BATCHED": MarkerType.TIMELINE_SERVER_BASED,
    "DIRECT": MarkerType.DIRECT,
}


def parse_marker_type(value: str, *, key: str = "spark.sparkguard.markers.type") -> MarkerType:
    """Parse a marker mode: ``sidecar`` or ``direct``, in any case; ``timeline-server`` and
    ``TIMELINE_SERVER_BASED`` are accepted for ``sidecar``. A purely computational function."""
    found = _ALIASES.get(value.strip().upper().replace("-", "_"))
    if found is None:
        raise errors.ConfigError(
            f"{key}={value!r} is not a marker mode; use sidecar (batched by the driver's marker "
            "sidecar) or direct (markers written to storage by each task)"
        )
    return found


def marker_dir(table: str, instant: str) -> str:
    """The marker directory of ``instant`` in the table at path ``table``."""
    timeline.job_of_instant(instant)
    return paths.join(table, timeline.SPARKGUARD_DIR, MARKERS_DIR, instant)


def marker_name(data_file: str, io_type: IOType = IOType.CREATE) -> str:
    """The marker name of ``data_file`` (a path relative to the table)."""
    paths.validate_relative(data_file, what="data file")
    return f"{data_file}.marker.{io_type.value}"


def parse_marker_name(name: str) -> tuple[str, IOType]:
    """Split a marker name into the data file (relative path) and its IO type."""
    match = _MARKER_SUFFIX.match(name)
    if not match:
        raise errors.CorruptFileError(
            f"{name!r} is not a marker name (expected <file>.marker.CREATE|MERGE|APPEND)"
        )
    data_file = paths.validate_relative(match.group("file"), what="marked data file")
    return data_file, IOType(match.group("io"))


@dataclasses.dataclass(frozen=True)
class BatchContent:
    """The marker names of one ``MARKERS<i>`` file, and its torn last line (if any)."""

    names: tuple[str, ...]
    torn: str | None = None


def _is_marker_name(name: str) -> bool:
    try:
        parse_marker_name(name)
    except (errors.CorruptFileError, errors.InvalidPathError):
        return False
    return True


def parse_batch_content(content: bytes, *, source: str, lenient: bool = False) -> BatchContent:
    """Parse one ``MARKERS<i>`` file: one marker name per line, blank lines ignored.

    A last line without its newline that is not a whole marker name is *torn* (a crash
    mid-append) and returned apart. Any other line that is not a marker name raises
    :class:`CorruptFileError` naming ``source`` and the line; with ``lenient`` (a temp copy,
    never acknowledged as a whole) such lines are skipped instead.
    """
    lines = content.split(b"\n")
    tail = lines.pop()  # after the last newline: b"" for a well-formed file
    names: list[str] = []
    for number, raw in enumerate(lines, start=1):
        if not raw:
            continue
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError:
            name = ""
        if _is_marker_name(name):
            names.append(name)
        elif not lenient:
            raise errors.CorruptFileError(
                f"{source} line {number} is not a marker name ({raw[:80]!r}); expected "
                "'<data file>.marker.CREATE|MERGE|APPEND'. The file was damaged or not "
                "written by sparkguard: fix or remove that line (check whether the data file "
                "it meant exists and delete it if uncommitted), then run the rollback again"
            )
    torn = None
    if tail:
        text = tail.decode("utf-8", errors="replace")
        if _is_marker_name(text):
            names.append(text)  # whole name, only its newline is missing
        else:
            torn = text
    return BatchContent(tuple(names), torn)


def parse_batch_file(content: bytes, *, source: str) -> list[str]:
    """Marker names in one ``MARKERS<i>`` file (see :func:`parse_batch_content`; a torn last
    line is left out)."""
    return list(parse_batch_content(content, source=source).names)


def render_batch_file(names: Iterable[str]) -> bytes:
    """The content of a ``MARKERS<i>`` file holding ``names``."""
    return "".join(f"{name}\n" for name in names).encode()


def read_type(manager: filemanager.FileManager, directory: str) -> MarkerType | None:
    """The type written in ``MARKERS.type``, or ``None`` when missing or empty."""
    try:
        content = manager.read_bytes(paths.join(directory, TYPE_FILE)).decode().strip()
    except FileNotFoundError:
        return None
    if not content:
        return None
    return parse_marker_type(content, key=paths.join(directory, TYPE_FILE))


@dataclasses.dataclass(frozen=True)
class MarkerDirSnapshot:
    """What one listing of a marker directory showed: its files and the marker names in them.

    Rollback deletes the data files of :attr:`marked_files` and then exactly :attr:`files`
    (:func:`delete_snapshot`), never a marker that appeared after the listing: such a late
    marker (a zombie executor's) keeps the directory alive, so the next rollback pass finds it
    and its file. A ``MARKERS<i>`` file is deleted only if it still holds the content read
    here (:attr:`contents`); one rewritten since is read again first.
    """

    directory: str
    files: tuple[str, ...]
    names: frozenset[str]
    #: content of each batch file as read (path -> bytes)
    contents: Mapping[str, bytes] = dataclasses.field(default_factory=dict)
    #: torn last lines: (batch file, the partial text)
    torn: tuple[tuple[str, str], ...] = ()
    #: what is odd but harmless (a garbage or disagreeing ``MARKERS.type``)
    warnings: tuple[str, ...] = ()

    @property
    def marked_files(self) -> set[str]:
        """The data files (relative to the table) the markers name."""
        return {parse_marker_name(name)[0] for name in self.names}


def _type_warnings(directory: str, raw: bytes | None, *, batched: bool, direct: bool) -> list[str]:
    """Warnings about ``MARKERS.type`` vs. what the directory holds (purely computational)."""
    if raw is None or not raw.strip():
        return []
    where = paths.join(directory, TYPE_FILE)
    try:
        declared = parse_marker_type(raw.decode("utf-8"), key=where)
    except (errors.ConfigError, UnicodeDecodeError):
        return [
            f"{where} holds {raw[:40]!r}, not DIRECT or TIMELINE_SERVER_BASED; markers were "
            "read from the files present (both formats)"
        ]
    found = []
    if declared is MarkerType.DIRECT and batched:
        found.append("MARKERS<i> files")
    if declared is MarkerType.TIMELINE_SERVER_BASED and direct:
        found.append("direct marker files")
    if not found:
        return []
    return [
        f"{where} says {declared.value} but the directory holds {found[0]}; all of them were read"
    ]


def snapshot_marker_dir(manager: filemanager.FileManager, directory: str) -> MarkerDirSnapshot:
    """List ``directory`` once and read every marker in it, batched and direct alike.

    Reads what is there rather than trusting ``MARKERS.type``, so a missing, empty or wrong
    type file never hides a marker (a wrong one is reported in :attr:`warnings`). A temp copy
    of a batch file (an interrupted rewrite, or one a rollback set aside) is read too, leniently.
    """
    names: set[str] = set()
    files = []
    contents: dict[str, bytes] = {}
    torn: list[tuple[str, str]] = []
    type_raw: bytes | None = None
    batched = direct = False
    for info in _walk(manager, directory):
        files.append(info.path)
        relative = info.path[len(directory.rstrip("/")) + 1 :]
        base = paths.basename(relative)
        if relative == TYPE_FILE:
            with contextlib.suppress(FileNotFoundError):
                type_raw = manager.read_bytes(info.path)
            continue
        if filemanager.is_temp_name(base):
            target = filemanager.temp_target(base)
            if "/" not in relative and target is not None and _BATCH_FILE.match(target):
                with contextlib.suppress(FileNotFoundError):
                    content = manager.read_bytes(info.path)
                    names.update(parse_batch_content(content, source=info.path, lenient=True).names)
            continue
        if "/" not in relative and _BATCH_FILE.match(relative):
            batched = True
            try:
                content = manager.read_bytes(info.path)
            except FileNotFoundError:
                continue  # removed since the listing (a concurrent rollback)
            parsed = parse_batch_content(content, source=info.path)
            contents[info.path] = content
            names.update(parsed.names)
            if parsed.torn is not None:
                torn.append((info.path, parsed.torn))
        elif _MARKER_SUFFIX.match(relative) and _is_marker_name(relative):
            direct = True
            names.add(relative)
        else:
            raise errors.CorruptFileError(
                f"unexpected file {info.path} in marker directory {directory}; it is not a "
                "marker: move it elsewhere, then run the rollback again"
            )
    return MarkerDirSnapshot(
        directory,
        tuple(files),
        frozenset(names),
        contents=contents,
        torn=tuple(torn),
        warnings=tuple(_type_warnings(directory, type_raw, batched=batched, direct=direct)),
    )


def read_marker_names(manager: filemanager.FileManager, directory: str) -> set[str]:
    """Every marker name in ``directory``, from batched files and direct markers alike."""
    return set(snapshot_marker_dir(manager, directory).names)


def read_marked_files(manager: filemanager.FileManager, directory: str) -> set[str]:
    """The data files (relative to the table) marked in ``directory``, whatever the format."""
    return snapshot_marker_dir(manager, directory).marked_files


def list_marker_files(manager: filemanager.FileManager, directory: str) -> list[str]:
    """Every file of a marker directory (one recursive listing)."""
    return [info.path for info in _walk(manager, directory)]


def delete_marker_dir(
    manager: filemanager.FileManager,
    directory: str,
    keep: Collection[str] = (),
    listed: Iterable[str] | None = None,
) -> int:
    """Delete every file of a marker directory (or of ``listed``, a listing already made) but
    ``keep`` (paths); returns how many. Idempotent."""
    if listed is None:
        listed = list_marker_files(manager, directory)
    files = [path for path in listed if path not in keep]
    return _delete_marker_files(manager, directory, files)


def delete_snapshot(
    manager: filemanager.FileManager,
    snapshot: MarkerDirSnapshot,
    *,
    on_new_names: Callable[[set[str]], None] | None = None,
) -> int:
    """Delete exactly the files ``snapshot`` listed (not later ones); returns how many.

    A batch file rewritten since the snapshot (a sidecar append that landed after it was read)
    is not deleted unread: its new names go to ``on_new_names`` (which must deal with their
    files) and only then is that version deleted, compared again; without a callback the file
    is left for the next pass.
    """
    files = [p for p in snapshot.files if p not in snapshot.contents]
    seen = set(snapshot.names)
    removed = 0

    def changed(path: str) -> Callable[[bytes], None]:
        def handle(current: bytes) -> None:
            assert on_new_names is not None
            fresh = set(parse_batch_content(current, source=path).names) - seen
            if fresh:
                on_new_names({parse_marker_name(name)[0] for name in fresh})
                seen.update(fresh)

        return handle

    for path, content in snapshot.contents.items():
        if on_new_names is None:
            if manager.delete_if_unchanged(path, content) is None:
                removed += 1
            continue  # else left in place: the next pass reads it
        # The new version's names are handed over before that version is deleted (on local
        # disk while it is held aside, where no writer can change it).
        if manager.delete_if_unchanged(path, content, on_changed=changed(path)) is None:
            removed += 1
    return removed + _delete_marker_files(manager, snapshot.directory, files)


def _delete_marker_files(manager: filemanager.FileManager, directory: str, files: list[str]) -> int:
    # Markers first, MARKERS.type last: an interrupted delete still reads as a marker dir.
    files.sort(key=lambda p: p.endswith("/" + TYPE_FILE))
    manager.delete_many(files)
    if manager.kind is not filemanager.Kind.DIRECT_PUT:
        _remove_empty_dirs(manager, directory, files)
    return len(files)


def _walk(manager: filemanager.FileManager, directory: str) -> list[filemanager.FileInfo]:
    # Direct markers nest like their data files (``day=1/part-…marker.CREATE``): one
    # recursive listing, not one per partition directory.
    return manager.list_files(directory)


def _remove_empty_dirs(manager: filemanager.FileManager, directory: str, files: list[str]) -> None:
    """Remove the now empty directories of the deleted markers, deepest first; a directory
    that is not empty (a marker created since the listing) stays."""
    root = directory.rstrip("/")
    dirs = {root}
    for path in files:
        parent = paths.parent(path)
        while len(parent) > len(root) and parent.startswith(root + "/"):
            dirs.add(parent)
            parent = paths.parent(parent)
    for path in sorted(dirs, key=lambda d: d.count("/"), reverse=True):
        with contextlib.suppress(OSError):  # missing, or not empty
            manager.fs.rmdir(path)


class MarkerClient(Protocol):
    """What executors use to create markers: direct files or the sidecar, same interface."""

    def create(self, directory: str, data_file: str, io_type: IOType = IOType.CREATE) -> None:
        """Durably record that ``data_file`` may be written. Must return only once durable."""

    def all_marked(self, directory: str) -> set[str]:
        """Data files marked in ``directory``."""

    def seal(self, directory: str) -> set[str]:
        """The commit's read of its markers (W8): data files marked in ``directory``, after
        which no marker of it is acknowledged where the client can promise it (the sidecar)."""

    def delete_dir(self, directory: str) -> None:
        """Remove the marker directory (after commit, or at the end of a rollback)."""

    def close(self) -> None:
        """Release connections."""


class DirectMarkerClient:
    """One empty file per marker, written put-if-absent through the file manager.

    Marker directories may be given as URLs (``s3://b/t/_sparkguard/markers/<i>``) or as paths
    of the manager's filesystem; both name the same place.
    """

    def __init__(self, manager: filemanager.FileManager) -> None:
        self.manager = manager

    def _path(self, directory: str) -> str:
        return paths.validate_base(self.manager.fs._strip_protocol(directory), what="marker dir")

    def create(self, directory: str, data_file: str, io_type: IOType = IOType.CREATE) -> None:
        """Write ``<directory>/<data_file>.marker.<io>`` (already there is fine: a retry)."""
        target = paths.join(self._path(directory), marker_name(data_file, io_type))
        self.manager.put_if_absent(target, b"")

    def all_marked(self, directory: str) -> set[str]:
        """Data files marked in ``directory``."""
        return read_marked_files(self.manager, self._path(directory))

    def seal(self, directory: str) -> set[str]:
        """Data files marked in ``directory``. Direct markers cannot be sealed: each task puts
        its own, so one put after this read is a stray file (docs/storage-contract.md)."""
        return self.all_marked(directory)

    def delete_dir(self, directory: str) -> None:
        """Remove the marker directory."""
        delete_marker_dir(self.manager, self._path(directory))

    def close(self) -> None:
        """Nothing to release."""

    def write_type(self, directory: str) -> None:
        """Write ``MARKERS.type`` = DIRECT (informational; readers do not depend on it)."""
        path = self._path(directory)
        self.manager.mkdirs(path)
        self.manager.put_if_absent(paths.join(path, TYPE_FILE), MarkerType.DIRECT.value.encode())
