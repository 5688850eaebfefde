"""Write identity: several writes of one job to one table, each its own instant and names.

The n-th write of a job id to a table in a driver run (one SparkContext) is write n: its files
are named ``part-<p>-<jobId>-w<n:03d>-c<seq>``, its ``.inflight`` and committed outcome record
``"write": n``. A rerun (a new driver run) maps write n to write n: committed -> skipped, not
committed -> the same names again. Real PySpark (local[2,4]); the kill test runs the job in a
child process and SIGKILLs its whole process group (driver, JVM, Python workers).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import formats
from sparkguard.spark_lib.spark import writer
from sparkguard.spark_lib.storage import reader, rollback, timeline
from sparkguard.spark_lib.tools import commands
from tests.spark_lib.spark_conftest import (
    assert_exactly_once,
    assert_no_strays,
    data_files_on_storage,
    ids_df,
    spark,
    undecided,
    unpublished_leftovers,
)
from tests.support.process import kill_session

__all__ = ["spark"]

#: the switch of the test-only fault hook (spark_lib/spark/faults.py; option "sparkguard.faults")
FAULTS_ENV = "SPARKGUARD_ENABLE_FAULTS"
FIRST = range(2000)
SECOND = range(2000, 3500)


# ------------------------------------------------------------------------------------------
# Pure parts and the counter (no Spark).
# ------------------------------------------------------------------------------------------


def test_batch_names_carry_the_write_and_never_collide() -> None:
    assert writer.batch_token("nightly", 0) == "nightly-w000"
    name = writer.data_file_name(
        partition=3, token=writer.batch_token("nightly", 12), seq=1, ext="parquet"
    )
    assert name == "part-00003-nightly-w012-c001.parquet"
    # A job id that itself ends like a write token still gets a name of its own.
    tricky = writer.data_file_name(
        partition=0, token=writer.batch_token("a-w001", 0), seq=0, ext="json"
    )
    plain = writer.data_file_name(partition=0, token=writer.batch_token("a", 1), seq=0, ext="json")
    assert tricky != plain
    with pytest.raises(ValueError, match="write index"):
        writer.batch_token("a", -1)


def test_counter_counts_per_job_and_table_and_survives_processes(tmp_path: Path) -> None:
    run = str(tmp_path / "run")
    take = writer.next_write_index
    assert [take(run, job_id="j", table_url="/t") for _ in range(3)] == [0, 1, 2]
    assert take(run, job_id="j", table_url="/other") == 0
    assert take(run, job_id="k", table_url="/t") == 0
    # Another process of the same driver run (a later planner worker) continues the count.
    code = (
        "import sys; from sparkguard.spark_lib.spark import writer; "
        "print(writer.next_write_index(sys.argv[1], job_id='j', table_url='/t'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, run], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "3"
    # No driver run (a writer built by hand, outside Spark): always write 0.
    assert take(None, job_id="j", table_url="/t") == 0


def test_concurrent_takers_never_share_an_index(tmp_path: Path) -> None:
    run = str(tmp_path / "run")
    taken: list[int] = []
    lock = threading.Lock()

    def take() -> None:
        for _ in range(25):
            index = writer.next_write_index(run, job_id="j", table_url="/t")
            with lock:
                taken.append(index)

    threads = [threading.Thread(target=take) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(taken) == list(range(100))


def test_rewrite_replaces_only_the_same_write() -> None:
    def commit(order: str, op: reader.Operation, write: int, *paths: str) -> reader.Commit:
        return reader.Commit(
            order=order,
            source=order,
            job_id="j",
            operation=op,
            files=tuple(timeline.DataFile(path=p, size=1, rows=1) for p in paths),
            write=write,
        )

    commits = [
        commit("1", reader.Operation.APPEND, 0, "a-w000", "b-w000"),
        commit("2", reader.Operation.APPEND, 1, "a-w001"),
        commit("3", reader.Operation.REWRITE, 0, "a-w000"),
    ]
    assert set(reader.visible_files(commits)) == {"a-w000", "a-w001"}
    assert reader.superseded_files(commits) == {"b-w000"}


def test_old_instants_without_a_write_are_write_0(tmp_path: Path) -> None:
    manager, table = filemanager.resolve(str(tmp_path / "t"))
    tl = timeline.Timeline(manager, table)
    instant = tl.start("old-job", attempt=0, marker_type="DIRECT")  # no write recorded
    tl.commit(instant, [], extra={"operation": "append"})
    status = tl.status(instant)
    assert writer.write_index_of(status) == 0
    commit = reader.commit_of_status(status)
    assert commit is not None
    assert commit.write == 0


# ------------------------------------------------------------------------------------------
# Real Spark, one session.
# ------------------------------------------------------------------------------------------


def _register(spark: Any, tmp_path: Path, job: str) -> str:
    journal = str(tmp_path / "journal")
    writer.register(
        spark, conf={"spark.sparkguard.jobId": job, "spark.sparkguard.journal": journal}
    )
    return journal


def _instants(url: str) -> list[timeline.InstantStatus]:
    return timeline.timeline_for(url).statuses()


def _outcome_doc(url: str, instant: str) -> dict[str, Any]:
    path = Path(url, "_sparkguard", "timeline", f"{instant}.outcome")
    return formats.decode(
        path.read_bytes(),
        kind=timeline.OUTCOME_KIND,
        versions=frozenset({timeline.VERSION}),
        source=str(path),
    )


@pytest.mark.spark
def test_two_appends_in_one_job_both_land(spark: Any, tmp_path: Path) -> None:
    _register(spark, tmp_path, "two-appends")
    url = str(tmp_path / "t")
    ids_df(spark, FIRST).write.format("sparkguard").mode("append").save(url)
    ids_df(spark, SECOND).write.format("sparkguard").mode("append").save(url)
    assert_exactly_once(url, range(FIRST.start, SECOND.stop))
    assert_no_strays(url)
    statuses = _instants(url)
    assert [s.state for s in statuses] == [timeline.State.COMMITTED] * 2
    assert [writer.write_index_of(s) for s in statuses] == [0, 1]
    assert [_outcome_doc(url, s.instant).get("write") for s in statuses] == [0, 1]
    assert [i["write"] for i in commands.inspect_table(url, options={})["instants"]] == [0, 1]
    for status, n in zip(statuses, (0, 1), strict=True):
        assert status.files
        assert all(f"-two-appends-w{n:03d}-c" in f.path for f in status.files)
    # Another table in the same job counts its own writes from 0.
    other = str(tmp_path / "other")
    ids_df(spark, range(10)).write.format("sparkguard").mode("append").save(other)
    assert [writer.write_index_of(s) for s in _instants(other)] == [0]


@pytest.mark.spark
def test_new_driver_run_maps_writes_again(spark: Any, tmp_path: Path) -> None:
    _register(spark, tmp_path, "same-session")
    url = str(tmp_path / "t")
    ids_df(spark, FIRST).write.format("sparkguard").mode("append").save(url)
    ids_df(spark, SECOND).write.format("sparkguard").mode("append").save(url)
    before = {p: Path(url, p).stat().st_mtime_ns for p in data_files_on_storage(url)}
    writer.new_driver_run(spark)  # what a restarted driver sees: write 0, 1 again
    ids_df(spark, FIRST).write.format("sparkguard").mode("append").save(url)
    ids_df(spark, SECOND).write.format("sparkguard").mode("append").save(url)
    after = {p: Path(url, p).stat().st_mtime_ns for p in data_files_on_storage(url)}
    assert before == after
    assert len(_instants(url)) == 2
    # rerun=rewrite of write 1 replaces write 1's files only.
    writer.new_driver_run(spark)
    ids_df(spark, FIRST).write.format("sparkguard").mode("append").save(url)
    ids_df(spark, SECOND, partitions=2).write.format("sparkguard").mode("append").option(
        "rerun", "rewrite"
    ).save(url)
    assert_exactly_once(url, range(FIRST.start, SECOND.stop))
    superseded = reader.superseded_files(reader.load_commits(*filemanager.resolve(url)))
    assert len(superseded) == 2
    assert all("-w001-" in p for p in superseded)


@pytest.mark.spark
def test_memory_store_is_refused_with_one_clear_line(spark: Any, tmp_path: Path) -> None:
    _register(spark, tmp_path, "mem-1")
    with pytest.raises(Exception, match="in-memory store lives inside one process") as exc:
        ids_df(spark, range(10)).write.format("sparkguard").mode("append").save("memory://t")
    assert "zombie" not in str(exc.value)


# ------------------------------------------------------------------------------------------
# Real Spark, a driver killed between two writes of one job, then rollback and rerun.
# ------------------------------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import sys
    from pyspark.sql import SparkSession
    from sparkguard.spark_lib.spark import writer
    url, job, journal, second_faults = sys.argv[1:5]
    spark = (SparkSession.builder.master("local[2,4]").config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1").getOrCreate())
    writer.register(spark, conf={"spark.sparkguard.jobId": job,
                                 "spark.sparkguard.journal": journal})
    def frame(lo, hi):
        return spark.range(lo, hi, numPartitions=4).selectExpr(
            "id", "cast(id % 3 as int) as k", "concat('v', id) as s")
    frame(0, 2000).write.format("sparkguard").mode("append").save(url)
    print("first committed", flush=True)
    second = frame(2000, 3500).write.format("sparkguard").mode("append")
    if second_faults:
        second = second.option("sparkguard.faults", second_faults)
    second.save(url)
    print("second committed", flush=True)
    spark.stop()
    """
)


