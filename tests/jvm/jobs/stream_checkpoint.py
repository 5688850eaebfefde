"""A plain Structured Streaming query, as users have them: it never imports sparkguard.

    python stream_checkpoint.py CONF_JSON CHECKPOINT SINK LAST_BATCH [ROWS_PER_BATCH]

Reads ``rate-micro-batch`` (ROWS_PER_BATCH rows per micro-batch, default 10, values 0, 1, 2, ...
in order) and writes SINK: ``noop`` or a parquet directory URL (Spark's file sink, with its
``_spark_metadata`` log), checkpointing to CHECKPOINT, until micro-batch LAST_BATCH has run
(restarting from an existing checkpoint resumes where it stopped). Prints one JSON line:
``{"lastBatch": n, "batchMs": [...]}`` (each batch's ``triggerExecution`` duration; with a
parquet sink also ``"sink": {"rows", "distinct", "max"}``, read back through its
``_spark_metadata``), or, when the query fails, ``{"error": "<message>"}`` and exits 4.
"""

from __future__ import annotations

import json
import sys
import time

from pyspark.sql import SparkSession
from pyspark.sql.utils import StreamingQueryException


def main() -> None:
    conf = json.loads(sys.argv[1])
    checkpoint, sink, last_batch = sys.argv[2], sys.argv[3], int(sys.argv[4])
    rows_per_batch = int(sys.argv[5]) if len(sys.argv) > 5 else 10
    builder = SparkSession.builder.master("local[2]").appName("stream-checkpoint")
    builder = builder.config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
    builder = builder.config("spark.sql.shuffle.partitions", "2")
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:
        stream = spark.readStream.format("rate-micro-batch").option(
            "rowsPerBatch", str(rows_per_batch)
        )
        df = stream.load().selectExpr("value")
        writer = df.writeStream.option("checkpointLocation", checkpoint)
        if sink == "noop":
            writer = writer.format("noop")
        else:
            writer = writer.format("parquet").option("path", sink)
        query = writer.start()
        batch_ms: dict[int, int] = {}
        try:
            while True:
                for progress in query.recentProgress:
                    batch_ms[progress["batchId"]] = progress["durationMs"]["triggerExecution"]
                if batch_ms and max(batch_ms) >= last_batch:
                    break
                if not query.isActive:
                    query.awaitTermination()  # raises the query's error
                    raise SystemExit("the query stopped without an error")
                time.sleep(0.05)
            query.stop()
        except StreamingQueryException as exc:
            print(json.dumps({"error": str(exc)}))
            sys.exit(4)
        result: dict[str, object] = {
            "lastBatch": max(batch_ms),
            "batchMs": [batch_ms[b] for b in sorted(batch_ms)],
        }
        if sink != "noop":
            back = spark.read.parquet(sink)  # the file sink's _spark_metadata decides the files
            row = back.selectExpr("count(*) AS n", "count(DISTINCT value) AS d", "max(value) AS m")
            n, d, m = row.first()  # type: ignore[misc]
            result["sink"] = {"rows": n, "distinct": d, "max": m}
    finally:
        spark.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
