"""A streaming query run with a checkpoint manager that may make it lose a race (tests only).

    python stream_race.py CONF_JSON CHECKPOINT LAST_BATCH

Reads ``rate-micro-batch`` (10 rows per micro-batch) into the ``noop`` sink, checkpointing to
CHECKPOINT, until micro-batch LAST_BATCH has run or the query fails. CONF_JSON is the Spark conf
(with tests/jvm/test_checkpoint_race.py: ``RacingCheckpointFileManager`` from the JVM module's
test classes, and the file it races for). Prints one JSON line and exits 0 either way::

    {"lastBatch": n or null, "mechanism": "<how sparkguard's manager publishes on CHECKPOINT>",
     "causes": [[java class, message], ...]}

``causes`` is the JVM exception chain of the query's failure, outermost first (empty when the
query ran to LAST_BATCH), so a test can tell which of Spark's checks stopped it and why.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from pyspark.sql import SparkSession


def cause_chain(throwable: Any) -> list[list[str]]:
    """[class, message] of a py4j ``Throwable`` and each of its causes."""
    chain: list[list[str]] = []
    while throwable is not None and len(chain) < 20:
        chain.append([throwable.getClass().getName(), str(throwable.getMessage())])
        cause = throwable.getCause()
        throwable = None if cause is None or cause.equals(throwable) else cause
    return chain


def main() -> None:
    conf = json.loads(sys.argv[1])
    checkpoint, last_batch = sys.argv[2], int(sys.argv[3])
    builder = SparkSession.builder.master("local[2]").appName("stream-race")
    builder = builder.config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
    builder = builder.config("spark.sql.shuffle.partitions", "2")
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:
        stream = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", "10")
        query = (
            stream.load()
            .selectExpr("value")
            .writeStream.option("checkpointLocation", checkpoint)
            .format("noop")
            .start()
        )
        batches: set[int] = set()
        while query.isActive:
            batches.update(p["batchId"] for p in query.recentProgress)
            if batches and max(batches) >= last_batch:
                query.stop()
                break
            time.sleep(0.05)
        batches.update(p["batchId"] for p in query.recentProgress)
        failure = query._jsq.exception()  # a Scala Option of the JVM's StreamingQueryException
        causes = cause_chain(failure.get()) if failure.isDefined() else []
        jvm: Any = spark._jvm
        hadoop_conf = spark._jsparkSession.sessionState().newHadoopConf()
        manager = jvm.io.sparkguard.spark.SparkguardCheckpointFileManager(
            jvm.org.apache.hadoop.fs.Path(checkpoint), hadoop_conf
        )
        result = {
            "lastBatch": max(batches) if batches else None,
            "mechanism": manager.mechanism(),
            "causes": causes,
        }
    finally:
        spark.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
