"""Drive a CheckpointFileManager directly from PySpark (py4j), as Spark's metadata logs do.

    python checkpoint_files.py CONF_JSON BASE_URL [MANAGER]

MANAGER is ``sparkguard`` (default: ``io.sparkguard.spark.SparkguardCheckpointFileManager``) or
``default`` (whatever ``CheckpointFileManager.create`` picks without the conf). Runs the shared
vectors of the atomic file manager under BASE_URL (one sub-directory each; the names match the
Python tests in tests/spark_lib/test_filemanager.py) and prints one JSON line with what each
observed.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from pyspark.sql import SparkSession

MANAGER_CLASS = "io.sparkguard.spark.SparkguardCheckpointFileManager"


def main() -> None:
    conf = json.loads(sys.argv[1])
    base = sys.argv[2].rstrip("/")
    which = sys.argv[3] if len(sys.argv) > 3 else "sparkguard"
    builder = SparkSession.builder.master("local[1]").appName("checkpoint-files")
    builder = builder.config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:
        result = run_vectors(spark, base, which)
    finally:
        spark.stop()
    print(json.dumps(result))


def run_vectors(spark: SparkSession, base: str, which: str) -> dict[str, Any]:
    jvm = spark._jvm  # type: ignore[attr-defined]
    hadoop_conf = spark._jsc.hadoopConfiguration()  # type: ignore[union-attr]
    path = jvm.org.apache.hadoop.fs.Path
    if which == "sparkguard":
        manager = jvm.io.sparkguard.spark.SparkguardCheckpointFileManager(path(base), hadoop_conf)
        mechanism = manager.mechanism()
    else:
        factory = jvm.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager
        manager = factory.create(path(base), hadoop_conf)
        mechanism = manager.getClass().getName()

    def read(p: str) -> bytes:
        stream = manager.open(path(p))
        try:
            return bytes(jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
        finally:
            stream.close()

    def close_error(stream: Any) -> str | None:
        try:
            stream.close()
        except Exception as exc:  # py4j's Py4JJavaError
            java = getattr(exc, "java_exception", None)
            if java is None:
                raise
            stream.cancel()  # what HDFSMetadataLog does after a failed close
            return str(java.getClass().getName())
        return None

    def names(directory: str) -> list[str]:
        if not manager.exists(path(directory)):
            return []
        return sorted(str(s.getPath().getName()) for s in manager.list(path(directory)))

    result: dict[str, Any] = {"mechanism": mechanism}

    # test_publishes_only_on_close
    target = f"{base}/publish/0"
    stream = manager.createAtomic(path(target), False)
    stream.write(bytearray(b"hello world"))
    visible_before = bool(manager.exists(path(target)))
    stream.close()
    result["publishes_only_on_close"] = {
        "visible_before_close": visible_before,
        "content": read(target).decode(),
    }

    # test_cancel_leaves_nothing
    target = f"{base}/cancel/0"
    stream = manager.createAtomic(path(target), False)
    stream.write(bytearray(b"x" * 1000))
    stream.cancel()
    stream.cancel()
    result["cancel_leaves_nothing"] = {
        "exists": bool(manager.exists(path(target))),
        "names": names(f"{base}/cancel"),
    }

    # test_create_if_absent_refuses_existing
    target = f"{base}/once/0"
    first = manager.createAtomic(path(target), False)
    first.write(bytearray(b"first"))
    first.close()
    second = manager.createAtomic(path(target), False)
    second.write(bytearray(b"second"))
    result["create_if_absent_refuses_existing"] = {
        "error": close_error(second),
        "content": read(target).decode(),
        "names": names(f"{base}/once"),
    }

    # test_racing_creators_exactly_one_wins: every writer has its stream open and its bytes
    # written before the first one publishes (Spark's metadata-log race between two queries).
    target = f"{base}/race/0"
    streams = [manager.createAtomic(path(target), False) for _ in range(4)]
    for i, racing in enumerate(streams):
        racing.write(bytearray(f"writer-{i}".encode() * 100))
    errors = [close_error(racing) for racing in streams]
    result["racing_creators_exactly_one_wins"] = {
        "errors": errors,
        "content": read(target).decode(),
        "names": names(f"{base}/race"),
    }

    # test_overwrite_replaces
    target = f"{base}/replace/0"
    for payload in (b"old", b"new"):
        stream = manager.createAtomic(path(target), True)
        stream.write(bytearray(payload))
        stream.close()
    result["overwrite_replaces"] = {"content": read(target).decode()}
    return result


if __name__ == "__main__":
    main()
