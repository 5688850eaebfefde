"""R8a without Spark: a JVM write whose driver died after its outcome (W9) and before the end of
its publication (W9a) is rolled *forward* by ``rollback``: on a rename store every file the
outcome lists under a temp name is renamed onto its name, on S3 every upload it lists is
completed; nothing is deleted, and running it again changes nothing (docs/storage-contract.md,
"Publication after the outcome")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors
from sparkguard.spark_lib.storage import markers, rollback, timeline
from tests.support import s3server

JVM = rollback.JVM_PROTOCOL
JOB = "fwd"


def _commit_unpublished(table: Path, files: dict[str, tuple[bytes, bool]]) -> str:
    """A committed JVM append of ``files`` (relative name -> (bytes, published yet)) whose
    markers survive: the published ones under their names, the others under the temp names
    the outcome lists."""
    table.mkdir()
    manager, path = filemanager.resolve(str(table))
    tl = timeline.Timeline(manager, path)
    instant = tl.start(JOB, attempt=0, marker_type="DIRECT")
    mdir = Path(markers.marker_dir(str(table), instant))
    mdir.mkdir(parents=True)
    (mdir / "MARKERS.type").write_text("DIRECT")
    listed = []
    for relative, (data, published) in files.items():
        target = table / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.parent / filemanager.make_temp_name(target.name)
        (target if published else temp).write_bytes(data)
        marker = mdir / f"{relative}.marker.CREATE"
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        listed.append((relative, temp.relative_to(table).as_posix(), len(data)))
    tl.commit(
        instant,
        [timeline.DataFile(path=r, size=n, rows=1) for r, _, n in listed],
        extra={"operation": "append", "protocol": JVM},
    )
    # The JVM driver's outcome names each file's temp file (the Python writer's never does).
    outcome = table / "_sparkguard" / "timeline" / f"{instant}.outcome"
    doc = json.loads(outcome.read_text())
    for entry, (_, temp, _) in zip(doc["files"], listed, strict=True):
        entry["temp"] = temp
    outcome.write_text(json.dumps(doc) + "\n")
    return instant


def _on_disk(table: Path) -> dict[str, bytes]:
    return {
        p.relative_to(table).as_posix(): p.read_bytes()
        for p in table.rglob("*")
        if p.is_file() and "_sparkguard" not in p.parts
    }


def test_rollback_publishes_what_a_dead_driver_left_under_temp_names(tmp_path: Path) -> None:
    table = tmp_path / "t"
    files = {
        "part-00000-fwd-w000-c000.parquet": (b"published", True),
        "part-00001-fwd-w000-c000.parquet": (b"unpublished", False),
        "k=1/part-00002-fwd-w000-c000.parquet": (b"in a partition", False),
    }
    _commit_unpublished(table, files)

    dry = rollback.rollback_table(str(table), job_id=JOB, dry_run=True)
    assert (dry.files_published, dry.files_deleted) == (2, 0)
    assert len([n for n in _on_disk(table) if filemanager.is_temp_name(n)]) == 2

    summary = rollback.rollback_table(str(table), job_id=JOB)
    assert (summary.files_published, summary.files_deleted) == (2, 0)
    assert summary.to_json()["filesPublished"] == 2
    assert _on_disk(table) == {name: data for name, (data, _) in files.items()}
    assert not (table / "_sparkguard" / "markers").exists() or not any(
        (table / "_sparkguard" / "markers").iterdir()
    )

    again = rollback.rollback_table(str(table), job_id=JOB)
    assert (again.files_published, again.files_deleted, again.markers_deleted) == (0, 0, 0)


def test_a_listed_file_gone_from_both_names_is_a_warning_and_nothing_is_deleted(
    tmp_path: Path,
) -> None:
    table = tmp_path / "t"
    _commit_unpublished(
        table,
        {
            "part-00000-fwd-w000-c000.parquet": (b"kept", False),
            "part-00001-fwd-w000-c000.parquet": (b"gone", False),
        },
    )
    for temp in table.glob(".part-00001-*"):
        temp.unlink()
    summary = rollback.rollback_table(str(table), job_id=JOB)
    assert (summary.files_published, summary.files_deleted) == (1, 0)
    assert any("part-00001-fwd-w000-c000.parquet" in w for w in summary.warnings)
    assert _on_disk(table) == {"part-00000-fwd-w000-c000.parquet": b"kept"}


@pytest.mark.parametrize(
    "temp",
    [
        "other/.part-00000-fwd-w000-c000.parquet.sg-tmp-0123456789ab",  # another directory
        ".part-00001-fwd-w000-c000.parquet.sg-tmp-0123456789ab",  # another name's temp
        "part-00000-fwd-w000-c000.parquet",  # not a temp name
    ],
)
def test_an_outcome_naming_a_temp_that_is_not_its_files_is_refused(temp: str) -> None:
    entry = {"path": "part-00000-fwd-w000-c000.parquet", "size": 1, "rows": 1, "temp": temp}
    with pytest.raises(errors.CorruptFileError, match="not a temp name"):
        timeline.DataFile.from_json(entry, source="x.outcome")


def test_a_failed_rewrites_temp_files_of_committed_names_go_and_the_committed_ones_stay(
    tmp_path: Path,
) -> None:
    """A rerun=rewrite that failed left its files under temp names of the committed names (its
    markers name them): the rollback removes those temp files and their checksums, publishes
    the committed instant's own (R8a) and keeps every committed file."""
    table = tmp_path / "t"
    files = {
        "part-00000-fwd-w000-c000.parquet": (b"published", True),
        "part-00001-fwd-w000-c000.parquet": (b"unpublished", False),
    }
    _commit_unpublished(table, files)
    (table / ".part-00000-fwd-w000-c000.parquet.crc").write_bytes(b"committed file's checksum")
    manager, path = filemanager.resolve(str(table))
    tl = timeline.Timeline(manager, path)
    rewrite = tl.start(JOB, attempt=1, marker_type="DIRECT", operation="rewrite")
    mdir = Path(markers.marker_dir(str(table), rewrite))
    mdir.mkdir(parents=True)
    (mdir / "MARKERS.type").write_text("DIRECT")
    for name in files:
        (mdir / f"{name}.marker.CREATE").touch()
        temp = filemanager.make_temp_name(name)
        (table / temp).write_bytes(b"the failed rewrite's")
        (table / f".{temp}.crc").write_bytes(b"its checksum")
    assert tl.claim_rollback(rewrite)  # the failed driver's abortJob

    summary = rollback.rollback_table(str(table), job_id=JOB)
    assert (summary.files_published, summary.files_deleted) == (1, 0)
    assert summary.temp_files_removed == 2
    assert _on_disk(table) == {
        **{name: data for name, (data, _) in files.items()},
        ".part-00000-fwd-w000-c000.parquet.crc": b"committed file's checksum",
    }


