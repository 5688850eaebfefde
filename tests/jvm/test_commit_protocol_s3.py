"""The JVM commit protocol on an object store: an unchanged PySpark job writes ``s3a://`` tables
on the test S3 server (moto) with the conf ``sparkguard spark-conf`` prints plus the S3A conf,
and the Python side (reader, inspect, rollback: s3fs, which serves ``s3a://`` URLs too) reads
and repairs its output unchanged."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from sparkguard import cli
from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.spark import sparkconf
from sparkguard.spark_lib.storage import reader, rollback, timeline
from sparkguard.spark_lib.tools import commands
from tests.jvm import conftest, s3a
from tests.support import s3server

pytestmark = [pytest.mark.spark, pytest.mark.s3]


def run_job(script: str, *args: str, conf: dict[str, str], expect_exit: int = 0) -> Any:
    """``conftest.run_job`` with room for S3A's start on a loaded machine."""
    return conftest.run_job(script, *args, conf=conf, timeout=900, expect_exit=expect_exit)


JOB = "jvm-s3-job-1"
NAMES = [f"part-{p:05d}-{JOB}-w000-c000.snappy.parquet" for p in range(4)]


def _conf(server: s3server.S3Server, jars: Path, journal: str) -> dict[str, str]:
    """sparkguard's conf + the S3A conf, with both jar lists in ``spark.jars``."""
    guard = sparkconf.build_spark_conf(JOB, journal=journal)
    storage = s3a.spark_conf(server, jars)
    return {**guard, **storage, "spark.jars": f"{guard['spark.jars']},{storage['spark.jars']}"}


def _keys(server: s3server.S3Server, bucket: str, prefix: str) -> list[str]:
    pages = server.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def _uploads(server: s3server.S3Server, bucket: str, prefix: str) -> list[str]:
    """Keys of the multipart uploads in progress under ``prefix``, one per upload."""
    listed = server.client().list_multipart_uploads(Bucket=bucket, Prefix=prefix)
    return sorted(u["Key"] for u in listed.get("Uploads", []))


def _data(keys: list[str], table: str) -> list[str]:
    """Data object keys relative to the table (no ``_sparkguard/``)."""
    data = [k for k in keys if k.endswith(".parquet") and "/_sparkguard/" not in k]
    return [k[len(table) + 1 :] for k in data]


def _committed_ids(table: str, options: dict[str, Any]) -> list[int]:
    """Every ``n`` in the files the committed-only reader lists (s3fs + pyarrow, no Spark)."""
    import pyarrow.parquet as pq
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    ids: list[int] = []
    for path in reader.committed_paths(table, storage_options=options):
        with fs.open(path, "rb") as f:
            ids.extend(pq.read_table(f).column("n").to_pylist())
    return sorted(ids)


