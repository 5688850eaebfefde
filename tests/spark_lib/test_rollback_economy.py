"""A rollback's cost follows the failed write: batched deletes and truthful counts on S3.

Counts of storage requests (a counting ``S3FileSystem._call_s3``), never timings. Two S3
servers: one that honours a condition per key of ``DeleteObjects`` as AWS S3 does
(``tests/support/moto_conditional.py``): the delete itself tells which files existed; and moto
as shipped (the session's server), which reports every key deleted: existence is read first.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import s3fs
from aiobotocore.client import AioBaseClient
from fsspec.asyn import sync_wrapper

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import paths
from sparkguard.spark_lib.filemanager import direct_put
from sparkguard.spark_lib.storage import journal, markers, rollback, timeline
from tests.support import s3server

JOB = "failed-job"
DIRS = 40


@pytest.fixture(scope="module")
def conditional_server() -> Iterator[s3server.S3Server]:
    """An S3 server that honours ``ETag: *`` per key of ``DeleteObjects`` (AWS S3 does)."""
    with s3server.run_s3_server(conditional_deletes=True) as server:
        yield server


@pytest.fixture(autouse=True)
def fresh_store_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test asks its store again whether it honours conditional bulk deletes."""
    monkeypatch.setattr(direct_put, "_CONDITIONAL_BULK_DELETE", {})


@contextlib.contextmanager
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[collections.Counter[str]]:
    """Every S3 request of every client, by operation (``HeadObject``, ``ListObjectsV2``, ...;
    ``data <operation>``: requests on a key outside ``_sparkguard/`` and the journal;
    ``list <prefix>``: listings by prefix; ``delete keys``: the keys bulk deletes named,
    ``data keys`` those of data files, ``data deletes`` the bulk deletes that named any)."""
    counts: collections.Counter[str] = collections.Counter()
    original = AioBaseClient._make_api_call

    async def counting(self: Any, operation: str, params: dict[str, Any]) -> Any:
        counts[operation] += 1
        key = str(params.get("Key", ""))
        if key and "_sparkguard/" not in key and "journal" not in key:
            counts[f"data {operation}"] += 1
        if operation == "ListObjectsV2":
            counts[f"list {params.get('Prefix', '')}"] += 1
        if operation == "DeleteObjects":
            keys = [o["Key"] for o in params["Delete"]["Objects"]]
            counts["delete keys"] += len(keys)
            data = [k for k in keys if "_sparkguard/" not in k and ".sg-absent-probe-" not in k]
            counts["data keys"] += len(data)
            counts["data deletes"] += 1 if data else 0
        return await original(self, operation, params)

    monkeypatch.setattr(AioBaseClient, "_make_api_call", counting)
    yield counts


def _name(i: int) -> str:
    return f"day={i % DIRS:03d}/part-{i:05d}-{JOB}-c000.parquet"


def _failed_write(
    url: str, journal_url: str, options: dict[str, Any], *, marked: int, written: int, uploads: int
) -> tuple[filemanager.FileManager, str, str]:
    """A write that died: ``marked`` direct markers over :data:`DIRS` directories, the first
    ``written`` of those names published, the next ``uploads`` left as incomplete multipart
    uploads (a killed writer's), the rest never written. (manager, table path, instant)."""
    manager, table = filemanager.resolve(url, storage_options=options)
    manager.write_bytes(paths.join(table, "_existing"), b"", overwrite=True)  # kept by R11
    tl = timeline.Timeline(manager, table)
    kept = "day=000/part-00000-other-c000.parquet"
    committed = tl.start("other", attempt=0, marker_type="DIRECT")
    manager.write_bytes(paths.join(table, kept), b"keep")
    tl.commit(committed, [timeline.DataFile(path=kept, size=4, rows=1)], extra={})
    instant = tl.start(JOB, attempt=0, marker_type="DIRECT")
    jmanager, jpath = filemanager.resolve(journal_url, storage_options=options)
    journal.Journal(jmanager, jpath, JOB).record(table=url, instant=instant, attempt=0)
    client = markers.DirectMarkerClient(manager)
    mdir = markers.marker_dir(table, instant)
    client.write_type(mdir)
    fs = manager.fs
    for i in range(marked):
        client.create(mdir, _name(i))
        target = paths.join(table, _name(i))
        if i < written:
            manager.write_bytes(target, b"y" * 8, overwrite=True)
        elif i < written + uploads:
            bucket, key, _ = fs.split_path(target)
            fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key)
    return manager, table, instant


def _pending_uploads(manager: filemanager.FileManager, table: str) -> int:
    assert isinstance(manager, filemanager.DirectPutFileManager)
    return len(manager.list_pending_uploads(table.rstrip("/") + "/"))


