"""Throughput of the sparkguard writer against Spark's built-in parquet writer, same run.

    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/writer.py [--quick] [--rows N] [--rounds R]

The same cached DataFrame (int, long, double and string columns) is written alternately with
``df.write.parquet``, with a bare PySpark Arrow data source (one parquet file per task, written
straight to its final name: no markers, no atomic publication, no fsync, no timeline) and with
``df.write.format("sparkguard")``; the best round of each is compared. The bare source shows
what PySpark's Python data source path costs by itself, so the gap to the built-in writer
splits into "Python data source" and "sparkguard". Last line:
``writer: sparkguard/builtin throughput = <r>``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("PYTHONSAFEPATH", "1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

KINDS = ("builtin", "python-source", "sparkguard")


def bare_source() -> type[Any]:
    """A minimal Arrow data source: what any Python writer pays, with no guarantees at all."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    class BareWriter(DataSourceArrowWriter):
        def __init__(self, path: str) -> None:
            self.path = path

        def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
            from pyspark import TaskContext

            context = TaskContext.get()
            partition = context.partitionId() if context else 0
            os.makedirs(self.path, exist_ok=True)
            table = pa.Table.from_batches(list(iterator))
            pq.write_table(table, f"{self.path}/part-{partition:05d}.parquet")
            return WriterCommitMessage()

        def commit(self, messages: list[WriterCommitMessage | None]) -> None:
            """Nothing to publish."""

        def abort(self, messages: list[WriterCommitMessage | None]) -> None:
            """Nothing to clean (the bare writer leaves whatever it wrote)."""

    class BareSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench_bare"

        def writer(self, schema: Any, overwrite: bool) -> BareWriter:
            return BareWriter(str(self.options["path"]))

    return BareSource


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="300k rows, 1 round")
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    rows, rounds = (300_000, 1) if args.quick else (args.rows, args.rounds)

    from pyspark.sql import SparkSession

    from sparkguard.spark_lib import writer

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    base = tempfile.mkdtemp(prefix="sg-bench-writer-")
    writer.register(spark, conf={"spark.sparkguard.journal": f"{base}/journal"})
    spark.dataSource.register(bare_source())
    df = spark.range(0, rows, numPartitions=args.partitions).selectExpr(
        "id",
        "cast(id % 1000 as int) as a",
        "cast(id as double) * 1.5 as d",
        "concat('name-', cast(id % 50000 as string)) as s",
    )
    df.cache().count()
    print(f"rows={rows} partitions={args.partitions} rounds={rounds} dir={base}", flush=True)

    best = dict.fromkeys(KINDS, float("inf"))
    for n in range(rounds):
        for kind in KINDS:
            target = f"{base}/{kind}-{n}"
            start = time.perf_counter()
            if kind == "builtin":
                df.write.mode("append").parquet(target)
            elif kind == "python-source":
                df.write.format("bench_bare").mode("append").save(target)
            else:
                df.write.format("sparkguard").mode("append").option("jobId", f"bench-{n}").save(
                    target
                )
            elapsed = time.perf_counter() - start
            best[kind] = min(best[kind], elapsed)
            print(
                f"round {n} {kind:13s} {elapsed:7.2f}s  {rows / elapsed / 1e6:6.2f} M rows/s",
                flush=True,
            )
            shutil.rmtree(target, ignore_errors=True)
    spark.stop()
    shutil.rmtree(base, ignore_errors=True)
    print("best: " + ", ".join(f"{kind} {best[kind]:.2f}s" for kind in KINDS))
    print(
        f"python-source/builtin throughput = {best['builtin'] / best['python-source']:.2f}, "
        f"sparkguard/python-source = {best['python-source'] / best['sparkguard']:.2f}"
    )
    print(f"writer: sparkguard/builtin throughput = {best['builtin'] / best['sparkguard']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
