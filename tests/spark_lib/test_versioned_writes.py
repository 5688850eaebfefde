"""Conditional rewrites (``write_versioned``) against the rollback's compare-and-delete.

The marker sidecar rewrites a batch file only if it is still the version it last wrote, and
rollback's R7 deletes one only if it still holds what was read: between them, no version is
deleted unread and no rewrite lands on a deleted file. Local disk and the S3 server.
"""

from __future__ import annotations

import pytest

from sparkguard.spark_lib.base import errors, paths
from tests.spark_lib.conftest import Store


def test_create_rewrite_and_conflicts(durable_store: Store) -> None:
    manager = durable_store.manager
    target = paths.join(durable_store.base, "MARKERS0")
    assert manager.versioned_writes
    first = manager.write_versioned(target, b"a\n", None)
    with pytest.raises(errors.AlreadyExistsError):
        manager.write_versioned(target, b"x\n", None)
    second = manager.write_versioned(target, b"a\nb\n", first)
    assert second != first
    assert manager.read_versioned(target) == (b"a\nb\n", second)
    with pytest.raises(errors.VersionConflictError, match="MARKERS0"):
        manager.write_versioned(target, b"a\nc\n", first)  # stale: another version is there
    assert manager.read_bytes(target) == b"a\nb\n"
    manager.delete(target)
    with pytest.raises(errors.VersionConflictError, match="gone"):
        manager.write_versioned(target, b"a\nb\nc\n", second)
    assert not manager.exists(target)  # nothing was published
    assert manager.list(durable_store.base) == []  # and no temp file is left


def test_a_rewrite_after_the_rollbacks_read_is_handed_over_before_the_delete(
    durable_store: Store,
) -> None:
    manager = durable_store.manager
    target = paths.join(durable_store.base, "MARKERS0")
    read = manager.write_versioned(target, b"a\n", None)  # what the rollback read (R4)
    latest = manager.write_versioned(target, b"a\nb\n", read)  # a sidecar append after R4
    seen: list[bytes] = []
    assert manager.delete_if_unchanged(target, b"a\n", on_changed=seen.append) is None
    assert seen == [b"a\nb\n"]
    assert not manager.exists(target)
    with pytest.raises(errors.VersionConflictError):  # the sidecar's next append fails
        manager.write_versioned(target, b"a\nb\nc\n", latest)
    assert not manager.exists(target)


def test_a_rewrite_racing_the_rollbacks_delete_is_never_deleted_unread(
    durable_store: Store,
) -> None:
    """The sidecar appends while R7 deals with a version it had not read. Local disk: R7 holds
    the file aside meanwhile, so the append fails. S3: the append lands, and R7's conditional
    delete sees it and hands it over too. Either way every acknowledged line was read."""
    manager = durable_store.manager
    target = paths.join(durable_store.base, "MARKERS0")
    manager.write_versioned(target, b"a\n", None)
    version = manager.write_versioned(target, b"a\nb\n", manager.read_versioned(target)[1])
    seen: list[bytes] = []
    appended: list[bytes] = []

    def on_changed(current: bytes) -> None:
        seen.append(current)
        if len(seen) == 1:
            try:
                manager.write_versioned(target, current + b"c\n", version)
            except errors.VersionConflictError:
                return
            appended.append(current + b"c\n")

    assert manager.delete_if_unchanged(target, b"a\n", on_changed=on_changed) is None
    if durable_store.name == "local":
        assert appended == []
        assert seen == [b"a\nb\n"]
    else:
        assert appended == [b"a\nb\nc\n"]
        assert seen == [b"a\nb\n", b"a\nb\nc\n"]
    assert not manager.exists(target)
    assert manager.list(durable_store.base) == []


def test_a_rewrite_does_not_recreate_a_removed_directory(durable_store: Store) -> None:
    """A rollback that deleted the last batch file removed its directory too (local disk): the
    sidecar's next conditional rewrite fails without creating the directory again (it used to
    leave an empty marker directory of the rolled-back instant)."""
    manager = durable_store.manager
    directory = paths.join(durable_store.base, "markers")
    target = paths.join(directory, "MARKERS0")
    first = manager.write_versioned(target, b"a\n", None)
    manager.delete(target)
    if manager.exists(directory):
        manager.fs.rmdir(directory)
    with pytest.raises(errors.VersionConflictError, match="gone"):
        manager.write_versioned(target, b"a\nb\n", first)
    assert not manager.exists(directory)
