"""The JVM commit protocol under a flaky S3: an unchanged PySpark job writes ``s3a://`` through
the fault-injecting S3 front (``tests/support/s3faults.py``: a few percent of every request type
answered 503 SlowDown or 500 InternalError, delayed, or reset before the store or after it
applied the request). A job whose task fails is aborted, rolled back (the Python rollback,
through the same front) and rerun: with the faults off the table holds every row exactly once,
no uncommitted object, no multipart upload, no temp file. S3A's retry policy
(``fs.s3a.retry.*``, ``fs.s3a.attempts.maximum``) is what rides through the faults."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkguard.spark_lib.storage import rollback
from tests.jvm import test_commit_protocol_s3 as on_s3
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
    result = on_s3.run_job("plain_write.py", table, "1000", "4", conf=conf)
    assert s3_faults.injected[(Op.PUT, Fault.RESET_AFTER)] >= 4
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
