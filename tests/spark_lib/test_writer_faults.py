"""Driver SIGKILLs (a subprocess runs the job) at every fault point of the batch writer, and the
task-retry / job-failure case on the S3 server.

Each kill waits for the fault's signal line (the job is paused exactly there), kills the whole
driver process group, then checks that readers see all rows or none (as the outcome decides),
that the rollback leaves nothing undecided and that a re-run holds each row exactly once.

The kills share one driver (one JVM start instead of one per point): it runs one write per
selected (store, point) at once, each its own job id, journal and table, each paused at its own
point, and a single SIGKILL then kills all of them. Every point still has its own test, which
checks its own table and job: the rows visible after the kill, the rollback, the re-run.
"""

from __future__ import annotations

import dataclasses
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
from tests.spark_lib.spark_conftest import (
    assert_exactly_once,
    assert_no_strays,
    data_files_on_storage,
    fired,
    ids_df,
    injected,
    spark,
    undecided,
    unpublished_leftovers,
    visible_ids,
)
from tests.support import s3server
from tests.support.process import kill_session

__all__ = ["spark"]

pytestmark = pytest.mark.spark
ROWS = range(3000)

CHILD = textwrap.dedent(
    """
    import json, sys, threading, traceback
    from pyspark.sql import SparkSession
    from sparkguard.spark_lib.spark import faults, writer
    cases = json.loads(sys.argv[1])
    # A task slot for every paused task, and more for the writes that run on to their point.
    spark = (SparkSession.builder.master(f"local[{len(cases) + 2},4]")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.host", "127.0.0.1").getOrCreate())
    # Every write names its own job, journal and storage options (write options override the
    # session's conf, which only has to be complete).
    writer.register(spark, conf={"spark.sparkguard.jobId": "unused",
                                 "spark.sparkguard.journal": cases[0]["journal"]})
    def write(case):
        try:
            # A new thread's JVM side has no active session: the registered source lives in it.
            SparkSession._get_j_spark_session_class(spark._jvm).setActiveSession(
                spark._jsparkSession)
            df = spark.range(0, 3000, numPartitions=4).selectExpr(
                "id", "cast(id % 3 as int) as k", "cast(id as double) * 0.5 as d",
                "concat('v', id) as s")
            out = (df.write.format("sparkguard").mode("append").option("jobId", case["job"])
                   .option("journal", case["journal"]).option(faults.OPTION, case["faults"]))
            if case["options"]:
                out = out.option("storageOptions", json.dumps(case["options"]))
            out.save(case["url"])
            print("finished", case["point"], flush=True)
        except BaseException:
            # The parent fails at once on this line instead of waiting for its deadline.
            print("failed", case["point"], flush=True)
            traceback.print_exc()
    threads = [threading.Thread(target=write, args=(case,)) for case in cases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    """
)

P = faults.Point


def _kill_case(point: str) -> list[dict[str, Any]]:
    """Faults that pause the job at ``point`` exactly once (a test then kills the driver)."""
    pause: dict[str, Any] = {"point": point, "action": "pause"}
    if point.startswith("task:"):
        pause["partition"] = 1  # one task pauses; the other tasks may run on
    if point == P.ABORT_START:
        # Every attempt of partition 1 fails, so Spark aborts the write: it pauses there.
        return [{"point": P.TASK_END, "partition": 1}, pause]
    return [pause]


#: every point of the batch writer, killed on local disk; test_fault_points.py checks the list
KILL_POINTS = [p for p in P if not p.value.startswith("stream:")]
#: on the S3 server too: a kill that leaves an unfinished upload, and one that leaves a
#: committed outcome with its markers
S3_KILL_POINTS = [P.TASK_MID_FILE, P.COMMIT_AFTER_OUTCOME]
KILL_CASES = [("local", p) for p in KILL_POINTS] + [("s3", p) for p in S3_KILL_POINTS]

#: how long the shared driver may take to start and reach every point, on a loaded machine (a
#: paused write waits for the kill; the setup stays well inside pytest's 600 s timeout)
REACH_TIMEOUT = 300.0


@dataclasses.dataclass(frozen=True)
class Killed:
    """One write of the killed driver: its store, table, job and journal, where it paused."""

    kind: str
    point: str
    url: str
    job: str
    journal: str
    options: dict[str, Any]
    signal: Path


def _killed(kind: str, point: str, base: str, options: dict[str, Any], tmp_path: Path) -> Killed:
    job = f"killed-{zlib.crc32(point.encode()):08x}"
    base = f"{base}/{job}"
    signal = tmp_path / f"signal-{kind}-{job}"
    return Killed(kind, point, f"{base}/t", job, f"{base}/journal", options, signal)


