"""A plain PySpark job, as users have them: it never imports sparkguard.

    python plain_write.py CONF_JSON OUTPUT_URL ROWS PARTITIONS
        [MODE [FAIL_AT [FIRST [PARTITION_EXPR]]]]

CONF_JSON is a JSON object of Spark conf (what ``sparkguard spark-conf --format json`` prints, plus
storage settings). Writes ``spark.range(FIRST, FIRST + ROWS)`` (FIRST default 0) as column ``n`` to
parquet in PARTITIONS tasks with ``mode(MODE)`` (default append), reads the directory back and
prints one JSON line: ``{"rows": <rows read>, "ids": <distinct ids read>}``. With FAIL_AT (``-``
for none), the task writing row FAIL_AT fails every attempt (``raise_error``), so the write aborts
after the other tasks published their files; the job then exits 3 after printing ``{"failed":
true}``. FAIL_AT ``<row>:first`` fails only the first attempt of that task (a Python UDF reads
``TaskContext.attemptNumber``): with task retries in the conf (``spark.master`` ``local[2,2]``) its
second attempt writes the file and the job succeeds. With PARTITION_EXPR (a SQL expression of
``n``), the write adds the column ``k`` = that expression and is ``partitionBy("k")`` (a dynamic
partition overwrite when CONF_JSON sets ``spark.sql.sources.partitionOverwriteMode=dynamic``).

With ``"sparkguard.test.writeFormat": "sparkguard"`` in CONF_JSON (removed before Spark sees
it), the write is ``df.write.format("sparkguard").save(url)`` instead of ``.parquet(url)``: the
Python API's format name, with sparkguard's jar on the classpath the JVM front of the commit
protocol (still no sparkguard import).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from pyspark.sql import SparkSession

#: a key of CONF_JSON that only this job reads: the format name of the write
WRITE_FORMAT_KEY = "sparkguard.test.writeFormat"


def _fail_first_attempt(row: int) -> Any:
    """A UDF passing ``n`` through that fails the first attempt of the task holding ``row``."""
    from pyspark import TaskContext
    from pyspark.sql.functions import udf

    def once(n: int) -> int:
        task = TaskContext.get()
        if n == row and task is not None and task.attemptNumber() == 0:
            raise RuntimeError(f"injected failure of the first attempt at row {row}")
        return n

    return udf(once, "long")


def main() -> None:
    conf = json.loads(sys.argv[1])
    write_format = conf.pop(WRITE_FORMAT_KEY, "parquet")
    url, rows, partitions = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    mode = sys.argv[5] if len(sys.argv) > 5 else "append"
    fail_spec = sys.argv[6] if len(sys.argv) > 6 and sys.argv[6] != "-" else None
    first_only = fail_spec is not None and fail_spec.endswith(":first")
    fail_at = int(fail_spec.removesuffix(":first")) if fail_spec is not None else None
    first = int(sys.argv[7]) if len(sys.argv) > 7 else 0
    partition_expr = sys.argv[8] if len(sys.argv) > 8 else None
    started = time.monotonic()
    builder = SparkSession.builder.master("local[2]").appName("plain-write")
    builder = builder.config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
    if first_only:
        os.environ["PYSPARK_PYTHON"] = sys.executable  # the UDF's workers: this interpreter
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:
        ready = time.monotonic()
        df = spark.range(first, first + rows, numPartitions=partitions).withColumnRenamed("id", "n")
        if fail_at is not None and first_only:
            df = df.select(_fail_first_attempt(fail_at)("n").alias("n"))
        elif fail_at is not None:
            df = df.selectExpr(f"IF(n = {fail_at}, raise_error('injected failure'), n) AS n")
        writer = df.write.mode(mode)
        if partition_expr is not None:
            writer = df.selectExpr("n", f"{partition_expr} AS k").write.mode(mode).partitionBy("k")
        if fail_at is not None and not first_only:
            try:
                writer.format(write_format).save(url)
            except Exception as exc:
                print(f"the write failed: {exc}", file=sys.stderr)
                print(json.dumps({"failed": True}))
                sys.exit(3)
            raise SystemExit("the injected failure did not fail the write")
        writer.format(write_format).save(url)
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
