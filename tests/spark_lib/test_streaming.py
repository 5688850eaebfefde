"""The streaming sink in real PySpark: queries failed at every fault point of the sink (local
disk and S3 server) or killed mid-stream and restarted from their checkpoint hold each input row
exactly once, fail only with the injected fault, and readers never see half a batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from sparkguard.spark_lib.spark import faults, writer
from sparkguard.spark_lib.storage import rollback
from tests.spark_lib.conftest import Store
from tests.spark_lib.spark_conftest import (
    assert_exactly_once,
    assert_no_strays,
    fired,
    injected,
    spark,
    undecided,
    visible_ids,
)
from tests.support.process import kill_session

__all__ = ["spark"]

pytestmark = pytest.mark.spark
#: two micro-batches (maxFilesPerTrigger=1): the batch the faults and kills hit (each point is
#: reached in the first batch a run executes: batch 0, or its re-execution) and one after it
FILES = 2
PER_FILE = 50


def _input(tmp_path: Path) -> Path:
    source = tmp_path / "in"
    source.mkdir()
    for n in range(FILES):
        lines = [json.dumps({"id": n * PER_FILE + i, "s": f"v{i}"}) for i in range(PER_FILE)]
        (source / f"f{n:03d}.json").write_text("\n".join(lines) + "\n")
    return source


def _register(spark: Any, store: Store, job: str) -> str:
    journal = f"{store.url}/journal"
    conf = {"spark.sparkguard.jobId": job, "spark.sparkguard.journal": journal}
    if store.options:
        conf["spark.sparkguard.storageOptions"] = json.dumps(store.options)
    writer.register(spark, conf=conf)
    return journal


def _start(spark: Any, source: Path, url: str, ckpt: Path, injected_faults: list[Any]) -> Any:
    """Start the query (availableNow: it stops when the input is consumed)."""
    stream = (
        spark.readStream.schema("id long, s string")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
    )
    return (
        stream.writeStream.format("sparkguard")
        .option("path", url)
        .option("checkpointLocation", str(ckpt))
        .option(faults.OPTION, json.dumps(injected_faults))
        .trigger(availableNow=True)
        .start()
    )


P = faults.Point
#: case -> (the fault, the point the first run fails at or None); test_fault_points.py checks
#: every point has a case. Each fault fires once (``once``): the restart runs through.
STREAM_CASES: dict[str, tuple[dict[str, Any], str | None]] = {
    # The batch's commit fails before deciding: the restart re-runs the batch.
    P.STREAM_COMMIT_START: ({"point": P.STREAM_COMMIT_START}, P.STREAM_COMMIT_START),
    # The batch is committed, the query dies before the checkpoint knows: the restart re-runs
    # the batch and drops the duplicate's files.
    P.STREAM_AFTER_COMMIT: ({"point": P.STREAM_AFTER_COMMIT}, P.STREAM_AFTER_COMMIT),
    # A task attempt of a micro-batch fails: Spark retries the task, the query goes on.
    f"{P.TASK_AFTER_FILE}/stream": ({"point": P.TASK_AFTER_FILE, "attempt": 0}, None),
}


@pytest.mark.parametrize("case_id", list(STREAM_CASES))
def test_stream_fault_point_restart_holds_each_row_once(
    spark: Any, durable_store: Store, tmp_path: Path, case_id: str
) -> None:
    fault, failing_point = STREAM_CASES[case_id]
    job = f"stream-{zlib.crc32(case_id.encode()):08x}"
    journal = _register(spark, durable_store, job)
    source = _input(tmp_path)
    url, options = f"{durable_store.url}/t", durable_store.options
    signal_file = tmp_path / "signal"
    injected_faults = [{**fault, "signal": str(signal_file), "once": str(tmp_path / "once")}]
    ckpt = tmp_path / "ckpt"
    if failing_point is not None:
        # The first run fails with exactly the injected fault ...
        with pytest.raises(Exception, match=injected(failing_point)):
            _start(spark, source, url, ckpt, injected_faults).awaitTermination()
        # ... and between restarts a reader sees whole batches only.
        assert len(visible_ids(url, options)) % PER_FILE == 0
    _start(spark, source, url, ckpt, injected_faults).awaitTermination()  # runs through
    assert fired(signal_file) == {fault["point"]: 1}
    assert_exactly_once(url, range(FILES * PER_FILE), options)
    # Leftovers of the failed run are gone once the job is rolled back (or the batch decided).
    rollback.rollback_job(job, journal, storage_options=options)
    assert_no_strays(url, options)


STREAM_CHILD = """
import sys
from pyspark.sql import SparkSession
from sparkguard.spark_lib.spark import faults, writer
source, url, ckpt, journal, injected = sys.argv[1:6]
spark = (SparkSession.builder.master("local[2,4]").config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.driver.host", "127.0.0.1").getOrCreate())
writer.register(spark, conf={"spark.sparkguard.jobId": "stream-killed",
                             "spark.sparkguard.journal": journal})
stream = spark.readStream.schema("id long, s string").option("maxFilesPerTrigger", 1).json(source)
query = (stream.writeStream.format("sparkguard").option("path", url)
         .option("checkpointLocation", ckpt).option(faults.OPTION, injected)
         .trigger(availableNow=True).start())
query.awaitTermination()
print("finished", flush=True)
"""


#: killed in this order, one round each (each restart runs into the next point)
KILL_POINTS = (P.STREAM_COMMIT_START, P.STREAM_AFTER_COMMIT, P.TASK_MID_FILE, P.TASK_AFTER_FILE)


@pytest.mark.slow
def test_stream_driver_sigkilled_and_restarted_holds_each_row_once(tmp_path: Path) -> None:
    """SIGKILL of the whole driver (JVM and Python workers) at each point in turn, then
    restarts from the checkpoint: every row exactly once, leftovers removed by the rollback."""
    source = _input(tmp_path)
    url, ckpt, journal = str(tmp_path / "t"), str(tmp_path / "ckpt"), str(tmp_path / "journal")
    env = {**os.environ, "PYTHONSAFEPATH": "1", "PYSPARK_PYTHON": sys.executable}
    for round_, point in enumerate(KILL_POINTS):
        signal_file = tmp_path / f"signal-{round_}"
        fault = {
            "point": point,
            "action": "pause",
            "signal": str(signal_file),
            "once": str(tmp_path / f"once-{round_}"),
        }
        child = subprocess.Popen(
            [sys.executable, "-c", STREAM_CHILD, str(source), url, ckpt, journal,
             json.dumps([fault])],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 240
        while not signal_file.exists():
            assert child.poll() is None, f"round {round_}: the query ended before {point} fired"
            assert time.monotonic() < deadline, f"round {round_}: {point} never fired"
            time.sleep(0.2)
        kill_session(child.pid)  # paused at the point: the driver, JVM, workers
        child.wait()
        assert fired(signal_file) == {point: 1}
        # Between restarts a reader sees whole batches only.
        assert len(visible_ids(url)) % PER_FILE == 0, point
    finished = subprocess.run(
        [sys.executable, "-c", STREAM_CHILD, str(source), url, ckpt, journal, "[]"],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert "finished" in finished.stdout, finished.stderr[-3000:]
    assert_exactly_once(url, range(FILES * PER_FILE))
    rollback.rollback_job("stream-killed", journal)
    assert_no_strays(url)


REFUSED = "inside foreachBatch .* is not supported: this writer counts writes per driver run"


def test_python_writer_inside_foreach_batch_is_refused_and_commits_nothing(
    spark: Any, tmp_path: Path
) -> None:
    """``df.write.format("sparkguard")`` inside ``foreachBatch`` would be identified by its rank
    in the driver run, which a restarted query changes (it would skip a batch). It is refused
    by the write's first task, naming the fix, on both paths: a write to start (its instant is
    rolled back, no file stays) and a write that matched a committed one (the skip that would
    lose the batch)."""
    url = str(tmp_path / "t")
    journal = str(tmp_path / "journal")
    writer.register(
        spark, conf={"spark.sparkguard.jobId": "fb-python", "spark.sparkguard.journal": journal}
    )
    source = _input(tmp_path)

    def run_query(ckpt: str) -> None:
        def each(batch: Any, _batch_id: int) -> None:
            batch.write.format("sparkguard").mode("append").save(url)

        query = (
            spark.readStream.schema("id long, s string")
            .json(str(source))
            .writeStream.foreachBatch(each)
            .option("checkpointLocation", str(tmp_path / ckpt))
            .trigger(availableNow=True)
            .start()
        )
        with pytest.raises(Exception, match=REFUSED):
            query.awaitTermination()

    writer.new_driver_run(spark)
    run_query("c1")  # write 0 of this run: a new instant, refused by its tasks
    assert undecided(url) == []
    assert visible_ids(url) == []
    assert_no_strays(url)

    writer.new_driver_run(spark)
    spark.range(0, 10).selectExpr("id", "'x' as s").write.format("sparkguard").mode("append").save(
        url
    )  # write 0 committed outside any query
    writer.new_driver_run(spark)
    run_query("c2")  # write 0 again: matched, skipped... and refused, not silently skipped
    assert_exactly_once(url, range(10))
    assert_no_strays(url)