# -- object stores: pending uploads ----------------------------------------------------------

S3_NAMES = [f"part-0000{p}-{JOB}-w000-c000.parquet" for p in range(3)]


def _upload(client: Any, bucket: str, key: str, data: bytes) -> str:
    """A multipart upload of ``data`` at ``key`` in one part, left open; its id."""
    upload = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    client.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=1, Body=data)
    return str(upload)


@pytest.mark.s3
def test_rollback_completes_the_uploads_a_dead_driver_left_open(
    s3_server: s3server.S3Server,
) -> None:
    """A JVM append on S3 whose driver died inside its publication window: one upload
    completed, two still open (the outcome lists their ids), one more open upload of a
    committed name that the outcome does not list (a failed attempt's); one of the two open
    ones rewrites a name whose older object is still there (``rerun=rewrite``). The rollback
    completes the two (R8a: ListParts, CompleteMultipartUpload: the rewrite's content replaces
    the older object), aborts the stray one (R8b) and deletes nothing; a second run changes
    nothing."""
    bucket = s3_server.create_bucket()
    client = s3_server.client()
    options = s3_server.storage_options
    table = f"s3://{bucket}/t"
    manager, path = filemanager.resolve(table, storage_options=options)
    tl = timeline.Timeline(manager, path)
    instant = tl.start(JOB, attempt=0, marker_type="DIRECT")
    mdir = f"t/{timeline.SPARKGUARD_DIR}/markers/{instant}"
    client.put_object(Bucket=bucket, Key=f"{mdir}/MARKERS.type", Body=b"DIRECT")
    data = {name: f"rows of {name}".encode() for name in S3_NAMES}
    rewritten = S3_NAMES[2]
    client.put_object(Bucket=bucket, Key=f"t/{rewritten}", Body=b"an earlier write's rows")
    uploads = {}
    for name in S3_NAMES:
        client.put_object(Bucket=bucket, Key=f"{mdir}/{name}.marker.CREATE", Body=b"")
        uploads[name] = _upload(client, bucket, f"t/{name}", data[name])
    first = S3_NAMES[0]
    client.complete_multipart_upload(
        Bucket=bucket, Key=f"t/{first}", UploadId=uploads[first],
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": client.list_parts(
            Bucket=bucket, Key=f"t/{first}", UploadId=uploads[first])["Parts"][0]["ETag"]}]},
    )  # fmt: skip
    _upload(client, bucket, f"t/{first}", b"a failed attempt's rows")  # a stray one
    tl.commit(
        instant,
        [timeline.DataFile(path=n, size=len(data[n]), rows=1) for n in S3_NAMES],
        extra={"operation": "append", "protocol": JVM},
    )
    key = f"t/{timeline.SPARKGUARD_DIR}/timeline/{instant}.outcome"
    doc = json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    for entry in doc["files"]:  # what the JVM driver's outcome says of each file
        entry["upload"] = uploads[entry["path"]]
    client.put_object(Bucket=bucket, Key=key, Body=json.dumps(doc).encode())

    def pending() -> list[tuple[str, str]]:
        listed = client.list_multipart_uploads(Bucket=bucket, Prefix="t/").get("Uploads", [])
        return sorted((u["Key"], u["UploadId"]) for u in listed)

    dry = rollback.rollback_table(table, job_id=JOB, storage_options=options, dry_run=True)
    assert (dry.files_published, dry.files_deleted) == (2, 0)
    assert len(pending()) == 3

    summary = rollback.rollback_table(table, job_id=JOB, storage_options=options)
    assert (summary.files_published, summary.files_deleted) == (2, 0)
    assert summary.temp_files_removed == 1  # the stray upload, aborted
    assert pending() == []
    for name in S3_NAMES:
        body = client.get_object(Bucket=bucket, Key=f"t/{name}")["Body"].read()
        assert body == data[name], name
    again = rollback.rollback_table(table, job_id=JOB, storage_options=options)
    assert (again.files_published, again.files_deleted, again.markers_deleted) == (0, 0, 0)


def test_an_outcome_naming_an_upload_that_is_not_an_id_is_refused() -> None:
    entry = {"path": "part-00000-fwd-w000-c000.parquet", "size": 1, "rows": 1, "upload": 7}
    with pytest.raises(errors.CorruptFileError, match="not an upload id"):
        timeline.DataFile.from_json(entry, source="x.outcome")