def test_rollback_deletes_in_batches_and_counts_what_existed(
    conditional_server: s3server.S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = conditional_server.storage_options
    bucket = f"s3://{conditional_server.create_bucket()}"
    url, journal_url = f"{bucket}/t", f"{bucket}/journal"
    manager, table, instant = _failed_write(
        url, journal_url, options, marked=120, written=80, uploads=5
    )
    with counted(monkeypatch) as counts:
        summary = rollback.rollback_job(JOB, journal_url, storage_options=options)
    assert summary.files_deleted == 80
    assert summary.temp_files_removed == 5
    record = timeline.Timeline(manager, table).read_rolledback(instant)
    assert record is not None
    assert record["deleted"] == sorted(_name(i) for i in range(80))
    # A marked name with no file is absent, not deleted (an aborted upload is no file).
    assert record["absent"] == sorted(_name(i) for i in range(80, 120))
    assert record["filesDeleted"] == 80
    # The store's answer to the delete told which existed: no HEAD, no listing per directory.
    assert counts["data HeadObject"] == 0
    assert counts["ListMultipartUploads"] == 1  # one listing for 40 directories
    assert counts["data deletes"] == 1
    assert counts["data keys"] == 120
    # The question to the store (one absent key), the data, the markers: three bulk deletes.
    assert counts["DeleteObjects"] == 3
    assert counts["AbortMultipartUpload"] == 5
    # Listings: the timeline, the markers, the snapshots; never a data directory, nor the
    # whole table (the table has a commit: R11 keeps it without listing it).
    assert not [k for k in counts if k.startswith("list t/day=")], counts
    assert counts["list t/"] == 0, counts
    assert not manager.existing_files(paths.join(table, _name(i)) for i in range(120))
    assert manager.exists(paths.join(table, "day=000/part-00000-other-c000.parquet"))
    assert _pending_uploads(manager, table) == 0


def test_more_than_a_thousand_names_take_one_bulk_delete_per_thousand(
    conditional_server: s3server.S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = conditional_server.create_bucket()
    manager, _ = filemanager.resolve(
        f"s3://{bucket}/t", storage_options=conditional_server.storage_options
    )
    assert isinstance(manager, filemanager.DirectPutFileManager)
    names = [f"{bucket}/t/d={i % 7}/f{i:05d}" for i in range(2500)]
    manager.fs.pipe(dict.fromkeys(names[::10], b"x"))  # 250 exist, 2,250 do not
    with counted(monkeypatch) as counts:
        removed = manager.delete_existing(names)
    assert removed == set(names[::10])
    assert counts["DeleteObjects"] == 1 + 3  # the store's answer asked once, then 3 batches
    assert counts["delete keys"] == 1 + 2500
    assert counts["HeadObject"] == counts["ListObjectsV2"] == 0
    with counted(monkeypatch) as again:
        assert manager.delete_existing(names) == set()  # asked once per store: no new probe
    assert again["DeleteObjects"] == 3


def test_store_without_conditional_bulk_deletes_reads_existence_first(
    s3_bucket: str, s3_options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """moto as shipped reports an absent key deleted: existence is read (concurrently), and
    only the files that exist are deleted and counted."""
    url, journal_url = f"{s3_bucket}/t", f"{s3_bucket}/journal"
    manager, table, instant = _failed_write(
        url, journal_url, s3_options, marked=60, written=45, uploads=3
    )
    assert isinstance(manager, filemanager.DirectPutFileManager)
    with counted(monkeypatch) as counts:
        summary = rollback.rollback_job(JOB, journal_url, storage_options=s3_options)
    assert summary.files_deleted == 45
    assert summary.temp_files_removed == 3
    record = timeline.Timeline(manager, table).read_rolledback(instant)
    assert record is not None
    assert record["absent"] == sorted(_name(i) for i in range(45, 60))
    assert record["deleted"] == sorted(_name(i) for i in range(45))
    assert counts["data HeadObject"] == 60  # fewer than 100 names in a directory: a HEAD each
    assert counts["data keys"] == 45  # only what exists
    assert counts["data deletes"] == 1
    assert counts["ListMultipartUploads"] == 1
    assert not manager.honours_conditional_bulk_delete(paths.join(table, _name(0)))
    assert not manager.existing_files(paths.join(table, _name(i)) for i in range(60))


def test_a_refused_key_of_a_bulk_delete_is_an_error_not_an_absent_file(
    conditional_server: s3server.S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = conditional_server.create_bucket()
    manager, _ = filemanager.resolve(
        f"s3://{bucket}/t", storage_options=conditional_server.storage_options
    )
    assert isinstance(manager, filemanager.DirectPutFileManager)
    manager.conditional_bulk_delete = True

    async def refused(self: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        assert method == "delete_objects"
        key = kwargs["Delete"]["Objects"][0]["Key"]
        return {"Errors": [{"Key": key, "Code": "AccessDenied", "Message": "Access Denied"}]}

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", refused)
    with pytest.raises(OSError, match=r"AccessDenied.*permissions"):
        manager.delete_existing([f"{bucket}/t/a"])


def test_pending_uploads_are_listed_past_one_page(
    conditional_server: s3server.S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = conditional_server.create_bucket()
    manager, _ = filemanager.resolve(
        f"s3://{bucket}/t", storage_options=conditional_server.storage_options
    )
    assert isinstance(manager, filemanager.DirectPutFileManager)
    pages = {
        "": {
            "Uploads": [{"Key": "t/a", "UploadId": "1"}],
            "IsTruncated": True,
            "NextKeyMarker": "t/a",
            "NextUploadIdMarker": "1",
        },
        "t/a": {"Uploads": [{"Key": "t/b", "UploadId": "2"}], "IsTruncated": False},
    }
    asked: list[dict[str, Any]] = []

    async def paged(self: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        assert method == "list_multipart_uploads"
        asked.append(kwargs)
        return pages[kwargs.get("KeyMarker", "")]

    monkeypatch.setattr(s3fs.S3FileSystem, "call_s3", sync_wrapper(paged))
    found = manager.list_pending_uploads(f"{bucket}/t/")
    assert [u["Key"] for u in found] == ["t/a", "t/b"]
    assert asked[1]["UploadIdMarker"] == "1"