def _child_env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONSAFEPATH": "1",
        "PYSPARK_PYTHON": sys.executable,
        FAULTS_ENV: "1",
    }


def _run_job(url: str, job: str, journal: str, *, second_faults: str = "") -> None:
    subprocess.run(
        [sys.executable, "-c", CHILD, url, job, journal, second_faults],
        env=_child_env(),
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=300,
    )


def _run_and_kill_during_second_write(tmp_path: Path, url: str, job: str, journal: str) -> None:
    signal_file = tmp_path / "paused"
    pause = [
        {
            "point": "task:after-file",
            "partition": 1,
            "action": "pause",
            "signal": str(signal_file),
        }
    ]
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, url, job, journal, json.dumps(pause)],
        env=_child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not signal_file.exists():  # the explicit signal: a task of write 1 is paused
            assert child.poll() is None, "the job ended before its second write paused"
            assert time.monotonic() < deadline, "the second write never paused"
            time.sleep(0.2)
    finally:
        kill_session(child.pid)  # the driver, its JVM and Python workers at once
        child.wait()


@pytest.mark.spark
@pytest.mark.slow
def test_driver_killed_during_second_write_then_rollback_and_rerun(tmp_path: Path) -> None:
    """Two driver processes: the first is SIGKILLed while write 1 is paused after a file;
    after the rollback, the rerun (a new process, so a new driver run) skips the committed
    write 0 and writes write 1 again under the same names. That a plain rerun of a job whose
    writes are all committed changes nothing is test_new_driver_run_maps_writes_again's claim
    (a third process here would cost a JVM start for the same code path)."""
    url, job, journal = str(tmp_path / "t"), "two-writes", str(tmp_path / "journal")
    _run_and_kill_during_second_write(tmp_path, url, job, journal)
    statuses = _instants(url)
    assert [s.state for s in statuses] == [timeline.State.COMMITTED, timeline.State.INFLIGHT]
    assert [writer.write_index_of(s) for s in statuses] == [0, 1]
    # write 1 left files, unpublished: a plain directory reader sees none of them
    assert any("-w001-" in p for p in unpublished_leftovers(url))
    assert not any("-w001-" in p for p in data_files_on_storage(url))
    assert_exactly_once(url, FIRST)  # a reader sees write 0 only

    summary = rollback.rollback_job(job, journal)
    assert summary.instants_rolled_back == (statuses[1].instant,)
    assert undecided(url) == []
    assert_no_strays(url)

    _run_job(url, job, journal)  # the rerun: write 0 skipped, write 1 written again
    assert_exactly_once(url, range(FIRST.start, SECOND.stop))
    assert_no_strays(url)
    committed = [s for s in _instants(url) if s.state is timeline.State.COMMITTED]
    assert [writer.write_index_of(s) for s in committed] == [0, 1]