def _inspect(
    url: str, server: s3server.S3Server, capsys: pytest.CaptureFixture[str], mp: pytest.MonkeyPatch
) -> dict[str, Any]:
    mp.setenv(commands.STORAGE_ENV, json.dumps(server.storage_options))
    capsys.readouterr()
    assert cli.main(["inspect", url, "--json"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def test_a_jvm_write_to_s3_makes_no_probes_and_python_tools_read_what_it_committed(
    s3_server: s3server.S3Server,
    s3a_jars: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The write's requests (through a counting proxy: :func:`_assert_written_without_probes`),
    then what the Python side reads of it, after a rerun that skips it."""
    from tests.jvm import test_checkpoint_manager as counting

    bucket = s3_server.create_bucket()
    table, journal = f"s3a://{bucket}/t", f"s3a://{bucket}/journal"
    conf = _conf(s3_server, s3a_jars, journal)
    with counting.counting_proxy(s3_server) as proxy:
        counted = {**conf, "spark.hadoop.fs.s3a.endpoint": proxy}
        result = run_job("plain_write.py", table, "1000", "4", conf=counted)
        log = counting.requests_of(proxy)
    assert result == {"rows": 1000, "ids": 1000}
    _assert_written_without_probes(s3_server, bucket, "t", log)
    # Committed, then the job ran again (spark-operator#1854): the rerun's write 0 is skipped.
    result = run_job("plain_write.py", table, "1000", "4", conf=conf)
    assert result == {"rows": 1000, "ids": 1000}

    keys = _keys(s3_server, bucket, "t/")
    assert _data(keys, "t") == NAMES  # written directly under their final names, once
    assert not [k for k in keys if "_temporary" in k or "sg-tmp" in k or k.endswith("_SUCCESS")]
    # The commit deleted its markers (S3A leaves an empty directory marker "markers/" behind).
    assert [k for k in keys if "/_sparkguard/markers/" in k] in ([], ["t/_sparkguard/markers/"])
    options = s3_server.storage_options
    assert reader.committed_paths(table, storage_options=options) == [f"{table}/{n}" for n in NAMES]
    assert _committed_ids(table, options) == list(range(1000))
    doc = _inspect(table, s3_server, capsys, monkeypatch)
    assert [i["state"] for i in doc["instants"]] == ["committed"]
    assert {i["rows"] for i in doc["instants"]} == {1000}
    assert doc["visible"]["files"] == 4
    assert doc["visible"]["rows"] == 1000
    # The journal (on S3 too) names the table as s3a://, which the Python side opens.
    summary = rollback.rollback_job(JOB, journal, storage_options=options)
    assert list(summary.tables) == [table]
    assert not summary.instants_rolled_back
    assert summary.files_deleted == 0


def test_a_partitioned_write_to_s3_is_committed_exactly_once(
    s3_server: s3server.S3Server, s3a_jars: Path
) -> None:
    bucket = s3_server.create_bucket()
    table, journal = f"s3a://{bucket}/p", f"s3a://{bucket}/journal"
    conf = _conf(s3_server, s3a_jars, journal)
    # One run: a rerun's skip of the committed write is the same step partitioned or not
    # (test_a_jvm_write_to_s3_makes_no_probes_and_python_tools_read_what_it_committed reruns).
    result = run_job("plain_write.py", table, "900", "2", "append", "-", "0", "n % 3", conf=conf)
    assert result == {"rows": 900, "ids": 900}

    data = _data(_keys(s3_server, bucket, "p/"), "p")
    expected = [
        f"k={k}/part-{p:05d}-{JOB}-w000-c000.snappy.parquet" for k in range(3) for p in range(2)
    ]
    assert data == expected
    options = s3_server.storage_options
    committed = reader.committed_paths(table, storage_options=options)
    assert committed == [f"{table}/{name}" for name in expected]
    manager, path = filemanager.resolve(table, storage_options=options)
    statuses = timeline.Timeline(manager, path).statuses(job_id=JOB)
    assert [s.state for s in statuses] == [timeline.State.COMMITTED]


def test_a_failed_jvm_write_on_s3_is_rolled_back_and_the_rerun_is_exactly_once(
    s3_server: s3server.S3Server,
    s3a_jars: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bucket = s3_server.create_bucket()
    table, journal = f"s3a://{bucket}/f", f"s3a://{bucket}/journal"
    conf = _conf(s3_server, s3a_jars, journal)
    # Row 600 is in task 2 of 4 (rows 500-749): the others leave their files as pending
    # uploads, the job aborts; no directory reader sees any of them.
    failed = run_job(
        "plain_write.py", table, "1000", "4", "append", "600", conf=conf, expect_exit=3
    )
    assert failed == {"failed": True}
    assert _data(_keys(s3_server, bucket, "f/"), "f") == [], "a file of a failed write visible"
    pending = _uploads(s3_server, bucket, "f/")
    assert pending, "the tasks before the failure left their uploads"
    # Spark closed the failed task's writer (its upload left open, partial rows); abortTask
    # aborted it.
    assert f"f/part-00002-{JOB}-w000-c000.snappy.parquet" not in pending
    options = s3_server.storage_options
    assert reader.committed_paths(table, storage_options=options) == []
    doc = _inspect(table, s3_server, capsys, monkeypatch)
    assert [i["state"] for i in doc["instants"]] == [timeline.State.ROLLING_BACK.value]

    summary = rollback.rollback_job(JOB, journal, storage_options=options)
    assert summary.files_deleted == 0
    assert summary.temp_files_removed == len(pending)  # R6: the uploads aborted
    assert _uploads(s3_server, bucket, "f/") == []

    result = run_job("plain_write.py", table, "1000", "4", conf=conf)
    assert result == {"rows": 1000, "ids": 1000}
    assert _data(_keys(s3_server, bucket, "f/"), "f") == NAMES
    assert _committed_ids(table, options) == list(range(1000))


def test_only_the_accepted_attempts_upload_is_published_and_no_upload_is_left(
    s3_server: s3server.S3Server, s3a_jars: Path
) -> None:
    """Task 2's first attempt fails mid-file (its writer closed: the upload left open); its
    abortTask aborts it, the retry writes the name again, and the driver completes only the
    accepted attempt's upload: every row once, no upload left."""
    bucket = s3_server.create_bucket()
    table, journal = f"s3a://{bucket}/a", f"s3a://{bucket}/journal"
    conf = {**_conf(s3_server, s3a_jars, journal), "spark.master": "local[2,2]"}
    done = conftest.job_result(
        "plain_write.py", table, "1000", "4", "append", "600:first", conf=conf, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "injected failure of the first attempt at row 600" in done.stderr  # it did fail
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"rows": 1000, "ids": 1000}
    assert _data(_keys(s3_server, bucket, "a/"), "a") == NAMES
    assert _uploads(s3_server, bucket, "a/") == []
    assert _committed_ids(table, s3_server.storage_options) == list(range(1000))


def test_racing_put_if_absent_on_the_s3_server_has_exactly_one_winner(
    s3_server: s3server.S3Server, s3a_jars: Path
) -> None:
    bucket = s3_server.create_bucket()
    url = f"s3a://{bucket}/t/_sparkguard/timeline/20260101000000000-{JOB}.outcome"
    conf = _conf(s3_server, s3a_jars, f"s3a://{bucket}/journal")
    result = run_job("race_put_if_absent.py", url, "8", conf=conf)
    assert result["store"] == "io.sparkguard.spark.store.ObjectStoreAtomicStore"
    assert len(result["winners"]) == 1, result
    assert result["content"] == f"racer-{result['winners'][0]}"


def test_a_rerun_without_rollback_writes_over_the_failed_attempts_uploads(
    s3_server: s3server.S3Server, s3a_jars: Path
) -> None:
    """The failed attempt left pending uploads of the names the rerun writes again; the rerun's
    commit (W8) aborts every upload of its names but its own, and completes its own. (S3A's
    own create, probing or in performance mode, is not what writes data files: the tasks'
    owned create leaves a multipart upload, whatever ``fs.s3a.create.performance`` says.)"""
    bucket = s3_server.create_bucket()
    table, journal = f"s3a://{bucket}/r", f"s3a://{bucket}/journal"
    conf = _conf(s3_server, s3a_jars, journal)
    failed = run_job(
        "plain_write.py", table, "1000", "4", "append", "600", conf=conf, expect_exit=3
    )
    assert failed == {"failed": True}
    assert _data(_keys(s3_server, bucket, "r/"), "r") == []
    assert _uploads(s3_server, bucket, "r/")

    result = run_job("plain_write.py", table, "1000", "4", conf=conf)
    assert result == {"rows": 1000, "ids": 1000}
    assert _data(_keys(s3_server, bucket, "r/"), "r") == NAMES
    assert _uploads(s3_server, bucket, "r/") == []
    options = s3_server.storage_options
    assert reader.committed_paths(table, storage_options=options) == [f"{table}/{n}" for n in NAMES]
    # The failed attempt's instant was claimed by the rerun; its rollback keeps committed names.
    summary = rollback.rollback_job(JOB, journal, storage_options=options)
    assert summary.files_deleted == 0
    assert _committed_ids(table, options) == list(range(1000))


def test_speculation_is_refused_on_s3_before_anything_is_written(
    s3_server: s3server.S3Server, s3a_jars: Path
) -> None:
    # A killed speculative copy would complete a file of partial rows over its twin's: refused
    # when the protocol is instantiated (FAIL_AT beyond the rows: only the refusal can fail it).
    bucket = s3_server.create_bucket()
    conf = {**_conf(s3_server, s3a_jars, f"s3a://{bucket}/journal"), "spark.speculation": "true"}
    failed = run_job(
        "plain_write.py", f"s3a://{bucket}/s", "100", "2", "append", "1000", conf=conf,
        expect_exit=3,
    )  # fmt: skip
    assert failed == {"failed": True}
    assert _keys(s3_server, bucket, "") == []


def test_a_store_ignoring_if_none_match_is_refused_before_anything_is_written(
    s3_server: s3server.S3Server, s3a_jars: Path
) -> None:
    # On a store that ignores If-None-Match: * the timeline's put-if-absent would silently
    # overwrite: the store's first use probes it (a key created twice must get 412) and refuses.
    bucket = s3_server.create_bucket(ignores_if_none_match=True)
    conf = _conf(s3_server, s3a_jars, f"s3a://{bucket}/journal")
    failed = conftest.job_result(
        "plain_write.py", f"s3a://{bucket}/s", "100", "2", "append", "1000", conf=conf,
        timeout=900,
    )  # fmt: skip
    assert failed.returncode == 3, failed.stderr[-3000:]
    refusal = f"ignores If-None-Match: * on PUT in bucket '{bucket}'"
    assert refusal in failed.stderr, failed.stderr[-3000:]
    assert f"the store at {s3_server.endpoint}" in failed.stderr
    assert _keys(s3_server, bucket, "") == []  # no data, no timeline, no probe key


def _assert_written_without_probes(
    s3_server: s3server.S3Server, bucket: str, table: str, log: list[dict[str, Any]]
) -> None:
    """The requests ``log`` of a 4-task write of 1000 rows to the table at key ``table``: data
    files are created without probes and not read back by the task.

    The tasks open their files as sg-s3a:// (OwnedFileSystem): each is a multipart upload the
    task leaves open (no HEAD/LIST probe of the name; the length and rows come from the
    stream), so until the commit decides, each data key sees its upload's start and its one
    part only, and no directory reader sees it: the commit's W7/W8 check is one listing of the
    uploads under the table (the accepted ones still pending, the others aborted), not a HEAD
    per file; after the outcome the driver completes each upload (one request). The driver's
    state checks make no S3A existence probe (HEAD, or a LIST with a delimiter) under
    _sparkguard/, and list it at most twice before the .inflight."""
    outcome = next(
        i
        for i, r in enumerate(log)
        if r["method"] == "PUT" and r["path"].startswith(f"/{bucket}/{table}/_sparkguard/timeline/")
        and r["path"].endswith(".outcome")
    )  # fmt: skip
    # W6 (the completions) runs between the outcome and W10 (the markers' delete); the job's
    # read of the table comes after
    w10 = next(
        i for i, r in enumerate(log) if i > outcome
        and f"{table}/_sparkguard/markers/" in r["path"] + urllib.parse.unquote(r["query"])
    )  # fmt: skip
    before, after = log[:outcome], log[outcome + 1 : w10]
    for name in NAMES:
        on_key = [r["method"] for r in before if r["path"] == f"/{bucket}/{table}/{name}"]
        assert on_key == ["POST", "PUT"], (name, on_key)  # the upload's start, its one part
        probes = [r for r in before if f"prefix={table}/{name}" in urllib.parse.unquote(r["query"])]
        assert probes == [], (name, probes)
        published = [r["method"] for r in after if r["path"] == f"/{bucket}/{table}/{name}"]
        assert published == ["POST"], (name, published)  # CompleteMultipartUpload
    last_upload = max(
        i for i, r in enumerate(before) if r["method"] == "PUT" and r["path"].endswith(".parquet")
    )
    queries = [urllib.parse.parse_qs(r["query"], keep_blank_values=True) for r in before]
    w7 = [
        q for r, q in zip(before[last_upload:], queries[last_upload:], strict=True)
        if r["method"] == "GET" and q.get("prefix") == [f"{table}/"]
    ]  # fmt: skip
    assert len(w7) == 1, w7  # the uploads under the table, listed once
    assert "uploads" in w7[0], w7
    state = [
        (r["method"], q)
        for r, q in zip(before, queries, strict=True)
        if f"/{table}/_sparkguard/" in r["path"]
        or q.get("prefix", [""])[0].startswith(f"{table}/_sparkguard")
    ]  # fmt: skip
    assert [m for m, _ in state if m == "HEAD"] == [], "an existence probe"
    assert [q for m, q in state if "delimiter" in q] == [], "an S3A listStatus probe"
    inflight = next(
        i for i, r in enumerate(log) if r["method"] == "PUT" and r["path"].endswith(".inflight")
    )
    opening = [
        q for r, q in zip(log[:inflight], queries[:inflight], strict=False)
        if r["method"] == "GET" and q.get("prefix") == [f"{table}/_sparkguard/"]
    ]  # fmt: skip
    assert 1 <= len(opening) <= 2, opening
    # The sizes and rows the streams recorded are the objects' and the footers' (250 rows each).
    client = s3_server.client()
    key = next(
        k for k in _keys(s3_server, bucket, f"{table}/_sparkguard/timeline/") if "outcome" in k
    )
    outcome = json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    sizes = {
        n: client.head_object(Bucket=bucket, Key=f"{table}/{n}")["ContentLength"] for n in NAMES
    }
    assert {f["path"]: (f["size"], f["rows"]) for f in outcome["files"]} == {
        n: (sizes[n], 250) for n in NAMES
    }
