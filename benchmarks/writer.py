"""Throughput of the sparkguard writer against Spark's built-in parquet writer, same run.

    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/writer.py [--quick] [--rows N] [--rounds R]
        [--repeats K] [--warm-ups W] [--partitions P] [--fsspec] [--arrow-batch ROWS]
        [--fsync-bare]
    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/writer.py --row-groups [--quick]

The same cached DataFrame (int, long, double and string columns) is written with
``df.write.parquet`` and with ``df.write.format("sparkguard")`` in a session that has
sparkguard's jar on its classpath (``spark.jars``, nothing else): the path users get, the JVM
front (Spark's parquet writer through sparkguard's commit protocol, chosen for that write only;
docs/writer.md, "Which path writes"). ``--fsspec`` adds the Python writer
(``format("sparkguard-fsspec")``) and a bare PySpark Arrow data source (one parquet file per
task, written straight to its final name: no markers, no atomic publication, no fsync, no
timeline), what any Python writer pays. Every writer first writes W times untimed at the largest
size (``--warm-ups``, 3 by default: the JIT settles after five to eight writes of 8M rows, and
the writers share Spark's parquet code, so it settles for all of them), then R >= 3 timed rounds
run. In a round, each size is written K times by every writer (``--repeats``, 2 by default),
the writers alternating write by write, their order rotated each round so that every writer goes
first, second and last; the best of the R x K writes of each writer at each size is compared.

Each round writes three sizes (``--rows`` N, N/2 and N/4: 8M, 4M and 2M rows by default;
``--quick``: 1M, 500k and 250k, the same procedure on less data). A write costs a fixed part
(job planning, commit) plus a part per row, and the writers differ in both, so a ratio at one
size depends on the size. The headline ratio is therefore the *marginal* one: built-in seconds
per extra row over sparkguard's, each the least-squares slope through the writer's best time
at each size; the ratio at each size is printed too. The sizes span 6M rows because on this
kind of machine a write's time varies by 10-20 % from one round to the next: with the 1M/2M
pair used before, the two best times of a writer differed by 0.15-0.2 s, about the noise, and
ten runs of the same code printed marginal ratios from 0.45 to 4.97 (docs/benchmarks.md).

``--arrow-batch`` sets ``spark.sql.execution.arrow.maxRecordsPerBatch`` (Spark's default is
10,000; it matters to the Python writers only); ``--fsync-bare`` (with ``--fsspec``) adds the
bare source with an fsync of each file it writes (what durable publication costs by itself).
The jar must be built (``scripts/build-jvm.sh``). ``--row-groups`` is a pyarrow-only mode: the
same rows written as parquet with 128k-row and with 1Mi-row groups (file size and time, best of
3).

Last line: ``writer: sparkguard/builtin throughput = <r> (marginal, per extra row)``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

sys.path.append(os.path.dirname(os.path.abspath(__file__)))  # _common, beside this file
os.environ.setdefault("PYTHONSAFEPATH", "1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from _common import log, rotated

KINDS = ("builtin", "sparkguard")
FSSPEC_KINDS = ("python-source", "sparkguard-fsspec")
FSYNC_KIND = "python-source+fsync"


def bare_source(*, fsync: bool) -> type[Any]:
    """A minimal Arrow data source: what any Python writer pays, with no guarantees at all."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    class BareWriter(DataSourceArrowWriter):
        def __init__(self, path: str) -> None:
            self.path = path

        def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
            from pyspark import TaskContext

            context = TaskContext.get()
            partition = context.partitionId() if context else 0
            os.makedirs(self.path, exist_ok=True)
            table = pa.Table.from_batches(list(iterator))
            target = f"{self.path}/part-{partition:05d}.parquet"
            pq.write_table(table, target)
            if fsync:
                descriptor = os.open(target, os.O_RDONLY)
                try:
                    os.fsync(descriptor)
                finally:
                    os.close(descriptor)
            return WriterCommitMessage()

        def commit(self, messages: list[WriterCommitMessage | None]) -> None:
            """Nothing to publish."""

        def abort(self, messages: list[WriterCommitMessage | None]) -> None:
            """Nothing to clean (the bare writer leaves whatever it wrote)."""

    class BareSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench_bare_fsync" if fsync else "bench_bare"

        def writer(self, schema: Any, overwrite: bool) -> BareWriter:
            return BareWriter(str(self.options["path"]))

    return BareSource


