"""The batch writer in real PySpark (local[2,4]): layout, re-runs, overwrite, and faults.

Every fault point of the writer (spark_lib/spark/faults.py) is injected on local disk and on the S3
server; each write fails with exactly the injected fault (or survives it through a task retry),
the fault fires exactly as often as expected, and after rollback + re-run the table holds each
row exactly once, no uncommitted file is left on storage, and readers only ever see committed
(whole) files.
"""

from __future__ import annotations

import dataclasses
import json
import random
import zlib
from pathlib import Path
from typing import Any

import pytest

from sparkguard.spark_lib.spark import faults, writer
from sparkguard.spark_lib.storage import reader, rollback
from tests.spark_lib.conftest import Store
from tests.spark_lib.spark_conftest import (
    assert_exactly_once,
    assert_no_strays,
    data_files_on_storage,
    fired,
    ids_df,
    injected,
    spark,
    undecided,
    visible_ids,
)

__all__ = ["spark"]  # the fixture, imported for pytest

pytestmark = pytest.mark.spark
ROWS = range(4000)


def _register(spark: Any, tmp_path: Path, job: str) -> str:
    journal = str(tmp_path / "journal")
    writer.register(
        spark, conf={"spark.sparkguard.jobId": job, "spark.sparkguard.journal": journal}
    )
    return journal


def _write(df: Any, url: str, *, mode: str = "append", **options: str) -> None:
    out = df.write.format("sparkguard").mode(mode)
    for key, value in options.items():
        out = out.option(key, value)
    out.save(url)


def test_partitioned_write_layout_and_read_back(spark: Any, tmp_path: Path) -> None:
    _register(spark, tmp_path, "layout-1")
    url = str(tmp_path / "t")
    _write(ids_df(spark, ROWS), url, partitionBy="k", maxRecordsPerFile="200")
    files = data_files_on_storage(url)
    assert files == set(reader.committed_files(url))
    assert {f.split("/")[0] for f in files} == {"k=0", "k=1", "k=2"}
    assert all("-layout-1-w000-c" in f and f.endswith(".parquet") for f in files)
    assert any(f.endswith("-c001.parquet") for f in files)  # maxRecordsPerFile rolled over
    assert_exactly_once(url, ROWS)
    df = reader.read_table(spark, url)
    assert sorted(df.columns) == ["d", "id", "k", "s"]
    assert df.count() == len(ROWS)
    assert df.where("k = 1").count() == len([i for i in ROWS if i % 3 == 1])
    marker_root = Path(url, "_sparkguard", "markers")
    assert not marker_root.exists() or list(marker_root.iterdir()) == []


def test_json_format(spark: Any, tmp_path: Path) -> None:
    _register(spark, tmp_path, "json-1")
    url = str(tmp_path / "t")
    _write(ids_df(spark, range(300)), url, format="json")
    assert all(f.endswith(".json") for f in data_files_on_storage(url))
    assert_exactly_once(url, range(300))
    assert reader.read_table(spark, url).count() == 300


def test_rerun_same_job_skips_and_rewrite_and_new_job(spark: Any, tmp_path: Path) -> None:
    _register(spark, tmp_path, "rerun-1")
    url = str(tmp_path / "t")
    _write(ids_df(spark, ROWS), url)
    before = {p: Path(url, p).stat().st_mtime_ns for p in data_files_on_storage(url)}
    writer.new_driver_run(spark)  # a re-run is a new driver run: its first write is write 0
    _write(ids_df(spark, ROWS), url)  # same job id: exactly-once re-run, nothing written
    after = {p: Path(url, p).stat().st_mtime_ns for p in data_files_on_storage(url)}
    assert before == after
    assert_exactly_once(url, ROWS)
    # rerun=rewrite writes the same names again; fewer partitions: the old extra file is
    # superseded, not duplicated.
    writer.new_driver_run(spark)
    _write(ids_df(spark, ROWS, partitions=2), url, rerun="rewrite")
    assert_exactly_once(url, ROWS)
    assert len(reader.superseded_files(reader.load_commits(*_open(url)))) == 2
    # Another job id appends new files.
    _write(ids_df(spark, range(4000, 4100)), url, jobId="rerun-2")
    assert_exactly_once(url, range(4100))


def _open(url: str) -> tuple[Any, str]:
    from sparkguard.spark_lib import filemanager

    return filemanager.resolve(url)


def test_overwrite_supersedes_earlier_files(spark: Any, tmp_path: Path) -> None:
    _register(spark, tmp_path, "ow-1")
    url = str(tmp_path / "t")
    _write(ids_df(spark, ROWS), url)
    _write(ids_df(spark, range(10, 20)), url, mode="overwrite", jobId="ow-2")
    assert_exactly_once(url, range(10, 20))
    commits = reader.load_commits(*_open(url))
    assert len(reader.superseded_files(commits)) == 4
    assert reader.read_table(spark, url).count() == 10


def test_bad_options_fail_with_named_errors(spark: Any, tmp_path: Path) -> None:
    _register(spark, tmp_path, "bad-1")
    url = str(tmp_path / "t")
    for options, needle in [
        ({"format": "orc"}, "format"),
        ({"partitionBy": "nope"}, "partitionBy"),
        ({"maxRecordsPerFile": "-3"}, "maxRecordsPerFile"),
        ({"jobId": "Bad_Id"}, "jobId"),
        ({"rerun": "twice"}, "rerun"),
    ]:
        with pytest.raises(Exception, match=needle):
            _write(ids_df(spark, range(10)), url, **options)


