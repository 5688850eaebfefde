"""A stateful Structured Streaming query with ``foreachBatch``, as users have them: it never
imports sparkguard.

    python stream_foreach_batch.py CONF_JSON CHECKPOINT OUTPUT LAST_BATCH [STALL_FLAG STALL_BATCH]

Reads ``rate-micro-batch`` (10 rows per micro-batch, values 0, 1, 2, ... in order), keeps a
running ``count`` and ``sum`` per ``k = value % 5`` in the state store (update mode), and in
``foreachBatch`` appends each batch's updated rows, with the batch id, to the parquet table
OUTPUT (a plain ``df.write``: the commit protocol in CONF decides how). Checkpoints to
CHECKPOINT; runs until micro-batch LAST_BATCH has run (a restart resumes from the checkpoint);
later batches write nothing, so the stop never lands inside a write.
With STALL_FLAG, the batch STALL_BATCH waits after its write while that file exists (the test
kills it there: the write committed, the batch not).

Prints one JSON line: ``{"lastBatch": n, "state": {batchId: [rows, sum of counts]}, "output":
[[batch, k, n, s], ...]}``: the state store read back at every batch (every state file must
parse) and OUTPUT read by listing the directory (``spark.read.parquet``).
"""

from __future__ import annotations

import json
import os
import sys
import time

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812


def main() -> None:
    conf = json.loads(sys.argv[1])
    checkpoint, output, last_batch = sys.argv[2], sys.argv[3], int(sys.argv[4])
    stall_flag = sys.argv[5] if len(sys.argv) > 5 else None
    stall_batch = int(sys.argv[6]) if len(sys.argv) > 6 else -1
    builder = SparkSession.builder.master("local[2]").appName("stream-foreach-batch")
    builder = builder.config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
    builder = builder.config("spark.sql.shuffle.partitions", "2")
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()

    def write(batch: DataFrame, batch_id: int) -> None:
        if batch_id > last_batch:
            return  # the job is stopping: stop() lands between batches' writes, never in one
        batch.withColumn("batch", F.lit(batch_id)).write.mode("append").parquet(output)
        while batch_id == stall_batch and stall_flag and os.path.exists(stall_flag):
            time.sleep(0.1)

    try:
        stream = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", "10").load()
        counts = (
            stream.select((F.col("value") % 5).alias("k"), "value")
            .groupBy("k")
            .agg(F.count("*").alias("n"), F.sum("value").alias("s"))
        )
        query = (
            counts.writeStream.outputMode("update")
            .option("checkpointLocation", checkpoint)
            .foreachBatch(write)
            .start()
        )
        done = -1
        while done < last_batch:
            progress = query.lastProgress
            if progress is not None:
                done = max(done, progress["batchId"])
            if not query.isActive:
                query.awaitTermination()  # raises the query's error
                raise SystemExit("the query stopped without an error")
            time.sleep(0.05)
        query.stop()
        done = last_batch  # later batches wrote nothing (see write())
        back = spark.read.parquet(output).select("batch", "k", "n", "s").collect()
        state: dict[int, list[int]] = {}
        for batch_id in range(done + 1):
            # Spark's state reader loads the state store as of this batch: every delta and
            # snapshot file it needs must parse.
            rows = (
                spark.read.format("statestore")
                .option("batchId", batch_id)
                .load(checkpoint)
                .selectExpr("count(*) AS rows", "sum(value.count) AS n")
                .first()
            )
            assert rows is not None
            state[batch_id] = [rows["rows"], rows["n"]]
        result = {
            "lastBatch": done,
            "state": state,
            "output": sorted([r["batch"], r["k"], r["n"], r["s"]] for r in back),
        }
    finally:
        spark.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
