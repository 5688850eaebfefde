"""Driver SIGKILLs (a subprocess runs the job) at every fault point of the batch writer, and the
task-retry / job-failure case on the S3 server.

Each kill waits for the fault's signal line (the job is paused exactly there), kills the whole
driver process group, then checks that readers see all rows or none (as the outcome decides),
that the rollback leaves nothing undecided and that a re-run holds each row exactly once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from sparkguard.spark_lib.spark import faults, writer
from sparkguard.spark_lib.storage import rollback
from tests.spark_lib.conftest import Store, make_store
from tests.spark_lib.spark_conftest import (
    assert_exactly_once,
    assert_no_strays,
    fired,
    ids_df,
    injected,
    spark,
    undecided,
    visible_ids,
)
from tests.support.process import kill_session

__all__ = ["spark"]

pytestmark = pytest.mark.spark
ROWS = range(3000)

CHILD = textwrap.dedent(
    """
    import json, sys
    from pyspark.sql import SparkSession
    from sparkguard.spark_lib.spark import faults, writer
    url, job, journal, injected, options = sys.argv[1:6]
    spark = (SparkSession.builder.master("local[2,4]").config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1").getOrCreate())
    conf = {"spark.sparkguard.jobId": job, "spark.sparkguard.journal": journal}
    if json.loads(options):
        conf["spark.sparkguard.storageOptions"] = options
    writer.register(spark, conf=conf)
    df = spark.range(0, 3000, numPartitions=4).selectExpr(
        "id", "cast(id % 3 as int) as k", "cast(id as double) * 0.5 as d", "concat('v', id) as s")
    df.write.format("sparkguard").mode("append").option(faults.OPTION, injected).save(url)
    print("finished", flush=True)
    """
)

P = faults.Point


def _kill_case(point: str) -> list[dict[str, Any]]:
    """Faults that pause the job at ``point`` exactly once (a test then kills the driver)."""
    pause: dict[str, Any] = {"point": point, "action": "pause"}
    if point.startswith("task:"):
        pause["partition"] = 1  # one task pauses; the other core's task may run on
    if point == P.ABORT_START:
        # Every attempt of partition 1 fails, so Spark aborts the write: it pauses there.
        return [{"point": P.TASK_END, "partition": 1}, pause]
    return [pause]


#: every point of the batch writer, killed on local disk; test_fault_points.py checks the list
KILL_POINTS = [p for p in P if not p.value.startswith("stream:")]
#: on the S3 server (each kill costs a JVM start, so two): a kill that leaves an unfinished
#: upload, and one that leaves a committed outcome with its markers
S3_KILL_POINTS = [P.TASK_MID_FILE, P.COMMIT_AFTER_OUTCOME]


def _run_and_kill(
    tmp_path: Path, url: str, job: str, journal: str, *, options: dict[str, Any], point: str
) -> None:
    """Run the job in a child driver, SIGKILL it once it paused at ``point``."""
    signal_file = tmp_path / f"signal-{job}"
    injected_faults = [{**f, "signal": str(signal_file)} for f in _kill_case(point)]
    env = {**os.environ, "PYTHONSAFEPATH": "1", "PYSPARK_PYTHON": sys.executable}
    argv = [sys.executable, "-c", CHILD, url, job, journal, json.dumps(injected_faults),
            json.dumps(options)]  # fmt: skip
    child = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + 240
    while fired(signal_file)[point] == 0:
        assert child.poll() is None, f"the job ended before reaching {point}"
        assert time.monotonic() < deadline, f"{point} was never reached"
        time.sleep(0.2)
    kill_session(child.pid)  # the driver, its JVM and Python workers, at once
    child.wait()
    expected = {point: 1, **({P.TASK_END: 4} if point == P.ABORT_START else {})}
    assert fired(signal_file) == expected


def _kill_then_recover(spark: Any, store: Store, tmp_path: Path, point: str) -> None:
    job = f"killed-{zlib.crc32(point.encode()):08x}"
    url, journal, options = f"{store.url}/t", f"{store.url}/journal", store.options
    _run_and_kill(tmp_path, url, job, journal, options=options, point=point)
    ids = visible_ids(url, options)
    expected = list(ROWS) if point == P.COMMIT_AFTER_OUTCOME else []
    assert sorted(ids) == expected, point  # the outcome decides: all of it, or none of it
    summary = rollback.rollback_job(job, journal, storage_options=options)
    assert undecided(url, options) == []
    # The write created the table's location: a rollback removes it (the rerun creates it).
    removed = () if point == P.COMMIT_AFTER_OUTCOME else summary.tables
    assert summary.tables_removed == removed, point
    conf = {"spark.sparkguard.jobId": job, "spark.sparkguard.journal": journal}
    if options:
        conf["spark.sparkguard.storageOptions"] = json.dumps(options)
    writer.register(spark, conf=conf)
    ids_df(spark, ROWS).write.format("sparkguard").mode("append").save(url)
    assert_exactly_once(url, ROWS, options)
    assert_no_strays(url, options)


KILL_CASES = [("local", p) for p in KILL_POINTS] + [("s3", p) for p in S3_KILL_POINTS]


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "point"), KILL_CASES)
def test_driver_sigkilled_then_rollback_and_rerun(
    spark: Any, tmp_path: Path, request: pytest.FixtureRequest, kind: str, point: faults.Point
) -> None:
    _kill_then_recover(spark, make_store(kind, tmp_path, request), tmp_path, point)


@pytest.mark.s3
def test_s3_task_retry_job_failure_rollback_and_rerun(
    spark: Any, s3_bucket: str, s3_options: dict[str, Any], tmp_path: Path
) -> None:
    url, journal = f"{s3_bucket}/t", f"{s3_bucket}/journal"
    conf = {
        "spark.sparkguard.jobId": "s3-job",
        "spark.sparkguard.journal": journal,
        "spark.sparkguard.storageOptions": json.dumps(s3_options),
    }
    writer.register(spark, conf=conf)
    signal_file = tmp_path / "signal"
    # Every attempt of partition 2 fails after its first file: the job fails after 4 attempts.
    failing = json.dumps([{"point": P.TASK_AFTER_FILE, "partition": 2, "signal": str(signal_file)}])
    with pytest.raises(Exception, match=injected(P.TASK_AFTER_FILE)):
        ids_df(spark, ROWS).write.format("sparkguard").mode("append").option(
            "partitionBy", "k"
        ).option(faults.OPTION, failing).save(url)
    assert fired(signal_file) == {P.TASK_AFTER_FILE: 4}
    assert undecided(url, s3_options) == []  # abort rolled it back already
    rollback.rollback_job("s3-job", journal, storage_options=s3_options)
    assert_no_strays(url, s3_options)
    signal_file.unlink()
    writer.new_driver_run(spark)  # the re-run: write 0 again, under the rolled-back names
    once = json.dumps(
        [{"point": P.TASK_MID_FILE, "partition": 1, "attempt": 0, "signal": str(signal_file)}]
    )
    ids_df(spark, ROWS).write.format("sparkguard").mode("append").option("partitionBy", "k").option(
        faults.OPTION, once
    ).save(url)
    assert fired(signal_file) == {P.TASK_MID_FILE: 1}  # the retry succeeded
    assert_exactly_once(url, ROWS, s3_options)
    assert_no_strays(url, s3_options)
    writer.new_driver_run(spark)  # a re-run is a new driver run: its first write is write 0
    ids_df(spark, ROWS).write.format("sparkguard").mode("append").option("partitionBy", "k").save(
        url
    )
    assert_exactly_once(url, ROWS, s3_options)  # same job id again: skipped
