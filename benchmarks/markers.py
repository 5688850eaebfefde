"""Direct vs batched (sidecar) markers on S3-like storage, plus sidecar ack latency and capacity.

Storage is the moto S3 server behind benchmarks/_s3proxy.py, which adds per-request latency
(default 20 ms) and throttles each prefix to 3,500 writes/s with 503 SlowDown, like S3.

Job phase (three modes in one run): W writer threads write F small data files, creating a
marker before each (direct: one object per marker through DirectMarkerClient; batched:
HttpMarkerClient to a real sidecar process writing MARKERS files through the same proxy, once
with the sidecar's shipped default flush mode ``interval`` and once with ``group-commit``); then
the commit removes the markers. Storage requests are counted at the proxy. R >= 2 rounds
(default 3), the order of the modes rotated each round so each goes first; the best round of
each mode is compared, and every round's job ratio is printed.

Latency phase: marker ack latency p50/p99 of interval vs group-commit flushing, on the proxy.
Capacity phase: acknowledged markers/s of one sidecar on the local filesystem, and p99. Both
alternate the order of the two modes by round too.

    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/markers.py --quick     # 1,000 files
    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/markers.py             # 3,000 files
    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/markers.py --files 100000 --writers 64

``--quick`` and the full run differ only in size (files, capacity markers per connection):
same writers (16), same rounds, same warm-up. Each timed job is preceded by an untimed marker
through the same client or sidecar (the store's client library and connections are loaded by
the first marker, a cost per job, not per file). The full size is 3,000 files: the direct mode
writes 15-100 files/s through moto on the shared 2-core machine (depending on its load), so
the issue's 100,000 files x 3 modes x 3 rounds would take hours; run that size explicitly (last
command above) where it fits.
The marker cleanup ratio grows with the size by construction (direct: one listing page and one
DeleteObjects per 1,000 markers; batched: the sidecar's few MARKERS files), so only the request
and job ratios are expected to agree between sizes.

The last two lines are ``markers: batched=<mode>: requests direct/batched = <x>x, cleanup
direct/batched = <c>x, job direct/batched = <y>x``, group-commit first, then interval (the
shipped default) last.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

sys.path.append(os.path.dirname(os.path.abspath(__file__)))  # _common, beside this file

from _common import (
    free_port,
    log,
    percentile,
    process,
    proxied_s3,
    proxy_call,
    rotated,
    wait_http,
)

from sparkguard.spark_lib import filemanager, markers
from sparkguard.spark_lib.marker_http import HttpMarkerClient

TOKEN = "bench-token"  # noqa: S105 - a throwaway token for a local benchmark
INSTANT = "20261122120000000-bench"
PAYLOAD = b"x" * 256
MARKER_CATEGORIES = ("markers", "sparkguard")  # _s3proxy.classify's categories


@contextlib.contextmanager
def sidecar(port: int, roots: str, env: dict[str, str], mode: str) -> Iterator[str]:
    settings = {
        **env,
        "SPARKGUARD_SIDECAR_ALLOWED_ROOTS": roots,
        "SPARKGUARD_SIDECAR_TOKEN": TOKEN,
        "SPARKGUARD_SIDECAR_PORT": str(port),
        "SPARKGUARD_SIDECAR_FLUSH_MODE": mode,
        "SPARKGUARD_SIDECAR_LOG_LEVEL": "WARNING",
    }
    with process([sys.executable, "-m", "sparkguard.sidecar"], settings):
        wait_http(f"http://127.0.0.1:{port}/readyz")
        yield f"http://127.0.0.1:{port}"


def run_threads(count: int, target: Any) -> float:
    errors: list[BaseException] = []

    def guarded(index: int) -> None:
        try:
            target(index)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(f"{len(errors)} writers failed; first: {errors[0]!r}")
    return time.monotonic() - started


def run_job(
    mode: str,
    *,
    files: int,
    writers: int,
    bucket: str,
    options: dict[str, Any],
    proxy: str,
    endpoint: str | None,
) -> dict[str, float]:
    """One write job: markers + data files, then the commit's marker cleanup."""
    manager, _ = filemanager.resolve(f"s3://{bucket}", storage_options=options)
    table = f"{bucket}/tbl"
    directory = f"s3://{table}/_sparkguard/markers/{INSTANT}"
    latencies: list[float] = []
    done = [0]
    lock = threading.Lock()
    direct = markers.DirectMarkerClient(manager)

    def writer(w: int) -> None:
        client: markers.MarkerClient = (
            direct if endpoint is None else HttpMarkerClient(endpoint, token=TOKEN, deadline_s=120)
        )
        for i in range(w, files, writers):
            name = f"part-{i:06d}-bench-c000.parquet"
            started = time.perf_counter()
            client.create(directory, name)
            elapsed = time.perf_counter() - started
            manager.write_bytes(f"{table}/{name}", PAYLOAD)
            with lock:
                latencies.append(elapsed)
                done[0] += 1
        client.close()

    # Untimed, uncounted warm-up of this mode's path to storage: the first marker of a fresh
    # sidecar (or of this process's direct client) loads the store's client library and opens
    # its connections, seconds on a busy machine. Paid once per job whatever the job's size, it
    # would weigh 10x more in --quick than in the full run and make their ratios disagree.
    warm_dir = f"s3://{bucket}/warm-up/_sparkguard/markers/{INSTANT}"
    # The writer's W2 (uncounted, like the data path's setup): .inflight before any marker. The
    # sidecar refuses a marker directory whose instant has none (checked once, at load).
    for owner in (table, f"{bucket}/warm-up"):
        manager.write_bytes(
            f"{owner}/_sparkguard/timeline/{INSTANT}.inflight", b"{}", overwrite=True
        )
    warm: markers.MarkerClient = (
        direct if endpoint is None else HttpMarkerClient(endpoint, token=TOKEN, deadline_s=120)
    )
    warm.create(warm_dir, "part-warm-up.parquet")
    manager.write_bytes(f"{bucket}/warm-up/part-warm-up.parquet", PAYLOAD)
    warm.delete_dir(warm_dir)
    warm.close()
    proxy_call(proxy, "/_proxy/reset", "POST")
    stop = threading.Event()

    def progress() -> None:
        while not stop.wait(10):
            log(f"  {mode}: {done[0]}/{files} files written")

    reporter = threading.Thread(target=progress, daemon=True)
    reporter.start()
    write_s = run_threads(writers, writer)
    stop.set()
    written = proxy_call(proxy, "/_proxy/stats")
    # Check (uncounted) that every file is marked, then clean up as the commit does.
    check, check_path = filemanager.resolve(directory, storage_options=options)
    marked = markers.read_marked_files(check, check_path)
    assert len(marked) == files, f"{mode}: {len(marked)} files marked, expected {files}"
    before_cleanup = proxy_call(proxy, "/_proxy/stats")
    cleaner: markers.MarkerClient = (
        direct if endpoint is None else HttpMarkerClient(endpoint, token=TOKEN, deadline_s=600)
    )
    started = time.monotonic()
    cleaner.delete_dir(directory)
    cleanup_s = time.monotonic() - started
    cleaner.close()
    after = proxy_call(proxy, "/_proxy/stats")
    assert not markers.read_marked_files(check, check_path)
    # Marker requests include the marker service's own reads of the table's _sparkguard files
    # (the sidecar's fence: is the instant still undecided?), counted apart by the proxy.
    cleanup_requests = sum(after.get(k, 0) - before_cleanup.get(k, 0) for k in MARKER_CATEGORIES)
    result = {
        "write_s": write_s,
        "cleanup_s": cleanup_s,
        "job_s": write_s + cleanup_s,
        "marker_requests": sum(written.get(k, 0) for k in MARKER_CATEGORIES) + cleanup_requests,
        "fence_requests": after.get("sparkguard", 0),
        "data_requests": written.get("data", 0),
        "throttled": after.get("throttled", 0),
        "ack_p50_ms": percentile(latencies, 0.5) * 1000,
        "ack_p99_ms": percentile(latencies, 0.99) * 1000,
    }
    log(
        f"{mode}: write {write_s:.1f} s, cleanup {cleanup_s:.2f} s, marker requests "
        f"{result['marker_requests']:.0f} (of which timeline reads {result['fence_requests']:.0f}; "
        f"data {result['data_requests']:.0f}, throttled 503s "
        f"{result['throttled']:.0f}), marker p50 {result['ack_p50_ms']:.1f} ms "
        f"p99 {result['ack_p99_ms']:.1f} ms"
    )
    return result


