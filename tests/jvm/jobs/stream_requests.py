"""A plain PySpark streaming job that runs many tiny micro-batches into a parquet file sink and
reports, per batch, the storage operations sparkguard's JVM protocol did and the batch's time.

    python stream_requests.py CONF_JSON SINK CHECKPOINT BATCHES

Source ``rate-micro-batch`` (one row per batch, no input listing: the source's cost does not grow
with the batches), one task per batch, the query stopped once BATCHES batches ran; Spark's sink
manifest deletes its compacted batch files at once (``fileSink.log.cleanupDelay=0``). The conf
must set ``spark.hadoop.sparkguard.test.countStoreOps=true`` (the JVM module's
``CountingAtomicStore``). Prints one JSON line ``{"ops": [...], "ms": [...], "batches": <n>}``:
per instant ``[operations, names listed, S3-style requests, nanoseconds in the store]``, per
batch its ``triggerExecution`` milliseconds.
"""

from __future__ import annotations

import json
import sys
import time

from pyspark.sql import SparkSession


def main() -> None:
    conf = json.loads(sys.argv[1])
    sink, checkpoint, batches = sys.argv[2], sys.argv[3], int(sys.argv[4])
    builder = SparkSession.builder.master("local[1]").appName("stream-requests")
    builder = builder.config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
    builder = builder.config("spark.sql.shuffle.partitions", "1")
    builder = builder.config("spark.sql.streaming.numRecentProgressUpdates", str(batches + 100))
    builder = builder.config("spark.sql.streaming.fileSink.log.cleanupDelay", "0")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:
        counting = spark.sparkContext._jvm.io.sparkguard.spark.store.CountingAtomicStore  # type: ignore[union-attr]
        counting.reset()
        stream = (
            spark.readStream.format("rate-micro-batch")
            .option("rowsPerBatch", 1)
            .option("numPartitions", 1)
            .load()
            .selectExpr("value AS n")
        )
        query = (
            stream.writeStream.format("parquet")
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="0 seconds")
            .start(sink)
        )
        while True:
            progress = query.lastProgress
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
            if progress is not None and progress["batchId"] >= batches:
                break
            time.sleep(0.5)
        query.stop()
        ran = [p for p in query.recentProgress if p["numInputRows"] > 0]
        ran = [p for p in ran if p["batchId"] < batches]
        ms = [int(p["durationMs"]["triggerExecution"]) for p in ran]
        ops = json.loads(counting.report())[: batches + 1]
        print(json.dumps({"ops": ops, "ms": ms, "batches": len(ran)}))
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
