"""HttpMarkerClient against a real sidecar server, a flaky one, and no server at all."""

from __future__ import annotations

import asyncio
import re
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from sparkguard.sidecar import app, config
from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors
from sparkguard.spark_lib.spark import marker_http
from sparkguard.spark_lib.spark.marker_http import HttpMarkerClient
from sparkguard.spark_lib.storage import markers
from tests.sidecar.conftest import TOKEN, free_port, marker_dir_under


@pytest.fixture
async def endpoint(
    aiohttp_server: Callable[..., Any], make_config: Callable[..., config.SidecarConfig]
) -> str:
    server: TestServer = await aiohttp_server(app.create_app(make_config()))
    return f"http://127.0.0.1:{server.port}"


async def test_client_round_trip(endpoint: str, root: str) -> None:
    directory = marker_dir_under(root)
    client = HttpMarkerClient(endpoint, token=TOKEN, deadline_s=10)
    try:
        assert not await asyncio.to_thread(client.dir_exists, directory)
        await asyncio.to_thread(client.create, directory, "p=1/part-00000.parquet")
        await asyncio.to_thread(
            client.create, directory, "part-00001.parquet", markers.IOType.MERGE
        )
        await asyncio.to_thread(
            client.create, directory, "part-00002.parquet", markers.IOType.APPEND
        )
        await asyncio.to_thread(client.create, directory, "p=1/part-00000.parquet")  # a retry
        expected = {"p=1/part-00000.parquet", "part-00001.parquet", "part-00002.parquet"}
        assert await asyncio.to_thread(client.all_marked, directory) == expected
        manager, path = filemanager.resolve(directory)
        assert markers.read_marked_files(manager, path) == expected
        assert markers.read_type(manager, path) is markers.MarkerType.TIMELINE_SERVER_BASED
        assert await asyncio.to_thread(client.dir_exists, directory)
        await asyncio.to_thread(client.delete_dir, directory)
        assert not await asyncio.to_thread(client.dir_exists, directory)
        assert await asyncio.to_thread(client.all_marked, directory) == set()
    finally:
        client.close()


async def test_client_reports_refusals_without_retrying(
    aiohttp_server: Callable[..., Any], make_config: Callable[..., config.SidecarConfig], root: str
) -> None:
    requests: list[str] = []

    @web.middleware
    async def count(request: web.Request, handler: Any) -> web.StreamResponse:
        requests.append(request.path)
        response: web.StreamResponse = await handler(request)
        return response

    application = app.create_app(make_config())
    application.middlewares.insert(0, count)
    server: TestServer = await aiohttp_server(application)
    endpoint = f"http://127.0.0.1:{server.port}"
    directory = marker_dir_under(root)
    bad_token = HttpMarkerClient(endpoint, token="nope", deadline_s=10)
    with pytest.raises(errors.MarkerError, match="HTTP 401: wrong bearer token"):
        await asyncio.to_thread(bad_token.create, directory, "a.parquet")
    assert requests == ["/v1/markers/create"]  # one request: a refusal is not retried
    client = HttpMarkerClient(endpoint, token=TOKEN, deadline_s=10)
    with pytest.raises(errors.MarkerError, match="outside the sidecar's allowed roots"):
        await asyncio.to_thread(
            client.create, "/etc/t/_sparkguard/markers/20261122120000000-j", "a"
        )
    assert len(requests) == 2
    with pytest.raises(errors.InvalidPathError):
        await asyncio.to_thread(client.create, directory, "../escape")
    assert len(requests) == 2  # refused by the client before any request
    client.close()
    bad_token.close()


