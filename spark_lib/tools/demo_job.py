"""The demo's Spark job: write ``rows`` rows to a table through sparkguard.

Run by ``sparkguard demo`` as a separate driver process so that it can be killed mid-write.
``python -m sparkguard.spark_lib.tools.demo_job --help`` lists its flags. The rows are ids
``0..rows-1`` with a few derived columns, so a reader can check each id appears exactly once.
"""

from __future__ import annotations

import argparse
import json
import sys


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The job's flags."""
    parser = argparse.ArgumentParser(prog="sparkguard-demo-job", description=__doc__)
    parser.add_argument("--table", required=True, help="table URL")
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--attempt", type=int, default=0)
    parser.add_argument("--journal", required=True, help="journal URL")
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--markers", default="TIMELINE_SERVER_BASED")
    parser.add_argument("--endpoint", default="", help="marker sidecar URL")
    parser.add_argument("--token-file", default="")
    parser.add_argument("--faults", default="", help="test hook: writer fault list (JSON)")
    parser.add_argument("--master", default="local[2,4]")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the job; exit code 0 when the write committed (or was already committed)."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from pyspark.sql import SparkSession

    from sparkguard.spark_lib.spark import faults, writer

    spark = (
        SparkSession.builder.master(args.master)
        .appName(f"sparkguard-demo-{args.job_id}")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    conf = {
        "spark.sparkguard.jobId": args.job_id,
        "spark.sparkguard.attempt": str(args.attempt),
        "spark.sparkguard.journal": args.journal,
        "spark.sparkguard.markers.type": args.markers,
    }
    if args.endpoint:
        conf["spark.sparkguard.markers.endpoint"] = args.endpoint
    if args.token_file:
        conf["spark.sparkguard.markers.tokenFile"] = args.token_file
    writer.register(spark, conf=conf)
    frame = spark.range(0, args.rows, numPartitions=args.partitions).selectExpr(
        "id",
        "cast(id % 7 as int) as bucket",
        "cast(id as double) * 1.5 as amount",
        "concat('order-', id) as label",
    )
    write = frame.write.format("sparkguard").mode("append")
    if args.faults:
        json.loads(args.faults)  # fail fast on a malformed hook
        write = write.option(faults.OPTION, args.faults)
    write.save(args.table)
    spark.stop()
    print("demo job: committed", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
