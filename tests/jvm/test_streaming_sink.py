"""Spark's streaming file sink through ``SparkguardStreamingCommitProtocol``: an unchanged
streaming job (``tests/jvm/jobs/stream_write.py``, never imports sparkguard) run with the conf
``sparkguard spark-conf`` prints writes deterministic names; killed mid-batch, rolled back with
``sparkguard rollback`` and restarted from its checkpoint, it leaves no orphan and every input
row exactly once, through ``_spark_metadata`` and by listing the directory."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.spark import sparkconf
from sparkguard.spark_lib.storage import reader, rollback, sinklog, timeline
from sparkguard.spark_lib.tools import commands
from tests.jvm.conftest import JOBS, job_env, run_job
from tests.support.process import kill_session

pytestmark = pytest.mark.spark

JOB = "stream-job-1"
ROWS_PER_FILE = 1000
NAME = re.compile(rf"^k=[01]/part-\d{{5}}-{JOB}-b(\d{{10}})-c\d{{3}}\.snappy\.parquet$")


def _inputs(directory: Path, count: int, *, first: int = 0) -> None:
    """``count`` parquet files of ``n``, one micro-batch each, in modification-time order."""
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(first, first + count):
        path = directory / f"input-{i:03d}.parquet"
        values = pa.array(range(i * ROWS_PER_FILE, (i + 1) * ROWS_PER_FILE), pa.int64())
        pq.write_table(pa.table({"n": values}), path)
        os.utime(path, (1_700_000_000 + 10 * i, 1_700_000_000 + 10 * i))


def _on_disk(sink: Path) -> set[str]:
    """Data files found by listing the directory (what Hive/Trino/a plain reader see)."""
    return {
        str(p.relative_to(sink))
        for p in sink.rglob("*.parquet")
        if not any(part.startswith(("_", ".")) for part in p.relative_to(sink).parts)
    }


def _temp_files(sink: Path) -> list[str]:
    return [str(p) for p in sink.rglob("*.sg-tmp-*")]


def _listed(sink: Path) -> set[str]:
    manager, table = filemanager.resolve(str(sink))
    return set(sinklog.listed_files(manager, table))


def _rows_by_listing(sink: Path) -> list[int]:
    rows: list[int] = []
    for relative in sorted(_on_disk(sink)):
        rows.extend(pq.read_table(sink / relative, columns=["n"]).column("n").to_pylist())
    return rows


def _args(tmp_path: Path) -> tuple[dict[str, str], list[str]]:
    conf = sparkconf.build_spark_conf(JOB, journal=str(tmp_path / "journal"))
    paths = [str(tmp_path / d) for d in ("input", "sink", "checkpoint")]
    return conf, paths


def _wait_for(condition: object, *, timeout: float, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the job ended early:\n{process.communicate()[1][-3000:]}"
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("the job never reached the point where the test kills it")


def test_a_batch_killed_mid_write_is_rolled_back_and_rerun_exactly_once(tmp_path: Path) -> None:
    conf, (source, sink_dir, checkpoint) = _args(tmp_path)
    sink = Path(sink_dir)
    _inputs(Path(source), 3)
    flag = tmp_path / "stall"
    flag.write_text("the task holding row 1500 waits while this file exists\n")
    env = job_env()  # with the test JVM options
    # Batch 1 (rows 1000-1999) stalls in the task holding row 1500; the other task publishes.
    process = subprocess.Popen(
        [sys.executable, str(JOBS / "stream_write.py"), json.dumps(conf), source, sink_dir,
         checkpoint, str(flag), "1500"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip
    try:
        _wait_for(
            lambda: any(NAME.match(n).group(1) == "0000000001" for n in _on_disk(sink)),  # type: ignore[union-attr]
            timeout=240,
            process=process,
        )
    finally:
        kill_session(process.pid)  # the job's whole session: its Python, its JVM, its workers
        process.communicate()
    orphans = _on_disk(sink) - _listed(sink)
    assert orphans, "the killed batch left published files that _spark_metadata does not list"
    assert all(NAME.match(n) for n in _on_disk(sink)), _on_disk(sink)
    assert {NAME.match(n).group(1) for n in orphans} == {"0000000001"}  # type: ignore[union-attr]
    assert _listed(sink)
    assert reader.committed_paths(sink_dir) == [f"{sink_dir}/{n}" for n in sorted(_listed(sink))]

    summary = rollback.rollback_job(JOB, str(tmp_path / "journal"))
    assert summary.files_deleted == len(orphans)
    assert _on_disk(sink) == _listed(sink)  # no orphan left
    assert _temp_files(sink) == []

    flag.unlink()
    result = run_job("stream_write.py", source, sink_dir, checkpoint, conf=conf)
    rows = 3 * ROWS_PER_FILE
    assert result == {"rows": rows, "ids": rows}  # through _spark_metadata
    listing = _rows_by_listing(sink)  # ignoring _spark_metadata
    assert len(listing) == rows
    assert set(listing) == set(range(rows))
    assert _on_disk(sink) == _listed(sink)
    assert orphans <= _on_disk(sink)  # the re-executed batch wrote the same names again
    assert {NAME.match(n).group(1) for n in _on_disk(sink)} == {  # type: ignore[union-attr]
        f"{b:010d}" for b in range(3)
    }
    # sparkguard's timeline agrees with the manifest: every listed file is in a committed instant.
    assert reader.committed_paths(sink_dir) == [f"{sink_dir}/{n}" for n in sorted(_listed(sink))]
    again = rollback.rollback_job(JOB, str(tmp_path / "journal"))
    assert again.files_deleted == 0


def test_a_query_stopped_mid_batch_leaves_no_rolling_back_instant(tmp_path: Path) -> None:
    conf, (source, sink_dir, checkpoint) = _args(tmp_path)
    sink = Path(sink_dir)
    _inputs(Path(source), 3)
    flag = tmp_path / "stall"
    flag.write_text("the task holding row 1500 waits while this file exists\n")
    # Batch 1 stalls in the task holding row 1500; once the other task published its file, the
    # driver stops the query cleanly (query.stop()): Spark aborts the batch.
    result = run_job(
        "stream_stop.py", source, sink_dir, checkpoint, str(flag), "1500", "1", conf=conf
    )
    assert result == {"rows": ROWS_PER_FILE, "ids": ROWS_PER_FILE}  # batch 0 only
    report = commands.inspect_table(sink_dir, options={})
    states = {i["instant"]: i["state"] for i in report["instants"]}
    assert sorted(states.values()) == ["committed", "rolled_back"], states
    aborted = next(i for i, state in states.items() if state == "rolled_back")
    record = timeline.timeline_for(sink_dir).read_rolledback(aborted)
    assert record is not None
    # The stopped batch's published file was deleted by the abort, and recorded as such.
    assert record["deleted"], record
    assert {NAME.match(n).group(1) for n in record["deleted"]} == {"0000000001"}  # type: ignore[union-attr]
    assert set(record["deleted"]) <= set(record["marked"])
    assert record["complete"] is True
    assert record["filesDeleted"] == len(record["deleted"])
    assert _on_disk(sink) == _listed(sink)  # no orphan left for a directory lister
    assert _temp_files(sink) == []
    assert list((sink / "_sparkguard" / "markers").iterdir()) == []
    # A rollback afterwards has nothing left to do.
    summary = rollback.rollback_job(JOB, str(tmp_path / "journal"))
    assert (summary.files_deleted, summary.instants_rolled_back) == (0, ())
    # The restart re-executes batch 1 under the same names: each row once.
    result = run_job("stream_write.py", source, sink_dir, checkpoint, conf=conf)
    assert result == {"rows": 3 * ROWS_PER_FILE, "ids": 3 * ROWS_PER_FILE}
    assert _on_disk(sink) == _listed(sink)


def _last_instant(sink: Path) -> str:
    return sorted(p.stem for p in (sink / "_sparkguard" / "timeline").glob("*.inflight"))[-1]


def _crash_between_manifest_and_outcome(sink: Path, instant: str) -> None:
    """What a driver killed after ``_spark_metadata/<batch>`` and before the outcome leaves:
    the instant undecided, its markers still there."""
    tl_dir = sink / "_sparkguard" / "timeline"
    outcome = json.loads((tl_dir / f"{instant}.outcome").read_text())
    (tl_dir / f"{instant}.outcome").unlink()
    markers = sink / "_sparkguard" / "markers" / instant
    for file in outcome["files"]:
        marker = markers / f"{file['path']}.marker.CREATE"
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()


def test_the_manifest_decides_a_batch_whose_outcome_was_not_written(tmp_path: Path) -> None:
    conf, (source, sink_dir, checkpoint) = _args(tmp_path)
    sink = Path(sink_dir)
    _inputs(Path(source), 1)
    assert run_job("stream_write.py", source, sink_dir, checkpoint, conf=conf)["rows"] == 1000
    files = _on_disk(sink)
    assert files == _listed(sink)
    assert files

    # Rollback finds the batch in _spark_metadata: committed, not rolled back; nothing deleted.
    instant = _last_instant(sink)
    _crash_between_manifest_and_outcome(sink, instant)
    summary = rollback.rollback_job(JOB, str(tmp_path / "journal"))
    assert summary.files_deleted == 0
    assert not summary.instants_rolled_back
    manager, table = filemanager.resolve(sink_dir)
    status = timeline.Timeline(manager, table).status(instant)
    assert status.state is timeline.State.COMMITTED
    assert {f.path for f in status.files} == files
    assert not (sink / "_sparkguard" / "markers" / instant).exists()

    # The same crash, found by the next batch's setupJob in the JVM: recorded as committed.
    _crash_between_manifest_and_outcome(sink, instant)
    _inputs(Path(source), 1, first=1)
    result = run_job("stream_write.py", source, sink_dir, checkpoint, conf=conf)
    assert result == {"rows": 2000, "ids": 2000}
    status = timeline.Timeline(manager, table).status(instant)
    assert status.state is timeline.State.COMMITTED
    assert status.extra.get("recorded") == "repaired"
    assert {f.path for f in status.files} == files
    assert _on_disk(sink) == _listed(sink)
    assert len(_rows_by_listing(sink)) == 2000
