"""Sidecar load: C concurrent HttpMarkerClient threads x N markers against one real sidecar.

    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/sidecar_load.py [--quick]
        [--clients C] [--per-client N] [--flush-mode interval|group-commit]

Local filesystem (the batching logic is the same for every store). Reports acknowledged
markers/s, flushes, and the sidecar's RSS before / at peak; checks that every marker was written
exactly once. This was the timing part of tests/sidecar/test_load.py (unit tests do not time
things; tests/sidecar/test_load.py keeps the functional check). Last line:
``sidecar load: <r> markers/s``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.append(os.path.dirname(os.path.abspath(__file__)))  # _common, beside this file

from _common import free_port, log, metric, process, rss_kib, wait_http

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.spark.marker_http import HttpMarkerClient
from sparkguard.spark_lib.storage import markers

TOKEN = "bench-token"  # noqa: S105 - a throwaway token for a local benchmark
INSTANT = "20261122120000000-bench"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="16 clients x 500 markers")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--per-client", type=int, default=2_000)
    parser.add_argument(
        "--flush-mode", default="interval", choices=["interval", "group-commit"],
        help="the sidecar's flush policy (default: interval, the shipped default)",
    )  # fmt: skip
    args = parser.parse_args()
    clients, per_client = (16, 500) if args.quick else (args.clients, args.per_client)
    total = clients * per_client
    with tempfile.TemporaryDirectory(prefix="sg-bench-load-") as root:
        directory = f"{root}/table/_sparkguard/markers/{INSTANT}"
        for table in ("table", "warmup"):  # the writer's W2: .inflight before any marker (the
            # sidecar refuses a marker directory whose instant has none, checked at load)
            timeline_dir = Path(root, table, "_sparkguard", "timeline")
            timeline_dir.mkdir(parents=True)
            (timeline_dir / f"{INSTANT}.inflight").write_bytes(b"{}")
        port = free_port()
        endpoint = f"http://127.0.0.1:{port}"
        env = {
            "SPARKGUARD_SIDECAR_ALLOWED_ROOTS": root,
            "SPARKGUARD_SIDECAR_TOKEN": TOKEN,
            "SPARKGUARD_SIDECAR_PORT": str(port),
            "SPARKGUARD_SIDECAR_FLUSH_MODE": args.flush_mode,
            "SPARKGUARD_SIDECAR_MAX_PENDING": "10000",
            "SPARKGUARD_SIDECAR_LOG_LEVEL": "WARNING",
        }
        with process([sys.executable, "-m", "sparkguard.sidecar"], env) as sidecar:
            wait_http(f"{endpoint}/readyz")
            warmup = HttpMarkerClient(endpoint, token=TOKEN)
            warmup.create(f"{root}/warmup/_sparkguard/markers/{INSTANT}", "w.parquet")
            warmup.close()
            rss_before = peak = rss_kib(sidecar.pid)
            errors: list[BaseException] = []
            start = threading.Barrier(clients + 1)

            def client_thread(c: int) -> None:
                client = HttpMarkerClient(endpoint, token=TOKEN, deadline_s=120)
                try:
                    start.wait()
                    for i in range(per_client):
                        client.create(directory, f"c{c:03d}/part-{i:05d}-job-1-c000.parquet")
                except BaseException as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)
                finally:
                    client.close()

            threads = [threading.Thread(target=client_thread, args=(c,)) for c in range(clients)]
            for thread in threads:
                thread.start()
            log(f"{clients} clients x {per_client} markers, flush mode {args.flush_mode}")
            start.wait()
            started = time.perf_counter()
            for thread in threads:
                while thread.is_alive():  # sample the RSS while the load runs
                    thread.join(timeout=0.5)
                    peak = max(peak, rss_kib(sidecar.pid))
            elapsed = time.perf_counter() - started
            if errors:
                raise RuntimeError(f"{len(errors)} clients failed; first: {errors[0]!r}")
            flushes = metric(endpoint, "sparkguard_sidecar_flush_batch_size_count")
            peak = max(peak, rss_kib(sidecar.pid))
        manager, path = filemanager.resolve(directory)
        marked = markers.read_marked_files(manager, path)
        assert len(marked) == total, f"{len(marked)} markers on storage, expected {total}"
    print(
        f"{total} markers in {elapsed:.1f} s, {flushes:.0f} flushes "
        f"({total / max(flushes, 1):.1f} markers per flush), sidecar RSS "
        f"{rss_before / 1024:.0f} -> peak {peak / 1024:.0f} MiB"
    )
    print(f"sidecar load: {total / elapsed:.0f} markers/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
