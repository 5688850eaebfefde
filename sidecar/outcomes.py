"""An instant's outcome on storage, as the sidecar's fence looks it up.

An instant whose ``<table>/_sparkguard/timeline/<instant>.outcome`` exists is decided
(committed, or claimed by a rollback): the sidecar refuses its markers. These are the reads
behind that refusal; when the sidecar makes them is the batcher's business
(:mod:`~sparkguard.sidecar.batcher`).
"""

from __future__ import annotations

import json

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import paths
from sparkguard.spark_lib.storage import timeline


def outcome_path(marker_dir_path: str, instant: str) -> str:
    """``<table>/_sparkguard/timeline/<instant>.outcome`` for a marker directory's path."""
    table = marker_dir_path.rstrip("/").rsplit("/", 3)[0]
    return paths.join(table, timeline.SPARKGUARD_DIR, timeline.TIMELINE_DIR, instant + ".outcome")


def is_decided(manager: filemanager.FileManager, path: str) -> bool:
    """Whether the outcome file at ``path`` exists, asked of the store (no listing cache).

    A one-byte ranged read: one request on object stores whether the file exists or not
    (``info`` would add a listing on a miss, to look for a directory of that name).
    """
    try:
        manager.fs.cat_file(path, start=0, end=1)
    except FileNotFoundError:
        return False
    return True


def read_outcome(manager: filemanager.FileManager, path: str) -> str | None:
    """The ``outcome`` field of the outcome file at ``path`` (``None`` when it is missing;
    ``"unreadable"`` when it cannot be parsed, which callers treat as not committed)."""
    try:
        raw = manager.read_bytes(path)
    except FileNotFoundError:
        return None
    try:
        return str(json.loads(raw)["outcome"])
    except (ValueError, KeyError, TypeError):
        return "unreadable"


def is_gone(manager: filemanager.FileManager, path: str) -> bool:
    """Whether the instant of the outcome file at ``path`` was decided and then removed: its
    ``.inflight`` does not exist. A writer puts ``.inflight`` before any marker (W2), and only a
    rollback that removed the location its decided write created deletes it
    (docs/storage-contract.md, "The life of a table"; a compactor archiving a decided instant
    too). One read, when a directory's state is loaded."""
    return not is_decided(manager, path[: -len(".outcome")] + ".inflight")
