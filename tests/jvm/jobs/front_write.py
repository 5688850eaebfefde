"""``df.write.format("sparkguard")`` with sparkguard's jar on the classpath: the JVM front.

    python front_write.py CONF_JSON BASE_DIR

Registers the fsspec writer (``writer.register``), then writes, under BASE_DIR:
``table`` through ``format("sparkguard")`` (a local path: the JVM path) twice, the second time
as a rerun (``new_driver_run``: skipped); ``fsspec`` through ``format("sparkguard")`` with a
``local://`` URL (no Hadoop FileSystem: handed to the fsspec writer); ``stream`` through
``writeStream.format("sparkguard")`` (the Python streaming sink) from the JSON files in
``BASE_DIR/in``; ``plain`` with ``df.write.parquet`` (Spark's own protocol: the session conf was
not changed). Prints one JSON line with what it saw.
"""

from __future__ import annotations

import json
import os
import sys

from pyspark.sql import SparkSession

from sparkguard.spark_lib.spark import writer


def main() -> None:
    conf = json.loads(sys.argv[1])
    base = sys.argv[2]
    os.environ["PYSPARK_PYTHON"] = sys.executable  # the fsspec writer's workers: this interpreter
    builder = SparkSession.builder.master("local[2]").appName("front-write")
    builder = builder.config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:
        registered = writer.register(spark).name()
        df = spark.range(0, 1000, numPartitions=4).withColumnRenamed("id", "n")
        for _ in range(2):
            writer.new_driver_run(spark)
            df.write.format("sparkguard").mode("append").option("jobId", "front-py").option(
                "journal", f"{base}/journal"
            ).save(f"{base}/table")
        df.write.format("sparkguard").mode("append").option("jobId", "front-py").save(
            f"local://{base}/fsspec"
        )
        query = (
            spark.readStream.schema("id long")
            .json(f"{base}/in")
            .writeStream.format("sparkguard")
            .option("path", f"{base}/stream")
            .option("jobId", "front-stream")
            .option("checkpointLocation", f"{base}/ckpt")
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        df.write.parquet(f"{base}/plain")
        protocol = spark.conf.get("spark.sql.sources.commitProtocolClass", None)
        result = {"registered": registered, "sessionProtocol": protocol}
    finally:
        spark.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
