"""Validation and joining of the names sparkguard writes: no traversal, no surprises.

Purely computational functions with no side-effects.
"""

from __future__ import annotations

import posixpath
import re

from sparkguard.spark_lib.base import errors

#: Longest single path segment we accept (S3 keys are at most 1024 bytes in total).
MAX_SEGMENT_LENGTH = 255
#: Longest relative name (several segments) we accept.
MAX_NAME_LENGTH = 1024

_FORBIDDEN_CHARS = re.compile(r"[\x00-\x1f\x7f\\]")


def validate_segment(segment: str, *, what: str = "name") -> str:
    """Return ``segment`` if it is one safe path segment, else raise :class:`InvalidPathError`.

    Safe means: non-empty, not ``.`` or ``..``, no ``/``, no backslash or control characters,
    at most :data:`MAX_SEGMENT_LENGTH` characters.
    """
    if not isinstance(segment, str) or not segment:
        raise errors.InvalidPathError(f"{what} must be a non-empty string, got {segment!r}")
    if segment in (".", ".."):
        raise errors.InvalidPathError(
            f"{what} {segment!r} is a relative reference; use a plain name without '.' or '..'"
        )
    if "/" in segment:
        raise errors.InvalidPathError(f"{what} {segment!r} must be a single segment without '/'")
    if _FORBIDDEN_CHARS.search(segment):
        raise errors.InvalidPathError(
            f"{what} {segment!r} contains a backslash or control character; remove it"
        )
    if len(segment) > MAX_SEGMENT_LENGTH:
        raise errors.InvalidPathError(
            f"{what} is {len(segment)} characters long; the limit is {MAX_SEGMENT_LENGTH}"
        )
    return segment


def validate_relative(name: str, *, what: str = "name") -> str:
    """Return ``name`` if it is a safe relative path (segments joined by ``/``).

    Rejects absolute paths, empty segments (``a//b``), ``.``/``..`` segments and names longer
    than :data:`MAX_NAME_LENGTH`.
    """
    if not isinstance(name, str) or not name:
        raise errors.InvalidPathError(f"{what} must be a non-empty string, got {name!r}")
    if name.startswith("/"):
        raise errors.InvalidPathError(f"{what} {name!r} is absolute; give a relative name")
    if len(name) > MAX_NAME_LENGTH:
        raise errors.InvalidPathError(
            f"{what} is {len(name)} characters long; the limit is {MAX_NAME_LENGTH}"
        )
    for segment in name.split("/"):
        validate_segment(segment, what=f"segment of {what} {name!r}")
    return name


def validate_base(path: str, *, what: str = "path") -> str:
    """Return a normalised base path (no protocol) or raise if it contains traversal.

    Absolute local paths are allowed here; ``..`` segments and empty paths are not.
    """
    if not isinstance(path, str) or not path.strip():
        raise errors.InvalidPathError(f"{what} must be a non-empty path, got {path!r}")
    if "\x00" in path:
        raise errors.InvalidPathError(f"{what} {path!r} contains a NUL character")
    segments = path.split("/")
    if ".." in segments:
        raise errors.InvalidPathError(
            f"{what} {path!r} contains '..'; give the resolved path instead"
        )
    trimmed = path.rstrip("/")
    return trimmed or "/"


def join(base: str, *names: str) -> str:
    """Join validated relative ``names`` under ``base`` with ``/``."""
    for name in names:
        validate_relative(name)
    return posixpath.join(base, *names) if names else base


def basename(path: str) -> str:
    """The last segment of a ``/``-separated path."""
    return path.rstrip("/").rsplit("/", 1)[-1]


def parent(path: str) -> str:
    """Everything before the last segment of a ``/``-separated path."""
    head = path.rstrip("/").rsplit("/", 1)
    return head[0] if len(head) == 2 and head[0] else "/" if path.startswith("/") else ""
