"""Direct vs batched (sidecar) markers on S3-like storage, plus sidecar ack latency and capacity.

Storage is the moto S3 server behind benchmarks/_s3proxy.py, which adds per-request latency
(default 20 ms) and throttles each prefix to 3,500 writes/s with 503 SlowDown, like S3.

Job phase (four modes in one run): W writers write F small data files, creating a
marker before each (direct: one object per marker through DirectMarkerClient; batched:
HttpMarkerClient to a real sidecar process writing MARKERS files through the same proxy, once
with the sidecar's shipped default flush mode ``adaptive`` and its defaults, once with
``interval`` at 50 ms (the default before, Hudi's) and once with ``group-commit``); then the
commit removes the markers. Storage requests are counted at the proxy. R >= 2 rounds
(default 3), the order of the modes rotated each round so each goes first; the best round of
each mode is compared, and every round's job ratio is printed. The writers are threads of
``--writer-processes`` processes (default 4), as a job's tasks run in several executors: with
all 64 threads in one Python process, 150-160 ms of a data PUT's 180 ms went by inside that
process (its interpreter lock and its one S3 client loop) against 5-13 ms in moto and the
proxy's 20 ms, so the job phase measured the load generator (docs/benchmarks.md). Each
process warms its S3 client up untimed; the job's time runs from the start signal to the last
process's end. The proxy also sums moto's own time per category, logged per job. The cleanup
is the time the commit waits for its W10 request: the sidecar deletes a directory its commit
sealed after answering (docs/sidecar.md), so the benchmark then waits, untimed and asking moto
directly, until no marker is left, logs when that was, and counts the delete's requests.

Latency phase: marker ack latency p50/p99 of interval vs group-commit flushing, on the proxy.
Capacity phase: acknowledged markers/s of one sidecar on the local filesystem, and p50/p99 of
the acks. The load models a driver's sidecar serving every task of every executor: 400 task
connections by default (50 executors x 8 task slots), each sending one marker (the bytes
``HttpMarkerClient.create`` sends, on a kept-alive connection) and waiting for its ack before the
next, as a task waits before it writes its data file. The load generator is one asyncio event
loop in this process pinned to one CPU (``os.sched_setaffinity``), the sidecar pinned to the
other; both lines say so. The machine's other processes are not pinned, so the 1-minute load is
printed beside each round. The goal is >= 5,000 markers/s with p99 <= 100 ms (set as 2 x the 50 ms
interval that shipped then) for the shipped policy. Both phases alternate the order of the modes
by round too;
``--capacity-only`` runs the capacity phase alone (no S3 server).

    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/markers.py --quick     # 1,000 files
    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/markers.py             # 3,000 files
    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/markers.py --files 100000 --writers 64
    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/markers.py --capacity-only --rounds 2

``--quick`` and the full run differ only in size (files, capacity markers per connection):
same writers (16), same rounds, same warm-up. Each timed job is preceded by an untimed marker
through the same client or sidecar (the store's client library and connections are loaded by
the first marker, a cost per job, not per file). The full size is 3,000 files: the direct mode
writes 15-100 files/s through moto on the shared 2-core machine (depending on its load), so
100,000 files x 3 modes x 3 rounds would take hours; run that size explicitly (last
command above) where it fits.
The marker cleanup ratio grows with the size by construction (direct: one listing page and one
DeleteObjects per 1,000 markers; batched: the sidecar's few MARKERS files), so only the request
and job ratios are expected to agree between sizes.

The last three lines are ``markers: batched=<mode>: requests direct/batched = <x>x, cleanup
direct/batched = <c>x, job direct/batched = <y>x``: interval, group-commit, then adaptive (the
shipped default) last.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import multiprocessing
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

from sparkguard.sidecar import config as sidecar_config
from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.spark.marker_http import HttpMarkerClient
from sparkguard.spark_lib.storage import markers

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
        **MODE_ENV.get(mode, {}),
    }
    with process([sys.executable, "-m", "sparkguard.sidecar"], settings):
        wait_http(f"http://127.0.0.1:{port}/readyz")
        yield f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def pinned_sidecar(
    port: int, root: str, mode: str, cpus: set[int] | None
) -> Iterator[tuple[str, int]]:
    """A sidecar process for ``root`` on local disk, pinned to ``cpus`` (every thread it
    starts inherits the mask: it is set before the first one exists); yields (endpoint, pid)."""
    settings = {
        "SPARKGUARD_SIDECAR_ALLOWED_ROOTS": root,
        "SPARKGUARD_SIDECAR_TOKEN": TOKEN,
        "SPARKGUARD_SIDECAR_PORT": str(port),
        "SPARKGUARD_SIDECAR_FLUSH_MODE": mode,
        "SPARKGUARD_SIDECAR_LOG_LEVEL": "WARNING",
        **MODE_ENV.get(mode, {}),
    }
    with process([sys.executable, "-m", "sparkguard.sidecar"], settings) as proc:
        if cpus is not None:
            os.sched_setaffinity(proc.pid, cpus)  # just exec'd: the interpreter is starting
        wait_http(f"http://127.0.0.1:{port}/readyz")
        if cpus is not None:
            for task in os.listdir(f"/proc/{proc.pid}/task"):
                allowed = os.sched_getaffinity(int(task))
                assert allowed == cpus, f"sidecar thread {task} runs on CPUs {allowed}"
        yield f"http://127.0.0.1:{port}", proc.pid


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


def job_paths(bucket: str) -> tuple[str, str]:
    """A job's table (bucket-relative) and its instant's marker directory (URL)."""
    table = f"{bucket}/tbl"
    return table, f"s3://{table}/_sparkguard/markers/{INSTANT}"


@dataclasses.dataclass(frozen=True)
class WriterGroup:
    """The writers one process runs: ``writers[index::processes]`` of the job's, each writing
    files ``w, w + writers, ...`` with a marker before each."""

    files: int
    writers: int
    index: int
    processes: int
    bucket: str
    options: dict[str, Any]
    endpoint: str | None

    def run(self, done: Any) -> tuple[list[float], list[float]]:
        """Run this group's writer threads; ``done`` counts written files (``.value``, with
        ``.get_lock()``). Returns the marker and data PUT latencies, in seconds."""
        manager, _ = filemanager.resolve(f"s3://{self.bucket}", storage_options=self.options)
        table, directory = job_paths(self.bucket)
        latencies: list[float] = []
        data_latencies: list[float] = []
        lock = threading.Lock()
        direct = markers.DirectMarkerClient(manager)

        def writer(w: int) -> None:
            client: markers.MarkerClient = (
                direct
                if self.endpoint is None
                else HttpMarkerClient(self.endpoint, token=TOKEN, deadline_s=120)
            )
            for i in range(w, self.files, self.writers):
                name = f"part-{i:06d}-bench-c000.parquet"
                started = time.perf_counter()
                client.create(directory, name)
                elapsed = time.perf_counter() - started
                manager.write_bytes(f"{table}/{name}", PAYLOAD)
                data_elapsed = time.perf_counter() - started - elapsed
                with lock:
                    latencies.append(elapsed)
                    data_latencies.append(data_elapsed)
                with done.get_lock():
                    done.value += 1
            client.close()

        ids = range(self.index, self.writers, self.processes)
        run_threads(len(ids), lambda n: writer(ids[n]))
        return latencies, data_latencies

    def warm(self) -> None:
        """Untimed: this process's first request loads the store's client and opens its
        connections (seconds on a busy machine, once per process)."""
        manager, _ = filemanager.resolve(f"s3://{self.bucket}", storage_options=self.options)
        manager.write_bytes(f"{self.bucket}/warm-up/process-{self.index}", PAYLOAD)


def _writer_process(group: WriterGroup, done: Any, ready: Any, go: Any, results: Any) -> None:
    """A child process of the job phase: warm up, say so, wait for the start, write, report."""
    try:
        group.warm()
        ready.put(group.index)
        go.wait()
        results.put(("ok", group.run(done)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises
        ready.put(group.index)
        results.put(("error", repr(exc)))


def run_writers(
    groups: list[WriterGroup], done: Any, proxy: str
) -> tuple[float, list[float], list[float]]:
    """Run the job's writers (in this process for one group, else one process per group, as a
    job's tasks run in several executors), timed from the start of the first write to the end
    of the last; the proxy's counters are reset just before. Returns (seconds, marker
    latencies, data PUT latencies)."""
    if len(groups) == 1:
        proxy_call(proxy, "/_proxy/reset", "POST")
        started = time.monotonic()
        latencies, data_latencies = groups[0].run(done)
        return time.monotonic() - started, latencies, data_latencies
    context = multiprocessing.get_context("spawn")  # no fork of this process's threads and loops
    ready, results, go = context.Queue(), context.Queue(), context.Event()
    children = [
        context.Process(target=_writer_process, args=(group, done, ready, go, results))
        for group in groups
    ]
    for child in children:
        child.start()
    try:
        for _ in children:
            ready.get(timeout=120)
        proxy_call(proxy, "/_proxy/reset", "POST")
        started = time.monotonic()
        go.set()
        latencies: list[float] = []
        data_latencies: list[float] = []
        errors: list[str] = []
        for _ in children:
            status, answer = results.get(timeout=1800)
            if status == "ok":
                latencies.extend(answer[0])
                data_latencies.extend(answer[1])
            else:
                errors.append(answer)
        elapsed = time.monotonic() - started
        if errors:
            raise RuntimeError(f"{len(errors)} writer processes failed; first: {errors[0]}")
        return elapsed, latencies, data_latencies
    finally:
        for child in children:
            child.join(timeout=30)
            if child.is_alive():
                child.kill()


def run_job(
    mode: str,
    *,
    files: int,
    writers: int,
    processes: int,
    bucket: str,
    options: dict[str, Any],
    raw_options: dict[str, Any],
    proxy: str,
    endpoint: str | None,
) -> dict[str, float]:
    """One write job: markers + data files, then the commit's markers: its read (W8) and, once
    it has decided (W9), the cleanup (W10)."""
    manager, _ = filemanager.resolve(f"s3://{bucket}", storage_options=options)
    table, directory = job_paths(bucket)
    direct = markers.DirectMarkerClient(manager)
    done = multiprocessing.get_context("spawn").Value("i", 0)
    groups = [
        WriterGroup(files, writers, index, processes, bucket, options, endpoint)
        for index in range(processes)
    ]

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
    stop = threading.Event()

    def progress() -> None:
        while not stop.wait(10):
            log(f"  {mode}: {done.value}/{files} files written")

    reporter = threading.Thread(target=progress, daemon=True)
    reporter.start()
    try:
        write_s, latencies, data_latencies = run_writers(groups, done, proxy)
    finally:
        stop.set()
    written = proxy_call(proxy, "/_proxy/stats")
    # Check (uncounted) that every file is marked on storage.
    check, check_path = filemanager.resolve(directory, storage_options=options)
    marked = markers.read_marked_files(check, check_path)
    assert len(marked) == files, f"{mode}: {len(marked)} files marked, expected {files}"
    # The commit as spark_lib's writer makes it (writer.py, commit): W8 reads the markers
    # through the job's marker client (counted; timed apart, not part of the job's time as
    # before), W9 writes the outcome (uncounted, like the W2 above), W10 deletes the markers.
    cleaner: markers.MarkerClient = (
        direct if endpoint is None else HttpMarkerClient(endpoint, token=TOKEN, deadline_s=600)
    )
    before_read = proxy_call(proxy, "/_proxy/stats")
    started = time.monotonic()
    read = cleaner.seal(directory)
    read_s = time.monotonic() - started
    before_outcome = proxy_call(proxy, "/_proxy/stats")
    assert len(read) == files, f"{mode}: the commit read {len(read)} markers, expected {files}"
    manager.write_bytes(
        f"{table}/_sparkguard/timeline/{INSTANT}.outcome",
        b'{"outcome": "committed"}',
        overwrite=False,
    )
    before_cleanup = proxy_call(proxy, "/_proxy/stats")
    started = time.monotonic()
    cleaner.delete_dir(directory)
    cleanup_s = time.monotonic() - started
    cleaner.close()
    # The sidecar deletes a sealed directory after its answer (the commit does not wait for
    # W10): untimed, wait until storage has no marker left (asked of moto directly, past the
    # proxy, so the polls are not counted), then count the delete's requests.
    raw, raw_path = filemanager.resolve(directory, storage_options=raw_options)
    deadline = started + 120
    while True:
        raw.fs.invalidate_cache()
        if not markers.read_marked_files(raw, raw_path):
            break
        assert time.monotonic() < deadline, f"{mode}: markers still on storage after 120 s"
        time.sleep(0.01)
    gone_s = time.monotonic() - started
    after = proxy_call(proxy, "/_proxy/stats")
    # Marker requests include the marker service's own reads of the table's _sparkguard files
    # (the sidecar's fence: is the instant still undecided?), counted apart by the proxy.
    read_requests = sum(before_outcome.get(k, 0) - before_read.get(k, 0) for k in MARKER_CATEGORIES)
    cleanup_requests = sum(after.get(k, 0) - before_cleanup.get(k, 0) for k in MARKER_CATEGORIES)
    fence_requests = sum(
        stats.get("sparkguard", 0) - since.get("sparkguard", 0)
        for stats, since in ((written, {}), (before_outcome, before_read), (after, before_cleanup))
    )
    result = {
        "write_s": write_s,
        "read_s": read_s,
        "cleanup_s": cleanup_s,
        "gone_s": gone_s,
        "job_s": write_s + cleanup_s,
        "marker_requests": sum(written.get(k, 0) for k in MARKER_CATEGORIES)
        + read_requests
        + cleanup_requests,
        "fence_requests": fence_requests,
        "data_requests": written.get("data", 0),
        "throttled": after.get("throttled", 0),
        "ack_p50_ms": percentile(latencies, 0.5) * 1000,
        "ack_p99_ms": percentile(latencies, 0.99) * 1000,
    }
    upstream = {
        category: written.get(f"upstream_us:{category}", 0)
        / 1000
        / max(written.get(category, 0), 1)
        for category in ("data", "markers")
    }
    log(
        f"{mode}: mean upstream (moto) time per request in the write phase: data "
        f"{upstream['data']:.1f} ms, markers {upstream['markers']:.1f} ms (the proxy adds "
        f"its latency on top); data PUT as the writers saw it: p50 "
        f"{percentile(data_latencies, 0.5) * 1000:.1f} ms, p99 "
        f"{percentile(data_latencies, 0.99) * 1000:.1f} ms"
    )
    log(
        f"{mode}: write {write_s:.1f} s, commit read {read_s:.2f} s, cleanup {cleanup_s:.3f} s "
        f"(markers gone from storage after {gone_s:.2f} s), "
        f"marker requests "
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


def _create_request(host: str, port: int, directory: str, name: str) -> bytes:
    """The bytes ``HttpMarkerClient.create`` sends (http.client's header order, JSON body)."""
    body = json.dumps({"markerdir": directory, "markername": name}).encode()
    head = (
        f"POST /v1/markers/create HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Accept-Encoding: identity\r\nContent-Length: {len(body)}\r\n"
        f"Accept: application/json\r\nAuthorization: Bearer {TOKEN}\r\n"
        "Content-Type: application/json\r\n\r\n"
    )
    return head.encode() + body


async def _capacity_load(
    endpoint: str, directory: str, connections: int, per: int
) -> tuple[float, list[float]]:
    """``connections`` task connections, each sending ``per`` markers one at a time (the next
    once the previous is acknowledged), as ``HttpMarkerClient`` does: the same request bytes on
    a kept-alive connection. A lean client (asyncio streams, the requests prepared before the
    clock starts) so that one core of load drives the sidecar's core to its limit; every answer
    is read whole and must be a 200. Returns the wall time of the timed part and each
    marker's ack latency."""
    host, port_text = endpoint.removeprefix("http://").rsplit(":", 1)
    port = int(port_text)
    requests = [
        [
            _create_request(host, port, directory, f"c{c:04d}/part-{i:06d}-bench-c000.parquet")
            for i in range(per)
        ]
        for c in range(connections)
    ]
    streams = [await asyncio.open_connection(host, port) for _ in range(connections)]
    latencies: list[float] = []
    go = asyncio.Event()

    async def one(c: int) -> None:
        reader, writer = streams[c]
        await go.wait()
        for request in requests[c]:
            started = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            body = await reader.readexactly(length)
            if head[9:12] != b"200":
                raise RuntimeError(f"HTTP {head[9:12].decode()}: {body[:300]!r}")
            latencies.append(time.perf_counter() - started)

    tasks = [asyncio.create_task(one(c)) for c in range(connections)]
    await asyncio.sleep(0.2)  # every task waits on the event: the connections are all open
    started = time.perf_counter()
    go.set()
    try:
        await asyncio.gather(*tasks)
    finally:
        for _, writer in streams:
            writer.close()
    return time.perf_counter() - started, latencies


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far, from /proc (Linux)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pinning() -> tuple[set[int] | None, set[int] | None]:
    """(load generator's CPUs, sidecar's CPUs): two distinct cores when this process may use
    two, else ``(None, None)`` (both share whatever they get)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None, None
    return {cpus[0]}, {cpus[1]}


def capacity_phase(args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    """Acknowledged markers/s and ack latency of one sidecar on local disk, each mode in turn
    (order rotated by round); returns each round's figures per mode."""
    load_cpus, sidecar_cpus = _pinning()
    own = os.sched_getaffinity(0)
    if load_cpus is None:
        log("capacity: fewer than 2 CPUs available: load and sidecar share them (not pinned)")
    else:
        log(
            f"capacity: sidecar pinned to CPU {min(sidecar_cpus or ())}, load generator (this "
            f"process's event loop) to CPU {min(load_cpus)}; the machine's other processes are "
            f"not pinned (1-minute load {os.getloadavg()[0]:.1f})"
        )
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in BATCHED_MODES}
    with tempfile.TemporaryDirectory(prefix="sg-capacity-") as root:
        for n in range(args.rounds):
            for mode in rotated(BATCHED_MODES, n):
                table = f"{root}/{mode}-{n}"
                directory = f"{table}/_sparkguard/markers/{INSTANT}"
                timeline_dir = f"{table}/_sparkguard/timeline"
                os.makedirs(timeline_dir)  # the writer's W2: .inflight before any marker
                with open(f"{timeline_dir}/{INSTANT}.inflight", "wb") as inflight:
                    inflight.write(b"{}")
                with pinned_sidecar(free_port(), root, mode, sidecar_cpus) as (endpoint, pid):
                    # Untimed: the first marker loads the directory and writes MARKERS.type.
                    warm = HttpMarkerClient(endpoint, token=TOKEN, deadline_s=60)
                    warm.create(directory, "part-warm-up.parquet")
                    warm.close()
                    cpu_before = _cpu_seconds(pid)
                    if load_cpus is not None:
                        os.sched_setaffinity(0, load_cpus)
                    try:
                        elapsed, lat = asyncio.run(
                            _capacity_load(
                                endpoint,
                                directory,
                                args.capacity_connections,
                                args.capacity_per_connection,
                            )
                        )
                    finally:
                        os.sched_setaffinity(0, own)
                    sidecar_cpu = (_cpu_seconds(pid) - cpu_before) / elapsed
                loaded = markers.read_marked_files(*filemanager.resolve(directory))
                expected = args.capacity_connections * args.capacity_per_connection + 1
                assert len(loaded) == expected, f"{len(loaded)} markers on disk, want {expected}"
                result = {
                    "rate": len(lat) / elapsed,
                    "p50_ms": percentile(lat, 0.5) * 1000,
                    "p99_ms": percentile(lat, 0.99) * 1000,
                    "sidecar_cpu": sidecar_cpu,
                    "cpu_us": sidecar_cpu / (len(lat) / elapsed) * 1e6,
                    "load": os.getloadavg()[0],
                }
                results[mode].append(result)
                log(
                    f"round {n}: capacity on local fs, {mode}, {args.capacity_connections} "
                    f"connections x {args.capacity_per_connection}: {result['rate']:.0f} "
                    f"acknowledged markers/s, p50 {result['p50_ms']:.1f} ms, p99 "
                    f"{result['p99_ms']:.1f} ms, sidecar CPU {sidecar_cpu:.0%} of one core, "
                    f"{result['cpu_us']:.0f} us per marker (1-minute load {result['load']:.1f})"
                )
    return results