def ack_latency(endpoint: str, directory: str, *, writers: int, per_writer: int) -> list[float]:
    latencies: list[float] = []
    lock = threading.Lock()

    def writer(w: int) -> None:
        client = HttpMarkerClient(endpoint, token=TOKEN, deadline_s=120)
        for i in range(per_writer):
            started = time.perf_counter()
            client.create(directory, f"w{w:03d}/part-{i:06d}.parquet")
            with lock:
                latencies.append(time.perf_counter() - started)
        client.close()

    run_threads(writers, writer)
    return latencies


async def _capacity_load(
    endpoint: str, directory: str, connections: int, per: int
) -> tuple[float, list[float]]:
    import aiohttp

    latencies: list[float] = []
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections)) as session:

        async def one(c: int) -> None:
            for i in range(per):
                params = {"markerdir": directory, "markername": f"c{c:04d}/part-{i:06d}.parquet"}
                started = time.perf_counter()
                async with session.post(
                    endpoint + "/v1/markers/create", params=params, headers=headers
                ) as answer:
                    await answer.read()
                    if answer.status != 200:
                        raise RuntimeError(f"HTTP {answer.status}")
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(one(c) for c in range(connections)))
        return time.perf_counter() - started, latencies


BATCHED_MODES = ("interval", "group-commit")
SHIPPED = "interval"  # sidecar/config.py's default; the operator does not override it


