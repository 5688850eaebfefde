"""A plain PySpark streaming job that stops its query cleanly mid-batch (never imports sparkguard).

    python stream_stop.py CONF_JSON INPUT_DIR SINK CHECKPOINT STALL_FLAG STALL_ROW STOP_BATCH

Like ``stream_write.py`` (parquet file sink to SINK partitioned by ``k = n % 2``, one input file
per micro-batch, two tasks per batch), but with a processing-time trigger, as a long-running
query has: the task holding row STALL_ROW sleeps while the file STALL_FLAG exists. Once a data
file of batch STOP_BATCH is published in SINK (the other task of that batch finished), the
driver calls ``query.stop()``, as an operator or a notebook user does. Then reads SINK back
through ``_spark_metadata``, stops Spark, removes STALL_FLAG (its stalled Python worker then
ends) and prints one JSON line ``{"rows": <rows read>, "ids": <distinct n read>}``.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time

from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812
from pyspark.sql.types import LongType


def main() -> None:
    conf = json.loads(sys.argv[1])
    source, sink, checkpoint, stall_flag = sys.argv[2:6]
    stall_row, stop_batch = int(sys.argv[6]), int(sys.argv[7])
    os.environ["PYSPARK_PYTHON"] = sys.executable  # the UDF's workers: this interpreter
    builder = SparkSession.builder.master("local[2]").appName("stream-stop")
    builder = builder.config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
    builder = builder.config("spark.sql.shuffle.partitions", "2")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:

        def stall(n: int) -> int:
            while n == stall_row and os.path.exists(stall_flag):
                time.sleep(0.2)  # until the query's stop kills the task
            return n

        stall_udf = F.udf(stall, LongType())
        stream = spark.readStream.schema("n long").option("maxFilesPerTrigger", 1).parquet(source)
        out = stream.repartition(2).select(stall_udf("n").alias("n"))
        out = out.withColumn("k", F.col("n") % 2)
        query = (
            out.writeStream.format("parquet")
            .option("checkpointLocation", checkpoint)
            .partitionBy("k")
            .trigger(processingTime="1 second")
            .start(sink)
        )
        published = os.path.join(sink, "k=*", f"part-*-b{stop_batch:010d}-*")
        deadline = time.monotonic() + 240
        while not glob.glob(published):
            if query.exception() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"no file of batch {stop_batch} was published: {query.status}")
            time.sleep(0.2)
        query.stop()
        back = spark.read.parquet(sink)  # through _spark_metadata, as Spark reads a sink
        result = {"rows": back.count(), "ids": back.select("n").distinct().count()}
    finally:
        spark.stop()
        if os.path.exists(stall_flag):
            os.remove(stall_flag)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