def _interval_ms(mode: str) -> int:
    """A mode's flush interval: its own setting, else the environment's, else the sidecar's
    default."""
    fields = {f.name: f.default for f in dataclasses.fields(sidecar_config.SidecarConfig)}
    default = str(fields["batch_interval_ms"])
    env = {"SPARKGUARD_SIDECAR_BATCH_INTERVAL_MS": default, **os.environ, **MODE_ENV.get(mode, {})}
    return int(env["SPARKGUARD_SIDECAR_BATCH_INTERVAL_MS"])


def report_capacity(results: dict[str, list[dict[str, float]]], connections: int) -> None:
    """One line per mode: its best round by markers/s, and every round's figures."""
    for mode, rounds in results.items():
        best = max(rounds, key=lambda r: r["rate"])
        each = ", ".join(
            f"{r['rate']:.0f}/s p99 {r['p99_ms']:.0f} ms ({r['cpu_us']:.0f} us/marker)"
            for r in rounds
        )
        print(
            f"capacity {mode} ({connections} connections, local disk, flush interval "
            f"{_interval_ms(mode)} ms): best {best['rate']:.0f} markers/s, p50 "
            f"{best['p50_ms']:.1f} ms, p99 {best['p99_ms']:.1f} ms; rounds: {each}"
        )


