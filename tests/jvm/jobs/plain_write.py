"""A plain PySpark job, as users have them: it never imports sparkguard.

    python plain_write.py CONF_JSON OUTPUT_URL ROWS PARTITIONS [MODE [FAIL_AT [BUCKETS]]]

CONF_JSON is a JSON object of Spark conf (what ``sparkguard spark-conf --format json`` prints,
plus storage settings). Writes ``spark.range(ROWS)`` as parquet in PARTITIONS tasks with
``mode(MODE)`` (default append), reads the directory back and prints one JSON line:
``{"rows": <rows read>, "ids": <distinct ids read>}``. With FAIL_AT, the task writing row
FAIL_AT fails every attempt (``raise_error``), so the write aborts after the other tasks
published their files; the job then exits 3 after printing ``{"failed": true}`` (FAIL_AT ``-``:
none). With BUCKETS, a column ``b = n % BUCKETS`` is added and the write is
``partitionBy("b")`` (Hive-style ``b=<value>/`` directories).
"""

from __future__ import annotations

import json
import sys
import time

from pyspark.sql import SparkSession


def main() -> None:
    conf = json.loads(sys.argv[1])
    url, rows, partitions = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    mode = sys.argv[5] if len(sys.argv) > 5 else "append"
    fail_at = int(sys.argv[6]) if len(sys.argv) > 6 and sys.argv[6] != "-" else None
    buckets = int(sys.argv[7]) if len(sys.argv) > 7 else None
    started = time.monotonic()
    builder = SparkSession.builder.master("local[2]").appName("plain-write")
    builder = builder.config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:
        ready = time.monotonic()
        df = spark.range(0, rows, numPartitions=partitions).withColumnRenamed("id", "n")
        if fail_at is not None:
            df = df.selectExpr(f"IF(n = {fail_at}, raise_error('injected failure'), n) AS n")
        if buckets is not None:
            df = df.selectExpr("n", f"n % {buckets} AS b")
        writer = df.write.mode(mode)
        if buckets is not None:
            writer = writer.partitionBy("b")
        if fail_at is not None:
            try:
                writer.parquet(url)
            except Exception:
                print(json.dumps({"failed": True}))
                sys.exit(3)
            raise SystemExit("the injected failure did not fail the write")
        writer.parquet(url)
        written = time.monotonic()
        back = spark.read.parquet(url)
        result = {"rows": back.count(), "ids": back.select("n").distinct().count()}
        timings = {"start": ready - started, "write": written - ready}
        print(f"plain_write timings: {json.dumps(timings)}", file=sys.stderr)
    finally:
        spark.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
