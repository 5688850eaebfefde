"""Every 4xx is exactly one INFO line naming its status, never a traceback (docs/sidecar.md).

The app is served in-process with the logger, filter and access-log settings of the real
server, so aiohttp's own lines (a request its parser refuses, a body it fails to discard after
the answer) are counted too. Requests go over raw sockets with ``Connection: close``: the
server's close is the signal that everything it logs about the request has been logged.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sparkguard.sidecar import app, config, server
from sparkguard.spark_lib.storage import timeline
from tests.sidecar.conftest import INSTANT, TOKEN, marker_dir_under

AUTH = f"Authorization: Bearer {TOKEN}\r\n".encode()
MAX_BODY = 1024


def post(
    path: str,
    body: bytes,
    *,
    auth: bytes = AUTH,
    content_type: bytes = b"application/json",
    extra: bytes = b"",
) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: sidecar\r\nConnection: close\r\n".encode()
        + auth
        + b"Content-Type: "
        + content_type
        + b"\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n"
        + extra
        + b"\r\n"
        + body
    )


def get(path: str | bytes, *, auth: bytes = AUTH, extra: bytes = b"") -> bytes:
    target = path if isinstance(path, bytes) else path.encode()
    return (
        b"GET "
        + target
        + b" HTTP/1.1\r\nHost: sidecar\r\nConnection: close\r\n"
        + (auth + extra + b"\r\n")
    )


def marker(directory: str, name: str) -> bytes:
    return json.dumps({"markerdir": directory, "markername": name}).encode()


def broken_gzip(directory: str) -> bytes:
    return gzip.compress(marker(directory, "a.parquet"))[:12] + b"\xff" * 40


#: name -> (the request, given the marker directory; the status it is answered with)
CASES: dict[str, tuple[Callable[[str], bytes], int]] = {
    "invalid name": (lambda d: post("/v1/markers/create", marker(d, "../x")), 400),
    "escape not utf-8": (
        lambda d: post(f"/v1/markers/create?markerdir={d}&markername=%FF", b""),
        400,
    ),
    "duplicate json key": (
        lambda d: post(
            "/v1/markers/create",
            f'{{"markerdir": "{d}", "markername": "a", "markername": "b"}}'.encode(),
        ),
        400,
    ),
    "no token": (lambda d: post("/v1/markers/create", marker(d, "a"), auth=b""), 401),
    "outside the roots": (
        lambda d: post(
            "/v1/markers/create", marker(f"/elsewhere/t/_sparkguard/markers/{INSTANT}", "a")
        ),
        403,
    ),
    "unknown route": (lambda d: get("/v1/markers/nope"), 404),
    "wrong method": (lambda d: get(f"/v1/markers/create?markerdir={d}&markername=a"), 405),
    "decided instant": (lambda d: post("/v1/markers/create", marker(d, "late.parquet")), 409),
    "body too large": (lambda d: post("/v1/markers/create", marker(d, "a" * 2 * MAX_BODY)), 413),
    "broken gzip": (
        lambda d: post("/v1/markers/create", broken_gzip(d), extra=b"Content-Encoding: gzip\r\n"),
        400,
    ),
    "broken gzip without token": (
        lambda d: post(
            "/v1/markers/create", broken_gzip(d), auth=b"", extra=b"Content-Encoding: gzip\r\n"
        ),
        401,
    ),
    "broken chunked body": (
        lambda d: (
            b"POST /v1/markers/create HTTP/1.1\r\nHost: sidecar\r\n"
            + AUTH
            + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n"
        ),
        400,
    ),
    "header line too long": (
        lambda d: get("/healthz", extra=b"X: " + b"a" * 20_000 + b"\r\n"),
        400,
    ),
    "raw byte in the query": (
        lambda d: get(b"/v1/markers/all?markerdir=\xff"),
        400,
    ),
}


def decide(timeline_dir: Path) -> None:
    """Write the instant's outcome: its markers are refused (409) from now on."""
    timeline_dir.mkdir(parents=True, exist_ok=True)
    (timeline_dir / f"{INSTANT}.outcome").write_text("{}")


async def exchange(port: int, request: bytes) -> int:
    """Send ``request``, read until the server closes; the answer's status."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), timeout=30)  # a hang guard, not a measure
    finally:
        writer.close()
    return int(data.split(b" ", 2)[1])


@pytest.mark.parametrize("case", list(CASES))
async def test_every_4xx_is_one_info_line(
    case: str,
    aiohttp_server: Callable[..., Any],
    make_config: Callable[..., config.SidecarConfig],
    root: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = make_config(max_body_bytes=MAX_BODY)
    server.install_log_filter()
    test_server = await aiohttp_server(app.create_app(settings), **server.runner_options(settings))
    directory = marker_dir_under(root)
    request, status = CASES[case]
    caplog.set_level(logging.INFO)
    if case == "decided instant":
        decide(Path(root, "table", timeline.SPARKGUARD_DIR, timeline.TIMELINE_DIR))
        # The first sighting adds the instant's own WARNING; count a later request alone.
        assert await exchange(test_server.port, request(directory)) == 409
    caplog.clear()

    assert await exchange(test_server.port, request(directory)) == status

    lines = [record for record in caplog.records if record.levelno >= logging.INFO]
    assert len(lines) == 1, [record.getMessage() for record in lines]
    (line,) = lines
    assert line.levelno == logging.INFO
    assert f"refused with {status}" in line.getMessage()
    assert line.exc_info is None
    assert "Traceback" not in caplog.text
    assert not Path(directory, "MARKERS0").exists()  # noqa: ASYNC240 - the server is idle
