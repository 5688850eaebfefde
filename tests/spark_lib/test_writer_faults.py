"""Driver SIGKILLs (a subprocess runs the job) and the core fault cases on the S3 server."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from sparkguard.spark_lib import rollback, writer
from tests.spark_lib.spark_conftest import (
    assert_exactly_once,
    assert_no_strays,
    committed_ids,
    ids_df,
    spark,
    undecided,
)

__all__ = ["spark"]

pytestmark = pytest.mark.spark
ROWS = range(3000)

CHILD = textwrap.dedent(
    """
    import json, os, sys
    from pyspark.sql import SparkSession
    from sparkguard.spark_lib import writer
    url, job, journal, faults = sys.argv[1:5]
    spark = (SparkSession.builder.master("local[2,4]").config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1").getOrCreate())
    writer.register(spark, conf={"spark.sparkguard.jobId": job,
                                 "spark.sparkguard.journal": journal})
    df = spark.range(0, 3000, numPartitions=4).selectExpr(
        "id", "cast(id % 3 as int) as k", "cast(id as double) * 0.5 as d", "concat('v', id) as s")
    df.write.format("sparkguard").mode("append").option(writer.FAULTS_OPTION, faults).save(url)
    print("finished", flush=True)
    """
)


def _run_and_kill(tmp_path: Path, url: str, job: str, journal: str, point: str) -> None:
    signal_file = tmp_path / f"signal-{job}"
    faults = json.dumps([{"point": point, "action": "pause", "signal": str(signal_file)}])
    env = {**os.environ, "PYTHONSAFEPATH": "1", "PYSPARK_PYTHON": sys.executable}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, url, job, journal, faults],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 240
    while not signal_file.exists():
        assert child.poll() is None, "the job ended before reaching the kill point"
        assert time.monotonic() < deadline, "the kill point was never reached"
        time.sleep(0.2)
    os.killpg(child.pid, signal.SIGKILL)  # the driver, its JVM and Python workers, at once
    child.wait()


@pytest.mark.slow
def test_driver_sigkilled_then_rollback_and_rerun(spark: Any, tmp_path: Path) -> None:
    rng = random.Random(4242)
    points = [
        "driver:after-inflight",
        "task:mid-file",
        "task:after-file",
        "commit:start",
        "commit:after-outcome",
    ]
    for n, point in enumerate(rng.sample(points, 2)):
        job, url, journal = f"killed-{n}", str(tmp_path / f"t{n}"), str(tmp_path / "journal")
        _run_and_kill(tmp_path, url, job, journal, point)
        ids = committed_ids(url) if Path(url, "_sparkguard", "timeline").exists() else []
        assert sorted(ids) in ([], list(ROWS)), point  # all of it, or none of it
        rollback.rollback_job(job, journal)
        assert undecided(url) == []
        writer.register(
            spark, conf={"spark.sparkguard.jobId": job, "spark.sparkguard.journal": journal}
        )
        ids_df(spark, ROWS).write.format("sparkguard").mode("append").save(url)
        assert_exactly_once(url, ROWS)
        assert_no_strays(url)


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
    failing = json.dumps([{"point": "task:after-file", "partition": 2}])  # every attempt
    with pytest.raises(Exception, match="injected fault"):
        ids_df(spark, ROWS).write.format("sparkguard").mode("append").option(
            "partitionBy", "k"
        ).option(writer.FAULTS_OPTION, failing).save(url)
    assert undecided(url, s3_options) == []  # abort rolled it back already
    rollback.rollback_job("s3-job", journal, storage_options=s3_options)
    assert_no_strays(url, s3_options)
    writer.new_driver_run(spark)  # the re-run: write 0 again, under the rolled-back names
    once = json.dumps([{"point": "task:mid-file", "partition": 1, "attempt": 0}])
    ids_df(spark, ROWS).write.format("sparkguard").mode("append").option("partitionBy", "k").option(
        writer.FAULTS_OPTION, once
    ).save(url)
    assert_exactly_once(url, ROWS, s3_options)
    assert_no_strays(url, s3_options)
    writer.new_driver_run(spark)  # a re-run is a new driver run: its first write is write 0
    ids_df(spark, ROWS).write.format("sparkguard").mode("append").option("partitionBy", "k").save(
        url
    )
    assert_exactly_once(url, ROWS, s3_options)  # same job id again: skipped
