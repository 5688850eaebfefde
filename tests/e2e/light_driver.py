"""The stand-in's light driver (``job="light"``): sparkguard's Python writer without a Spark JVM.

    python light_driver.py driver CONF_JSON TABLE ROWS PARTITIONS RUN_DIR KILL_POINT EXECUTOR_DELAY
    python light_driver.py executor RUN_DIR PARTITION ROWS PARTITIONS
    python light_driver.py stream CONF_JSON TABLE ROWS PARTITIONS RUN_DIR KILL_POINT DELAY BATCHES

The driver runs the steps Spark would run for ``df.write.format("sparkguard").save(TABLE)``,
like ``tests/jvm/jobs/owner_race_python.py``: the writer's driver step (``writer.source_class
(conf)(...).writer(schema, False)``: the rollback of this owner's leftovers, the inflight instant,
the journal), then the tasks' files, then the commit. CONF_JSON holds the app's injected
``spark.sparkguard.*`` settings (job id, owner, attempt, journal, markers). The rows are ids
``0..ROWS-1`` split into PARTITIONS contiguous ranges, so every run writes the same files.

Tasks: partitions 0..P-2 are written by the driver process itself; the last partition by an
*executor* process the stand-in starts at the driver's request, outside the driver pod's
namespaces (a pod of its own: killing the driver pod does not kill it). The executor waits
EXECUTOR_DELAY seconds before it writes, so when the driver dies it is still writing: a
lingering executor, which keeps going until the stand-in's garbage collection stops it (see
``StandInSparkOperator.executor_linger_s``). It hands its files to the driver through
``RUN_DIR/executor-<p>.json``; a driver that is gone never reads them. What it
did (and when) goes to ``RUN_DIR/executor-<p>.log``.

``stream``: a streaming query's driver, as a query restarted from its checkpoint behaves:
micro-batches 0..BATCHES-1, each one write (ROWS rows: ids ``b*ROWS .. (b+1)*ROWS-1``, every
partition written by the driver), numbered per driver run (one SparkContext per pod: the write
counters live in RUN_DIR), so a restarted driver replays the batches from 0 and skips the ones
committed (``rerun=skip``). With KILL_POINT ``mid-write`` it stalls in the middle of the second
batch it writes itself (after committing one), to be killed there.

KILL_POINT (``none``, ``before-files``, ``mid-write``, ``after-commit``): the driver creates
``RUN_DIR/at-<point>`` there and stalls until it is killed (the file-flag stall of
``tests/jvm/jobs/stream_foreach_batch.py``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

KILL_POINTS = ("none", "before-files", "mid-write", "after-commit")


def _stall(run_dir: Path, point: str, kill_point: str) -> None:
    if point != kill_point:
        return
    (run_dir / f"at-{point}").touch()
    while True:  # until the stand-in kills this driver
        time.sleep(1)


def _batch(partition: int, rows: int, partitions: int, *, offset: int = 0) -> object:
    import pyarrow as pa

    per = -(-rows // partitions)
    ids = [offset + i for i in range(partition * per, min(rows, (partition + 1) * per))]
    return pa.record_batch({"id": pa.array(ids, pa.int64())})


def _request_executor(run_dir: Path, argv: list[str]) -> None:
    """Ask for an executor pod: ``RUN_DIR/executor-requests/<n>.json`` holds its command line
    (written whole: a temp name renamed); the stand-in starts it (``StandInSparkOperator``'s
    ``_start_executors``) and records its pid under ``RUN_DIR/executors/``."""
    requests = run_dir / "executor-requests"
    requests.mkdir(exist_ok=True)
    tmp = requests / f".{os.getpid()}.tmp"
    tmp.write_text(json.dumps(argv))
    os.replace(tmp, requests / f"{time.monotonic_ns()}.json")


def _executor_done(run_dir: Path, partition: int, result: Path, timeout: float = 120) -> bool:
    """Wait for the executor's files (True) or its failure (False)."""
    trail = run_dir / f"executor-{partition}.log"
    deadline = time.monotonic() + timeout
    while not result.exists():
        if time.monotonic() > deadline or (trail.exists() and " failed: " in trail.read_text()):
            return False
        time.sleep(0.02)
    return True


