"""The Python storage paths under a flaky S3 (``tests/support/s3faults.py`` before the server).

A writer job is killed (its tasks wrote, it never committed), rolled back and rerun, all with
a few percent of every request failing (503 SlowDown, 500 InternalError, delays, resets before
the store and after it applied the request) and with bursts (every request of a kind failing
for a while). botocore's retry policy (``filemanager.registry.S3_RETRIES``) rides through it,
and a retried write that had landed is recognised as the writer's own. With the faults off the
table then holds every row exactly once, no uncommitted file, no undecided instant, no
multipart upload; each kind of fault was injected (a fault test whose faults never fired
fails).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors, paths
from sparkguard.spark_lib.filemanager import registry
from sparkguard.spark_lib.filemanager.direct_put import DirectPutFileManager
from sparkguard.spark_lib.storage import markers, metadatalog, rollback, snapshots
from sparkguard.spark_lib.storage import timeline as timeline_
from tests.spark_lib.spark_conftest import assert_exactly_once, assert_no_strays, undecided
from tests.spark_lib.test_rollback import PARTS, _all_rows, _start, _task
from tests.support.s3faults import REALISTIC, Fault, Op, Rates, S3FaultFront

pytestmark = pytest.mark.s3


def _bucket_of(url: str) -> str:
    return url.removeprefix("s3://").split("/")[0]


def _assert_clean(front: S3FaultFront, url: str, options: dict[str, Any]) -> None:
    """Verification with the faults off: every row once, nothing uncommitted or pending."""
    with front.off():
        assert_exactly_once(url, _all_rows(), options)
        assert_no_strays(url, options)
        assert undecided(url, options) == []
        manager, base = filemanager.resolve(url, storage_options=options)
        assert isinstance(manager, DirectPutFileManager)
        assert manager.list_pending_uploads(f"{_bucket_of(url)}/") == []
        names = [info.path for info in manager.list_tree(base)]
        assert not [n for n in names if ".tmp" in n or "_temporary" in n], names


def _assert_every_kind_fired(front: S3FaultFront) -> None:
    print(front.report())
    by_fault = front.injected_by_fault()
    assert all(by_fault[fault] > 0 for fault in Fault), by_fault


@pytest.mark.slow
def test_killed_job_rolled_back_and_rerun_under_faults(
    s3_faults: S3FaultFront, s3_bucket: str
) -> None:
    front, options = s3_faults, s3_faults.storage_options
    url, journal, job = f"{s3_bucket}/t", f"{s3_bucket}/journal", "flaky-1"
    front.set_rates(Rates(slowdown=0.04, internal=0.03, delay=0.03, reset_before=0.03,
                          reset_after=0.04))  # fmt: skip
    # The killed job: every task wrote (one twice, a duplicate attempt), no commit.
    killed = _start(url, journal, options, job, markerType="DIRECT")
    _task(killed, 1, PARTS[1], attempt=1, max_records=80)
    for partition, ids in PARTS.items():
        _task(killed, partition, ids)
    with front.off():  # 0 acknowledged markers lost: every data file written has its marker
        manager, base = filemanager.resolve(url, storage_options=options)
        marked = markers.read_marked_files(manager, markers.marker_dir(base, killed.instant))
        written = {i.path for i in manager.list_files(base) if "_sparkguard" not in i.path}
        assert written
        assert written <= {paths.join(base, m) for m in marked}
    # The rollback meets a burst: every delete answered 503 SlowDown for a second.
    front.burst(Op.DELETE, Fault.SLOWDOWN, 1.0)
    summary = rollback.rollback_job(job, journal, storage_options=options)
    assert summary.instants_rolled_back == (killed.instant,)
    # The rerun (same job id) meets a burst of resets after the store applied each PUT.
    rerun = _start(url, journal, options, job, markerType="DIRECT")
    front.fail_next(Op.PUT, Fault.RESET_AFTER, 3)
    rerun.commit([_task(rerun, p, ids) for p, ids in PARTS.items()])
    # A second rollback pass (as the operator runs on every driver start) finds nothing.
    assert rollback.rollback_job(job, journal, storage_options=options).files_deleted == 0
    front.set_rates(None)
    _assert_clean(front, url, options)
    _assert_every_kind_fired(front)


@pytest.mark.slow
def test_compaction_under_faults_keeps_every_row(s3_faults: S3FaultFront, s3_bucket: str) -> None:
    front, options = s3_faults, s3_faults.storage_options
    url, journal = f"{s3_bucket}/t", f"{s3_bucket}/journal"
    for partition, ids in PARTS.items():  # three committed writes, one partition each
        w = _start(url, journal, options, f"compacted-{partition}")
        w.commit([_task(w, partition, ids)])
    front.set_rates(REALISTIC)
    manager, base = filemanager.resolve(url, storage_options=options)
    front.fail_next(Op.PUT, Fault.RESET_AFTER, 2)
    snapshots.compact(manager, base)
    snapshots.compact(manager, base)  # a second run: nothing left to do, still no error
    front.set_rates(None)
    _assert_clean(front, url, options)
    assert front.injected[(Op.PUT, Fault.RESET_AFTER)] > 0


def test_retried_writes_that_landed_are_recognised(s3_faults: S3FaultFront, s3_bucket: str) -> None:
    """Every PUT, multipart completion and delete is applied, then its connection reset:
    botocore's retry meets the write it already made. A conditional create, a versioned
    rewrite and a multipart upload each recognise their own bytes (not a lost race); a delete
    of a gone key is success; a real race is still lost."""
    front, options = s3_faults, s3_faults.storage_options
    manager, base = filemanager.resolve(s3_bucket, storage_options=options)
    assert isinstance(manager, DirectPutFileManager)
    reset_next = front.fail_next
    reset_next(Op.PUT, Fault.RESET_AFTER)
    manager.write_bytes(paths.join(base, "once"), b"mine")  # put-if-absent
    reset_next(Op.PUT, Fault.RESET_AFTER)
    with pytest.raises(errors.AlreadyExistsError):
        manager.write_bytes(paths.join(base, "once"), b"another writer's")
    log = metadatalog.MetadataLog(manager, paths.join(base, "log"))
    reset_next(Op.PUT, Fault.RESET_AFTER)
    assert log.add(0, {"batch": 0})
    assert not log.add(0, {"batch": "other"})
    reset_next(Op.PUT, Fault.RESET_AFTER)
    version = manager.write_versioned(paths.join(base, "v"), b"1", None)
    reset_next(Op.PUT, Fault.RESET_AFTER)
    manager.write_versioned(paths.join(base, "v"), b"2", version)
    manager.block_size = 5 * 1024 * 1024  # S3's smallest part: two parts and a completion
    big = bytes(range(256)) * (45 * 1024)  # 11.25 MiB
    reset_next(Op.MPU_PART, Fault.RESET_AFTER)
    reset_next(Op.MPU_COMPLETE, Fault.RESET_AFTER)
    with manager.create_atomic(paths.join(base, "big")) as stream:
        stream.write(big)
    cancelled = manager.create_atomic(paths.join(base, "cancelled"))
    cancelled.write(big)
    reset_next(Op.MPU_ABORT, Fault.RESET_AFTER)
    cancelled.cancel()
    reset_next(Op.DELETE, Fault.RESET_AFTER)
    manager.delete(paths.join(base, "once"))
    with front.off():
        assert manager.read_bytes(paths.join(base, "big")) == big
        assert manager.read_bytes(paths.join(base, "v")) == b"2"
        assert not manager.exists(paths.join(base, "once"))
        assert not manager.exists(paths.join(base, "cancelled"))
        assert manager.list_pending_uploads(f"{_bucket_of(s3_bucket)}/") == []
    print(front.report())
    assert front.injected[(Op.PUT, Fault.RESET_AFTER)] == 5
    for op in (Op.MPU_PART, Op.MPU_COMPLETE, Op.MPU_ABORT, Op.DELETE):
        assert front.injected[(op, Fault.RESET_AFTER)] == 1, op


def test_a_burst_longer_than_the_retry_policy_fails_with_one_clear_error(
    s3_faults: S3FaultFront, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An outage outlasting every retry is an error naming the store's answer (the caller's
    step fails and the next rollback finishes it), never a silent success."""
    front = s3_faults
    options = {**front.storage_options, "config_kwargs": {"retries": {"total_max_attempts": 2}}}
    manager, base = filemanager.resolve(s3_bucket, storage_options=options)
    front.burst(Op.PUT, Fault.INTERNAL, 600)
    with pytest.raises(OSError, match="internal error"):
        manager.write_bytes(paths.join(base, "x"), b"x")
    with front.off():
        assert not manager.exists(paths.join(base, "x"))
    tl = timeline_.Timeline(manager, paths.join(base, "t"))
    front.burst(Op.LIST, Fault.SLOWDOWN, 600)
    started = time.monotonic()
    with pytest.raises(OSError, match="reduce your request rate"):
        tl.statuses()
    assert time.monotonic() - started < 30


def test_every_s3_client_gets_botocores_retry_policy_unless_the_options_name_one() -> None:
    options = {"key": "k", "secret": "s", "endpoint_url": "http://127.0.0.1:9"}
    manager, _ = filemanager.resolve("s3://bucket/t", storage_options=options)
    assert manager.fs.config_kwargs["retries"] == registry.S3_RETRIES
    own = {**options, "config_kwargs": {"retries": {"mode": "adaptive"}, "read_timeout": 5}}
    manager, _ = filemanager.resolve("s3://bucket/t", storage_options=own)
    assert manager.fs.config_kwargs == {"retries": {"mode": "adaptive"}, "read_timeout": 5}
    manager, _ = filemanager.resolve("/tmp/t")
    assert not hasattr(manager.fs, "config_kwargs")
