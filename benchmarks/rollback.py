"""Rollback of a failed write through its markers vs a listing-based orphan cleanup.

    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/rollback.py [--quick] [--s3]
        [--committed N] [--failed M] [--rounds R] [--latency-ms L]

Sizes (committed / failed): ``--quick`` 10,000 / 100; full 100,000 / 1,000 on local disk and
20,000 / 200 with ``--s3`` (moto scans the whole bucket for every LIST and builds the table at
~100 files/s on this machine: 100,000 files would take ~15 min before the first round).

A table holds N committed files (100 per instant, over 100 partition directories); a failed
write left M marked files (direct markers). ``rollback_job`` (journal -> timeline -> markers) is
timed against a listing-based orphan cleanup written as well as we could: one flat listing of
the timeline, every committed outcome fetched concurrently (fsspec ``cat`` of the list), one
flat listing of the table, batched deletes of what no commit lists. Both start from the same
state and must delete the same M files. R >= 2 rounds (default 3), the order alternating each
round; the best of each is compared, and each round's ratio is printed too. ``--quick`` is the
same procedure on a smaller table.

Local disk by default; ``--s3`` puts the table on moto's S3 server behind
``benchmarks/_s3proxy.py`` (``--latency-ms`` per request, default 20) and also counts the
storage requests of each cleanup (``requests listing/markers = <r>x``; ``--request-log``
prints the rollback's requests by operation and by what they touched). The S3 server honours
a condition per key of ``DeleteObjects`` (``ETag: *``: delete only if present, report absent
keys as errors) as AWS S3 does since 2025 (``tests/support/moto_conditional.py``; moto alone
does not): rollback's deletes then tell which files existed. ``--plain-moto`` measures a store
without it (rollback reads existence first: a HEAD per name, or a listing per directory). The
table is built straight on the server (not timed). Last line: ``rollback: listing/markers =
<x>x``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from typing import Any

sys.path.append(os.path.dirname(os.path.abspath(__file__)))  # _common, beside this file
os.environ.setdefault("PYTHONSAFEPATH", "1")

from _common import log, proxied_s3, proxy_call, rotated

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import formats, paths
from sparkguard.spark_lib.storage import journal, markers, rollback, timeline

PER_INSTANT = 100
DIRS = 100


def _build(url: str, options: Mapping[str, Any], committed: int) -> None:
    """N committed files in N/100 instants (setup: data written without the file manager)."""
    manager, table = filemanager.resolve(url, storage_options=options)
    tl = timeline.Timeline(manager, table)
    made = n = 0
    while made < committed:
        job = f"hist-{n:05d}"
        instant = tl.start(job, attempt=0, marker_type="DIRECT")
        files, blobs = [], {}
        for i in range(min(PER_INSTANT, committed - made)):
            rel = f"day={(made + i) % DIRS:03d}/part-{i:05d}-{job}-c000.parquet"
            blobs[paths.join(table, rel)] = b"x" * 16
            files.append(timeline.DataFile(path=rel, size=16, rows=1))
        if "file" in manager.fs.protocol:
            for target in blobs:
                manager.fs.makedirs(paths.parent(target), exist_ok=True)
        manager.fs.pipe(blobs)  # one call: concurrent on object stores
        tl.commit(instant, files, extra={"operation": "append"})
        made += len(files)
        n += 1
        if n % 100 == 0:
            log(f"  built {made}/{committed} committed files")


def _fail_write(
    url: str, options: Mapping[str, Any], journal_url: str, failed: int, *, job: str
) -> None:
    """A write that died: an inflight instant, its journal entry and M marked files."""
    manager, table = filemanager.resolve(url, storage_options=options)
    tl = timeline.Timeline(manager, table)
    instant = tl.start(job, attempt=0, marker_type="DIRECT")
    jmanager, jpath = filemanager.resolve(journal_url, storage_options=options)
    journal.Journal(jmanager, jpath, job).record(table=url, instant=instant, attempt=0)
    client = markers.DirectMarkerClient(manager)
    mdir = markers.marker_dir(table, instant)
    client.write_type(mdir)
    for i in range(failed):
        rel = f"day={i % DIRS:03d}/part-{i:05d}-{job}-c000.parquet"
        client.create(mdir, rel)
        manager.write_bytes(paths.join(table, rel), b"y" * 16, overwrite=True)


def listing_cleanup(url: str, options: Mapping[str, Any], *, job: str) -> int:
    """Delete every data file no committed instant lists (the no-markers way), written as a
    careful engineer would: one flat listing of the timeline, every committed outcome fetched
    concurrently (one GET each, no HEAD first), one flat listing of the table, batched deletes."""
    manager, table = filemanager.resolve(url, storage_options=options)
    tl = timeline.Timeline(manager, table)
    outcomes = [info.path for info in manager.list(tl.directory) if info.name.endswith(".outcome")]
    committed: set[str] = set()
    # fsspec's cat of a list: concurrent GETs on object stores (asyncio.gather in batches).
    for path, data in manager.fs.cat(outcomes, on_error="raise").items():
        doc = formats.decode(
            data, kind=timeline.OUTCOME_KIND, versions=frozenset({timeline.VERSION}), source=path
        )
        if doc["outcome"] == timeline.Outcome.COMMITTED.value:
            committed.update(f["path"] for f in doc["files"])
    root = table.rstrip("/")
    on_storage = (info.path[len(root) + 1 :] for info in manager.list_files(root))
    orphans = [
        rel
        for rel in on_storage
        if not any(part.startswith(("_", ".")) for part in rel.split("/")) and rel not in committed
    ]
    manager.delete_many(paths.join(table, rel) for rel in orphans)
    for status in tl.statuses(job_id=job):
        if status.state is timeline.State.INFLIGHT:
            tl.claim_rollback(status.instant)
            markers.delete_marker_dir(manager, markers.marker_dir(table, status.instant))
    return len(orphans)


def _by_area(logged: Any) -> dict[str, int]:
    """Requests counted by ``<operation> <area>``: the area is the ``_sparkguard/`` directory
    (timeline, markers, ...), ``data``, or the journal, from the key or the listing prefix."""
    counts: collections.Counter[str] = collections.Counter()
    for entry in logged:
        method, path, query = entry["method"], entry["path"], entry["query"]
        prefix = dict(part.split("=", 1) for part in query.split("&") if "=" in part).get(
            "prefix", ""
        )
        where = path + "/" + prefix.replace("%2F", "/")
        if "/_sparkguard/" in where:
            area = where.split("/_sparkguard/", 1)[1].split("/", 1)[0]
        elif "/journal-" in where:
            area = "journal"
        else:
            area = "data"
        op = "POST-delete" if method == "POST" and "delete" in query else method
        if method == "GET" and (query.startswith("list-type") or "prefix=" in query):
            op = "LIST"
        elif method == "GET" and "uploads" in query:
            op = "LIST-uploads"
        counts[f"{op} {area}"] += 1
    return dict(sorted(counts.items()))


@contextlib.contextmanager
def _storage(args: argparse.Namespace) -> Iterator[tuple[str, dict[str, Any], Any]]:
    """(table base URL, storage options, the proxy or None) for the chosen store."""
    if not args.s3:
        base = tempfile.mkdtemp(prefix="sg-bench-rollback-")
        try:
            yield base, {}, None
        finally:
            shutil.rmtree(base, ignore_errors=True)
        return
    with proxied_s3(
        latency_ms=args.latency_ms, write_rate=1e9, conditional_deletes=not args.plain_moto
    ) as store:
        yield f"s3://{store.s3.create_bucket()}", store.options, store


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="10k committed, 100 failed (same rounds)"
    )
    parser.add_argument("--s3", action="store_true", help="moto S3 server behind the proxy")
    parser.add_argument(
        "--committed", type=int, help="committed files (default 100,000; 20,000 with --s3)"
    )
    parser.add_argument("--failed", type=int, help="failed files (default 1,000; 200 with --s3)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument(
        "--plain-moto",
        action="store_true",
        help="an S3 server without conditional bulk deletes (moto as shipped)",
    )
    parser.add_argument(
        "--request-log",
        action="store_true",
        help="print the last markers rollback's requests by operation and area (with --s3)",
    )
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error(f"--rounds {args.rounds}: use at least 2 (the order alternates by round)")
    # Full size on the S3 server: 20,000 / 200 (the same 1 % failed). moto answers each LIST by
    # scanning every key of the bucket and builds the table at ~100 files/s here, so 100,000
    # files take ~15 min to build and minutes per listing cleanup; --quick is the same
    # procedure on 10,000 / 100.
    full = (20_000, 200) if args.s3 else (100_000, 1_000)
    committed, failed = (
        (10_000, 100) if args.quick else (args.committed or full[0], args.failed or full[1])
    )
    rounds = args.rounds
    with _storage(args) as (base, options, proxy):
        # Build and fail writes straight on the server; time the cleanups through the proxy.
        setup_options = proxy.s3.storage_options if proxy else options
        url = f"{base}/table"
        where = (
            f"S3 server + proxy ({args.latency_ms:g} ms/request, "
            f"{'no ' if args.plain_moto else ''}conditional bulk deletes)"
            if proxy
            else "local disk"
        )
        log(f"committed={committed} failed={failed} rounds={rounds} on {where}: {base}")
        start = time.perf_counter()
        _build(url, setup_options, committed)
        log(f"built the table in {time.perf_counter() - start:.1f}s")

        times: dict[str, list[float]] = {"markers": [], "listing": []}
        requests = {"markers": 0, "listing": 0}
        for n in range(-1, rounds):  # round -1: both once, untimed (imports, caches, sockets)
            for kind in rotated(("markers", "listing"), n):
                # A fresh failed job each time, as in life (a job is rolled back once).
                job = f"bench-{kind}-{n + 1}"
                journal_url = f"{base}/journal-{job}"
                _fail_write(url, setup_options, journal_url, failed, job=job)
                if proxy:
                    proxy.reset()
                start = time.perf_counter()
                if kind == "markers":
                    deleted = rollback.rollback_job(job, journal_url, storage_options=options)
                    count = deleted.files_deleted
                else:
                    count = listing_cleanup(url, options, job=job)
                elapsed = time.perf_counter() - start
                assert count == failed, (kind, count)
                used = proxy.stats().get("total", 0) if proxy else 0
                if n < 0:
                    log(f"warm-up {kind:8s} cleanup {elapsed * 1000:10.1f} ms (untimed)")
                    continue
                requests[kind] = used
                if proxy and kind == "markers" and args.request_log:
                    logged = proxy_call(proxy.proxy, "/_proxy/requests")
                    log(f"round {n} markers requests: {json.dumps(_by_area(logged))}")
                times[kind].append(elapsed)
                extra = f", {used} storage requests" if proxy else ""
                log(f"round {n} {kind:8s} cleanup {elapsed * 1000:10.1f} ms{extra}")
    best = {kind: min(values) for kind, values in times.items()}
    ratio = best["listing"] / best["markers"]
    per_round = [lst / mk for lst, mk in zip(times["listing"], times["markers"], strict=True)]
    print("per-round listing/markers: " + ", ".join(f"{r:.1f}x" for r in per_round))
    print(f"best: markers {best['markers'] * 1000:.1f} ms, listing {best['listing'] * 1000:.1f} ms")
    if args.s3:
        print(f"requests: markers {requests['markers']}, listing {requests['listing']}")
        print(f"requests listing/markers = {requests['listing'] / requests['markers']:.1f}x")
    print(f"rollback: listing/markers = {ratio:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