def _driver(argv: list[str]) -> int:
    from pyspark import cloudpickle
    from pyspark.sql.types import LongType, StructField, StructType

    from sparkguard.spark_lib.spark import writer
    from sparkguard.spark_lib.storage import timeline

    conf = json.loads(argv[0])
    table, rows, partitions = argv[1], int(argv[2]), int(argv[3])
    run_dir, kill_point, delay = Path(argv[4]), argv[5], float(argv[6])
    if kill_point not in KILL_POINTS:
        raise SystemExit(f"kill point {kill_point!r}: use one of {', '.join(KILL_POINTS)}")
    schema = StructType([StructField("id", LongType())])
    built = writer.source_class(conf)(options={"path": table}).writer(schema, False)
    if not isinstance(built, writer.BatchWriter):  # write 0 already committed (rerun=skip)
        print("light driver: already committed", flush=True)
        return 0
    # The last partition's task runs in an executor: its own session, as a pod of its own.
    last = partitions - 1
    (run_dir / "writer.pickle").write_bytes(cloudpickle.dumps(built.spec))  # type: ignore[no-untyped-call]
    # As Spark's driver asks the API server for executor pods: the stand-in starts the process
    # outside this pod (its own namespaces; this pod's death does not end it).
    _request_executor(run_dir, [
        sys.executable, __file__, "executor", str(run_dir), str(last), str(rows),
        str(partitions), str(delay),
    ])  # fmt: skip
    _stall(run_dir, "before-files", kill_point)
    messages: list[Any] = []
    for partition in range(last):
        files = writer.write_partition(
            built.spec, [_batch(partition, rows, partitions)], partition=partition, attempt=0,
            token=built.spec.settings.job_id,
        )  # fmt: skip
        messages.append(
            writer.WriteMessage(partition=partition, attempt=0, task_attempt_id=partition,
                                files=files)
        )  # fmt: skip
        _stall(run_dir, "mid-write", kill_point)
    result = run_dir / f"executor-{last}.json"
    if not _executor_done(run_dir, last, result):
        built.abort(messages)
        print("light driver: the executor failed; write aborted", flush=True)
        return 1
    files = tuple(
        timeline.DataFile.from_json(f, source=str(result)) for f in json.loads(result.read_text())
    )
    messages.append(
        writer.WriteMessage(partition=last, attempt=0, task_attempt_id=last, files=files)
    )
    built.commit(list(messages))
    _stall(run_dir, "after-commit", kill_point)
    print("light driver: committed", flush=True)
    return 0


def _stream(argv: list[str]) -> int:
    from pyspark.sql.types import LongType, StructField, StructType

    from sparkguard.spark_lib.spark import writer

    conf = json.loads(argv[0])
    table, rows, partitions = argv[1], int(argv[2]), int(argv[3])
    run_dir, kill_point, batches = Path(argv[4]), argv[5], int(argv[7])
    # This driver run's write counters (a SparkContext's files directory, per pod)
    counters = str(run_dir / writer.WRITE_COUNTS_DIR)
    writer.driver_run_dir = lambda: counters  # type: ignore[assignment]
    schema = StructType([StructField("id", LongType())])
    written = 0
    for batch in range(batches):
        built = writer.source_class(conf)(options={"path": table}).writer(schema, False)
        if not isinstance(built, writer.BatchWriter):
            print(f"light stream: batch {batch} already committed", flush=True)
            continue
        messages: list[Any] = []
        for partition in range(partitions):
            rows_of = _batch(partition, rows, partitions, offset=batch * rows)
            files = writer.write_partition(
                built.spec, [rows_of], partition=partition, attempt=0, token=built.token
            )
            messages.append(
                writer.WriteMessage(partition=partition, attempt=0, task_attempt_id=partition,
                                    files=files)
            )  # fmt: skip
            if written >= 1:
                _stall(run_dir, "mid-write", kill_point)
        built.commit(messages)
        written += 1
        print(f"light stream: batch {batch} committed", flush=True)
    return 0


def _executor(argv: list[str]) -> int:
    from pyspark import cloudpickle

    from sparkguard.spark_lib.spark import writer

    # SIGTERM (the pod's deletion) ends the task like an exception: an open file is cancelled.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    run_dir, partition = Path(argv[0]), int(argv[1])
    rows, partitions, delay = int(argv[2]), int(argv[3]), float(argv[4])
    spec = cloudpickle.loads((run_dir / "writer.pickle").read_bytes())
    trail = run_dir / f"executor-{partition}.log"
    time.sleep(delay)
    try:
        files = writer.write_partition(
            spec, [_batch(partition, rows, partitions)], partition=partition, attempt=0,
            token=spec.settings.job_id,
        )  # fmt: skip
    except BaseException as exc:  # SystemExit too: stopped by GC (SIGTERM) before it wrote
        trail.write_text(f"{time.time():.3f} failed: {exc!r}\n")
        raise
    trail.write_text(f"{time.time():.3f} wrote {[f.path for f in files]}\n")
    tmp = run_dir / f".executor-{partition}.json"
    # with each file's temp name or upload id: the driver publishes them after the outcome
    tmp.write_text(json.dumps([f.to_outcome_json() for f in files]))
    os.replace(tmp, run_dir / f"executor-{partition}.json")
    return 0


if __name__ == "__main__":
    mode, rest = sys.argv[1], sys.argv[2:]
    programs = {"driver": _driver, "stream": _stream, "executor": _executor}
    raise SystemExit(programs[mode](rest))