def row_groups(rows: int) -> int:
    """pyarrow only: the same rows with 128k-row vs 1Mi-row groups (size and time)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    ids = pa.array(range(rows), type=pa.int64())
    table = pa.table(
        {
            "id": ids,
            "a": pa.array([i % 1000 for i in range(rows)], type=pa.int32()),
            "d": pc.multiply(pc.cast(ids, pa.float64()), 1.5),
            "s": pa.array([f"name-{i % 50000}" for i in range(rows)]),
        }
    )
    results: dict[int, tuple[float, int]] = {}
    with tempfile.TemporaryDirectory(prefix="sg-bench-rowgroups-") as base:
        sizes = (128 * 1024, 1024 * 1024)
        for n in range(4):  # round 0 is the untimed warm-up
            for group in rotated(sizes, n):
                target = f"{base}/g{group}.parquet"
                started = time.perf_counter()
                pq.write_table(table, target, row_group_size=group)
                elapsed = time.perf_counter() - started
                size = os.path.getsize(target)
                if n:
                    best = results.get(group, (float("inf"), size))[0]
                    results[group] = (min(best, elapsed), size)
                    log(
                        f"round {n} row group {group:8d} rows: {elapsed:6.2f}s "
                        f"{size / 2**20:7.1f} MiB"
                    )
    (small_t, small_s), (big_t, big_s) = results[sizes[0]], results[sizes[1]]
    print(f"rows={rows}: 128k-row groups {small_t:.2f}s {small_s / 2**20:.1f} MiB; "
          f"1Mi-row groups {big_t:.2f}s {big_s / 2**20:.1f} MiB")  # fmt: skip
    print(f"row groups: 128k/1Mi size = {small_s / big_s:.2f}, time = {small_t / big_t:.2f}")
    return 0


def require_jvm_front(spark: Any) -> None:
    """Stop unless ``format("sparkguard")`` is the JVM front in ``spark``."""
    from sparkguard.spark_lib.spark import writer

    if not writer.jvm_front_available(spark):
        raise SystemExit(
            "benchmarks/writer.py: sparkguard's jar is not on the classpath; run "
            "scripts/build-jvm.sh"
        )


def slope(points: list[tuple[int, float]]) -> float:
    """Least-squares seconds per row through ``(rows, seconds)`` points (pure)."""
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    if spread == 0:
        raise ValueError("slope: the points need at least two different sizes")
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread


def writers_of(*, fsspec: bool, fsync_bare: bool) -> tuple[str, ...]:
    """The writers a run compares (pure)."""
    if not fsspec:
        return KINDS
    return (*KINDS, *FSSPEC_KINDS, *((FSYNC_KIND,) if fsync_bare else ()))


def parse_args() -> argparse.Namespace:
    """The command line, checked: a bad flag ends the run before Spark starts, naming it."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="250k, 500k and 1M rows (same procedure)"
    )
    parser.add_argument("--rows", type=int, default=8_000_000, help="the largest size")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds, at least 3")
    parser.add_argument("--repeats", type=int, default=2, help="writes of each size per round")
    parser.add_argument("--warm-ups", type=int, default=3, help="untimed writes per writer")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument(
        "--arrow-batch", type=int, default=0, help="maxRecordsPerBatch (0: Spark's)"
    )
    parser.add_argument(
        "--fsspec", action="store_true", help="add the Python writer and the bare source"
    )
    parser.add_argument("--fsync-bare", action="store_true", help="add the bare source + fsync")
    parser.add_argument("--row-groups", action="store_true", help="pyarrow row-group mode only")
    args = parser.parse_args()
    if args.rounds < 3:
        parser.error(f"--rounds {args.rounds}: use at least 3 (best of >= 3 rotated rounds)")
    if args.repeats < 1 or args.warm_ups < 1:
        parser.error(f"--repeats {args.repeats} --warm-ups {args.warm_ups}: use at least 1 of each")
    if args.fsync_bare and not args.fsspec:
        parser.error("--fsync-bare needs --fsspec (it is the bare Python source plus fsync)")
    return args


