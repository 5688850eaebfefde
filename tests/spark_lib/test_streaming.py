"""The streaming sink in real PySpark: queries killed mid-stream and restarted from their
checkpoint hold each input row exactly once, and readers never see half a batch."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sparkguard.spark_lib import reader, rollback, writer
from tests.spark_lib.spark_conftest import assert_exactly_once, assert_no_strays, spark

__all__ = ["spark"]

pytestmark = pytest.mark.spark
FILES = 6
PER_FILE = 50


def _input(tmp_path: Path) -> Path:
    source = tmp_path / "in"
    source.mkdir()
    for n in range(FILES):
        lines = [json.dumps({"id": n * PER_FILE + i, "s": f"v{i}"}) for i in range(PER_FILE)]
        (source / f"f{n:03d}.json").write_text("\n".join(lines) + "\n")
    return source


def _run_until_done(
    spark: Any, source: Path, url: str, ckpt: Path, faults: list[dict[str, Any]]
) -> int:
    """Run the query (availableNow) until it finishes; every failure restarts it. Returns how
    many times it failed."""
    failures = 0
    for _ in range(20):
        stream = (
            spark.readStream.schema("id long, s string")
            .option("maxFilesPerTrigger", 1)
            .json(str(source))
        )
        query = (
            stream.writeStream.format("sparkguard")
            .option("path", url)
            .option("checkpointLocation", str(ckpt))
            .option(writer.FAULTS_OPTION, json.dumps(faults))
            .trigger(availableNow=True)
            .start()
        )
        try:
            query.awaitTermination()
        except Exception:
            failures += 1
            # Between restarts a reader sees whole batches only.
            ids = _ids_or_empty(url)
            assert len(ids) % PER_FILE == 0
            continue
        return failures
    raise AssertionError("the query never finished")


def _ids_or_empty(url: str) -> list[int]:
    from tests.spark_lib.spark_conftest import committed_ids

    return committed_ids(url) if Path(url).exists() else []


@pytest.mark.slow
def test_stream_killed_and_restarted_holds_each_row_once(spark: Any, tmp_path: Path) -> None:
    rng = random.Random(7)
    writer.register(
        spark,
        conf={
            "spark.sparkguard.jobId": "stream-1",
            "spark.sparkguard.journal": str(tmp_path / "journal"),
        },
    )
    source = _input(tmp_path)
    url = str(tmp_path / "t")
    points = ["stream:commit-start", "stream:after-commit", "task:mid-file", "task:after-file"]
    # Four kills at random points, each firing once (each restart runs into the next one). A
    # task fault fails one attempt only: Spark retries the task and the batch goes on.
    faults = [{"point": rng.choice(points), "once": str(tmp_path / f"once-{n}")} for n in range(4)]
    faults.append({"point": "stream:after-commit", "once": str(tmp_path / "once-dup")})
    failures = _run_until_done(spark, source, url, tmp_path / "ckpt", faults)
    assert failures >= 1
    assert_exactly_once(url, range(FILES * PER_FILE))
    # Leftovers of the killed runs are gone once the job is rolled back (or the batch decided).
    rollback.rollback_job("stream-1", str(tmp_path / "journal"))
    assert_no_strays(url)
    assert reader.read_table(spark, url).count() == FILES * PER_FILE


STREAM_CHILD = """
import sys
from pyspark.sql import SparkSession
from sparkguard.spark_lib import writer
source, url, ckpt, journal, faults = sys.argv[1:6]
spark = (SparkSession.builder.master("local[2,4]").config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.driver.host", "127.0.0.1").getOrCreate())
writer.register(spark, conf={"spark.sparkguard.jobId": "stream-killed",
                             "spark.sparkguard.journal": journal})
stream = spark.readStream.schema("id long, s string").option("maxFilesPerTrigger", 1).json(source)
query = (stream.writeStream.format("sparkguard").option("path", url)
         .option("checkpointLocation", ckpt).option(writer.FAULTS_OPTION, faults)
         .trigger(availableNow=True).start())
query.awaitTermination()
print("finished", flush=True)
"""


@pytest.mark.slow
def test_stream_driver_sigkilled_and_restarted_holds_each_row_once(tmp_path: Path) -> None:
    """SIGKILL of the whole driver (JVM and Python workers) at random points, then restarts
    from the checkpoint: every row exactly once, leftovers removed by the rollback."""
    rng = random.Random(11)
    source = _input(tmp_path)
    url, ckpt, journal = str(tmp_path / "t"), str(tmp_path / "ckpt"), str(tmp_path / "journal")
    points = ["stream:commit-start", "stream:after-commit", "task:mid-file", "task:after-file"]
    env = {**os.environ, "PYTHONSAFEPATH": "1", "PYSPARK_PYTHON": sys.executable}
    kills = 0
    for round_ in range(4):
        signal_file = tmp_path / f"signal-{round_}"
        fault = {
            "point": rng.choice(points),
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
        while not signal_file.exists() and child.poll() is None:
            assert time.monotonic() < deadline, f"round {round_}: {fault} never fired"
            time.sleep(0.2)
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            kills += 1
        child.wait()
        # Between restarts a reader sees whole batches only.
        assert len(_ids_or_empty(url)) % PER_FILE == 0, fault
    assert kills >= 2
    finished = subprocess.run(
        [sys.executable, "-c", STREAM_CHILD, str(source), url, ckpt, journal, "[]"],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert "finished" in finished.stdout, finished.stderr[-3000:]
    assert_exactly_once(url, range(FILES * PER_FILE))
    rollback.rollback_job("stream-killed", journal)
    assert_no_strays(url)
