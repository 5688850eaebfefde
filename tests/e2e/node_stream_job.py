"""A plain PySpark Structured Streaming job for the node's recovery tier: it never imports
sparkguard (admission's conf puts the JVM layer under it: the checkpoint file manager and the
streaming commit protocol).

    node_stream_job.py INPUT SINK CHECKPOINT PAUSE_S

Reads the parquet files of INPUT (column ``n``) as a stream, one file per micro-batch, and
writes each batch with Spark's parquet file sink to SINK (checkpoint CHECKPOINT) with
``trigger(availableNow=True)``: the query ends once every file there at its start is written.
Each batch's two tasks sleep PAUSE_S seconds before they write, so a test sees a batch in flight.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql import SparkSession


def main() -> None:
    source, sink, checkpoint, pause = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    spark = SparkSession.builder.appName("sparkguard-node-stream").getOrCreate()

    def slow(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        time.sleep(pause)
        yield from batches

    stream = spark.readStream.schema("n long").option("maxFilesPerTrigger", 1).parquet(source)
    query = (
        stream.repartition(2)
        .mapInArrow(slow, "n long")
        .writeStream.format("parquet")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start(sink)
    )
    query.awaitTermination()
    spark.stop()
    print("node stream job: done")


if __name__ == "__main__":
    main()
