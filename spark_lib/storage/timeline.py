"""The timeline of a table: instants that are inflight, then decided exactly once.

Layout under ``<table>/_sparkguard/timeline/`` (docs/storage-contract.md, "Timeline")::

    <instant>.inflight     written when a write starts (job id, owner, attempt, marker type, ...)
    <instant>.outcome      "committed" + files | "rolled_back": put-if-absent, decided once
    <instant>.rolledback   the names a rollback found marked and what it deleted

An instant id is ``<UTC yyyyMMddHHmmssSSS>-<jobId>``: it sorts by start time and names its job,
so a rollback finds the instants of one job from a single listing. The outcome file is written
put-if-absent by both a committing driver and a rollback: of the two, exactly one wins. A driver
whose instant a rollback claimed first (a zombie) gets :class:`InstantDecidedError` on commit.

Every instant has an *owner* (``"owner"`` in its ``.inflight``; ``job:<jobId>`` when the writer
was given none, and for inflight files written before owners existed). A rollback touches only
the undecided instants of the owner it was asked about (see ``rollback``).
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors, formats, paths

SPARKGUARD_DIR: Final = "_sparkguard"
TIMELINE_DIR: Final = "timeline"
INFLIGHT_KIND: Final = "sparkguard.instant.inflight"
OUTCOME_KIND: Final = "sparkguard.instant.outcome"
ROLLEDBACK_KIND: Final = "sparkguard.instant.rolledback"
VERSION: Final = 1

JOB_ID_PATTERN: Final = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,98}[a-z0-9])?$")
_INSTANT_PATTERN: Final = re.compile(r"^(?P<ts>[0-9]{17})-(?P<job>[a-z0-9][a-z0-9.-]*)$")
_SUFFIXES: Final = (".inflight", ".outcome", ".rolledback")
OWNER_MAX_LENGTH: Final = 256
DEFAULT_OWNER_PREFIX: Final = "job:"


class Outcome(enum.StrEnum):
    """How an instant was decided."""

    COMMITTED = "committed"
    ROLLED_BACK = "rolled_back"


class State(enum.StrEnum):
    """Where an instant stands, as derived from its files."""

    INFLIGHT = "inflight"  # started, undecided: a running write, or a failed one to roll back
    COMMITTED = "committed"
    ROLLING_BACK = "rolling_back"  # fate decided (rolled back), cleanup not finished
    ROLLED_BACK = "rolled_back"


def validate_job_id(job_id: str, *, what: str = "job id") -> str:
    """Return ``job_id`` if it is usable in file names and instant ids, else raise ConfigError.

    Lower-case letters, digits, ``-`` and ``.``; starts and ends alphanumeric; at most 100.
    """
    if not isinstance(job_id, str) or not JOB_ID_PATTERN.fullmatch(job_id):
        raise errors.ConfigError(
            f"{what} {job_id!r} is not valid: use 1-100 lower-case letters, digits, '-' or '.', "
            "starting and ending with a letter or digit (e.g. 'nightly-sales-2026-11-22')"
        )
    return job_id


def default_owner(job_id: str) -> str:
    """The owner of an instant whose writer was given none: ``job:<jobId>``."""
    return f"{DEFAULT_OWNER_PREFIX}{job_id}"


def validate_owner(owner: str, *, what: str = "owner") -> str:
    """Return ``owner`` if it is a usable instant owner, else raise ConfigError.

    1-256 printable characters (no control characters), e.g. ``k8s:<namespace>/<name>/<id>``.
    """
    if (
        not isinstance(owner, str)
        or not owner.strip()
        or len(owner) > OWNER_MAX_LENGTH
        or not owner.isprintable()
    ):
        raise errors.ConfigError(
            f"{what} {owner!r} is not valid: use 1-{OWNER_MAX_LENGTH} printable characters "
            "without control characters (e.g. 'k8s:spark-jobs/nightly/4f2a9c')"
        )
    return owner


def job_of_instant(instant: str) -> str:
    """The job id encoded in an instant id."""
    match = _INSTANT_PATTERN.fullmatch(instant)
    if not match:
        raise errors.CorruptFileError(f"{instant!r} is not a sparkguard instant id")
    return match.group("job")


def _now_millis() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y%m%d%H%M%S%f")[:-3]


@dataclasses.dataclass(frozen=True)
class DataFile:
    """A data file an instant committed: path relative to the table, size in bytes, rows,
    ``temp``: where a rename store's task left it for the driver to publish after the outcome
    (relative to the table, in the file's directory; None when written under its name), and
    ``upload``: the id of the multipart upload an object store's task left open at its name for
    the driver to complete after the outcome (None: the object was written whole)."""

    path: str
    size: int
    rows: int
    temp: str | None = None
    upload: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON form stored in an outcome file (without ``temp`` and ``upload``: a record of
        what is published, as snapshots keep it)."""
        return {"path": self.path, "size": self.size, "rows": self.rows}

    def to_outcome_json(self) -> dict[str, Any]:
        """The JSON form in a committed outcome: :meth:`to_json` plus ``temp``/``upload`` when
        the file is published after the outcome (docs/storage-contract.md, W9)."""
        value = self.to_json()
        if self.temp is not None:
            value["temp"] = self.temp
        if self.upload is not None:
            value["upload"] = self.upload
        return value

    @classmethod
    def from_json(cls, value: Any, *, source: str) -> DataFile:
        """Parse one entry of an outcome's ``files`` list."""
        if not isinstance(value, dict):
            raise errors.CorruptFileError(f"{source}: a files entry is not an object")
        path = paths.validate_relative(
            formats.require(value, "path", str, source=source), what="committed file"
        )
        temp = value.get("temp")
        if temp is not None and not _is_temp_of(temp, path):
            raise errors.CorruptFileError(
                f"{source}: temp {temp!r} of {path} is not a temp name in its directory"
            )
        upload = value.get("upload")
        if upload is not None and (not isinstance(upload, str) or not upload):
            raise errors.CorruptFileError(f"{source}: upload of {path} is not an upload id")
        return cls(
            path=path,
            size=formats.require(value, "size", int, source=source),
            rows=formats.require(value, "rows", int, source=source),
            temp=temp,
            upload=upload,
        )


def _is_temp_of(temp: Any, path: str) -> bool:
    """Whether ``temp`` is the contract's temp name of ``path`` in ``path``'s directory."""
    if not isinstance(temp, str) or paths.parent(temp) != paths.parent(path):
        return False
    return filemanager.temp_target(temp) == paths.basename(path)


@dataclasses.dataclass(frozen=True)
class InstantInfo:
    """What ``<instant>.inflight`` says about a write."""

    instant: str
    job_id: str
    attempt: int
    marker_type: str
    operation: str
    started: str
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: who started the write (``job:<jobId>`` when the inflight names none)
    owner: str = ""
    #: the write identity: the n-th write of this job to this table in its driver run
    write: int | None = None


@dataclasses.dataclass(frozen=True)
class InstantStatus:
    """An instant and its files, read at one moment."""

    instant: str
    info: InstantInfo | None
    outcome: Outcome | None
    files: tuple[DataFile, ...]
    rolledback: Mapping[str, Any] | None
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def state(self) -> State:
        """The state derived from which files exist."""
        if self.outcome is Outcome.COMMITTED:
            return State.COMMITTED
        if self.outcome is Outcome.ROLLED_BACK:
            return State.ROLLED_BACK if self.rolledback is not None else State.ROLLING_BACK
        return State.INFLIGHT

    @property
    def job_id(self) -> str:
        """The job that opened this instant."""
        return job_of_instant(self.instant)

    @property
    def owner(self) -> str:
        """Who started the write (``job:<jobId>`` when unknown: no or an old ``.inflight``)."""
        if self.info is not None and self.info.owner:
            return self.info.owner
        return default_owner(self.job_id)

    @property
    def rolled_back_names(self) -> frozenset[str]:
        """Data files (relative) a rollback of this instant found marked (``.rolledback``)."""
        raw = (self.rolledback or {}).get("marked") or []
        return frozenset(n for n in raw if isinstance(n, str))


def info_of_document(doc: Mapping[str, Any], *, instant: str, source: str) -> InstantInfo:
    """The :class:`InstantInfo` of a decoded ``.inflight`` document (raises CorruptFileError)."""
    job_id = formats.require(doc, "jobId", str, source=source)
    owner = doc.get("owner", default_owner(job_id))
    if not isinstance(owner, str) or not owner:
        raise errors.CorruptFileError(f"{source} field 'owner' should be a non-empty string")
    write = doc.get("write")
    if write is not None and (not isinstance(write, int) or isinstance(write, bool)):
        raise errors.CorruptFileError(f"{source} field 'write' should be int")
    extra = doc.get("extra") or {}
    if not isinstance(extra, dict):
        raise errors.CorruptFileError(f"{source} field 'extra' should be an object")
    return InstantInfo(
        instant=instant,
        job_id=job_id,
        attempt=formats.require(doc, "attempt", int, source=source),
        marker_type=formats.require(doc, "markerType", str, source=source),
        operation=formats.require(doc, "operation", str, source=source),
        started=formats.require(doc, "started", str, source=source),
        extra=extra,
        owner=owner,
        write=write,
    )


def outcome_of_document(
    doc: Mapping[str, Any], *, source: str
) -> tuple[Outcome, tuple[DataFile, ...], Mapping[str, Any]]:
    """Outcome, files and ``extra`` of a decoded ``.outcome`` document (raises
    CorruptFileError)."""
    raw = formats.require(doc, "outcome", str, source=source)
    try:
        outcome = Outcome(raw)
    except ValueError:
        raise errors.CorruptFileError(f"{source} has unknown outcome {raw!r}") from None
    files = tuple(
        DataFile.from_json(f, source=source)
        for f in formats.require(doc, "files", list, source=source)
    )
    extra = doc.get("extra") or {}
    if not isinstance(extra, dict):
        raise errors.CorruptFileError(f"{source} field 'extra' should be an object")
    return outcome, files, extra


class Timeline:
    """The instants of one table, and the put-if-absent decisions about them."""

    def __init__(self, manager: filemanager.FileManager, table: str) -> None:
        self.manager = manager
        self.table = paths.validate_base(table, what="table path")
        self.directory = paths.join(self.table, SPARKGUARD_DIR, TIMELINE_DIR)

    def exists(self) -> bool:
        """Whether the table has a timeline: its directory, or (object stores list no empty
        directory) its snapshots when compaction archived every instant. A deleted table has
        neither."""
        return self.manager.exists(self.directory) or self.manager.exists(
            paths.join(self.table, SPARKGUARD_DIR, "snapshots")
        )

    def _path(self, instant: str, suffix: str) -> str:
        job_of_instant(instant)
        return paths.join(self.directory, instant + suffix)

    # -- writes -------------------------------------------------------------------------------
    def start(
        self,
        job_id: str,
        *,
        attempt: int,
        marker_type: str,
        operation: str = "append",
        extra: Mapping[str, Any] | None = None,
        owner: str | None = None,
        write: int | None = None,
    ) -> str:
        """Open a new instant for ``job_id`` and write its ``.inflight``; returns the instant id.

        ``owner`` (default ``job:<jobId>``) is recorded: rollbacks of other owners leave the
        instant alone while it is undecided. ``write`` (the write identity) is recorded when
        given. Two writers never get the same instant: the inflight file is put-if-absent and
        a loser retries with the next millisecond.
        """
        validate_job_id(job_id)
        owner = validate_owner(owner) if owner is not None else default_owner(job_id)
        self.manager.mkdirs(self.directory)
        body: dict[str, Any] = {
            "jobId": job_id,
            "owner": owner,
            "attempt": attempt,
            "markerType": marker_type,
            "operation": operation,
            "started": datetime.datetime.now(datetime.UTC).isoformat(),
            "extra": dict(extra or {}),
        }
        if write is not None:
            body["write"] = write
        for _ in range(1000):
            instant = f"{_now_millis()}-{job_id}"
            data = formats.encode(INFLIGHT_KIND, VERSION, {"instant": instant, **body})
            if self.manager.put_if_absent(self._path(instant, ".inflight"), data):
                return instant
            time.sleep(0.001)
        raise errors.SparkguardError(f"could not allocate an instant for job {job_id!r}")

    def commit(
        self,
        instant: str,
        files: Sequence[DataFile],
        *,
        extra: Mapping[str, Any] | None = None,
        write: int | None = None,
    ) -> None:
        """Decide ``instant`` as committed, listing its ``files`` (put-if-absent).

        ``write`` (the write identity, as in the ``.inflight``) is recorded when given.

        Raises :class:`InstantDecidedError` when the instant was already decided, e.g. by a
        rollback that claimed it first: then nothing of this commit is published.
        """
        body: dict[str, Any] = {
            "instant": instant,
            "outcome": Outcome.COMMITTED.value,
            "decided": datetime.datetime.now(datetime.UTC).isoformat(),
            "files": [f.to_outcome_json() for f in files],
            "extra": dict(extra or {}),
        }
        if write is not None:
            body["write"] = write
        data = formats.encode(OUTCOME_KIND, VERSION, body)
        outcome_path = self._path(instant, ".outcome")
        if not self.manager.put_if_absent(outcome_path, data):
            decided = self.read_outcome(instant)
            outcome = decided[0].value if decided else "unknown"
            raise errors.InstantDecidedError(
                f"instant {instant} of {self.table} was already decided as {outcome}; this "
                "commit is refused and publishes nothing (a rollback or another committer won)",
                instant=instant,
                outcome=outcome,
            )
        # W9, second half: a compactor deletes an archived instant's .inflight before its
        # outcome, so a put that won without an .inflight beside it is a zombie's commit of an
        # instant decided and archived long ago: withdraw it (readers ignore it meanwhile).
        if not self.manager.exists(self._path(instant, ".inflight")):
            self.manager.delete(outcome_path)
            raise errors.InstantDecidedError(
                f"instant {instant} of {self.table} was decided and archived before this "
                "commit (its .inflight is gone); this commit is refused and publishes nothing",
                instant=instant,
                outcome="archived",
            )

    def claim_rollback(self, instant: str) -> bool:
        """Decide ``instant`` as rolled back unless a commit came first.

        Returns ``True`` when the instant's fate is (now, or already was) rolled back, so the
        caller may delete its files; ``False`` when it is committed and must be left alone.
        """
        data = formats.encode(
            OUTCOME_KIND,
            VERSION,
            {
                "instant": instant,
                "outcome": Outcome.ROLLED_BACK.value,
                "decided": datetime.datetime.now(datetime.UTC).isoformat(),
                "files": [],
                "extra": {},
            },
        )
        if self.manager.put_if_absent(self._path(instant, ".outcome"), data):
            return True
        decided = self.read_outcome(instant)
        return decided is not None and decided[0] is Outcome.ROLLED_BACK

    def record_rolled_back(self, instant: str, summary: Mapping[str, Any]) -> None:
        """Write ``<instant>.rolledback`` with what the rollback deleted (after the fact).

        ``summary`` holds the fields of docs/storage-contract.md (``marked``, ``deleted``: the
        names actually removed, ``absent``: marked names that had no file, ...).
        """
        data = formats.encode(
            ROLLEDBACK_KIND,
            VERSION,
            {
                "instant": instant,
                "finished": datetime.datetime.now(datetime.UTC).isoformat(),
                **dict(summary),
            },
        )
        self.manager.write_bytes(self._path(instant, ".rolledback"), data, overwrite=True)

    # -- reads --------------------------------------------------------------------------------
    def read_info(self, instant: str) -> InstantInfo | None:
        """The parsed ``.inflight`` of ``instant``, or ``None`` when it is missing."""
        doc = self.read_inflight_document(instant)
        if doc is None:
            return None
        return info_of_document(doc, instant=instant, source=self._path(instant, ".inflight"))

    def read_inflight_document(self, instant: str) -> dict[str, Any] | None:
        """The ``.inflight`` document of ``instant`` (kind and version checked), or ``None``."""
        return self._read_document(instant, ".inflight", INFLIGHT_KIND)

    def _read_document(self, instant: str, suffix: str, kind: str) -> dict[str, Any] | None:
        """The versioned JSON ``<instant><suffix>`` of ``kind``, or ``None`` when missing."""
        path = self._path(instant, suffix)
        try:
            data = self.manager.read_bytes(path)
        except FileNotFoundError:
            return None
        return formats.decode(data, kind=kind, versions=frozenset({VERSION}), source=path)

    def read_outcome(
        self, instant: str
    ) -> tuple[Outcome, tuple[DataFile, ...], Mapping[str, Any]] | None:
        """The decided outcome of ``instant`` with its files, or ``None`` when undecided."""
        doc = self.read_outcome_document(instant)
        if doc is None:
            return None
        return outcome_of_document(doc, source=self._path(instant, ".outcome"))

    def read_outcome_document(self, instant: str) -> dict[str, Any] | None:
        """The checked ``.outcome`` document of ``instant``, or ``None`` when it is missing."""
        doc = self._read_document(instant, ".outcome", OUTCOME_KIND)
        if doc is not None:
            outcome_of_document(doc, source=self._path(instant, ".outcome"))
        return doc

    def read_rolledback(self, instant: str) -> dict[str, Any] | None:
        """The rollback summary of ``instant``, or ``None``."""
        return self._read_document(instant, ".rolledback", ROLLEDBACK_KIND)

    def instant_ids(self, *, job_id: str | None = None) -> list[str]:
        """Instant ids in start order (one listing), optionally only those of ``job_id``.

        An instant without ``.inflight`` is left out: it is void (a zombie's commit after its
        instant was archived, or a stray file of an archived instant; docs/storage-contract.md,
        "Zombie commits after archiving"); nothing reads or decides it.
        """
        return sorted(
            instant
            for instant, suffixes in self.files_by_instant(job_id=job_id).items()
            if ".inflight" in suffixes
        )

    def files_by_instant(self, *, job_id: str | None = None) -> dict[str, set[str]]:
        """Instant id -> the suffixes of its files (``.inflight``, ``.outcome``,
        ``.rolledback``), from one listing of the timeline, optionally only ``job_id``'s."""
        found: dict[str, set[str]] = {}
        for info in self.manager.list(self.directory):
            name = info.name
            if filemanager.is_temp_name(name):
                continue
            for suffix in _SUFFIXES:
                if name.endswith(suffix):
                    instant = name[: -len(suffix)]
                    break
            else:
                raise errors.CorruptFileError(
                    f"unexpected file {info.path} in timeline {self.directory}; move it elsewhere"
                )
            if not _INSTANT_PATTERN.fullmatch(instant):
                raise errors.CorruptFileError(f"{info.path} is not named by an instant id")
            if job_id is None or job_of_instant(instant) == job_id:
                found.setdefault(instant, set()).add(name[len(instant) :])
        return found

    def status(self, instant: str) -> InstantStatus:
        """Everything the timeline knows about ``instant``."""
        decided = self.read_outcome(instant)
        return InstantStatus(
            instant=instant,
            info=self.read_info(instant),
            outcome=decided[0] if decided else None,
            files=decided[1] if decided else (),
            rolledback=self.read_rolledback(instant),
            extra=decided[2] if decided else {},
        )

    def statuses(self, *, job_id: str | None = None) -> list[InstantStatus]:
        """:meth:`status` of every instant (of ``job_id`` when given), in start order."""
        return [self.status(i) for i in self.instant_ids(job_id=job_id)]

    def committed_files(self, *, instants: Iterable[str] | None = None) -> dict[str, str]:
        """Relative path -> committing instant, over committed instants (all, or ``instants``)."""
        result: dict[str, str] = {}
        for instant in self.instant_ids() if instants is None else instants:
            decided = self.read_outcome(instant)
            if decided and decided[0] is Outcome.COMMITTED:
                for data_file in decided[1]:
                    result[data_file.path] = instant
        return result


def timeline_for(url: str, **resolve_kwargs: Any) -> Timeline:
    """The timeline of the table at ``url`` (see :func:`filemanager.resolve` for options)."""
    manager, path = filemanager.resolve(url, **resolve_kwargs)
    return Timeline(manager, path)