# ------------------------------------------------------------------------------------------
# Faults: every fault point of the batch writer, on local disk and on the S3 server. The
# points are fixed (faults.Point); a seeded draw picks only the data layout of each case.
# ------------------------------------------------------------------------------------------

P = faults.Point
RETRIED = "retried"  # a task attempt fails, its retry succeeds: the write commits
FAILS = "fails"  # the write fails and publishes nothing
COMMITTED_THEN_FAILS = "committed-then-fails"  # the outcome is written, then the write fails


@dataclasses.dataclass(frozen=True)
class FaultCase:
    """Faults to inject, what the write does, the fault it fails with and the firings."""

    injected: tuple[dict[str, Any], ...]
    outcome: str
    raised: str | None  # the point named by the write's error
    fired: dict[str, int]


def _task_once(point: str, action: str = "raise") -> FaultCase:
    # Partition 1, first attempt only: one firing, then Spark's retry of the task succeeds.
    fault = {"point": point, "partition": 1, "attempt": 0, "action": action}
    return FaultCase((fault,), RETRIED, None, {point: 1})


def _driver(point: str, outcome: str = FAILS) -> FaultCase:
    return FaultCase(({"point": point},), outcome, point, {point: 1})


#: one case per point (the key), plus extra actions; test_fault_points.py checks the keys
WRITER_CASES: dict[str, FaultCase] = {
    P.DRIVER_AFTER_INFLIGHT: _driver(P.DRIVER_AFTER_INFLIGHT),
    P.TASK_BEFORE_MARKER: _task_once(P.TASK_BEFORE_MARKER),
    P.TASK_AFTER_MARKER: _task_once(P.TASK_AFTER_MARKER),
    P.TASK_MID_FILE: _task_once(P.TASK_MID_FILE),
    P.TASK_AFTER_FILE: _task_once(P.TASK_AFTER_FILE),
    P.TASK_END: _task_once(P.TASK_END),
    P.COMMIT_START: _driver(P.COMMIT_START),
    P.COMMIT_BEFORE_OUTCOME: _driver(P.COMMIT_BEFORE_OUTCOME),
    P.COMMIT_AFTER_OUTCOME: _driver(P.COMMIT_AFTER_OUTCOME, COMMITTED_THEN_FAILS),
    # Every attempt of partition 1 fails (4 attempts in local[2,4]), so Spark aborts the write;
    # the abort itself then fails: the job reports the task's fault, the instant stays inflight.
    P.ABORT_START: FaultCase(
        ({"point": P.TASK_END, "partition": 1}, {"point": P.ABORT_START}),
        FAILS,
        P.TASK_END,
        {P.TASK_END: 4, P.ABORT_START: 1},
    ),
    # An executor's Python worker dies (os._exit) mid-file: Spark retries the task.
    f"{P.TASK_MID_FILE}/exit": _task_once(P.TASK_MID_FILE, "exit"),
}


@pytest.mark.parametrize("case_id", list(WRITER_CASES))
def test_fault_point_then_rollback_and_rerun_hold_each_row_once(
    spark: Any, durable_store: Store, tmp_path: Path, case_id: str
) -> None:
    case = WRITER_CASES[case_id]
    rng = random.Random(zlib.crc32(f"{case_id} {durable_store.name}".encode()))
    partition_by, max_records = rng.choice(["", "k"]), rng.choice(["0", "300"])
    context = f"{case_id} on {durable_store.name}, partitionBy={partition_by!r} max={max_records}"
    job = f"fault-{zlib.crc32(case_id.encode()):08x}"
    url, journal, options = (
        f"{durable_store.url}/t",
        f"{durable_store.url}/journal",
        durable_store.options,
    )
    conf = {"spark.sparkguard.jobId": job, "spark.sparkguard.journal": journal}
    if options:
        conf["spark.sparkguard.storageOptions"] = json.dumps(options)
    writer.register(spark, conf=conf)
    signal_file = tmp_path / "signal"
    injected_faults = [{**fault, "signal": str(signal_file)} for fault in case.injected]
    layout = {"partitionBy": partition_by, "maxRecordsPerFile": max_records}
    faulted = {**layout, faults.OPTION: json.dumps(injected_faults)}

    if case.raised is None:
        _write(ids_df(spark, ROWS), url, **faulted)
    else:
        with pytest.raises(Exception, match=injected(case.raised)):
            _write(ids_df(spark, ROWS), url, **faulted)
    assert fired(signal_file) == case.fired, context
    # A reader at this moment sees committed data only: all of it, or none of it.
    visible = sorted(visible_ids(url, options))
    assert visible == ([] if case.outcome == FAILS else list(ROWS)), context

    rollback.rollback_job(job, journal, storage_options=options)
    assert undecided(url, options) == [], context
    writer.new_driver_run(spark)  # the re-run is a new driver run: write 0 again
    _write(ids_df(spark, ROWS), url, **layout)  # the re-run (skipped if already committed)
    assert_exactly_once(url, ROWS, options)
    assert_no_strays(url, options)
