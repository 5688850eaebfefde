"""Direct-put specifics on the S3 server: multipart, conditional complete, aborts."""

from __future__ import annotations

from typing import Any

import pytest

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors, paths


def _manager(url: str, options: dict[str, Any]) -> tuple[filemanager.DirectPutFileManager, str]:
    manager, base = filemanager.resolve(url, storage_options=options)
    assert isinstance(manager, filemanager.DirectPutFileManager)
    manager.block_size = 5 * 1024 * 1024  # S3's smallest part: exercise multipart cheaply
    return manager, base


def test_multipart_publishes_on_close(s3_bucket: str, s3_options: dict[str, Any]) -> None:
    manager, base = _manager(s3_bucket, s3_options)
    target = paths.join(base, "big.bin")
    payload = bytes(range(256)) * (11 * 1024 * 1024 // 256)
    stream = manager.create_atomic(target)
    for i in range(0, len(payload), 1 << 20):
        stream.write(payload[i : i + (1 << 20)])
    assert not manager.exists(target)
    assert len(manager.list_pending_uploads(base)) == 1
    stream.close()
    assert manager.read_bytes(target) == payload
    assert manager.list_pending_uploads(base) == []


def test_multipart_cancel_aborts_upload(s3_bucket: str, s3_options: dict[str, Any]) -> None:
    manager, base = _manager(s3_bucket, s3_options)
    target = paths.join(base, "big.bin")
    stream = manager.create_atomic(target)
    stream.write(b"z" * (6 * 1024 * 1024))
    assert len(manager.list_pending_uploads(base)) == 1
    stream.cancel()
    assert not manager.exists(target)
    assert manager.list_pending_uploads(base) == []


def test_multipart_losing_conditional_complete_aborts(
    s3_bucket: str, s3_options: dict[str, Any]
) -> None:
    manager, base = _manager(s3_bucket, s3_options)
    target = paths.join(base, "raced.bin")
    stream = manager.create_atomic(target)
    stream.write(b"a" * (6 * 1024 * 1024))
    manager.write_bytes(target, b"the winner")
    with pytest.raises(errors.AlreadyExistsError, match="412"):
        stream.close()
    assert manager.read_bytes(target) == b"the winner"
    assert manager.list_pending_uploads(base) == []


def test_abort_pending_uploads_cleans_killed_writers(
    s3_bucket: str, s3_options: dict[str, Any]
) -> None:
    manager, base = _manager(s3_bucket, s3_options)
    stream = manager.create_atomic(paths.join(base, "orphan.bin"))
    stream.write(b"q" * (5 * 1024 * 1024 + 1))  # one part uploaded, then "killed"
    assert manager.abort_pending_uploads(base) == 1
    assert manager.list_pending_uploads(base) == []


def test_store_without_conditional_put_is_refused_unless_opted_in() -> None:
    # A store sparkguard knows no conditional put for (memory stands in for e.g. a NAS gateway).
    manager, base = filemanager.resolve("memory://bucket/table", kind="direct-put")
    with pytest.raises(errors.UnsupportedStoreError, match=r"'memory'.*check-then-put"):
        manager.create_atomic(paths.join(base, "f"))


def test_check_then_put_opt_in(s3_bucket: str, s3_options: dict[str, Any]) -> None:
    manager, base = filemanager.resolve(
        s3_bucket, storage_options=s3_options, create_mode="check-then-put"
    )
    target = paths.join(base, "weak.bin")
    assert manager.put_if_absent(target, b"1") is True
    assert manager.put_if_absent(target, b"2") is False
    assert manager.read_bytes(target) == b"1"


def test_s3_filesystems_share_the_process_session(
    s3_bucket: str, s3_options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every resolve makes its own filesystem and client, from one botocore session per process
    and AWS environment; the session never travels with a pickled filesystem."""
    import pickle

    first, base = _manager(s3_bucket, s3_options)
    second, _ = _manager(s3_bucket, s3_options)
    assert first.fs is not second.fs
    assert first.fs.session is second.fs.session
    first.write_bytes(paths.join(base, "a"), b"1")
    assert second.read_bytes(paths.join(base, "a")) == b"1"
    assert first.fs.s3 is not second.fs.s3  # a client (and connection pool) each
    assert "session" not in pickle.loads(pickle.dumps(first.fs)).storage_options  # noqa: S301
    monkeypatch.setenv("AWS_PROFILE_SG_TEST", "other")  # another AWS environment
    third, _ = _manager(s3_bucket, s3_options)
    assert third.fs.session is not first.fs.session
    assert third.read_bytes(paths.join(base, "a")) == b"1"
