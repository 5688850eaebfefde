"""A small PySpark job for the bench's node (``test_spark_on_node.py``), run by upstream's
spark-operator in cluster mode: ``node_job.py OUT hang`` runs one task that never ends (its
executor stays busy until the test deletes the driver pod); ``node_job.py OUT write`` writes
100 rows in 2 tasks on the executors and commits them under OUT."""

from __future__ import annotations

import sys
import time

from pyspark.sql import SparkSession


def _hang(_: int) -> int:
    time.sleep(3600)
    return 0


def main(out: str, mode: str) -> None:
    spark = SparkSession.builder.appName(f"node-job-{mode}").getOrCreate()
    if mode == "hang":
        spark.sparkContext.parallelize([0], 1).map(_hang).collect()
    else:
        spark.range(100).repartition(2).write.mode("overwrite").parquet(f"{out}/rows")
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
