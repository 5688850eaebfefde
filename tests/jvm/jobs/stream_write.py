"""A plain PySpark streaming job, as users have them: it never imports sparkguard.

    python stream_write.py CONF_JSON INPUT_DIR SINK CHECKPOINT [STALL_FLAG STALL_ROW [FAIL_ROW]]

CONF_JSON is a JSON object of Spark conf (what ``sparkguard spark-conf --format json`` prints).
Reads the parquet files of INPUT_DIR (column ``n``) as a stream, one file per micro-batch
(``maxFilesPerTrigger=1``), spreads each batch over 2 tasks, and writes it with Spark's parquet
file sink to SINK, partitioned by ``k = n % 2``, with ``trigger(availableNow=True)``. With
STALL_FLAG, the task holding row STALL_ROW sleeps for ten minutes while the file STALL_FLAG
exists (the other task writes and publishes its files): a test kills the job there (STALL_FLAG
``-``: no stall). With FAIL_ROW, the first attempt of the task holding row FAIL_ROW fails there,
in every batch execution that holds it (Spark retries the task). Then reads
SINK back with ``spark.read.parquet`` (through ``_spark_metadata``) and prints one JSON line
``{"rows": <rows read>, "ids": <distinct n read>}``.
"""

from __future__ import annotations

import json
import os
import sys
import time

from pyspark import TaskContext
from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812
from pyspark.sql.types import LongType


def main() -> None:
    conf = json.loads(sys.argv[1])
    source, sink, checkpoint = sys.argv[2], sys.argv[3], sys.argv[4]
    stall_flag = sys.argv[5] if len(sys.argv) > 5 and sys.argv[5] != "-" else None
    stall_row = int(sys.argv[6]) if len(sys.argv) > 6 else -1
    fail_row = int(sys.argv[7]) if len(sys.argv) > 7 else -1
    os.environ["PYSPARK_PYTHON"] = sys.executable  # the UDF's workers: this interpreter
    master = "local[2,4]" if fail_row >= 0 else "local[2]"  # local[2,4]: task retries
    builder = SparkSession.builder.master(master).appName("stream-write")
    builder = builder.config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
    builder = builder.config("spark.sql.shuffle.partitions", "2")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:

        def stall(n: int) -> int:
            while n == stall_row and stall_flag is not None and os.path.exists(stall_flag):
                time.sleep(0.5)  # until the test kills the job (or removes the flag)
            task = TaskContext.get()
            if n == fail_row and task is not None and task.attemptNumber() == 0:
                raise RuntimeError(f"injected failure of the first attempt of the task with {n}")
            return n

        stall_udf = F.udf(stall, LongType())
        stream = spark.readStream.schema("n long").option("maxFilesPerTrigger", 1).parquet(source)
        out = stream.repartition(2).select(stall_udf("n").alias("n"))
        out = out.withColumn("k", F.col("n") % 2)
        query = (
            out.writeStream.format("parquet")
            .option("checkpointLocation", checkpoint)
            .partitionBy("k")
            .trigger(availableNow=True)
            .start(sink)
        )
        query.awaitTermination()
        back = spark.read.parquet(sink)  # through _spark_metadata, as Spark reads a sink
        result = {"rows": back.count(), "ids": back.select("n").distinct().count()}
    finally:
        spark.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