def _tail(path: Path, chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def _run_and_kill(killed: list[Killed], logs: Path) -> None:
    """Run every write in one child driver, SIGKILL it once each paused at its point.

    Fails at once, naming the points not reached and quoting the end of the driver's stderr,
    when a write ended (it prints a line) or the driver exited, and after REACH_TIMEOUT.
    """
    cases = [
        {
            "point": f"{k.kind}-{k.point}",
            "url": k.url,
            "job": k.job,
            "journal": k.journal,
            "options": k.options,
            "faults": json.dumps([{**f, "signal": str(k.signal)} for f in _kill_case(k.point)]),
        }
        for k in killed
    ]
    env = {**os.environ, "PYTHONSAFEPATH": "1", "PYSPARK_PYTHON": sys.executable}
    argv = [sys.executable, "-c", CHILD, json.dumps(cases)]
    stdout, stderr = logs / "driver.out", logs / "driver.err"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        child = subprocess.Popen(argv, env=env, stdout=out, stderr=err, start_new_session=True)
    try:
        deadline = time.monotonic() + REACH_TIMEOUT
        while waiting := [f"{k.kind}-{k.point}" for k in killed if fired(k.signal)[k.point] == 0]:
            problem = None
            if ended := _tail(stdout).split():
                problem = f"writes ended ({' '.join(ended)})"
            elif child.poll() is not None:
                problem = f"the driver exited ({child.returncode})"
            elif time.monotonic() > deadline:
                problem = f"{REACH_TIMEOUT:.0f} s passed"
            if problem is not None:
                raise AssertionError(
                    f"{problem} before {waiting} were reached; the driver's stderr ends:\n"
                    + _tail(stderr)
                )
            time.sleep(0.2)
    finally:
        kill_session(child.pid)  # the driver, its JVM and Python workers, at once
        child.wait()
    for k in killed:
        expected = {k.point: 1, **({P.TASK_END: 4} if k.point == P.ABORT_START else {})}
        assert fired(k.signal) == expected, f"{k.kind}-{k.point}"


@pytest.fixture(scope="module")
def killed_driver(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[tuple[str, str], Killed]:
    """One driver, one write per selected case of KILL_CASES (each paused there), SIGKILLed
    once; only the cases of the tests this run selected (one test id runs one write)."""
    selected = {
        (item.callspec.params["kind"], item.callspec.params["point"])
        for item in request.session.items
        if item.path == request.path and "killed_driver" in getattr(item, "fixturenames", ())
    }
    tmp_path = tmp_path_factory.mktemp("killed")
    stores: dict[str, tuple[str, dict[str, Any]]] = {"local": (str(tmp_path / "store"), {})}
    if any(kind == "s3" for kind, _ in selected):
        server: s3server.S3Server = request.getfixturevalue("s3_server")
        stores["s3"] = (f"s3://{server.create_bucket()}/store", server.storage_options)
    killed = [
        _killed(kind, point, *stores[kind], tmp_path)
        for kind, point in KILL_CASES
        if (kind, point) in selected
    ]
    _run_and_kill(killed, tmp_path)
    return {(k.kind, k.point): k for k in killed}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "point"),
    [
        pytest.param(kind, point, marks=[pytest.mark.s3] * (kind == "s3"))
        for kind, point in KILL_CASES
    ],
)
def test_driver_sigkilled_then_rollback_and_rerun(
    spark: Any, killed_driver: dict[tuple[str, str], Killed], kind: str, point: faults.Point
) -> None:
    killed = killed_driver[kind, point]
    url, job, journal, options = killed.url, killed.job, killed.journal, killed.options
    # A plain directory reader sees nothing of a write killed before its outcome, nor of one
    # killed after it and before its publication: the tasks left temp files / pending uploads.
    assert data_files_on_storage(url, options) == set(), point
    if point == P.COMMIT_AFTER_OUTCOME:
        # Inside the publication window a committed-only read fails naming a committed file.
        with pytest.raises(FileNotFoundError, match=r"part-\d{5}-"):
            visible_ids(url, options)
    else:
        assert visible_ids(url, options) == [], point
    summary = rollback.rollback_job(job, journal, storage_options=options)
    assert undecided(url, options) == []
    if point == P.COMMIT_AFTER_OUTCOME:  # rolled forward: all of it, before any rerun
        assert summary.files_published == len(data_files_on_storage(url, options)) > 0
        assert sorted(visible_ids(url, options)) == list(ROWS)
        assert_no_strays(url, options)
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
    assert unpublished_leftovers(url, options) == [], point


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
