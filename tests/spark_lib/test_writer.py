"""The batch writer in real PySpark (local[2,4]): layout, re-runs, overwrite, and faults.

For every fault: after rollback + re-run the table holds each expected row exactly once, no
uncommitted file is left on storage, and readers only ever see committed (whole) files.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from sparkguard.spark_lib import reader, rollback, writer
from tests.spark_lib.spark_conftest import (
    assert_exactly_once,
    assert_no_strays,
    data_files_on_storage,
    ids_df,
    spark,
    undecided,
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
# Faults, at random points (seeded): task attempts, whole jobs, the driver's commit.
# ------------------------------------------------------------------------------------------

TASK_POINTS = [
    "task:before-marker",
    "task:after-marker",
    "task:mid-file",
    "task:after-file",
    "task:end",
]
DRIVER_POINTS = [
    "driver:after-inflight",
    "commit:start",
    "commit:before-outcome",
    "commit:after-outcome",
]


def _random_fault(rng: random.Random, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    kind = rng.choice(["task-once", "task-once", "job", "driver"])
    if kind == "task-once":  # the first attempt fails, the retry succeeds
        return kind, {
            "point": rng.choice(TASK_POINTS),
            "partition": rng.randrange(4),
            "attempt": 0,
            "action": rng.choice(["raise", "raise", "exit"]),
        }
    if kind == "job":  # every attempt of one task fails: the job fails after others finished
        return kind, {"point": rng.choice(TASK_POINTS), "partition": rng.randrange(4)}
    return kind, {"point": rng.choice(DRIVER_POINTS)}


@pytest.mark.slow
def test_random_faults_then_rollback_and_rerun_hold_each_row_once(
    spark: Any, tmp_path: Path
) -> None:
    rng = random.Random(20261122)
    for round_ in range(8):
        kind, fault = _random_fault(rng, tmp_path)
        job = f"fault-{round_}"
        journal = _register(spark, tmp_path, job)
        url = str(tmp_path / f"t{round_}")
        partition_by = rng.choice(["", "k"])
        failed = False
        try:
            _write(
                ids_df(spark, ROWS),
                url,
                partitionBy=partition_by,
                maxRecordsPerFile=str(rng.choice([0, 300])),
                **{writer.FAULTS_OPTION: json.dumps([fault])},
            )
        except Exception:
            failed = True
        context = f"round {round_}: {kind} {fault} failed={failed}"
        if kind == "task-once":
            assert not failed, context
        if kind == "job" or fault["point"] in DRIVER_POINTS[:3]:
            assert failed, context
        # A reader at this moment sees committed data only: all of it, or none of it.
        ids = sorted(_safe_ids(url))
        assert ids in ([], list(ROWS)), context
        summary = rollback.rollback_job(job, journal)
        assert summary.job_id == job
        assert undecided(url) == [], context
        writer.new_driver_run(spark)  # the re-run is a new driver run: write 0 again
        _write(ids_df(spark, ROWS), url, partitionBy=partition_by)
        assert_exactly_once(url, ROWS)
        assert_no_strays(url)


def _safe_ids(url: str) -> list[int]:
    from tests.spark_lib.spark_conftest import committed_ids

    if not Path(url, "_sparkguard", "timeline").exists():
        return []
    return committed_ids(url)