BATCHED_MODES = ("adaptive", "interval", "group-commit")
#: sidecar/config.py's default flush mode, with its defaults (batch size 24, 250 ms), which the
#: operator's chart passes on unchanged
SHIPPED = "adaptive"
#: settings a mode runs with besides the sidecar's defaults: interval at the tick it shipped
#: with before adaptive became the default (Hudi's 50 ms)
MODE_ENV: dict[str, dict[str, str]] = {"interval": {"SPARKGUARD_SIDECAR_BATCH_INTERVAL_MS": "50"}}


def report(runs: dict[str, list[dict[str, float]]], latency: dict[str, list[float]]) -> None:
    """Print the best round of each mode, latencies, per-round and best ratios."""
    modes = tuple(runs)
    print("best round of each mode (job time), and its marker requests:")
    best = {mode: min(runs[mode], key=lambda r: r["job_s"]) for mode in modes}
    for mode in modes:
        r = best[mode]
        print(
            f"  {mode:12s} write {r['write_s']:.1f} s, commit read {r['read_s']:.2f} s, "
            f"cleanup {r['cleanup_s']:.3f} s (gone after {r['gone_s']:.2f} s), "
            f"marker requests {r['marker_requests']:.0f} (outcome/inflight reads "
            f"{r['fence_requests']:.0f}), ack p50 {r['ack_p50_ms']:.1f} / "
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
        help="a short run (1,000 files, 20 capacity markers per connection), same writers "
        "and rounds",
    )
    parser.add_argument("--files", type=int, default=3_000)
    parser.add_argument("--writers", type=int, default=16)
    parser.add_argument(
        "--writer-processes",
        type=int,
        default=4,
        help="processes the job phase's writers run in (default 4, as a job's tasks run in "
        "several executors; 1: every writer a thread of this process, whose interpreter lock "
        "and S3 client then dominate each request's time)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every mode (>= 2)")
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--write-rate", type=float, default=3500.0)
    parser.add_argument(
        "--capacity-connections",
        type=int,
        default=400,
        help="task connections of the capacity phase (default 400: a driver's sidecar serving "
        "50 executors x 8 task slots, each task waiting for its marker's ack)",
    )
    parser.add_argument("--capacity-per-connection", type=int, default=50)
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--skip-capacity", action="store_true")
    parser.add_argument(
        "--capacity-only", action="store_true", help="only the capacity phase (no S3 server)"
    )
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error(f"--rounds {args.rounds}: use at least 2 (the order rotates by round)")
    if not 1 <= args.writer_processes <= args.writers:
        parser.error(
            f"--writer-processes {args.writer_processes}: use 1 to --writers ({args.writers})"
        )
    if args.quick:
        args.files, args.capacity_per_connection = 1_000, 20
    if args.capacity_only:
        report_capacity(capacity_phase(args), args.capacity_connections)
        return 0
    modes = ("direct", *BATCHED_MODES)
    log(
        f"markers benchmark: {args.files} files, {args.writers} writers in "
        f"{args.writer_processes} processes, {args.rounds} rounds "
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
                        processes=args.writer_processes,
                        options=options, raw_options=s3.storage_options, proxy=proxy,
                        endpoint=None,
                    )  # fmt: skip
                else:
                    with sidecar(free_port(), f"s3://{bucket}", proxy_env, mode) as endpoint:
                        result = run_job(
                            mode, files=args.files, writers=args.writers, bucket=bucket,
                            processes=args.writer_processes,
                            options=options, raw_options=s3.storage_options, proxy=proxy,
                            endpoint=endpoint,
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
                        f"round {n}: ack latency on S3 proxy, {mode}, "
                        f"{args.writers} writers x {per}: p50 {percentile(lat, 0.5) * 1000:.1f} "
                        f"ms, p99 {percentile(lat, 0.99) * 1000:.1f} ms"
                    )

    if not args.skip_capacity:
        report_capacity(capacity_phase(args), args.capacity_connections)
    report(runs, latency)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
