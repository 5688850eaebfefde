"""A plain PySpark job that creates a table, as users write them: it never imports sparkguard.

    python create_table.py CONF_JSON HOW LOCATION ROWS PARTITIONS

HOW is ``saveAsTable`` (``df.write.saveAsTable("orders")``: a new managed table under
LOCATION, the warehouse directory), ``ctas`` (``CREATE TABLE orders USING parquet AS SELECT
...``, same place) or ``parquet`` (``df.write.parquet(LOCATION)`` with the default mode
errorifexists). The rows are ``n`` = 0..ROWS-1 in PARTITIONS tasks. Reads the table back
(``spark.table`` or ``spark.read.parquet``) and prints one JSON line:
``{"rows": <rows read>, "ids": <distinct ids read>}``. CONF_JSON is a JSON object of Spark
conf (what ``sparkguard spark-conf --format json`` prints, plus storage settings).
"""

from __future__ import annotations

import json
import sys

from pyspark.sql import SparkSession


def main() -> None:
    conf = json.loads(sys.argv[1])
    how, location, rows, partitions = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    builder = SparkSession.builder.master("local[2]").appName("create-table")
    builder = builder.config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
    if how != "parquet":
        builder = builder.config("spark.sql.warehouse.dir", location)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:
        df = spark.range(0, rows, numPartitions=partitions).withColumnRenamed("id", "n")
        if how == "saveAsTable":
            df.write.saveAsTable("orders")
            back = spark.table("orders")
        elif how == "ctas":
            df.createOrReplaceTempView("source")
            spark.sql("CREATE TABLE orders USING parquet AS SELECT n FROM source")
            back = spark.table("orders")
        elif how == "parquet":
            df.write.parquet(location)
            back = spark.read.parquet(location)
        else:
            raise SystemExit(f"HOW={how!r}: use saveAsTable, ctas or parquet")
        result = {"rows": back.count(), "ids": back.select("n").distinct().count()}
    finally:
        spark.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
