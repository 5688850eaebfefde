"""How HttpMarkerClient treats the sidecar's 408 and 409, against a scripted HTTP server."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator

import pytest

from sparkguard.spark_lib.base import errors
from sparkguard.spark_lib.spark.marker_http import HttpMarkerClient

DIRECTORY = "/data/t/_sparkguard/markers/20261122120000000-job-1"


class ScriptedServer(http.server.ThreadingHTTPServer):
    """Answers each POST with the next status of ``script``; records how many it got."""

    def __init__(self, script: list[int]) -> None:
        super().__init__(("127.0.0.1", 0), ScriptedHandler)
        self.script = script
        self.requests = 0


class ScriptedHandler(http.server.BaseHTTPRequestHandler):
    server: ScriptedServer

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.server.requests += 1
        status = self.server.script.pop(0)
        answer = (
            {"error": f"scripted {status}", "status": status}
            if status >= 400
            else {"markername": "a.parquet.marker.CREATE", "created": True}
        )
        body = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def scripted() -> Iterator[ScriptedServer]:
    server = ScriptedServer([])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def endpoint(server: ScriptedServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def test_408_is_retried(scripted: ScriptedServer) -> None:
    scripted.script[:] = [408, 200]
    with HttpMarkerClient(endpoint(scripted), token="t", deadline_s=30) as client:
        client.create(DIRECTORY, "a.parquet")
    assert scripted.requests == 2


def test_409_fails_at_once_with_the_sidecars_message(scripted: ScriptedServer) -> None:
    scripted.script[:] = [409, 200]
    with (
        HttpMarkerClient(endpoint(scripted), token="t", deadline_s=30) as client,
        pytest.raises(errors.MarkerError, match="HTTP 409: scripted 409") as refusal,
    ):
        client.create(DIRECTORY, "a.parquet")
    assert not isinstance(refusal.value, errors.MarkerServiceUnavailableError)
    assert scripted.requests == 1