def main() -> int:
    args = parse_args()
    large = 1_000_000 if args.quick else args.rows
    sizes = (large // 4, large // 2, large)
    if args.row_groups:
        return row_groups(large)
    kinds = writers_of(fsspec=args.fsspec, fsync_bare=args.fsync_bare)

    from pyspark.sql import SparkSession

    from sparkguard.spark_lib.spark import sparkconf, writer

    builder = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.memory", "4g")  # 14M cached rows
        .config(sparkconf.JARS_KEY, str(sparkconf.jar_path()))  # format("sparkguard"): the JVM
    )
    if args.arrow_batch:
        builder = builder.config("spark.sql.execution.arrow.maxRecordsPerBatch", args.arrow_batch)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    base = tempfile.mkdtemp(prefix="sg-bench-writer-")
    require_jvm_front(spark)
    writer.register(spark, conf={"spark.sparkguard.journal": f"{base}/journal"})
    spark.dataSource.register(bare_source(fsync=False))
    spark.dataSource.register(bare_source(fsync=True))
    frames = {}
    for rows in sizes:
        frames[rows] = spark.range(0, rows, numPartitions=args.partitions).selectExpr(
            "id",
            "cast(id % 1000 as int) as a",
            "cast(id as double) * 1.5 as d",
            "concat('name-', cast(id % 50000 as string)) as s",
        )
        frames[rows].cache().count()
    print(
        f"rows={', '.join(str(r) for r in sizes)} partitions={args.partitions} "
        f"rounds={args.rounds} repeats={args.repeats} (+{args.warm_ups} untimed warm-ups) "
        f"arrow-batch={args.arrow_batch or 'default'} dir={base}",
        flush=True,
    )

    def write(kind: str, rows: int, target: str, job: str) -> float:
        df = frames[rows]
        started = time.perf_counter()
        if kind == "builtin":
            df.write.mode("append").parquet(target)
        elif kind == "python-source":
            df.write.format("bench_bare").mode("append").save(target)
        elif kind == FSYNC_KIND:
            df.write.format("bench_bare_fsync").mode("append").save(target)
        elif kind == "sparkguard-fsspec":
            df.write.format(writer.FSSPEC_NAME).mode("append").option("jobId", job).save(target)
        else:
            df.write.format("sparkguard").mode("append").option("jobId", job).option(
                "journal", f"{base}/journal"
            ).save(target)
        elapsed = time.perf_counter() - started
        shutil.rmtree(target, ignore_errors=True)
        return elapsed

    for w in range(args.warm_ups):
        for kind in rotated(kinds, w):
            elapsed = write(kind, large, f"{base}/warm-{kind}-{w}", f"bench-warm-{w}")
            log(f"warm-up {w} {kind:17s} {elapsed:7.2f}s (untimed)")
    times: dict[tuple[str, int], list[float]] = {(k, r): [] for k in kinds for r in sizes}
    for n in range(args.rounds):
        for rows in sizes:
            for k in range(args.repeats):
                for kind in rotated(kinds, n + k):
                    job = f"bench-{rows}-{n}-{k}"
                    elapsed = write(kind, rows, f"{base}/{kind}-{rows}-{n}-{k}", job)
                    times[kind, rows].append(elapsed)
                    log(
                        f"round {n} {kind:19s} {rows:8d} rows {elapsed:7.2f}s  "
                        f"{rows / elapsed / 1e6:6.2f} M rows/s"
                    )
    spark.stop()
    shutil.rmtree(base, ignore_errors=True)
    best = {key: min(values) for key, values in times.items()}

    def marginal(kind: str) -> float:
        """Seconds per extra row: the cost of throughput, without the per-write fixed cost."""
        return slope([(rows, best[kind, rows]) for rows in sizes])

    for rows in sizes:
        print(f"best at {rows} rows: " + ", ".join(f"{k} {best[k, rows]:.2f}s" for k in kinds))
        per_round = [
            b / g for b, g in zip(times["builtin", rows], times["sparkguard", rows], strict=True)
        ]
        print(
            f"  sparkguard/builtin throughput at {rows} rows: "
            f"{best['builtin', rows] / best['sparkguard', rows]:.2f} (per pair of writes: "
            + ", ".join(f"{r:.2f}" for r in per_round)
            + ")"
        )
    if FSYNC_KIND in kinds:
        extra = best[FSYNC_KIND, large] - best["python-source", large]
        print(f"fsync of each file: +{extra:.2f}s on the bare source at {large} rows")
    if args.fsspec:
        print(
            "marginal (per extra row) throughput: "
            f"python-source/builtin = {marginal('builtin') / marginal('python-source'):.2f}, "
            f"sparkguard-fsspec/builtin = "
            f"{marginal('builtin') / marginal('sparkguard-fsspec'):.2f}"
        )
    ratio = marginal("builtin") / marginal("sparkguard")
    print(f"writer: sparkguard/builtin throughput = {ratio:.2f} (marginal, per extra row)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
