"""One of two drivers racing to open a write of one job id on one table (O4a, the JVM protocol).

    python owner_race.py CONF_JSON ROOT ROUNDS DELAYS_MS NAME

CONF_JSON is a JSON object of Spark conf (sparkguard's jar in ``spark.jars``, the job id and
this driver's owner in ``spark.sparkguard.*``). DELAYS_MS is one delay, or several separated by
commas that the rounds take in turn. For each round r the driver writes ``ROOT/ready-r-NAME``,
waits for ``ROOT/go-r`` (the test creates it once both drivers are ready), sleeps its delay,
then runs the protocol's driver steps on table ``ROOT/t<r>`` exactly as
Spark's file writer calls them: ``setupJob`` (W1, W2, the owner confirmation), then, unless it
refused or skipped, ``commitJob`` (no task wrote a file). Calling them directly keeps the two
drivers' ``setupJob`` within a millisecond of each other, which a whole ``df.write`` (query
planning first) would not. Prints one JSON line: ``{"r": "wrote" | "refused" | "skipped"}``.
"""

from __future__ import annotations

import json
import os
import sys
import time

from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession


def _wait_for(path: str) -> None:
    while not os.path.exists(path):
        time.sleep(0.0002)


def main() -> None:
    conf = json.loads(sys.argv[1])
    root, rounds, name = sys.argv[2], int(sys.argv[3]), sys.argv[5]
    delays = [float(d) for d in sys.argv[4].split(",")]
    builder = SparkSession.builder.master("local[1]").appName(f"owner-race-{name}")
    builder = builder.config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    empty = jvm.org.apache.spark.api.python.PythonUtils.toSeq(jvm.java.util.ArrayList())
    results = {}
    for round_no in range(rounds):
        table = f"{root}/t{round_no}"
        protocol = jvm.io.sparkguard.spark.SparkguardCommitProtocol(
            f"race-{round_no}", table, False
        )
        with open(f"{root}/ready-{round_no}-{name}", "w"):
            pass
        _wait_for(f"{root}/go-{round_no}")
        delay = delays[round_no % len(delays)]
        if delay:
            time.sleep(delay / 1000)
        try:
            protocol.setupJob(None)
        except Py4JJavaError as exc:
            if "OwnerConflictException" not in exc.java_exception.getClass().getName():
                raise
            results[round_no] = "refused"
            continue
        if protocol.instant() is None:  # the other driver committed write 0 first: rerun=skip
            results[round_no] = "skipped"
            continue
        protocol.commitJob(None, empty)
        results[round_no] = "wrote"
    print(json.dumps(results), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
