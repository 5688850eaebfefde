"""Where a Spark driver keeps its temp files: a plain PySpark job, as the tests' drivers run.

    python temp_dirs.py CONF_JSON OUTPUT_DIR

Runs a shuffle (Spark's shuffle codec, lz4-java, unpacks its native library) and writes the
result as Parquet (snappy-java, Parquet's default codec, unpacks its own), then prints one JSON
line: ``tmpdir`` (the JVM's ``java.io.tmpdir``), ``sparkFiles`` (the driver's SparkFiles
root, made under Spark's first local directory, where its block manager's directories go too)
and ``nativeLibs`` (the files of the two codecs' native libraries the JVM has mapped, from
``/proc/<pid>/maps``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pyspark import SparkFiles
from pyspark.sql import SparkSession


def main() -> None:
    conf = json.loads(sys.argv[1])
    builder = SparkSession.builder.master("local[2]").appName("temp-dirs")
    builder = builder.config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:
        counts = spark.range(0, 1000, numPartitions=2).selectExpr("id % 7 AS k").groupBy("k")
        counts.count().write.parquet(sys.argv[2])
        jvm = spark._jvm  # type: ignore[attr-defined]
        pid = jvm.java.lang.ProcessHandle.current().pid()
        mapped = Path(f"/proc/{pid}/maps").read_text().splitlines()
        libs = {line.split()[-1] for line in mapped if "lz4" in line or "snappy" in line}
        result = {
            "tmpdir": jvm.System.getProperty("java.io.tmpdir"),
            "sparkFiles": SparkFiles.getRootDirectory(),
            "nativeLibs": sorted(lib for lib in libs if lib.startswith("/")),
        }
    finally:
        spark.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
