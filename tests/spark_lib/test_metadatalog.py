"""The metadata log: put-if-absent batches, versioned payloads, loud corruption."""

from __future__ import annotations

import threading

import pytest

from sparkguard.spark_lib.base import errors, formats, paths
from sparkguard.spark_lib.storage import metadatalog
from tests.spark_lib.conftest import Store


def _log(store: Store) -> metadatalog.MetadataLog:
    return metadatalog.MetadataLog(store.manager, paths.join(store.base, "commits"))


def test_add_get_latest_list_purge(store: Store) -> None:
    log = _log(store)
    assert log.get_latest() is None
    assert log.list() == []
    assert log.add(0, {"offset": 10}) is True
    assert log.add(1, {"offset": 20}) is True
    assert log.add(1, {"offset": 99}) is False  # put-if-absent: the first payload stays
    assert log.add(10, {"offset": 30}) is True
    assert log.get(1) == {"offset": 20}
    assert log.get(5) is None
    assert log.list() == [0, 1, 10]  # numeric order, not lexical
    assert log.get_latest() == (10, {"offset": 30})
    assert log.purge(before=10) == 2
    assert log.list() == [10]


def test_threads_racing_add_exactly_one_wins(store: Store) -> None:
    log = _log(store)
    results: list[bool] = []
    barrier = threading.Barrier(6)

    def add(who: int) -> None:
        barrier.wait()
        results.append(log.add(7, {"who": who}))

    threads = [threading.Thread(target=add, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(True) == 1
    winner = log.get(7)
    assert winner is not None
    assert winner["who"] in range(6)


@pytest.mark.parametrize("bad", [-1, True, "3", 1.5])
def test_bad_batch_ids_are_rejected(store: Store, bad: object) -> None:
    with pytest.raises(errors.ConfigError, match="batch_id must be a non-negative integer"):
        _log(store).add(bad, {})  # type: ignore[arg-type]
    assert store.manager.list(store.base) == []


def test_corrupt_file_is_rejected_loudly(store: Store) -> None:
    log = _log(store)
    log.add(0, {"ok": True})
    store.manager.write_bytes(paths.join(log.directory, "1"), b"{not json", overwrite=True)
    with pytest.raises(errors.CorruptFileError, match=r"commits/1 is not valid JSON"):
        log.get(1)
    with pytest.raises(errors.CorruptFileError):
        log.get_latest()


def test_unknown_version_is_rejected(store: Store) -> None:
    log = _log(store)
    future = formats.encode(metadatalog.KIND, 99, {"batchId": 3, "payload": {}})
    store.manager.write_bytes(paths.join(log.directory, "3"), future)
    with pytest.raises(errors.UnsupportedVersionError, match=r"version 99.*Upgrade sparkguard"):
        log.get(3)


def test_foreign_files_are_not_silently_skipped(store: Store) -> None:
    log = _log(store)
    log.add(0, {})
    store.manager.write_bytes(paths.join(log.directory, "notes.txt"), b"hi")
    with pytest.raises(errors.CorruptFileError, match=r"unexpected file .*notes\.txt"):
        log.list()


def test_renamed_batch_file_is_detected(store: Store) -> None:
    log = _log(store)
    log.add(0, {})
    data = store.manager.read_bytes(paths.join(log.directory, "0"))
    store.manager.write_bytes(paths.join(log.directory, "5"), data)
    with pytest.raises(errors.CorruptFileError, match="batchId=0"):
        log.get(5)
