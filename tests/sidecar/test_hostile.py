"""The sidecar under hostile clients, and its fence on decided instants.

Every test but two drives a real ``python -m sparkguard.sidecar`` process, over raw sockets
where ``HttpMarkerClient`` would have sanitised the request, and ends by checking that the
process's RSS and open file descriptors stayed bounded (``/proc/<pid>/status`` and ``fd``) and
that every marker it acknowledged is on storage (the ``MARKERS<i>`` files, read back by the
library's reader). The two others drive the batcher in-process, to break a flush on purpose and
to put a rollback's claim exactly between the fence's check and the write. Only 127.0.0.1 is
used; every loop is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
import resource
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkguard.sidecar import batcher, config, errors, metrics, validation
from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors as lib_errors
from sparkguard.spark_lib.spark.marker_http import HttpMarkerClient
from sparkguard.spark_lib.storage import markers, rollback, timeline
from tests.sidecar.conftest import (
    TOKEN,
    free_port,
    marker_dir_under,
    open_fds,
    rss_kib,
    run_sidecar,
)

AUTH_LINE = f"Authorization: Bearer {TOKEN}\r\n".encode()
#: RSS a sidecar may grow by during one test (its baseline is ~60 MiB)
RSS_GROWTH_KIB = 64 * 1024
#: open fds a sidecar may hold above its baseline once every client connection is closed
FD_SLACK = 8
TIMELINE_TYPE = markers.MarkerType.TIMELINE_SERVER_BASED.value


@dataclasses.dataclass
class Sidecar:
    """A running sidecar process and what the test needs to talk to it and judge it."""

    process: Any
    port: int
    log_path: Path
    baseline_fds: int
    baseline_rss_kib: int

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, **kwargs: Any) -> HttpMarkerClient:
        return HttpMarkerClient(self.endpoint, token=TOKEN, **{"deadline_s": 30.0, **kwargs})

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def assert_bounded(self) -> None:
        """RSS grew by less than RSS_GROWTH_KIB; the fds of closed connections were released."""
        pid = self.process.pid
        deadline = time.monotonic() + 15
        while open_fds(pid) > self.baseline_fds + FD_SLACK and time.monotonic() < deadline:
            time.sleep(0.05)  # the sidecar closes its side when it notices the client's close
        assert open_fds(pid) <= self.baseline_fds + FD_SLACK, (
            f"{open_fds(pid)} fds open, baseline {self.baseline_fds}"
        )
        assert rss_kib(pid) < self.baseline_rss_kib + RSS_GROWTH_KIB


@contextlib.contextmanager
def sidecar(
    root: str,
    tmp_path: Path,
    env: dict[str, str] | None = None,
    *,
    preexec_fn: Callable[[], None] | None = None,
) -> Iterator[Sidecar]:
    port = free_port()
    log_path = tmp_path / f"sidecar-{port}.log"
    full_env = {"SPARKGUARD_SIDECAR_LOG_LEVEL": "INFO", **(env or {})}
    with run_sidecar(
        port=port, roots=root, extra_env=full_env, log_path=log_path, preexec_fn=preexec_fn
    ) as process:
        yield Sidecar(process, port, log_path, open_fds(process.pid), rss_kib(process.pid))
        assert process.poll() is None, "the sidecar died"


@dataclasses.dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict[str, Any]:
        value = json.loads(self.body)
        assert isinstance(value, dict)
        return value


def read_answer(sock: socket.socket) -> Answer:
    """One HTTP answer from ``sock`` (raises AssertionError when it closes without one)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"the connection closed without an answer after {data!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        key, _, value = line.partition(":")
        headers[key.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return Answer(int(lines[0].split()[1]), headers, rest[:length])


def post_head(
    length: int,
    *,
    content_type: bytes = b"application/json",
    auth: bytes = AUTH_LINE,
) -> bytes:
    return (
        b"POST /v1/markers/create HTTP/1.1\r\nHost: sidecar\r\n"
        + auth
        + b"Content-Type: "
        + content_type
        + b"\r\nContent-Length: "
        + str(length).encode()
        + b"\r\n\r\n"
    )


def raw_post(port: int, body: bytes, **head: Any) -> Answer:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(post_head(len(body), **head) + body)
        return read_answer(sock)


def create_markers(sc: Sidecar, directory: str, count: int, *, prefix: str) -> set[str]:
    """Create ``count`` markers through the real client; the data files acknowledged."""
    acked = set()
    with sc.client() as client:
        for i in range(count):
            name = f"{prefix}-{i:04d}.parquet"
            client.create(directory, name)
            acked.add(name)
    return acked


def assert_durable(directory: str, acked: set[str]) -> None:
    manager, path = filemanager.resolve(directory)
    missing = acked - markers.read_marked_files(manager, path)
    assert not missing, f"{len(missing)} acknowledged markers are not on storage"


def wait_for_log(sc: Sidecar, fragment: str, *, timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while fragment not in sc.log():
        assert time.monotonic() < deadline, f"{fragment!r} never logged:\n{sc.log()[-2000:]}"
        time.sleep(0.05)


# -- severe: a marker name Python made from a non-UTF-8 file name ------------------------------
def test_lone_surrogate_name_is_400_and_leaks_no_place(root: str, tmp_path: Path) -> None:
    directory = marker_dir_under(root)
    # 20 bad requests against 8 places: one leaked place each would leave none for the rest.
    with sidecar(root, tmp_path, {"SPARKGUARD_SIDECAR_MAX_PENDING": "8"}) as sc:
        with sc.client(deadline_s=5, request_timeout_s=3) as client:
            for i in range(20):
                with pytest.raises(lib_errors.MarkerError, match=r"HTTP 400.*lone surrogate"):
                    client.create(directory, f"\udc80bad-{i}.parquet")
        acked = create_markers(sc, directory, 40, prefix="good")
        with socket.create_connection(("127.0.0.1", sc.port), timeout=10) as sock:
            sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: sidecar\r\n\r\n")
            assert read_answer(sock).json()["pending"] == 0
        assert "Traceback" not in sc.log()
        sc.assert_bounded()
    assert_durable(directory, acked)


async def test_an_error_in_a_flush_answers_its_whole_batch(root: str) -> None:
    """A name no batch file can hold, slipped past validation, breaks its flush: every request
    of that batch is still answered, and its places are released for the next ones."""
    settings = config.SidecarConfig(
        allowed_roots=(root,), auth_disabled=True, flush_mode=config.FlushMode.GROUP_COMMIT
    )
    marker_batcher = batcher.MarkerBatcher(settings, metrics.build_metrics())
    marker_batcher.start()
    directory = validation.validate_marker_dir(marker_dir_under(root), allowed_roots=(root,))
    try:
        answers = await asyncio.wait_for(
            asyncio.gather(
                marker_batcher.create(directory, "\udc80x.parquet.marker.CREATE"),
                marker_batcher.create(directory, "a.parquet.marker.CREATE"),
                marker_batcher.create(directory, "b.parquet.marker.CREATE"),
                return_exceptions=True,
            ),
            timeout=30,
        )
        assert isinstance(answers[0], errors.UnavailableError)  # 503: nothing acknowledged
        assert marker_batcher.pending == 0
        assert await asyncio.wait_for(
            marker_batcher.create(directory, "c.parquet.marker.CREATE"), timeout=30
        )
    finally:
        await marker_batcher.drain(5)
        await marker_batcher.close()
    acked = {"c.parquet"} | {
        f"{n}.parquet" for n, answer in zip("ab", answers[1:], strict=True) if answer is True
    }
    assert_durable(marker_dir_under(root), acked)


class ClaimDuringWrite:
    """The local file manager, but a rollback claims the instant just before a batch file is
    written: the window between the sidecar's check before a flush and its write."""

    def __init__(self, inner: filemanager.FileManager, claim: Callable[[], object]) -> None:
        self._inner = inner
        self._claim = claim

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def write_bytes(self, path: str, data: bytes, *, overwrite: bool = False) -> None:
        if Path(path).name == "MARKERS0":
            self._claim()
        self._inner.write_bytes(path, data, overwrite=overwrite)

    @property
    def versioned_writes(self) -> bool:
        return self._inner.versioned_writes

    def write_versioned(self, path: str, data: bytes, expected: str | None) -> str:
        # Where the store has versioned writes, the sidecar creates a batch file this way.
        if Path(path).name == "MARKERS0":
            self._claim()
        return self._inner.write_versioned(path, data, expected)


async def test_a_claim_between_check_and_write_refuses_the_batch(root: str) -> None:
    table = f"{root}/orders"
    tl, instant = _start_instant(table)
    directory = markers.marker_dir(table, instant)
    local, _ = filemanager.resolve(directory)
    manager: Any = ClaimDuringWrite(local, lambda: tl.claim_rollback(instant))
    settings = config.SidecarConfig(allowed_roots=(root,), auth_disabled=True)
    marker_batcher = batcher.MarkerBatcher(
        settings, metrics.build_metrics(), managers={"file": manager}
    )
    marker_batcher.start()
    marker_dir = validation.validate_marker_dir(directory, allowed_roots=(root,))
    try:
        with pytest.raises(errors.InstantDecidedError, match=re.escape(instant)):
            await asyncio.wait_for(
                marker_batcher.create(marker_dir, "a.parquet.marker.CREATE"), timeout=30
            )
        assert marker_batcher.pending == 0
    finally:
        await marker_batcher.drain(5)
        await marker_batcher.close()
    # Written, but never acknowledged: its task fails before writing a.parquet.
    assert markers.read_marked_files(local, directory) == {"a.parquet"}
    assert tl.status(instant).state is timeline.State.ROLLING_BACK


# -- malformed requests: the client's fault, 4xx, one line, no traceback -----------------------
def test_malformed_requests_get_4xx_and_one_log_line_each(root: str, tmp_path: Path) -> None:
    directory = marker_dir_under(root)
    good = json.dumps({"markerdir": directory, "markername": "x.parquet"}).encode()
    cases: list[tuple[bytes, dict[str, Any], int, str]] = [
        (b'{"markerdir": "\xff\xfe", "markername": "a"}', {}, 400, "not valid UTF-8"),
        (b"[" * 30_000 + b"]" * 30_000, {}, 400, "nested too deeply"),
        (b'{"markerdir": ' + b"1" * 5_000 + b"}", {}, 400, "Exceeds the limit (4300 digits)"),
        (good, {"content_type": b"application/json; charset=bogus"}, 400, "unsupported charset"),
        (good, {"auth": b"Authorization: Bearer s3cr3t\xe9\xff\r\n"}, 401, "non-ASCII"),
        (b"--x\r\n\r\n--x--\r\n", {"content_type": b"multipart/form-data"}, 400, "multipart"),
    ]
    # Requests aiohttp's parser refuses (400) before the app sees them: logged by aiohttp.
    unparsable = [
        (
            b"POST /v1/markers/create HTTP/1.1\r\nHost: sidecar\r\n"
            + AUTH_LINE
            + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
            "Invalid character in chunk size",
        ),
        (
            b"GET /healthz HTTP/1.1\r\nHost: sidecar\r\nX: " + b"a" * 20_000 + b"\r\n\r\n",
            "LineTooLong",
        ),
    ]
    with sidecar(root, tmp_path) as sc:
        for body, head, status, fragment in cases:
            answer = raw_post(sc.port, body, **head)
            assert (answer.status, fragment in answer.json()["error"]) == (status, True), answer
        for request, _ in unparsable:
            with socket.create_connection(("127.0.0.1", sc.port), timeout=10) as sock:
                sock.sendall(request)
                assert read_answer(sock).status == 400
        acked = create_markers(sc, directory, 10, prefix="after")
        wait_for_log(sc, unparsable[-1][1])
        log = sc.log()
        assert "Traceback" not in log
        for fragment in [case[3] for case in cases] + [case[1] for case in unparsable]:
            assert sum(fragment in line for line in log.splitlines()) == 1, log
        sc.assert_bounded()
    assert_durable(directory, acked)


def test_client_hanging_up_mid_body_is_one_quiet_line(root: str, tmp_path: Path) -> None:
    directory = marker_dir_under(root)
    with sidecar(root, tmp_path) as sc:
        for _ in range(20):
            with socket.create_connection(("127.0.0.1", sc.port), timeout=10) as sock:
                sock.sendall(post_head(4096) + b'{"markerdir": "')
        wait_for_log(sc, "the request body could not be read")
        acked = create_markers(sc, directory, 10, prefix="after")
        assert "Traceback" not in sc.log()
        sc.assert_bounded()
    assert_durable(directory, acked)


# -- names no store takes: 400 before any storage call -----------------------------------------
def test_overlong_table_segment_or_job_id_is_400_and_touches_no_storage(
    root: str, tmp_path: Path
) -> None:
    too_long = [
        marker_dir_under(root, table="t" * 300, opened=False),
        marker_dir_under(root, instant="20261122120000000-" + "j" * 300, opened=False),
        # job ids: <= 100 characters
        marker_dir_under(root, instant="20261122120000000-" + "j" * 120, opened=False),
        marker_dir_under("s3://bucket/" + "/".join(["d" * 200] * 5)),  # S3 keys: <= 1024 bytes
    ]
    with sidecar(f"{root},s3://bucket", tmp_path) as sc:
        for directory in too_long:
            body = json.dumps({"markerdir": directory, "markername": "a.parquet"}).encode()
            answer = raw_post(sc.port, body)
            assert answer.status == 400, answer
            assert "retry-after" not in answer.headers
        assert list(Path(root).iterdir()) == []  # not even a directory was made
        directory = marker_dir_under(root)
        acked = create_markers(sc, directory, 5, prefix="ok")
        sc.assert_bounded()
    assert_durable(directory, acked)


# -- slow clients: bounded header and body read times --------------------------------------------
def test_slow_headers_and_bodies_are_cut_off(root: str, tmp_path: Path) -> None:
    directory = marker_dir_under(root)
    env = {"SPARKGUARD_SIDECAR_HEADER_TIMEOUT_S": "1", "SPARKGUARD_SIDECAR_BODY_TIMEOUT_S": "1"}
    with sidecar(root, tmp_path, env) as sc:
        slow = []
        try:
            for _ in range(200):
                sock = socket.create_connection(("127.0.0.1", sc.port), timeout=20)
                slow.append(sock)
                sock.sendall(b"POST /v1/markers/create HTTP/1.1\r\nHost: sidecar\r\n")
            # Served meanwhile (each request of the client completes its head at once).
            acked = create_markers(sc, directory, 20, prefix="during")
            for sock in slow:
                assert sock.recv(1024) == b""  # closed by the sidecar, well before 20 s
        finally:
            for sock in slow:
                sock.close()
        with socket.create_connection(("127.0.0.1", sc.port), timeout=20) as sock:
            sock.sendall(post_head(100) + b'{"markerdir"')
            answer = read_answer(sock)
        assert answer.status == 408
        assert "SPARKGUARD_SIDECAR_BODY_TIMEOUT_S" in answer.json()["error"]
        assert "Traceback" not in sc.log()
        sc.assert_bounded()
    assert_durable(directory, acked)


def _low_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


def test_connection_flood_under_a_low_fd_limit_is_shed_quietly(root: str, tmp_path: Path) -> None:
    """300 slow connections against a sidecar limited to 256 open files: the ones past its
    connection limit get 503 at once, the others are cut at the header timeout, markers keep
    being acknowledged, and the log stays a few lines."""
    directory = marker_dir_under(root)
    env = {"SPARKGUARD_SIDECAR_HEADER_TIMEOUT_S": "2", "SPARKGUARD_SIDECAR_BATCH_THREADS": "4"}
    with sidecar(root, tmp_path, env, preexec_fn=_low_fd_limit) as sc:
        flood = []
        statuses: list[int | None] = []
        try:
            for _ in range(300):
                sock = socket.create_connection(("127.0.0.1", sc.port), timeout=20)
                flood.append(sock)
                sock.sendall(b"POST /v1/markers/create HTTP/1.1\r\nHost: sidecar\r\n")
            acked = create_markers(sc, directory, 20, prefix="flood")
            for sock in flood:
                data = sock.recv(4096)
                statuses.append(int(data.split()[1]) if data else None)
        finally:
            for sock in flood:
                sock.close()
        # Past the limit the fd budget allows: 503 at once. How many depends on how fast the
        # kernel hands over connections beyond the listen backlog; the rest are cut at the
        # header timeout.
        refused = statuses.count(503)
        assert refused > 0, statuses
        assert statuses.count(None) + refused == 300, statuses
        acked |= create_markers(sc, directory, 20, prefix="after")
        log = sc.log()
        assert "Traceback" not in log
        assert len(log.encode()) < 16 * 1024, log[-3000:]
        assert open_fds(sc.process.pid) <= 256
        sc.assert_bounded()
    assert_durable(directory, acked)


# -- the fence: no marker for a decided instant ------------------------------------------------
def _start_instant(table: str) -> tuple[timeline.Timeline, str]:
    tl = timeline.timeline_for(table)
    instant = tl.start("job-1", attempt=1, marker_type=TIMELINE_TYPE)
    return tl, instant


def test_markers_of_a_rolled_back_or_committed_instant_are_refused(
    root: str, tmp_path: Path
) -> None:
    table = f"{root}/orders"
    tl, instant = _start_instant(table)
    directory = markers.marker_dir(table, instant)
    committed_tl, committed = _start_instant(f"{root}/customers")
    committed_dir = markers.marker_dir(f"{root}/customers", committed)
    with sidecar(root, tmp_path) as sc, sc.client(deadline_s=10) as client:
        for i in range(3):
            client.create(directory, f"part-{i}.parquet")
            Path(table, f"part-{i}.parquet").write_bytes(b"data")
        client.create(committed_dir, "part-0.parquet")
        summary = rollback.rollback_table(table, job_id="job-1")
        assert summary.files_deleted == 3
        for name in ("part-late.parquet", "part-0.parquet"):  # a new one, and a retried one
            with pytest.raises(
                lib_errors.MarkerError, match=rf"HTTP 409.*instant {re.escape(instant)}"
            ) as refusal:
                client.create(directory, name)
            # Not retried: the task fails at once, not at the client's deadline.
            assert not isinstance(refusal.value, lib_errors.MarkerServiceUnavailableError)
        # The commit as the writer makes it: its read of the markers (W8) seals the directory,
        # so a straggler is refused before the outcome exists (W9) as after, with no lookup.
        assert client.seal(committed_dir) == {"part-0.parquet"}
        for phase in ("between W8 and W9", "after W9"):
            if phase == "after W9":
                committed_tl.commit(committed, [])
            with pytest.raises(
                lib_errors.MarkerError, match=rf"HTTP 409.*instant {re.escape(committed)}"
            ):
                client.create(committed_dir, "part-1.parquet")
        assert markers.read_marked_files(*filemanager.resolve(committed_dir)) == {"part-0.parquet"}
        assert "Traceback" not in sc.log()
        sc.assert_bounded()
    manager, path = filemanager.resolve(directory)
    assert not manager.exists(path)  # nothing was appended to the rolled-back instant
    assert sorted(p.name for p in Path(table).iterdir()) == ["_sparkguard"]
    assert tl.status(instant).state is timeline.State.ROLLED_BACK


def test_markers_of_an_instant_removed_with_its_location_are_refused_by_the_next_sidecar(
    root: str, tmp_path: Path
) -> None:
    """A lingering executor of a killed first write asks the *next* driver pod's sidecar (fresh
    state) for a marker after the rollback removed the location the write created: the
    instant's outcome is gone with it, its missing ``.inflight`` refuses the marker (409), and
    nothing re-creates the location."""
    table = f"{root}/orders"
    tl = timeline.timeline_for(table)
    instant = tl.start(
        "job-1", attempt=1, marker_type=TIMELINE_TYPE, extra={"createdLocation": True}
    )
    directory = markers.marker_dir(table, instant)
    with sidecar(root, tmp_path) as sc, sc.client(deadline_s=10) as client:
        client.create(directory, "part-0.parquet")
        Path(table, "part-0.parquet").write_bytes(b"data")
    summary = rollback.rollback_table(table, job_id="job-1")
    assert summary.tables_removed == (table,)
    assert not Path(table).exists()
    with sidecar(root, tmp_path) as sc, sc.client(deadline_s=10) as client:
        with pytest.raises(
            lib_errors.MarkerError, match=rf"HTTP 409.*instant {re.escape(instant)}"
        ):
            client.create(directory, "part-1.parquet")
        assert "Traceback" not in sc.log()
    assert not Path(table).exists()


def test_markers_racing_a_rollback_are_refused_or_found(root: str, tmp_path: Path) -> None:
    """Tasks keep marking and writing while a real rollback claims the instant: each one is
    refused (409) once the claim is visible, and two rollback passes leave no data file."""
    table = f"{root}/orders"
    _, instant = _start_instant(table)
    directory = markers.marker_dir(table, instant)
    env = {"SPARKGUARD_SIDECAR_BATCH_INTERVAL_MS": "2", "SPARKGUARD_SIDECAR_BATCH_THREADS": "4"}
    refused: list[str] = []
    unexpected: list[BaseException] = []
    acked = 0
    started = threading.Event()
    lock = threading.Lock()

    def task(w: int, sc: Sidecar) -> None:
        nonlocal acked
        with sc.client(deadline_s=20) as client:
            for i in range(5_000):  # bounded; a 409 ends it long before
                name = f"w{w}-part-{i:05d}.parquet"
                try:
                    client.create(directory, name)
                except lib_errors.MarkerError as exc:
                    (refused if "HTTP 409" in str(exc) else unexpected).append(exc)
                    return
                Path(table, name).write_bytes(b"data")  # marker first, then the file
                with lock:
                    acked += 1
                    if acked >= 60:
                        started.set()
            unexpected.append(AssertionError(f"task {w} was never refused"))

    with sidecar(root, tmp_path, env) as sc:
        threads = [threading.Thread(target=task, args=(w, sc)) for w in range(4)]
        for thread in threads:
            thread.start()
        assert started.wait(60), "the tasks did not get going"
        rollback.rollback_table(table, job_id="job-1")
        for thread in threads:
            thread.join(timeout=60)
            assert not thread.is_alive()
        assert not unexpected, unexpected
        assert len(refused) == 4
        rollback.rollback_table(table, job_id="job-1")  # the pass that catches late files
        sc.assert_bounded()
    left = sorted(p.name for p in Path(table).iterdir() if p.name != "_sparkguard")
    assert left == [], f"{len(left)} data files outlived two rollback passes: {left[:5]}"
