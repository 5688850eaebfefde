"""The Python writer's side of a cross-language owner race (see ``owner_race.py``).

    python owner_race_python.py CONF_JSON ROOT ROUNDS DELAY_MS NAME

The same rounds, files and output as ``owner_race.py``, but each round runs the sparkguard
writer's driver step (``SparkguardDataSource.writer``, what Spark's planner calls; no Spark
session is needed for it), then one task's file and the commit. CONF_JSON holds the
``spark.sparkguard.*`` keys (job id, owner).
"""

from __future__ import annotations

import json
import os
import sys
import time

import pyarrow as pa
from pyspark.sql.types import LongType, StructField, StructType

from sparkguard.spark_lib.base import errors
from sparkguard.spark_lib.spark import writer


def _wait_for(path: str) -> None:
    while not os.path.exists(path):
        time.sleep(0.0002)


def main() -> None:
    conf = json.loads(sys.argv[1])
    root, rounds, delay, name = sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
    schema = StructType([StructField("n", LongType())])
    results = {}
    for round_no in range(rounds):
        source = writer.source_class({**conf, "spark.sparkguard.jobId": "race"})
        with open(f"{root}/ready-{round_no}-{name}", "w"):
            pass
        _wait_for(f"{root}/go-{round_no}")
        if delay:
            time.sleep(delay / 1000)
        try:
            built = source(options={"path": f"{root}/t{round_no}"}).writer(schema, False)
        except errors.OwnerConflictError:
            results[round_no] = "refused"
            continue
        if not isinstance(built, writer.BatchWriter):  # the other driver committed write 0
            results[round_no] = "skipped"
            continue
        batch = pa.record_batch({"n": pa.array([round_no], pa.int64())})
        token = built.spec.settings.job_id
        files = writer.write_partition(built.spec, [batch], partition=0, attempt=0, token=token)
        built.commit([writer.WriteMessage(partition=0, attempt=0, task_attempt_id=0, files=files)])
        results[round_no] = "wrote"
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
