"""Storage requests of a reader, a write and a rollback as a table's history grows.

    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/timeline.py [--quick] [--sizes 100,10000]
        [--no-s3] [--latency-ms 20]

For each size (instants of history) a table is built with the timeline API directly (no
Spark): appends by ten jobs, an overwrite every 250 instants, a rolled-back instant every 50
(decided 30 days ago: older than the late-file retention), with automatic compaction as
shipped (``spark.sparkguard.timeline.snapshotEvery`` = 10, after each commit). Then, counting
storage requests:

* reader: ``reader.committed_files`` of the table;
* write: one more batch write of a job with history, through the Python writer's driver
  steps (W1 guard, rerun lookup, ``.inflight``, owner confirmation, the commit's keep set and
  late-file sweep, the outcome, the automatic compaction check);
* rollback: ``rollback_table`` of a job with history (one of the ten) whose latest instant
  failed (inflight, a marker, a file).

On local disk requests are counted as file-manager operations (outermost calls); on the S3
server behind ``benchmarks/_s3proxy.py`` (20 ms a request) as HTTP requests the proxy saw. The
S3 tables are the local ones, copied to the server (10,000 instants through a 20 ms
proxy would take minutes and measure nothing). ``--quick`` runs each measurement once (the
counts are deterministic); without it each is run three times and the largest kept. The last
line: ``timeline: reader requests at 10000/100 instants = <a>x, write requests at 10000/100 =
<b>x, rollback requests at 10000/100 = <c>x`` (the S3 figures when S3 ran, else local disk).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.append(os.path.dirname(os.path.abspath(__file__)))  # _common, beside this file
os.environ.setdefault("PYTHONSAFEPATH", "1")

from _common import log, proxied_s3

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import formats, paths
from sparkguard.spark_lib.spark import config, writer
from sparkguard.spark_lib.storage import markers, reader, rollback, snapshots, timeline

JOBS = 10
#: spark.sparkguard.timeline.snapshotEvery for the build and the measured write (--snapshot-every)
SNAPSHOT_EVERY = {"value": 10}
OVERWRITE_EVERY = 250
ROLLBACK_EVERY = 50
COUNTED = (
    "list",
    "list_files",
    "read_bytes",
    "exists",
    "put_if_absent",
    "write_bytes",
    "delete",
    "delete_many",
    "existing_files",
    "delete_existing",
    "find_leftovers",
    "remove_leftovers",
    "delete_if_unchanged",
    "mkdirs",
    "open",
    "create_atomic",
)


class Counter:
    """Counts outermost file-manager operations (local disk's 'requests')."""

    def __init__(self) -> None:
        self.count = 0
        self.depth = threading.local()

    def wrap(self, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def counted(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(self.depth, "n", 0)
            if depth == 0:
                self.count += 1
            self.depth.n = depth + 1
            try:
                return method(*args, **kwargs)
            finally:
                self.depth.n = depth

        return counted


@contextlib.contextmanager
def counting() -> Iterator[Counter]:
    """Count file-manager operations of every manager while inside."""
    counter = Counter()
    saved: list[tuple[type, str, Any]] = []
    classes = (
        filemanager.FileManager,
        filemanager.RenameFileManager,
        filemanager.DirectPutFileManager,
        filemanager.MemoryFileManager,
    )
    for cls in classes:
        for name in COUNTED:
            if name in cls.__dict__:
                saved.append((cls, name, cls.__dict__[name]))
                setattr(cls, name, counter.wrap(cls.__dict__[name]))
    try:
        yield counter
    finally:
        for cls, name, original in saved:
            setattr(cls, name, original)


def build(url: str, instants: int) -> None:
    """``instants`` instants of history with compaction as shipped (setup, not measured)."""
    manager, table = filemanager.resolve(url)
    tl = timeline.Timeline(manager, table)
    settings = config.parse_settings(conf=_conf("job-0"))
    old = (datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=30)).isoformat()
    writes = [0] * JOBS
    for i in range(instants):
        job = f"job-{i % JOBS}"
        if i % ROLLBACK_EVERY == ROLLBACK_EVERY - 1:
            instant = tl.start(job, attempt=0, marker_type="DIRECT", write=writes[i % JOBS])
            tl.claim_rollback(instant)
            name = f"part-00000-{job}-w{writes[i % JOBS]:03d}-c000.parquet"
            tl.record_rolled_back(instant, {"marked": [name], "complete": True})
            # record_rolled_back stamps "finished" now: make this one old (30 days).
            path = paths.join(tl.directory, instant + ".rolledback")
            doc = formats.decode(
                manager.read_bytes(path),
                kind=timeline.ROLLEDBACK_KIND,
                versions=frozenset({1}),
                source=path,
            )
            doc["finished"] = old
            body = {k: v for k, v in doc.items() if k not in ("kind", "version")}
            data = formats.encode(timeline.ROLLEDBACK_KIND, 1, body)
            manager.write_bytes(path, data, overwrite=True)
        else:
            operation = "overwrite" if i % OVERWRITE_EVERY == OVERWRITE_EVERY // 2 else "append"
            write = writes[i % JOBS]
            writes[i % JOBS] += 1
            instant = tl.start(
                job, attempt=0, marker_type="DIRECT", operation=operation, write=write
            )
            rel = f"d={i % 7}/part-00000-{job}-w{write:03d}-c000.parquet"
            tl.commit(
                instant,
                [timeline.DataFile(rel, 1000, 10)],
                extra={
                    "operation": operation,
                    "format": "parquet",
                    "committedAt": reader.now_key(),
                },
                write=write,
            )
        writer.maybe_compact(manager, table, settings)


def measure_reader(url: str, options: dict[str, Any]) -> int:
    return len(reader.committed_files(url, storage_options=options))


def measure_write(url: str, options: dict[str, Any]) -> int:
    """One more batch write of job-3 through the Python writer's driver steps."""
    settings = config.parse_settings(
        conf={**_conf("job-3"), "spark.sparkguard.storageOptions": _json(options)}
    )
    target = writer.open_target(url, settings)
    guard = writer.roll_back_stale(target, settings)
    write = 100_000 + int(time.time() * 1000) % 100_000
    assert writer.committed_write(target, "job-3", write) is None
    tl = target.timeline
    instant = tl.start(
        "job-3", attempt=0, marker_type="DIRECT", operation="append", write=write, extra={}
    )
    rollback.confirm_sole_writer(tl, guard, instant=instant)
    keep = set(tl.committed_files(instants=tl.instant_ids(job_id="job-3")))
    keep |= snapshots.job_history(target.manager, target.path, "job-3").names
    rel = f"part-00000-job-3-w{write:06d}-c000.parquet"
    rollback.sweep_late_files(tl, job_id="job-3", instant=instant, keep=[rel])
    tl.commit(
        instant,
        [timeline.DataFile(rel, 1000, 10)],
        extra={"operation": "append", "committedAt": reader.now_key()},
        write=write,
    )
    writer.maybe_compact(target.manager, target.path, settings)
    return len(keep)


def prepare_failed(url: str, options: dict[str, Any], job: str, write: int) -> None:
    """A failed write of ``job`` (one with history): an inflight instant, one direct marker,
    its data file."""
    manager, table = filemanager.resolve(url, storage_options=options)
    tl = timeline.Timeline(manager, table)
    instant = tl.start(job, attempt=0, marker_type="DIRECT", write=write)
    rel = f"part-00000-{job}-w{write:06d}-c000.parquet"
    client = markers.DirectMarkerClient(manager)
    mdir = markers.marker_dir(table, instant)
    client.write_type(mdir)
    client.create(mdir, rel)
    manager.write_bytes(paths.join(table, rel), b"x" * 100, overwrite=True)


def measure_rollback(url: str, options: dict[str, Any], job: str) -> int:
    summary = rollback.rollback_table(url, job_id=job, storage_options=options)
    assert summary.files_deleted == 1, summary
    return summary.files_deleted


def _conf(job: str) -> dict[str, str]:
    return {
        "spark.sparkguard.jobId": job,
        "spark.sparkguard.timeline.snapshotEvery": str(SNAPSHOT_EVERY["value"]),
    }


def _json(options: dict[str, Any]) -> str:
    import json

    return json.dumps(options)


def run_local(sizes: list[int], repeats: int, workdir: Path) -> dict[int, dict[str, int]]:
    results: dict[int, dict[str, int]] = {}
    for size in sizes:
        url = str(workdir / f"local-{size}")
        started = time.monotonic()
        build(url, size)
        log(f"local: built {size} instants in {time.monotonic() - started:.1f} s")
        counts: dict[str, int] = {"reader": 0, "write": 0, "rollback": 0}
        for r in range(repeats):
            with counting() as c:
                measure_reader(url, {})
            counts["reader"] = max(counts["reader"], c.count)
            with counting() as c:
                measure_write(url, {})
            counts["write"] = max(counts["write"], c.count)
            job = "job-5"
            prepare_failed(url, {}, job, 900_000 + r)
            with counting() as c:
                measure_rollback(url, {}, job)
            counts["rollback"] = max(counts["rollback"], c.count)
        results[size] = counts
        print(f"local disk, {size} instants: {counts}", flush=True)
    return results


def run_s3(
    sizes: list[int], repeats: int, workdir: Path, latency_ms: float
) -> dict[int, dict[str, int]]:
    results: dict[int, dict[str, int]] = {}
    with proxied_s3(latency_ms=latency_ms, write_rate=3500) as s3:
        direct = s3.s3.storage_options
        bucket = s3.s3.create_bucket()
        fs = filemanager.resolve(f"s3://{bucket}/x", storage_options=direct)[0].fs
        for size in sizes:
            local = workdir / f"local-{size}"  # the local run's table (built as shipped)
            if not local.exists():
                build(str(local), size)
            url = f"s3://{bucket}/t{size}"
            started = time.monotonic()
            for file in sorted(local.rglob("*")):
                if file.is_file() and not file.name.startswith("."):
                    fs.pipe(f"{bucket}/t{size}/{file.relative_to(local)}", file.read_bytes())
            log(f"s3: copied the {size}-instant table in {time.monotonic() - started:.1f} s")
            counts: dict[str, int] = {"reader": 0, "write": 0, "rollback": 0}
            for r in range(repeats):
                seconds: dict[str, float] = {}
                for what, run in (("reader", measure_reader), ("write", measure_write)):
                    s3.reset()
                    started = time.monotonic()
                    run(url, s3.options)
                    seconds[what] = time.monotonic() - started
                    counts[what] = max(counts[what], s3.stats().get("total", 0))
                job = "job-5"
                prepare_failed(url, s3.options, job, 900_100 + r)
                s3.reset()
                started = time.monotonic()
                measure_rollback(url, s3.options, job)
                seconds["rollback"] = time.monotonic() - started
                counts["rollback"] = max(counts["rollback"], s3.stats().get("total", 0))
                timing = ", ".join(f"{k} {v:.2f} s" for k, v in seconds.items())
                log(f"s3, {size} instants, round {r + 1}: {timing}")
            results[size] = counts
            print(f"s3 (proxy {latency_ms:g} ms), {size} instants: {counts}", flush=True)
    return results


def ratio_line(results: dict[int, dict[str, int]], small: int, large: int) -> str:
    def ratio(what: str) -> str:
        return f"{results[large][what] / max(1, results[small][what]):.2f}"

    return (
        f"timeline: reader requests at {large}/{small} instants = {ratio('reader')}x, "
        f"write requests at {large}/{small} = {ratio('write')}x, "
        f"rollback requests at {large}/{small} = {ratio('rollback')}x"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="each measurement once")
    parser.add_argument("--sizes", default="100,10000", help="two history sizes, small,large")
    parser.add_argument("--no-s3", action="store_true", help="local disk only")
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument(
        "--snapshot-every",
        type=int,
        default=10,
        help="spark.sparkguard.timeline.snapshotEvery of the history and the write (0: the "
        "timeline before snapshots, for comparison)",
    )
    args = parser.parse_args(argv)
    SNAPSHOT_EVERY["value"] = args.snapshot_every
    sizes = sorted(int(s) for s in args.sizes.split(","))
    if len(sizes) != 2 or sizes[0] < 1:
        parser.error("--sizes takes two sizes, e.g. 100,10000")
    repeats = 1 if args.quick else 3
    workdir = Path(tempfile.mkdtemp(prefix="sg-timeline-bench-"))
    try:
        results = run_local(sizes, repeats, workdir)
        line = ratio_line(results, *sizes)
        print("local disk: " + line, flush=True)
        if not args.no_s3:
            s3_results = run_s3(sizes, repeats, workdir, args.latency_ms)
            line = ratio_line(s3_results, *sizes)
            print(f"s3 ({args.latency_ms:g} ms proxy): " + line, flush=True)
        print(line, flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
