"""Every check of one Spark version that needs no kill, in one driver (one JVM start).

    python matrix_job.py CONF_JSON WORK_DIR ROWS EXPECT [TABLES_JSON STORE_ROWS]

A PySpark job (only its Python-writer step imports sparkguard), run by
tests/compat/test_spark_matrix.py with that version's PySpark first on PYTHONPATH. CONF_JSON is
what ``sparkguard spark-conf --spark-version`` gives the version (for an unsupported one: the
conf of the newest line). It prints one JSON line of what it saw:

* ``version``: the running Spark;
* ``plain_read``: a CSV file written without Spark, read back with sparkguard's jar in
  ``spark.jars`` (every format lookup instantiates the jar's registered data source);
* EXPECT ``supported``: ``rerun`` (rows and distinct ids of ``WORK_DIR/table`` after the same
  append as the killed run, rerun once), ``stream`` (rows and distinct ids of a streaming
  query's file sink, the query stopped after its first input and restarted for the second),
  ``python_writer`` (rows read back after an append through sparkguard's Python writer, the
  job's one import of sparkguard); with TABLES_JSON (a store's name to a table URL on it,
  ``hdfs://`` or ``s3a://``, the store's conf in CONF_JSON), ``tables``: for each, the rows
  and distinct ids read back after the same unchanged append of STORE_ROWS rows;
* EXPECT ``refused``: ``write`` and ``front``, the first line naming sparkguard of the error
  that a parquet write under the conf and ``format("sparkguard")`` raised.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pyspark.sql import SparkSession


def _sparkguard_line(exc: BaseException) -> str:
    """The first line of ``exc`` (a Py4J error carries the JVM's) that names sparkguard."""
    lines = [line.strip() for line in str(exc).splitlines() if "sparkguard" in line.lower()]
    return lines[0] if lines else str(exc).splitlines()[0]


def _append(spark: SparkSession, table: str, rows: int) -> dict[str, int]:
    """The unchanged append of ``rows`` rows in 4 tasks, and the rows and distinct ids Spark
    reads back from ``table``."""
    spark.range(0, rows, numPartitions=4).withColumnRenamed("id", "n").write.mode("append").parquet(
        table
    )
    back = spark.read.parquet(table)
    return {"rows": back.count(), "ids": back.select("n").distinct().count()}


def _stream(spark: SparkSession, work: Path) -> dict[str, int]:
    source, sink, checkpoint = work / "in", work / "out", work / "checkpoint"
    source.mkdir()
    for batch in range(2):
        # One input file per run: the query sees the first, stops, and sees the second after
        # its restart.
        (source / f"{batch}.json").write_text(
            "".join(f'{{"n": {batch * 100 + i}}}\n' for i in range(100))
        )
        query = (
            spark.readStream.schema("n LONG")
            .json(str(source))
            .writeStream.format("parquet")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start(str(sink))
        )
        query.awaitTermination()
        query.stop()
    back = spark.read.parquet(str(sink))
    return {"rows": back.count(), "ids": back.select("n").distinct().count()}


def _python_writer(spark: SparkSession, work: Path, conf: dict[str, str]) -> int:
    """Rows read back after an append through the Python writer (``sparkguard-fsspec``: a
    Python data source, run in this release's Python workers)."""
    from sparkguard.spark_lib.spark import writer

    writer.register(spark, conf={"spark.sparkguard.jobId": conf["spark.sparkguard.jobId"] + "-py"})
    url = str(work / "python-table")
    spark.range(0, 1000, numPartitions=2).write.format(writer.FSSPEC_NAME).mode("append").save(url)
    return spark.read.parquet(url).count()


def main() -> None:
    conf = json.loads(sys.argv[1])
    work, rows, expect = Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    builder = SparkSession.builder.master("local[2]").appName("compat-matrix")
    builder = builder.config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    result: dict[str, object] = {"version": spark.version}
    try:
        csv = work / "plain.csv"
        csv.write_text("n\n1\n2\n3\n")
        result["plain_read"] = spark.read.option("header", "true").csv(str(csv)).count()
        table = str(work / "table")
        if expect == "supported":
            result["rerun"] = _append(spark, table, rows)
            if len(sys.argv) > 5:
                tables: dict[str, str] = json.loads(sys.argv[5])
                result["tables"] = {
                    name: _append(spark, url, int(sys.argv[6])) for name, url in tables.items()
                }
            result["stream"] = _stream(spark, work)
            result["python_writer"] = _python_writer(spark, work, conf)
        else:
            for name, write in (
                ("write", lambda: spark.range(3).write.parquet(table)),
                ("front", lambda: spark.range(3).write.format("sparkguard").save(table + "2")),
            ):
                try:
                    write()
                    result[name] = "written"
                except Exception as exc:  # the refusal is what is checked
                    result[name] = _sparkguard_line(exc)
    finally:
        spark.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
