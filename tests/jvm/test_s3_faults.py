"""The JVM commit protocol under a flaky S3: an unchanged PySpark job writes ``s3a://`` through
the fault-injecting S3 front (``tests/support/s3faults.py``: a few percent of every request type
answered 503 SlowDown or 500 InternalError, delayed, or reset before the store or after it
applied the request). A job whose task fails is aborted, rolled back (the Python rollback,
through the same front) and rerun, with faults placed on the rerun's timeline creates and on
its data files' pending uploads (start, part, completion): with the faults off the table holds
every row exactly once, no uncommitted object, no multipart upload, no temp file. S3A's retry policy
(``fs.s3a.retry.*``, ``fs.s3a.attempts.maximum``) is what rides through the faults."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest

from sparkguard.spark_lib.storage import rollback
from tests.jvm import conftest, stores
from tests.jvm import test_commit_protocol_s3 as on_s3
from tests.jvm import test_streaming_sink_s3 as sink_test
from tests.jvm.test_checkpoint_manager import assert_every_file_parses
from tests.spark_lib.spark_conftest import undecided
from tests.support import s3server
from tests.support.s3faults import Fault, Op, Rates, S3FaultFront

pytestmark = [pytest.mark.spark, pytest.mark.s3, pytest.mark.slow]


def test_a_failed_jvm_write_rolled_back_and_rerun_under_s3_faults(
    s3_server: s3server.S3Server, s3_faults: S3FaultFront, s3a_jars: Path
) -> None:
    bucket = s3_server.create_bucket()
    table, journal = f"s3a://{bucket}/f", f"s3a://{bucket}/journal"
    through_front = s3server.S3Server(endpoint=s3_faults.endpoint, process=s3_server.process)
    conf = on_s3._conf(through_front, s3a_jars, journal)
    options = s3_faults.storage_options
    s3_faults.set_rates(
        Rates(slowdown=0.03, internal=0.02, delay=0.02, reset_before=0.02, reset_after=0.02)
    )
    # Each kind for sure, besides the draws: the first PUTs land and then reset, the first
    # HEADs are delayed, the first LIST is reset before the store.
    s3_faults.fail_next(Op.PUT, Fault.RESET_AFTER, 2)
    s3_faults.fail_next(Op.HEAD, Fault.DELAY, 2)
    s3_faults.fail_next(Op.LIST, Fault.RESET_BEFORE)
    failed = on_s3.run_job(
        "plain_write.py", table, "1000", "4", "append", "600", conf=conf, expect_exit=3
    )
    assert failed == {"failed": True}
    rollback.rollback_job(on_s3.JOB, journal, storage_options=options)
    # The rerun's timeline creates are applied and their answers lost: S3A's retry meets its
    # own object (412), which its write id shows to be this create's, not a lost race.
    for suffix in (".inflight", ".outcome"):
        s3_faults.fail_next(Op.PUT, Fault.RESET_AFTER, key=suffix)
    # Its data files' pending uploads: one started twice (the first start's answer lost: an
    # upload nobody uses, which the commit aborts), one part reset before the store (retried),
    # one completion applied and its answer lost (S3A's retry of it succeeds on this store; one
    # that answers 404 NoSuchUpload instead is met by completeUpload's check of the object).
    s3_faults.fail_next(Op.MPU_CREATE, Fault.RESET_AFTER, key=".parquet")
    s3_faults.fail_next(Op.MPU_PART, Fault.RESET_BEFORE, key=".parquet")
    s3_faults.fail_next(Op.MPU_COMPLETE, Fault.RESET_AFTER, key=".parquet")
    # The commit's abort of that unused upload applied and its answer lost: S3A's retry meets
    # 404 NoSuchUpload, which is the abort done, not a failed commit (CI met it by chance).
    s3_faults.fail_next(Op.MPU_ABORT, Fault.RESET_AFTER, key=".parquet")
    result = on_s3.run_job("plain_write.py", table, "1000", "4", conf=conf)
    assert s3_faults.injected[(Op.PUT, Fault.RESET_AFTER)] >= 4
    for op, fault in (
        (Op.MPU_CREATE, Fault.RESET_AFTER),
        (Op.MPU_PART, Fault.RESET_BEFORE),
        (Op.MPU_COMPLETE, Fault.RESET_AFTER),
        (Op.MPU_ABORT, Fault.RESET_AFTER),
    ):
        assert s3_faults.injected[(op, fault)] >= 1, (op, fault)
    assert result == {"rows": 1000, "ids": 1000}
    s3_faults.set_rates(None)
    with s3_faults.off():
        assert on_s3._committed_ids(table, options) == list(range(1000))
        keys = on_s3._keys(s3_server, bucket, "f/")
        assert on_s3._data(keys, "f") == on_s3.NAMES
        assert not [k for k in keys if "_temporary" in k or ".tmp" in k], keys
        assert s3_server.client().list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
        assert undecided(table, options) == []
    print(s3_faults.report())
    by_fault = s3_faults.injected_by_fault()
    assert all(by_fault[fault] > 0 for fault in Fault), by_fault


def test_a_streaming_sink_killed_and_rerun_under_s3_faults(  # noqa: PLR0917 - fixtures
    s3_server: s3server.S3Server,
    s3_faults: S3FaultFront,
    s3a_jars: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Spark's file sink through ``SparkguardStreamingCommitProtocol``, its checkpoint through
    the checkpoint manager, its journal: all on ``s3a://`` through the fault front. The query is
    SIGKILLed at a seeded moment inside a batch, ``sparkguard rollback`` runs (through the front,
    as the rollback initContainer), and the rerun goes to the end, every step under faults, with
    each kind placed once on the sink's and the checkpoint's conditional creates and writes. With
    the faults off: every input row once, by the manifest and by listing; no file the manifest
    does not list, no multipart upload, no temp object; every checkpoint file parses."""
    through_front = s3server.S3Server(endpoint=s3_faults.endpoint, process=s3_server.process)
    on_front = stores.on_s3(through_front, s3a_jars)
    bucket = on_front.base.removeprefix("s3a://")
    # What the test reads goes to the store itself; Spark and the rollback go through the front.
    direct = stores.Store("s3", on_front.base, on_front.conf, dict(s3_server.storage_options))
    sink = sink_test.Sink(direct)
    # S3A's own policy, its waits shortened (500 ms each by default) to keep the test short
    conf = {
        **sink_test._conf(on_front, sink.journal),
        "spark.hadoop.fs.s3a.retry.interval": "50ms",
        "spark.hadoop.fs.s3a.retry.throttle.interval": "50ms",
    }
    inputs = 3
    source = tmp_path / "input"
    sink_test._inputs(source, inputs)
    args = [str(source), sink.url, sink.checkpoint, "-", "-1"]

    s3_faults.set_rates(
        Rates(slowdown=0.03, internal=0.02, delay=0.02, reset_before=0.02, reset_after=0.02)
    )
    s3_faults.fail_next(Op.PUT, Fault.RESET_AFTER, key="/cp/offsets/")  # the checkpoint's create
    s3_faults.fail_next(Op.PUT, Fault.RESET_AFTER, key="/sink/_spark_metadata/")  # the manifest
    s3_faults.fail_next(Op.PUT, Fault.RESET_AFTER, key=".outcome")  # a batch's commit
    s3_faults.fail_next(Op.PUT, Fault.RESET_BEFORE, key=".parquet")  # a data file
    s3_faults.fail_next(Op.HEAD, Fault.DELAY, 2)
    s3_faults.fail_next(Op.LIST, Fault.SLOWDOWN)
    s3_faults.fail_next(Op.GET, Fault.INTERNAL)

    delay = random.Random(37).uniform(0.5, 3.0)  # seed 37: 1.09 s into the second instant
    sink_test._kill_when(args, conf, tmp_path / "run0.err", lambda: sink.instants() >= 2, delay)
    conftest.rollback_as_init_container(
        sink_test.JOB, sink.journal, s3_faults.storage_options, capsys, monkeypatch
    )
    with (tmp_path / "run1.err").open("wb") as err:
        done = subprocess.run(
            conftest.job_command("stream_write.py", *args, conf=conf),
            stdout=subprocess.PIPE,
            stderr=err,
            env=conftest.job_env(),
            timeout=900,
            check=False,
        )
    assert done.returncode == 0, (tmp_path / "run1.err").read_text()[-3000:]
    s3_faults.set_rates(None)
    with s3_faults.off():
        rows = inputs * sink_test.ROWS_PER_FILE
        assert json.loads(done.stdout.decode().strip().splitlines()[-1]) == {
            "rows": rows,
            "ids": rows,
        }  # through _spark_metadata
        assert sorted(sink.rows_by_listing()) == list(range(rows))  # by listing
        assert sink.data_files() == sink.listed()
        assert not s3_server.client().list_multipart_uploads(Bucket=bucket).get("Uploads")
        assert sink.temp_objects() == []
        assert assert_every_file_parses(direct.files("cp/"), "cp/")["offsets"] >= 1
    print(s3_faults.report())
    by_fault = s3_faults.injected_by_fault()
    assert all(by_fault[fault] > 0 for fault in Fault), by_fault
