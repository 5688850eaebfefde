"""The demo's Spark job on the zero-code path: a plain PySpark job that never imports sparkguard.

    spark-submit [--conf k=v ...] demo_plain_job.py TABLE ROWS PARTITIONS

Writes ``ROWS`` rows (ids ``0..ROWS-1`` with a few derived columns, so a reader can check each
id appears exactly once) in ``PARTITIONS`` tasks with Spark's own parquet writer:
``df.write.mode("append").parquet(TABLE)``. Nothing here knows about sparkguard: the conf that
``sparkguard spark-conf`` prints (given to ``spark-submit`` by ``sparkguard demo``, injected by the
operator into a SparkApplication) routes that write through sparkguard's JVM commit protocol.

Its last line says which Python modules of sparkguard the driver loaded (none: the write is
Spark's), so the demo and its tests can show that the job had no sparkguard write API.
"""

from __future__ import annotations

import sys

from pyspark.sql import SparkSession


def main(argv: list[str]) -> int:
    """Run the write; exit code 0 when Spark's write returned."""
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    table, rows, partitions = argv[0], int(argv[1]), int(argv[2])
    spark = (
        SparkSession.builder.appName("sparkguard-demo-plain")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    frame = spark.range(0, rows, numPartitions=partitions).selectExpr(
        "id",
        "cast(id % 7 as int) as bucket",
        "cast(id as double) * 1.5 as amount",
        "concat('order-', id) as label",
    )
    frame.write.mode("append").parquet(table)
    spark.stop()
    loaded = sorted(name for name in sys.modules if name.split(".")[0] == "sparkguard")
    print(f"demo job: written; sparkguard Python modules loaded: {loaded or 'none'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
