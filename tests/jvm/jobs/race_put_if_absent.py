"""Racing put-if-absent through the JVM store, in one Spark driver (JVM threads via py4j).

    python race_put_if_absent.py CONF_JSON FILE_URL RACERS

Opens sparkguard's ``AtomicStore`` for FILE_URL (an object store: the conditional-PUT store)
with the session's Hadoop conf, then RACERS threads call ``putIfAbsent(FILE_URL, "racer-<i>")``
at the same moment. Prints one JSON line: ``{"winners": [<i>, ...], "content": <the file>}``.
"""

from __future__ import annotations

import json
import sys
import threading

from pyspark.sql import SparkSession


def main() -> None:
    conf = json.loads(sys.argv[1])
    url, racers = sys.argv[2], int(sys.argv[3])
    builder = SparkSession.builder.master("local[1]").appName("race-put-if-absent")
    builder = builder.config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        path = jvm.org.apache.hadoop.fs.Path(url)
        hadoop_conf = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]
        store = jvm.io.sparkguard.spark.store.AtomicStore.forTable(path, hadoop_conf)
        start = threading.Barrier(racers)
        won: list[int] = []
        lock = threading.Lock()

        def race(i: int) -> None:
            start.wait()
            if store.putIfAbsent(path, f"racer-{i}".encode()):
                with lock:
                    won.append(i)

        threads = [threading.Thread(target=race, args=(i,)) for i in range(racers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        content = bytes(store.read(path)).decode()
        result = {"winners": sorted(won), "content": content, "store": store.getClass().getName()}
    finally:
        spark.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
