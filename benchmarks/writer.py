"""Throughput of the sparkguard writer against Spark's built-in parquet writer, same run.

    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/writer.py [--quick] [--rows N] [--rounds R]

The same cached DataFrame (int, long, double and string columns) is written alternately with
``df.write.parquet`` and ``df.write.format("sparkguard")`` (markers and atomic publication
included); the best round of each is compared. Last line:
``writer: sparkguard/builtin throughput = <r>``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("PYTHONSAFEPATH", "1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


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
    df = spark.range(0, rows, numPartitions=args.partitions).selectExpr(
        "id",
        "cast(id % 1000 as int) as a",
        "cast(id as double) * 1.5 as d",
        "concat('name-', cast(id % 50000 as string)) as s",
    )
    df.cache().count()
    print(f"rows={rows} partitions={args.partitions} rounds={rounds} dir={base}", flush=True)

    best = {"builtin": float("inf"), "sparkguard": float("inf")}
    for n in range(rounds):
        for kind in ("builtin", "sparkguard"):
            target = f"{base}/{kind}-{n}"
            start = time.perf_counter()
            if kind == "builtin":
                df.write.mode("append").parquet(target)
            else:
                df.write.format("sparkguard").mode("append").option("jobId", f"bench-{n}").save(
                    target
                )
            elapsed = time.perf_counter() - start
            best[kind] = min(best[kind], elapsed)
            print(
                f"round {n} {kind:10s} {elapsed:7.2f}s  {rows / elapsed / 1e6:6.2f} M rows/s",
                flush=True,
            )
            shutil.rmtree(target, ignore_errors=True)
    spark.stop()
    shutil.rmtree(base, ignore_errors=True)
    ratio = best["builtin"] / best["sparkguard"]
    print(f"best: builtin {best['builtin']:.2f}s, sparkguard {best['sparkguard']:.2f}s")
    print(f"writer: sparkguard/builtin throughput = {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
