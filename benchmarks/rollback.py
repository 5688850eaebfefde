"""Rollback of a failed write through its markers vs a listing-based orphan cleanup.

    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/rollback.py [--quick] [--committed N]
        [--failed M] [--url URL]

A table holds N committed files (100 per instant, over 100 partition directories); a failed
write left M marked files. ``rollback_job`` (journal -> timeline -> markers) is timed against a
cleanup that lists the whole table, reads every committed instant and deletes what no commit
lists. Both start from the same state and must delete the same M files. Last line:
``rollback: listing/markers = <x>x``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

os.environ.setdefault("PYTHONSAFEPATH", "1")

from sparkguard.spark_lib import filemanager, journal, markers, paths, rollback, timeline

JOB = "bench-job"


def _build(url: str, committed: int, per_instant: int) -> None:
    manager, table = filemanager.resolve(url)
    tl = timeline.Timeline(manager, table)
    made = 0
    n = 0
    while made < committed:
        job = f"hist-{n:05d}"
        instant = tl.start(job, attempt=0, marker_type="DIRECT")
        files = []
        for i in range(min(per_instant, committed - made)):
            rel = f"day={(made + i) % 100:03d}/part-{i:05d}-{job}-c000.parquet"
            target = paths.join(table, rel)
            manager.fs.makedirs(paths.parent(target), exist_ok=True)
            manager.fs.pipe_file(target, b"x" * 16)  # setup only: no fsync needed
            files.append(timeline.DataFile(path=rel, size=16, rows=1))
        tl.commit(instant, files, extra={"operation": "append"})
        made += len(files)
        n += 1
        if n % 100 == 0:
            print(f"  built {made}/{committed} committed files", flush=True)


def _fail_write(url: str, journal_url: str, failed: int) -> None:
    manager, table = filemanager.resolve(url)
    tl = timeline.Timeline(manager, table)
    instant = tl.start(JOB, attempt=0, marker_type="DIRECT")
    jmanager, jpath = filemanager.resolve(journal_url)
    journal.Journal(jmanager, jpath, JOB).record(table=url, instant=instant, attempt=0)
    client = markers.DirectMarkerClient(manager)
    mdir = markers.marker_dir(table, instant)
    client.write_type(mdir)
    for i in range(failed):
        rel = f"day={i % 100:03d}/part-{i:05d}-{JOB}-c000.parquet"
        client.create(mdir, rel)
        manager.write_bytes(paths.join(table, rel), b"y" * 16, overwrite=True)


def listing_cleanup(url: str) -> int:
    """Delete every data file no committed instant lists (the no-markers way)."""
    manager, table = filemanager.resolve(url)
    tl = timeline.Timeline(manager, table)
    committed = set(tl.committed_files())
    on_disk: list[str] = []
    pending = [table]
    while pending:
        current = pending.pop()
        for info in manager.list(current):
            if info.name.startswith(("_", ".")):
                continue
            if info.is_dir:
                pending.append(info.path)
            else:
                on_disk.append(info.path[len(table) + 1 :])
    orphans = [rel for rel in on_disk if rel not in committed]
    manager.delete_many(paths.join(table, rel) for rel in orphans)
    for status in tl.statuses(job_id=JOB):
        if status.state is timeline.State.INFLIGHT:
            tl.claim_rollback(status.instant)
            markers.delete_marker_dir(manager, markers.marker_dir(table, status.instant))
    return len(orphans)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="10k committed, 100 failed")
    parser.add_argument("--committed", type=int, default=100_000)
    parser.add_argument("--failed", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    committed, failed = (10_000, 100) if args.quick else (args.committed, args.failed)
    rounds = 1 if args.quick else args.rounds
    base = tempfile.mkdtemp(prefix="sg-bench-rollback-")
    url = f"{base}/table"
    print(f"committed={committed} failed={failed} dir={base}", flush=True)
    start = time.perf_counter()
    _build(url, committed, 100)
    print(f"built the table in {time.perf_counter() - start:.1f}s", flush=True)

    best = {"markers": float("inf"), "listing": float("inf")}
    for n in range(rounds):
        journal_url = f"{base}/journal-m{n}"
        _fail_write(url, journal_url, failed)
        start = time.perf_counter()
        summary = rollback.rollback_job(JOB, journal_url)
        elapsed = time.perf_counter() - start
        assert summary.files_deleted == failed, summary
        best["markers"] = min(best["markers"], elapsed)
        print(f"round {n} markers rollback  {elapsed * 1000:9.1f} ms", flush=True)

        _fail_write(url, f"{base}/journal-l{n}", failed)
        start = time.perf_counter()
        deleted = listing_cleanup(url)
        elapsed = time.perf_counter() - start
        assert deleted == failed, deleted
        best["listing"] = min(best["listing"], elapsed)
        print(f"round {n} listing cleanup   {elapsed * 1000:9.1f} ms", flush=True)
    shutil.rmtree(base, ignore_errors=True)
    ratio = best["listing"] / best["markers"]
    print(f"best: markers {best['markers'] * 1000:.1f} ms, listing {best['listing'] * 1000:.1f} ms")
    print(f"rollback: listing/markers = {ratio:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
