"""Spark's streaming file-sink manifest (``<sink>/_spark_metadata``), read-only.

Spark's file sink commits micro-batch ``b`` by writing ``_spark_metadata/<b>`` put-if-absent:
the data files the batch added, one JSON object per line after a ``v1`` header. Every
``compactInterval`` batches it writes ``<b>.compact`` instead, holding every file up to ``b``
(and may later delete the batch files before it). For a sink written through
``SparkguardStreamingCommitProtocol`` this manifest is the source of truth of what is committed
(docs/storage-contract.md, "The streaming file sink"): rollback never deletes a file it lists,
and an instant whose batch it committed is recorded as committed, never rolled back.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from typing import Final

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors, paths

MANIFEST_DIR: Final = "_spark_metadata"
_ENTRY_NAME: Final = re.compile(r"^(0|[1-9][0-9]*)(\.compact)?$")
_VERSION_HEADER: Final = re.compile(r"^v([0-9]+)$")
#: The newest manifest format this reader knows (Spark's FileStreamSinkLog.VERSION).
MAX_VERSION: Final = 1


def manifest_dir(table: str) -> str:
    """``<table>/_spark_metadata``."""
    return paths.join(table, MANIFEST_DIR)


def _entries(manager: filemanager.FileManager, table: str) -> list[tuple[int, bool, str]]:
    """(batch id, is compact, path) of every manifest entry, oldest first; temp files skipped."""
    directory = manifest_dir(table)
    found = []
    for info in manager.list(directory):  # empty when there is no manifest: one request
        match = _ENTRY_NAME.match(info.name)
        if match and not info.is_dir:
            found.append((int(match.group(1)), match.group(2) is not None, info.path))
    return sorted(found)


def latest_batch(manager: filemanager.FileManager, table: str) -> int | None:
    """The highest batch id the sink's manifest committed, or None (no manifest)."""
    entries = _entries(manager, table)
    return entries[-1][0] if entries else None


def _relative(uri: str, table: str) -> str | None:
    """``uri`` (as Spark records it: ``file:/abs/path``, ``s3a://bucket/key``,
    ``hdfs://namenode:8020/abs/path``, URL-escaped) relative to ``table`` (the filesystem's
    path of the sink), or None when it lies elsewhere (pure).

    An object store's paths start with the bucket (the URI's authority); a rooted filesystem's
    (``/...``: local disk, HDFS) never hold the authority, so there a URI's authority (the
    NameNode) is not part of its path."""
    parts = urllib.parse.urlsplit(uri)
    location = urllib.parse.unquote(parts.netloc + parts.path if parts.netloc else parts.path)
    base = table.split("://", 1)[1] if "://" in table else table
    base = base.rstrip("/")
    candidates = [location, location.lstrip("/")]
    if parts.netloc and base.startswith("/"):
        candidates.append(urllib.parse.unquote(parts.path))
    for candidate in candidates:
        if candidate.startswith(base + "/"):
            return candidate[len(base) + 1 :]
    return None


def _read_entry(manager: filemanager.FileManager, path: str) -> list[dict[str, object]]:
    text = manager.read_bytes(path).decode("utf-8")
    lines = text.split("\n")
    header = _VERSION_HEADER.match(lines[0].strip()) if lines else None
    if header is None or int(header.group(1)) > MAX_VERSION:
        raise errors.CorruptFileError(
            f"{path} is not a Spark file-sink manifest of a version this sparkguard reads "
            f"(first line {lines[0][:40]!r}); upgrade sparkguard"
        )
    entries = []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            raise errors.CorruptFileError(f"{path} line {number} is not JSON") from None
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise errors.CorruptFileError(f"{path} line {number} has no 'path'")
        entries.append(entry)
    return entries


def listed_files(manager: filemanager.FileManager, table: str) -> dict[str, int]:
    """Relative path -> size of every data file the manifest lists (the newest compact file and
    the batch files after it, applying Spark's ``add``/``delete`` actions in order)."""
    entries = _entries(manager, table)
    compacts = [e for e in entries if e[1]]
    start = compacts[-1][0] if compacts else -1
    chosen = [compacts[-1]] if compacts else []
    chosen += [e for e in entries if not e[1] and e[0] > start]
    files: dict[str, int] = {}
    for _, _, path in chosen:
        for entry in _read_entry(manager, path):
            relative = _relative(str(entry["path"]), table)
            if relative is None:
                continue
            if entry.get("action", "add") == "delete":
                files.pop(relative, None)
            else:
                size = entry.get("size", -1)
                files[relative] = size if isinstance(size, int) else -1
    return files