async def test_token_file_is_reread_after_401(endpoint: str, root: str, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("old-token\n")
    client = HttpMarkerClient(endpoint, token_file=str(token_file), deadline_s=10)
    with pytest.raises(errors.MarkerError, match="401"):
        await asyncio.to_thread(client.create, marker_dir_under(root), "a")
    token_file.write_text(TOKEN + "\n")  # the secret was rotated
    await asyncio.to_thread(client.create, marker_dir_under(root), "a")
    client.close()


async def test_client_retries_unavailable_answers(aiohttp_server: Callable[..., Any]) -> None:
    calls: list[int] = []

    async def flaky(request: web.Request) -> web.Response:
        calls.append(1)
        if len(calls) < 3:
            return web.json_response(
                {"error": "queue full"}, status=503, headers={"Retry-After": "0"}
            )
        if len(calls) == 3:
            # Hang up mid-request: a connection-level failure.
            assert request.transport is not None
            request.transport.close()
        return web.json_response({"markername": "a.marker.CREATE", "created": True})

    application = web.Application()
    application.router.add_post("/v1/markers/create", flaky)
    server: TestServer = await aiohttp_server(application)
    client = HttpMarkerClient(f"http://127.0.0.1:{server.port}", deadline_s=10)
    await asyncio.to_thread(client.create, "/x/_sparkguard/markers/20261122120000000-j", "a")
    assert len(calls) == 4
    client.close()


class FakeClock:
    """The client's clock and sleep: time moves only when the client sleeps (or a test says a
    blocked read took its timeout), so the deadline logic is checked without wall time."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def longest_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Full jitter draws uniform(0, backoff): take the top of the range, deterministically."""
    monkeypatch.setattr(marker_http.random, "uniform", lambda low, high: high)


def attempts_in(message: str) -> int:
    found = re.search(r"\((\d+) attempts\)", message)
    assert found, message
    return int(found.group(1))


@pytest.mark.timeout(60)  # a safety net against a hang, not a measurement
def test_unreachable_sidecar_fails_within_the_deadline(longest_backoff: None) -> None:
    port = free_port()  # nothing listens there: every connect is refused at once
    clock = FakeClock()
    client = HttpMarkerClient(
        f"http://127.0.0.1:{port}", token=TOKEN, deadline_s=1.5, clock=clock, sleep=clock.sleep
    )
    started = clock.now
    with pytest.raises(errors.MarkerServiceUnavailableError) as caught:
        client.create("/x/_sparkguard/markers/20261122120000000-j", "a.parquet")
    message = str(caught.value)
    # Backoff 0.05, 0.1, 0.2, 0.4 s (doubling); the next, 0.8 s, would end past the 1.5 s
    # deadline (0.75 + 0.8), so the client gives up after the fifth attempt, without sleeping.
    assert clock.sleeps == pytest.approx([0.05, 0.1, 0.2, 0.4])
    assert attempts_in(message) == 5 == len(clock.sleeps) + 1
    assert clock.now - started < 1.5
    assert f"127.0.0.1:{port}" in message
    assert "within 1.5 s" in message
    assert "ConnectionRefusedError" in message


@pytest.mark.timeout(60)  # a safety net against a hang, not a measurement
def test_silent_sidecar_does_not_hang_the_client(longest_backoff: None) -> None:
    # A listener that never accepts nor answers: connects succeed, reads time out. Each read
    # really blocks for its socket timeout; the fake clock is moved by that timeout, so what is
    # checked is the client's arithmetic: every attempt's timeout is the request timeout clipped
    # to the time left, and the attempts stop at the deadline.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        port = listener.getsockname()[1]

        def run(deadline_s: float, request_timeout_s: float) -> tuple[list[float], str, float]:
            clock = FakeClock()
            client = HttpMarkerClient(
                f"http://127.0.0.1:{port}", deadline_s=deadline_s,
                request_timeout_s=request_timeout_s, clock=clock, sleep=clock.sleep,
            )  # fmt: skip
            send = client._send
            timeouts: list[float] = []

            def timed_send(*args: Any) -> Any:
                try:
                    return send(*args)
                except TimeoutError:
                    assert client._conn is not None
                    assert client._conn.sock is not None
                    timeout = client._conn.sock.gettimeout()
                    assert timeout is not None, "a read without a timeout could hang forever"
                    timeouts.append(timeout)
                    clock.now += timeout  # the read blocked that long
                    raise

            client._send = timed_send  # type: ignore[method-assign]
            started = clock.now
            with pytest.raises(errors.MarkerServiceUnavailableError, match="timed out") as caught:
                client.all_marked("/x/_sparkguard/markers/20261122120000000-j")
            client.close()
            assert attempts_in(str(caught.value)) == len(timeouts) == len(clock.sleeps) + 1
            return timeouts, str(caught.value), clock.now - started

        # Reads of 0.2 s, backoff 0.05, 0.1, 0.2: 0.2+0.05+0.2+0.1+0.2+0.2+0.2 = 1.15 s, and the
        # next backoff (0.4 s) would end past 1.5 s: four attempts.
        timeouts, _, spent = run(deadline_s=1.5, request_timeout_s=0.2)
        assert timeouts == pytest.approx([0.2] * 4)
        assert spent < 1.5
        # A request timeout longer than the deadline is clipped to the time left: one attempt
        # whose read gives up at the deadline (0.3 s), not after 10 s.
        timeouts, _, spent = run(deadline_s=0.3, request_timeout_s=10.0)
        assert timeouts == pytest.approx([0.3])
        assert spent == pytest.approx(0.3)


def test_bad_endpoint_and_options_are_config_errors() -> None:
    with pytest.raises(errors.ConfigError, match="not an http"):
        HttpMarkerClient("127.0.0.1:26754")
    with pytest.raises(errors.ConfigError, match="deadline_s"):
        HttpMarkerClient("http://127.0.0.1:1", deadline_s=0)
    with pytest.raises(errors.ConfigError, match="not both"):
        HttpMarkerClient("http://127.0.0.1:1", token="a", token_file="/b")


def test_client_module_needs_no_aiohttp() -> None:
    import subprocess

    code = (
        "import sys; sys.modules['aiohttp'] = None\n"
        "from sparkguard.spark_lib.spark import marker_http\n"
        "assert 'aiohttp' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONSAFEPATH": "1"})
