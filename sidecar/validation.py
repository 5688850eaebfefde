"""Validation of request parameters: marker directories and marker names.

Purely computational functions with no side-effects. Every rejection is a
:class:`~sparkguard.sidecar.errors.BadRequestError` (or ``ForbiddenDirError``) whose message
names the parameter and says what to send instead.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Final

from sparkguard.sidecar import errors
from sparkguard.spark_lib.base import errors as lib_errors
from sparkguard.spark_lib.base import paths
from sparkguard.spark_lib.storage import markers, timeline

MAX_DIR_LENGTH: Final = 2048
#: S3's (and GCS's) limit on an object key, in UTF-8 bytes
MAX_OBJECT_KEY_BYTES: Final = 1024
MAX_MARKER_NAME_LENGTH: Final = paths.MAX_NAME_LENGTH + len(".marker.APPEND")
_FORBIDDEN_CHARS: Final = re.compile(r"[\x00-\x1f\x7f\\]")
_MARKER_SUFFIX: Final = re.compile(r"\.marker\.(CREATE|MERGE|APPEND)$")
#: protocols whose URLs name the same store (and so the same marker files)
_CANONICAL_PROTOCOL: Final = {"file": "file", "local": "file", "s3a": "s3"}


@dataclasses.dataclass(frozen=True)
class MarkerDir:
    """A validated marker directory.

    ``key`` is canonical (``file://`` dropped, ``s3a`` read as ``s3``), so two spellings of one
    directory share one in-memory state and never race on its files.
    """

    key: str
    protocol: str
    path: str
    instant: str


def validate_marker_dir(raw: str | None, *, allowed_roots: Sequence[str]) -> MarkerDir:
    """Check ``markerdir``: ``<allowed root>/.../_sparkguard/markers/<instant id>``."""
    if raw is None or not raw.strip():
        raise errors.BadRequestError(
            "markerdir is missing: send the marker directory URL, "
            "e.g. markerdir=s3://bucket/table/_sparkguard/markers/<instant>"
        )
    if len(raw) > MAX_DIR_LENGTH:
        raise errors.BadRequestError(
            f"markerdir is {len(raw)} characters long; the limit is {MAX_DIR_LENGTH}"
        )
    _require_utf8(raw, what="markerdir")
    if _FORBIDDEN_CHARS.search(raw):
        raise errors.BadRequestError(
            "markerdir contains a backslash or control character; send a plain URL or path"
        )
    value = raw.strip().rstrip("/")
    if value.startswith("file://"):
        value = value[len("file://") :]
    if "://" in value:
        scheme, rest = value.split("://", 1)
        protocol = _CANONICAL_PROTOCOL.get(scheme.lower(), scheme.lower())
        path = rest
        key = f"{protocol}://{rest}"
        segments = rest.split("/")
        object_key = rest.partition("/")[2]
        if len(object_key.encode()) + len("/MARKERS999999") > MAX_OBJECT_KEY_BYTES:
            raise errors.BadRequestError(
                f"markerdir's object key is {len(object_key.encode())} bytes long; object stores "
                f"take keys of at most {MAX_OBJECT_KEY_BYTES} bytes, including the marker file "
                "names: use a shorter table path"
            )
    else:
        if not value.startswith("/"):
            raise errors.BadRequestError(
                f"markerdir {raw!r} is a relative path; send an absolute path or a URL"
            )
        protocol, path, key = "file", value, value
        segments = value.split("/")[1:]
    _check_segments(raw, segments)
    if len(segments) < 4 or segments[-3:-1] != [timeline.SPARKGUARD_DIR, markers.MARKERS_DIR]:
        raise errors.BadRequestError(
            f"markerdir {raw!r} is not a marker directory; it must end with "
            f"/{timeline.SPARKGUARD_DIR}/{markers.MARKERS_DIR}/<instant id>"
        )
    instant = segments[-1]
    try:
        timeline.validate_job_id(timeline.job_of_instant(instant), what="its job id")
    except lib_errors.CorruptFileError:
        raise errors.BadRequestError(
            f"markerdir {raw!r} ends with {instant[:80]!r}, which is not an instant id "
            "(<yyyyMMddHHmmssSSS>-<job id>)"
        ) from None
    except lib_errors.ConfigError as exc:
        raise errors.BadRequestError(
            f"markerdir ends with instant {instant[:80]!r}, whose job id is invalid ({exc})"
        ) from None
    if not any(_is_under(key, root) for root in allowed_roots):
        raise errors.ForbiddenDirError(
            f"markerdir {raw!r} is outside the sidecar's allowed roots "
            f"({', '.join(allowed_roots)}); write markers under one of them or add the table's "
            "location to SPARKGUARD_SIDECAR_ALLOWED_ROOTS"
        )
    return MarkerDir(key=key, protocol=protocol, path=path, instant=instant)


def _check_segments(raw: str, segments: Sequence[str]) -> None:
    if any(segment in ("", ".", "..") for segment in segments):
        raise errors.BadRequestError(
            f"markerdir {raw!r} has an empty, '.' or '..' segment; send the resolved path"
        )
    for segment in segments:
        # Checked before any storage call: no store takes a longer name, and the store's error
        # would read as an outage (503) that clients retry in vain.
        if len(segment.encode()) > paths.MAX_SEGMENT_LENGTH:
            raise errors.BadRequestError(
                f"markerdir has a segment of {len(segment.encode())} bytes "
                f"({segment[:40]!r}...); the limit is {paths.MAX_SEGMENT_LENGTH} bytes per "
                "segment: use a shorter table path"
            )


def _is_under(key: str, root: str) -> bool:
    if "://" in root:
        scheme, rest = root.split("://", 1)
        root = f"{_CANONICAL_PROTOCOL.get(scheme, scheme)}://{rest}"
    return key.startswith(root.rstrip("/") + "/")


def validate_marker_name(raw: str | None, *, io_type: markers.IOType, any_io: bool) -> str:
    """Check ``markername`` and return the full marker name ``<file>.marker.<IO>``.

    ``raw`` may be the full marker name or just the data file (relative to the table), in which
    case ``io_type`` is appended. With ``any_io`` (the generic ``create`` route) a full name may
    carry any IO type; otherwise it must carry ``io_type``.
    """
    if raw is None or not raw:
        raise errors.BadRequestError(
            "markername is missing: send the data file's path relative to the table "
            "(e.g. part-00003-<job>-c000.parquet), optionally with its .marker.<IO> suffix"
        )
    _require_utf8(raw, what="markername")
    if len(raw) > MAX_MARKER_NAME_LENGTH:
        raise errors.BadRequestError(
            f"markername is {len(raw)} characters long; the limit is {MAX_MARKER_NAME_LENGTH}"
        )
    for segment in _MARKER_SUFFIX.sub("", raw).split("/"):
        if len(segment.encode()) > paths.MAX_SEGMENT_LENGTH:
            raise errors.BadRequestError(
                f"markername has a segment of {len(segment.encode())} bytes "
                f"({segment[:40]!r}...); the limit is {paths.MAX_SEGMENT_LENGTH} bytes per "
                "segment of the data file's path"
            )
    try:
        if _MARKER_SUFFIX.search(raw):
            data_file, given_io = markers.parse_marker_name(raw)
            if not any_io and given_io is not io_type:
                raise errors.BadRequestError(
                    f"markername {raw!r} has IO type {given_io.value} but this route records "
                    f"{io_type.value}; use the matching route or drop the suffix"
                )
            return markers.marker_name(data_file, given_io)
        return markers.marker_name(raw, io_type)
    except lib_errors.SparkguardError as exc:
        raise errors.BadRequestError(f"markername is invalid: {exc}") from None


def _require_utf8(raw: str, *, what: str) -> None:
    # A lone surrogate is what Python makes of a file name that is not UTF-8 (PEP 383); JSON
    # can carry it ("\udc80"), but no marker file can store it.
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise errors.BadRequestError(
            f"{what} {raw[:80]!r} is not valid Unicode (a lone surrogate at position "
            f"{exc.start}, e.g. from a file name that is not UTF-8); name the files in UTF-8"
        ) from None
