"""Peak memory of the operator process while it runs its default 16 rollbacks at once.

    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/rollback_memory.py [--jobs 16] [--files 100000]

Sizes the chart's `operator.resources.limits.memory`. Each of ``--jobs`` failed jobs left one
inflight instant whose sidecar-batched markers (20 ``MARKERS<i>`` files, as the sidecar writes
them) name ``--files`` data files on local disk; the data files themselves are not created (a
rollback's memory is the marker names it reads and the sets it builds, not the files' bytes;
deleting a missing file costs the same bookkeeping). The operator's modules are imported first
(kopf, the Kubernetes client, the library): that is the baseline. Then the rollbacks run at
once, one thread each, as the operator's rollback slots run them, while a sampler reads the
process's resident set every 20 ms. Last line: ``peak <MiB> MiB (baseline <MiB> MiB)``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
import tempfile
import threading
import time

sys.path.append(os.path.dirname(os.path.abspath(__file__)))  # _common, beside this file
os.environ.setdefault("PYTHONSAFEPATH", "1")

from _common import log

import sparkguard.operator.main  # noqa: F401  - the operator's own footprint is the baseline
from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import paths
from sparkguard.spark_lib.storage import journal, markers, rollback, timeline

BATCH_FILES = 20  # the sidecar's default batch threads: MARKERS0..19


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _failed_job(base: str, n: int, files: int) -> tuple[str, str]:
    """A job that died with ``files`` marked names; returns its id and journal URL."""
    job = f"mem-{n:02d}"
    table = f"{base}/t{n:02d}"
    manager, root = filemanager.resolve(table)
    instant = timeline.Timeline(manager, root).start(
        job, attempt=0, marker_type=markers.MarkerType.TIMELINE_SERVER_BASED.value
    )
    journal_url = f"{base}/journal-{job}"
    jmanager, jpath = filemanager.resolve(journal_url)
    journal.Journal(jmanager, jpath, job).record(table=table, instant=instant, attempt=0)
    mdir = markers.marker_dir(root, instant)
    manager.write_bytes(
        paths.join(mdir, "MARKERS.type"), markers.MarkerType.TIMELINE_SERVER_BASED.value.encode()
    )
    names = [
        markers.marker_name(f"day={i % 100:03d}/part-{i:05d}-{job}-c000.parquet")
        for i in range(files)
    ]
    for b in range(BATCH_FILES):
        manager.write_bytes(
            paths.join(mdir, f"MARKERS{b}"), markers.render_batch_file(names[b::BATCH_FILES])
        )
    return job, journal_url


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=16, help="rollbacks at once (default 16)")
    parser.add_argument("--files", type=int, default=100_000, help="marked files per job")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sg-rollback-memory-") as base:
        jobs = [_failed_job(base, n, args.files) for n in range(args.jobs)]
        log(f"{args.jobs} failed jobs of {args.files} marked files each written")
        baseline = _rss_mib()
        peak = baseline
        done = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.wait(0.02):
                peak = max(peak, _rss_mib())

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            results = list(pool.map(lambda j: rollback.rollback_job(j[0], j[1]), jobs))
        done.set()
        sampler.join()
        elapsed = time.perf_counter() - start
        assert all(len(r.instants_rolled_back) == 1 for r in results), results
        log(f"{args.jobs} rollbacks of {args.files} names in {elapsed:.1f}s")
    print(f"peak {peak:.0f} MiB (baseline {baseline:.0f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
