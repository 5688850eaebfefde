"""Snapshots with real parquet through the Python writer (Spark): automatic compaction after
commits, rerun-skip of archived writes, and every row exactly once for the committed-only
reader and for a plain directory reader. Few and small: Spark is slow here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sparkguard.spark_lib.spark import writer
from sparkguard.spark_lib.storage import reader, rollback, timeline
from tests.spark_lib.spark_conftest import assert_exactly_once, assert_no_strays, ids_df, spark

__all__ = ["spark"]

pytestmark = pytest.mark.spark
JOB = "snap-e2e"


def test_archived_writes_are_skipped_on_rerun_and_rows_stay_exactly_once(
    spark: Any, tmp_path: Path
) -> None:
    url = str(tmp_path / "t")
    writer.register(
        spark,
        conf={
            "spark.sparkguard.jobId": JOB,
            "spark.sparkguard.journal": str(tmp_path / "journal"),
            "spark.sparkguard.timeline.snapshotEvery": "2",
        },
    )
    writer.new_driver_run(spark)
    chunks = [range(i * 100, (i + 1) * 100) for i in range(5)]
    for chunk in chunks[:3]:
        ids_df(spark, chunk, partitions=2).write.format("sparkguard").mode("append").save(url)
    # A failed attempt of write 3, rolled back (so a snapshot covers a rolled-back instant).
    tl = timeline.timeline_for(url)
    failed = tl.start(JOB, attempt=0, marker_type="DIRECT", write=3)
    rollback.rollback_table(url, job_id=JOB)
    assert tl.status(failed).state is timeline.State.ROLLED_BACK
    for chunk in chunks[3:]:
        ids_df(spark, chunk, partitions=2).write.format("sparkguard").mode("append").save(url)
    hot = tl.instant_ids()
    assert len(hot) < 3, hot  # compacted as it went: the history is in the snapshot
    assert failed not in hot
    expected = range(500)
    assert_exactly_once(url, expected)
    assert_no_strays(url)
    # A rerun of the whole job (a new driver run): every write is found committed, archived
    # or hot, and skipped.
    writer.new_driver_run(spark)
    for chunk in chunks:
        ids_df(spark, chunk, partitions=2).write.format("sparkguard").mode("append").save(url)
    assert_exactly_once(url, expected)
    assert_no_strays(url)
    plain = spark.read.parquet(url).select("id").collect()  # a plain directory reader
    assert sorted(r.id for r in plain) == list(expected)
    table = reader.read_table(spark, url).select("id").collect()
    assert sorted(r.id for r in table) == list(expected)