def report(runs: dict[str, list[dict[str, float]]], latency: dict[str, list[float]]) -> None:
    """Print the best round of each mode, latencies, per-round and best ratios."""
    modes = tuple(runs)
    print("best round of each mode (job time), and its marker requests:")
    best = {mode: min(runs[mode], key=lambda r: r["job_s"]) for mode in modes}
    for mode in modes:
        r = best[mode]
        print(
            f"  {mode:12s} write {r['write_s']:.1f} s, cleanup {r['cleanup_s']:.2f} s, "
            f"marker requests {r['marker_requests']:.0f}, ack p50 {r['ack_p50_ms']:.1f} / "
            f"p99 {r['ack_p99_ms']:.1f} ms, throttled {r['throttled']:.0f}"
        )
    for mode in BATCHED_MODES:
        if latency[mode]:
            print(
                f"  ack latency {mode} (all rounds, {len(latency[mode])} samples): p50 "
                f"{percentile(latency[mode], 0.5) * 1000:.1f} ms, "
                f"p99 {percentile(latency[mode], 0.99) * 1000:.1f} ms"
            )
    lines = []
    for mode in (*[m for m in BATCHED_MODES if m != SHIPPED], SHIPPED):
        direct, batched = best["direct"], best[mode]
        x = direct["marker_requests"] / max(1.0, batched["marker_requests"])
        c = direct["cleanup_s"] / batched["cleanup_s"]
        y = direct["job_s"] / batched["job_s"]
        per_round = [
            d["job_s"] / b["job_s"] for d, b in zip(runs["direct"], runs[mode], strict=True)
        ]
        shipped = " (the shipped default)" if mode == SHIPPED else ""
        print(f"  per-round job direct/{mode}: " + ", ".join(f"{r:.2f}x" for r in per_round))
        lines.append(
            f"markers: batched={mode}{shipped}: requests direct/batched = {x:.1f}x, "
            f"cleanup direct/batched = {c:.1f}x, job direct/batched = {y:.2f}x"
        )
    print("\n".join(lines))  # the shipped default's line is the last one


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a short run (1,000 files, 100 capacity markers per connection), same writers "
        "and rounds",
    )
    parser.add_argument("--files", type=int, default=3_000)
    parser.add_argument("--writers", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every mode (>= 2)")
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--write-rate", type=float, default=3500.0)
    parser.add_argument("--capacity-connections", type=int, default=64)
    parser.add_argument("--capacity-per-connection", type=int, default=200)
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--skip-capacity", action="store_true")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error(f"--rounds {args.rounds}: use at least 2 (the order rotates by round)")
    if args.quick:
        args.files, args.capacity_per_connection = 1_000, 100
    modes = ("direct", *BATCHED_MODES)
    log(
        f"markers benchmark: {args.files} files, {args.writers} writers, {args.rounds} rounds "
        f"(order rotated each round), proxy latency {args.latency_ms:g} ms, "
        f"{args.write_rate:g} writes/s per prefix; batched = the sidecar with flush mode "
        f"{' and '.join(BATCHED_MODES)} (shipped default: {SHIPPED})"
    )
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    latency: dict[str, list[float]] = {mode: [] for mode in BATCHED_MODES}
    with proxied_s3(latency_ms=args.latency_ms, write_rate=args.write_rate) as store:
        s3, proxy, options, proxy_env = store.s3, store.proxy, store.options, store.env()
        for n in range(args.rounds):
            for mode in rotated(modes, n):
                bucket = s3.create_bucket()
                log(f"round {n}: {mode} markers ...")
                if mode == "direct":
                    result = run_job(
                        mode, files=args.files, writers=args.writers, bucket=bucket,
                        options=options, proxy=proxy, endpoint=None,
                    )  # fmt: skip
                else:
                    with sidecar(free_port(), f"s3://{bucket}", proxy_env, mode) as endpoint:
                        result = run_job(
                            mode, files=args.files, writers=args.writers, bucket=bucket,
                            options=options, proxy=proxy, endpoint=endpoint,
                        )  # fmt: skip
                runs[mode].append(result)

            if not args.skip_latency:
                per = max(20, args.files // args.writers // 10)
                for mode in rotated(BATCHED_MODES, n):
                    bucket = s3.create_bucket()
                    with sidecar(free_port(), f"s3://{bucket}", proxy_env, mode) as endpoint:
                        lat = ack_latency(
                            endpoint, f"s3://{bucket}/lat/_sparkguard/markers/{INSTANT}",
                            writers=args.writers, per_writer=per,
                        )  # fmt: skip
                    latency[mode].extend(lat)
                    log(
                        f"round {n}: ack latency on S3 proxy, {mode} (interval 50 ms), "
                        f"{args.writers} writers x {per}: p50 {percentile(lat, 0.5) * 1000:.1f} "
                        f"ms, p99 {percentile(lat, 0.99) * 1000:.1f} ms"
                    )

    if not args.skip_capacity:
        with tempfile.TemporaryDirectory(prefix="sg-capacity-") as root:
            for n in range(args.rounds):
                for mode in rotated(BATCHED_MODES, n):
                    directory = f"{root}/{mode}-{n}/_sparkguard/markers/{INSTANT}"
                    timeline_dir = f"{root}/{mode}-{n}/_sparkguard/timeline"
                    os.makedirs(timeline_dir)  # the writer's W2: .inflight before any marker
                    with open(f"{timeline_dir}/{INSTANT}.inflight", "wb") as inflight:
                        inflight.write(b"{}")
                    with sidecar(free_port(), root, {}, mode) as endpoint:
                        elapsed, lat = asyncio.run(
                            _capacity_load(
                                endpoint,
                                directory,
                                args.capacity_connections,
                                args.capacity_per_connection,
                            )
                        )
                    log(
                        f"round {n}: capacity on local fs, {mode} (interval 50 ms), "
                        f"{args.capacity_connections} connections: {len(lat) / elapsed:.0f} "
                        f"acknowledged markers/s, p50 {percentile(lat, 0.5) * 1000:.1f} ms, "
                        f"p99 {percentile(lat, 0.99) * 1000:.1f} ms"
                    )

    report(runs, latency)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
