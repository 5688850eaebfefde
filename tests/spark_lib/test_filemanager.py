"""The atomic file manager's contract, on every backend."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors, paths
from tests.spark_lib.conftest import Store


def test_publishes_only_on_close(store: Store) -> None:
    target = paths.join(store.base, "part-00000.bin")
    stream = store.manager.create_atomic(target)
    stream.write(b"hello ")
    stream.write(b"world")
    assert not store.manager.exists(target)
    stream.close()
    assert store.manager.read_bytes(target) == b"hello world"
    assert stream.tell() == 11
    stream.close()  # closing twice is a no-op


def _publish(manager: filemanager.FileManager, held: filemanager.Held) -> bool:
    """Publish what ``hold`` left through the primitive the writer's W9a uses for it (a rename
    of the temp file, the completion of the upload); False when there was nothing to publish."""
    if held.temp is not None:
        return manager.publish_temp(held.temp, held.path)
    assert held.upload is not None
    return held.path in manager.complete_uploads({held.path: held.upload})


def test_hold_leaves_the_file_unlisted_until_published_or_cancelled(store: Store) -> None:
    """``hold`` closes without publishing (a temp file; on S3 an open upload, even for a small
    file); publishing it works once; ``cancel`` of a held stream removes it."""
    manager = store.manager
    kept, dropped = paths.join(store.base, "held.bin"), paths.join(store.base, "dropped.bin")
    streams, held = {}, {}
    for target in (kept, dropped):
        streams[target] = manager.create_atomic(target, overwrite=True)
        streams[target].write(b"held bytes")
        held[target] = streams[target].hold()
        assert held[target].path == target
        assert not manager.exists(target)
        assert (held[target].temp is None) == (store.name == "s3")
        visible = [i.name for i in manager.list(store.base)]
        assert not any(n.endswith(".bin") and not n.startswith(".") for n in visible), visible
    streams[dropped].cancel()
    assert _publish(manager, held[dropped]) is False  # cancelled: nothing to publish
    assert _publish(manager, held[kept]) is True
    assert manager.read_bytes(kept) == b"held bytes"
    assert _publish(manager, held[kept]) is False  # published already
    assert not manager.exists(dropped)
    assert [i.name for i in manager.list(store.base)] == ["held.bin"]
    if isinstance(manager, filemanager.DirectPutFileManager):
        assert manager.list_pending_uploads(store.base + "/") == []


def test_cancel_leaves_nothing(store: Store) -> None:
    target = paths.join(store.base, "cancelled.bin")
    stream = store.manager.create_atomic(target)
    stream.write(b"x" * 1000)
    stream.cancel()
    stream.cancel()
    assert not store.manager.exists(target)
    assert [i.name for i in store.manager.list(store.base)] == []
    with pytest.raises(ValueError, match="cancelled"):
        stream.write(b"more")


def test_exception_in_context_leaves_nothing(store: Store) -> None:
    target = paths.join(store.base, "boom.bin")

    def failing_task() -> None:
        with store.manager.create_atomic(target) as stream:
            stream.write(b"partial")
            raise RuntimeError("task failed")

    with pytest.raises(RuntimeError):
        failing_task()
    assert not store.manager.exists(target)
    assert store.manager.list(store.base) == []


def test_create_if_absent_refuses_existing(store: Store) -> None:
    target = paths.join(store.base, "once.bin")
    store.manager.write_bytes(target, b"first")
    with pytest.raises(errors.AlreadyExistsError, match="already exists"):
        store.manager.write_bytes(target, b"second")
    with pytest.raises(FileExistsError):  # also a plain FileExistsError
        store.manager.write_bytes(target, b"third")
    assert store.manager.read_bytes(target) == b"first"
    assert [i.name for i in store.manager.list(store.base)] == ["once.bin"]
    assert store.manager.put_if_absent(target, b"fourth") is False


def test_empty_file_create_if_absent(store: Store) -> None:
    """Empty files (direct markers) must be exclusive too."""
    target = paths.join(store.base, "marker")
    assert store.manager.put_if_absent(target, b"") is True
    assert store.manager.put_if_absent(target, b"") is False
    assert store.manager.read_bytes(target) == b""


def test_overwrite_replaces(store: Store) -> None:
    target = paths.join(store.base, "replace.bin")
    store.manager.write_bytes(target, b"old")
    store.manager.write_bytes(target, b"new", overwrite=True)
    assert store.manager.read_bytes(target) == b"new"


def test_list_exists_delete_mkdirs(store: Store) -> None:
    sub = paths.join(store.base, "a", "b")
    store.manager.mkdirs(sub)
    store.manager.write_bytes(paths.join(sub, "f1"), b"1")
    store.manager.write_bytes(paths.join(sub, "f2"), b"22")
    infos = store.manager.list(sub)
    assert [(i.name, i.size, i.is_dir) for i in infos] == [("f1", 1, False), ("f2", 2, False)]
    assert store.manager.exists(paths.join(sub, "f1"))
    assert store.manager.delete_many([paths.join(sub, "f1"), paths.join(sub, "missing")]) == 2
    store.manager.delete(paths.join(sub, "f1"))  # idempotent
    assert [i.name for i in store.manager.list(sub)] == ["f2"]
    assert store.manager.list(paths.join(store.base, "nowhere")) == []


def test_list_files_finds_nested_files_only(store: Store) -> None:
    m, base = store.manager, store.base
    for rel in ("a", "d=1/b", "d=1/e=2/c", "d=2/x"):
        m.write_bytes(paths.join(base, rel), b"12")
    found = m.list_files(base)
    assert [info.path[len(base) + 1 :] for info in found] == ["a", "d=1/b", "d=1/e=2/c", "d=2/x"]
    assert all(info.size == 2 and not info.is_dir for info in found)
    assert [i.name for i in m.list_files(paths.join(base, "d=1"))] == ["b", "c"]
    assert m.list_files(paths.join(base, "missing")) == []


def test_open_is_read_only(store: Store) -> None:
    target = paths.join(store.base, "r.bin")
    store.manager.write_bytes(target, b"abc")
    with store.manager.open(target) as f:
        assert f.read() == b"abc"
    with pytest.raises(errors.ConfigError, match="only read modes"):
        store.manager.open(target, "wb")


def test_racing_creators_exactly_one_wins(store: Store) -> None:
    target = paths.join(store.base, "contended.bin")
    winners: list[int] = []
    losers: list[int] = []
    barrier = threading.Barrier(8)

    def race(i: int) -> None:
        stream = store.manager.create_atomic(target)
        stream.write(f"writer-{i}".encode() * 100)
        barrier.wait()
        try:
            stream.close()
            winners.append(i)
        except errors.AlreadyExistsError:
            losers.append(i)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1
    assert len(losers) == 7
    assert store.manager.read_bytes(target) == f"writer-{winners[0]}".encode() * 100
    assert [i.name for i in store.manager.list(store.base)] == ["contended.bin"]


@pytest.mark.parametrize(
    "bad",
    ["../escape", "a/../b", "", "a//b", "/abs/name", "nul\x00char", "back\\slash", "x" * 300],
)
def test_bad_relative_names_are_rejected(bad: str) -> None:
    with pytest.raises(errors.InvalidPathError):
        paths.join("/base", bad)


def test_bad_paths_write_nothing(tmp_path: Path) -> None:
    manager, base = filemanager.resolve(str(tmp_path))
    with pytest.raises(errors.InvalidPathError, match=r"'\.\.'"):
        manager.create_atomic(f"{base}/../evil")
    with pytest.raises(errors.InvalidPathError):
        manager.create_atomic(f"{base}/dir/")
    assert list(tmp_path.iterdir()) == []


def test_unknown_protocol_and_kind_are_clear() -> None:
    with pytest.raises(errors.UnsupportedStoreError, match=r"no atomic file manager.*'ftp2'"):
        filemanager.resolve("ftp2://host/x")
    with pytest.raises(errors.ConfigError, match=r"fileManager='copy'.*rename, direct-put"):
        filemanager.resolve("/tmp/x", kind="copy")
    with pytest.raises(errors.ConfigError, match="createMode='maybe'"):
        filemanager.resolve("s3://b/x", create_mode="maybe")
    with pytest.raises(errors.InvalidPathError):
        filemanager.resolve("")


def test_storage_options_no_filesystem_takes_are_refused(tmp_path: Path) -> None:
    """fsspec filesystems swallow unknown keywords; sparkguard names them instead."""
    with pytest.raises(errors.ConfigError) as caught:
        filemanager.resolve(str(tmp_path), storage_options={"endpont_url": "x", "secert": "s"})
    message = str(caught.value)
    assert "keys 'endpont_url', 'secert' are not an option of file:// storage" in message
    assert "LocalFileSystem takes auto_mkdir" in message
    with pytest.raises(errors.ConfigError, match=r"^spark.sparkguard.storageOptions: key "):
        filemanager.resolve(
            "s3://b/t",
            storage_options={"endpoint_ur": "http://x"},  # misspelt
            options_source="spark.sparkguard.storageOptions",
        )
    # What they do take, their own and fsspec's common ones, passes.
    filemanager.resolve(str(tmp_path), storage_options={"auto_mkdir": True})
    s3 = {
        "endpoint_url": "http://127.0.0.1:1",
        "key": "k",
        "secret": "s",
        "client_kwargs": {"region_name": "us-east-1"},
        "use_listings_cache": False,
    }
    filemanager.resolve("s3://b/t", storage_options=s3)
    # One setting serves a local journal and tables on S3: S3's options pass a local path.
    filemanager.resolve(str(tmp_path), storage_options=s3)
    # ... and tables on HDFS and on S3: each filesystem gets its own options only (an S3
    # client given HDFS's host failed to start: `sparkguard rollback` of such a job crashed).
    both = {**s3, "host": "127.0.0.1", "port": 9870, "user": "spark"}
    manager, _ = filemanager.resolve("s3://b/t", storage_options=both)
    assert not {"host", "port", "user"} & set(manager.fs.storage_options)
    assert manager.fs.storage_options["key"] == "k"


def test_the_python_writer_names_its_storage_options_key(tmp_path: Path) -> None:
    from sparkguard.spark_lib.spark import config

    conf = {"spark.sparkguard.jobId": "j-1", "spark.sparkguard.storageOptions": '{"anno": true}'}
    settings = config.parse_settings(conf=conf)
    with pytest.raises(errors.ConfigError, match=r"^spark.sparkguard.storageOptions: key 'anno'"):
        settings.resolve(str(tmp_path))
    settings = config.parse_settings(conf=conf, options={"storageOptions": '{"anno": true}'})
    with pytest.raises(errors.ConfigError, match=r"^write option 'storageOptions': key 'anno'"):
        settings.resolve(str(tmp_path))


def test_a_write_error_names_the_file_being_written(tmp_path: Path) -> None:
    """``os.write`` errors (ENOSPC among them) name no file: the stream adds its path, so the
    message a user sees says where the disk is full."""
    manager, base = filemanager.resolve(str(tmp_path))
    stream = manager.create_atomic(f"{base}/data.bin")

    def full(data: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    stream._write = full  # type: ignore[method-assign]
    with pytest.raises(OSError, match="No space left") as caught:
        stream.write(b"x")
    assert caught.value.errno == errno.ENOSPC
    assert caught.value.filename == f"{base}/data.bin"
    stream.cancel()
    assert list(tmp_path.iterdir()) == []


def test_local_leftover_temp_files_are_recognisable(tmp_path: Path) -> None:
    manager, base = filemanager.resolve(str(tmp_path))
    stream = manager.create_atomic(f"{base}/data.parquet")
    stream.write(b"abc")
    leftovers = manager.find_temp_files(base)  # as a killed writer would leave them
    assert len(leftovers) == 1
    assert filemanager.is_temp_name(leftovers[0])
    assert paths.basename(leftovers[0]).startswith(".data.parquet.sg-tmp-")
    stream.cancel()
    assert manager.find_temp_files(base) == []


def test_rename_noreplace_refuses_existing(tmp_path: Path) -> None:
    (tmp_path / "src").write_bytes(b"s")
    (tmp_path / "dst").write_bytes(b"d")
    with pytest.raises(FileExistsError):
        filemanager.rename_noreplace(str(tmp_path / "src"), str(tmp_path / "dst"))
    assert (tmp_path / "dst").read_bytes() == b"d"
    filemanager.rename_noreplace(str(tmp_path / "src"), str(tmp_path / "new"))
    assert (tmp_path / "new").read_bytes() == b"s"
    assert not (tmp_path / "src").exists()


def test_plain_paths_resolve_to_rename_backend(tmp_path: Path) -> None:
    manager, base = filemanager.resolve(str(tmp_path))
    assert manager.kind is filemanager.Kind.RENAME
    assert base == str(tmp_path)
    manager2, base2 = filemanager.resolve(f"file://{tmp_path}")
    assert manager2.kind is filemanager.Kind.RENAME
    assert base2 == str(tmp_path)
