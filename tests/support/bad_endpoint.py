"""An HTTP endpoint on loopback that fails every request in one way: the marker clients' and
the operator's API client's failure tests (``misbehaving_endpoint``)."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator

from tests.support.s3server import free_port


@contextlib.contextmanager
def misbehaving_endpoint(kind: str) -> Iterator[str]:
    """An endpoint that fails every request in the way ``kind`` names: ``unreachable`` (nothing
    listens), ``silent`` (reads the request, never answers), ``reset`` (RST after the request),
    or an HTTP status (answered with it)."""
    if kind == "unreachable":
        yield f"http://127.0.0.1:{free_port()}"
        return
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    stop = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.recv(65536)  # the request (small: a marker name)
            if kind == "silent":
                held.append(conn)  # never answered: the client's read times out
            elif kind == "reset":
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()
            else:
                body = b'{"error": "flush failed"}'
                conn.sendall(
                    f"HTTP/1.1 {kind} Failed\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                    + body
                )
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        listener.close()
