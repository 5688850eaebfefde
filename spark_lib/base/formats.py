"""Versioned JSON documents: every file sparkguard writes carries ``kind`` and ``version``.

Readers reject unknown versions and corrupt content with a clear error; nothing is silently
skipped. Purely computational functions with no side-effects.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sparkguard.spark_lib.base import errors


def encode(kind: str, version: int, body: Mapping[str, Any]) -> bytes:
    """Serialise ``body`` as a ``kind`` document of format ``version`` (UTF-8 JSON)."""
    document = {"kind": kind, "version": version, **body}
    return (json.dumps(document, sort_keys=True, separators=(",", ":")) + "\n").encode()


def decode(data: bytes, *, kind: str, versions: frozenset[int], source: str) -> dict[str, Any]:
    """Parse a ``kind`` document whose version is one of ``versions``.

    Raises :class:`~sparkguard.spark_lib.base.errors.CorruptFileError` for content that is not such
    a document and :class:`~sparkguard.spark_lib.base.errors.UnsupportedVersionError` for a version
    this library does not know; both name ``source`` (the file).
    """
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise errors.CorruptFileError(
            f"{source} is not valid JSON ({exc}); it was not written by sparkguard or was "
            "damaged. Inspect it, then move it aside if it is garbage"
        ) from None
    if not isinstance(document, dict):
        raise errors.CorruptFileError(f"{source} holds {type(document).__name__}, not an object")
    if document.get("kind") != kind:
        raise errors.CorruptFileError(
            f"{source} is a {document.get('kind')!r} document where a {kind!r} was expected"
        )
    version = document.get("version")
    if version not in versions:
        known = ", ".join(str(v) for v in sorted(versions))
        raise errors.UnsupportedVersionError(
            f"{source} has format version {version!r}; this sparkguard reads version(s) {known}. "
            "Upgrade sparkguard to read it"
        )
    return document


def require(document: Mapping[str, Any], key: str, kind: type, *, source: str) -> Any:
    """``document[key]``, checked to be a ``kind``; a clear error names the field otherwise."""
    if key not in document:
        raise errors.CorruptFileError(f"{source} lacks the required field {key!r}")
    value = document[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise errors.CorruptFileError(
            f"{source} field {key!r} should be {kind.__name__}, got {type(value).__name__}"
        )
    return value
