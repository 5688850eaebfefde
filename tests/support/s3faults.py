"""A fault-injecting S3 front: a loopback HTTP proxy between S3 clients and the test S3 server.

Every S3 client of a test (s3fs/botocore in the test process, in the sidecar, in Spark's Python
workers; S3A in the JVM) is pointed at :attr:`S3FaultFront.endpoint` instead of moto's. Each
request is classified by its S3 operation (:class:`Op`: PUT, GET, HEAD, LIST, DELETE and the
multipart operations) and, by a seeded random draw per request, either forwarded unchanged or
met with one fault (:class:`Fault`):

- ``slowdown``: ``503 SlowDown`` (S3's throttling answer), nothing reaches the store;
- ``internal``: ``500 InternalError``, nothing reaches the store;
- ``delay``: the request waits ``delay_s`` (throttling latency), then is forwarded;
- ``reset_before``: the connection is reset (RST) before the request reaches the store;
- ``reset_after``: the request is forwarded and applied, then the connection is reset instead
  of answering: the client sees an error for a write that happened.

``fail_next(op, fault, count)`` gives the next ``count`` requests of a kind that fault (placed
exactly: a retry then goes through; with ``key=``, only requests whose path contains it);
``burst(op, fault, seconds)`` makes every request of that kind fail that way for a while (a
store under load, or an outage of one kind). ``off()`` turns
every fault off, for verification reads. :attr:`S3FaultFront.injected` counts the faults
injected, by operation and kind.

The draw is seeded (``seed``); with concurrent clients the order in which requests draw
depends on scheduling, so a run is reproducible in its rates, not request by request.

The front forwards bytes it does not interpret: SigV4 headers, ``Content-MD5``, checksums and
``Expect: 100-continue`` (answered here, as S3 does, before the body is read) pass through; a
chunked request body is re-framed with a ``Content-Length`` (moto's server reads either).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import http.client
import http.server
import random
import socket
import socketserver
import struct
import threading
import time
import urllib.parse
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any, Final

from tests.support import s3server

#: headers a proxy must not forward (hop-by-hop, or re-made here)
_HOP_HEADERS: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "expect",
        "content-length",
    }
)


class Op(enum.StrEnum):
    """The kind of an S3 request, as the front classifies it."""

    PUT = "PUT"  # PutObject, CopyObject
    GET = "GET"  # GetObject
    HEAD = "HEAD"  # HeadObject, HeadBucket
    LIST = "LIST"  # ListObjects(V2), ListMultipartUploads, ListParts, ListBuckets
    DELETE = "DELETE"  # DeleteObject, DeleteObjects
    MPU_CREATE = "MPU_CREATE"  # CreateMultipartUpload
    MPU_PART = "MPU_PART"  # UploadPart, UploadPartCopy
    MPU_COMPLETE = "MPU_COMPLETE"  # CompleteMultipartUpload
    MPU_ABORT = "MPU_ABORT"  # AbortMultipartUpload
    OTHER = "OTHER"  # bucket-level calls (CreateBucket, GetBucketLocation, ...): never faulted


class Fault(enum.StrEnum):
    """What the front does to a request instead of (or besides) forwarding it."""

    SLOWDOWN = "slowdown"
    INTERNAL = "internal"
    DELAY = "delay"
    RESET_BEFORE = "reset_before"
    RESET_AFTER = "reset_after"


#: the operations that change the store (a reset after them leaves a change the client missed)
WRITES: Final = frozenset(
    {Op.PUT, Op.DELETE, Op.MPU_CREATE, Op.MPU_PART, Op.MPU_COMPLETE, Op.MPU_ABORT}
)


@dataclasses.dataclass(frozen=True)
class Rates:
    """Probability per request of each fault (their sum must stay below 1)."""

    slowdown: float = 0.0
    internal: float = 0.0
    delay: float = 0.0
    reset_before: float = 0.0
    reset_after: float = 0.0

    def draw(self, rng: random.Random) -> Fault | None:
        """One fault, or None (forward unchanged), by one draw of ``rng``."""
        point = rng.random()
        for fault in Fault:
            point -= getattr(self, fault.value)
            if point < 0:
                return fault
        return None


#: "a few percent" of every kind, on every operation
REALISTIC: Final = Rates(
    slowdown=0.03, internal=0.02, delay=0.02, reset_before=0.02, reset_after=0.02
)


def classify(method: str, target: str, headers: Mapping[str, str]) -> Op:  # noqa: PLR0911 (one return per S3 operation reads best)
    """The S3 operation of a request (path-style or virtual-host addressing alike)."""
    parsed = urllib.parse.urlsplit(target)
    query = urllib.parse.parse_qs(parsed.query, keep_blank_values=True)
    path = parsed.path.strip("/")
    host = headers.get("host", "").split(":")[0]
    virtual_host = host.count(".") and not host.replace(".", "").isdigit() and host != "localhost"
    has_key = bool(path) if virtual_host else "/" in path
    if method == "POST" and "uploads" in query:
        return Op.MPU_CREATE
    if method == "POST" and "uploadId" in query:
        return Op.MPU_COMPLETE
    if method == "POST" and "delete" in query:
        return Op.DELETE
    if method == "PUT" and "uploadId" in query:
        return Op.MPU_PART
    if method == "DELETE" and "uploadId" in query:
        return Op.MPU_ABORT
    if method == "GET" and ("uploads" in query or "uploadId" in query):
        return Op.LIST
    if not has_key:
        if method == "GET" and not (
            query.keys()
            - {
                "list-type",
                "prefix",
                "delimiter",
                "continuation-token",
                "max-keys",
                "start-after",
                "marker",
                "encoding-type",
                "fetch-owner",
            }
        ):
            return Op.LIST
        if method == "HEAD":
            return Op.HEAD
        return Op.OTHER
    return {"PUT": Op.PUT, "GET": Op.GET, "HEAD": Op.HEAD, "DELETE": Op.DELETE}.get(
        method, Op.OTHER
    )


def _error_body(code: str, message: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<RequestId>{uuid.uuid4().hex[:16]}</RequestId></Error>"
    ).encode()


class S3FaultFront:
    """The proxy (threads in this process); see the module docstring."""

    def __init__(
        self,
        upstream: str,
        *,
        seed: int = 0,
        rates: Mapping[Op, Rates] | Rates | None = None,
        delay_s: float = 0.2,
    ) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        self.upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._rates: dict[Op, Rates] = {}
        self.set_rates(rates)
        self.delay_s = delay_s
        self._enabled = True
        self._bursts: dict[Op, tuple[Fault, float]] = {}
        #: per operation, the faults placed by :meth:`fail_next` (each with its key filter)
        self._next: dict[Op, list[tuple[Fault, str | None]]] = {}
        #: faults injected, by (operation, fault)
        self.injected: Counter[tuple[Op, Fault]] = Counter()
        #: requests seen, by operation (forwarded or not)
        self.requests: Counter[Op] = Counter()
        front = self

        class Handler(_Handler):
            owner = front

        self._server = _Server(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="s3-fault-front", daemon=True
        )
        self._thread.start()

    @property
    def storage_options(self) -> dict[str, Any]:
        """s3fs storage options that reach the store through this front (the test keys)."""
        return s3server.storage_options_for(self.endpoint)

    def env(self) -> dict[str, str]:
        """Environment variables for a subprocess whose S3 clients should go through here."""
        return s3server.env_for(self.endpoint)

    # -- control -------------------------------------------------------------------------

    def set_rates(self, rates: Mapping[Op, Rates] | Rates | None) -> None:
        """Per-operation rates (one :class:`Rates` for every operation but OTHER)."""
        with self._lock:
            if rates is None:
                self._rates = {}
            elif isinstance(rates, Rates):
                self._rates = {op: rates for op in Op if op is not Op.OTHER}
            else:
                self._rates = dict(rates)

    def burst(self, op: Op, fault: Fault, seconds: float) -> None:
        """Every request of ``op`` gets ``fault`` for the next ``seconds``."""
        with self._lock:
            self._bursts[op] = (fault, time.monotonic() + seconds)

    def fail_next(self, op: Op, fault: Fault, count: int = 1, *, key: str | None = None) -> None:
        """The next ``count`` requests of ``op`` get ``fault`` (before any burst or rate): a
        fault placed exactly, whose retry then goes through. With ``key``, only requests whose
        path (``/<bucket>/<key>``) contains it, the others of ``op`` passing as if unplaced.
        Placed faults add up, each met by the first request it matches."""
        with self._lock:
            self._next.setdefault(op, []).extend([(fault, key)] * count)

    @contextlib.contextmanager
    def off(self) -> Iterator[None]:
        """No faults inside the block (bursts included): for verification reads."""
        with self._lock:
            was, self._enabled = self._enabled, False
        try:
            yield
        finally:
            with self._lock:
                self._enabled = was

    def injected_by_fault(self) -> Counter[Fault]:
        """Faults injected, by kind (every operation together)."""
        result: Counter[Fault] = Counter()
        for (_, fault), count in self.injected.items():
            result[fault] += count
        return result

    def report(self) -> str:
        """One line per operation: requests seen and faults injected by kind."""
        lines = []
        for op in Op:
            faults = {f.value: self.injected[(op, f)] for f in Fault if self.injected[(op, f)]}
            if self.requests[op] or faults:
                lines.append(f"{op.value:<13} requests={self.requests[op]:<5} faults={faults}")
        return "\n".join(lines)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> S3FaultFront:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the decision -------------------------------------------------------------------

    def decide(self, op: Op, path: str = "") -> Fault | None:
        """The fault for one request of ``op`` on ``path`` (counted), or None."""
        with self._lock:
            self.requests[op] += 1
            if not self._enabled or op is Op.OTHER:
                return None
            fault: Fault | None = None
            burst = self._bursts.get(op)
            placed = self._next.get(op, [])
            match = next(
                (i for i, (_, key) in enumerate(placed) if key is None or key in path), None
            )
            if match is not None:
                fault = placed.pop(match)[0]
            elif burst is not None and time.monotonic() < burst[1]:
                fault = burst[0]
            else:
                rates = self._rates.get(op)
                fault = rates.draw(self._rng) if rates is not None else None
            if fault is not None:
                self.injected[(op, fault)] += 1
            return fault


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Handler(http.server.BaseHTTPRequestHandler):
    owner: S3FaultFront
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the test prints the front's counters instead."""

    def do_GET(self) -> None:
        self._proxy()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_GET  # noqa: N815

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            body = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return bytes(body)
                body += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _reset(self) -> None:
        """Close the client's connection with a RST (not a FIN): a dropped connection."""
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
        self.close_connection = True

    def finish(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            super().finish()

    def _proxy(self) -> None:
        headers = {k.lower(): v for k, v in self.headers.items()}
        op = classify(self.command, self.path, headers)
        body = self._read_body()
        fault = self.owner.decide(op, urllib.parse.urlsplit(self.path).path)
        if fault is Fault.DELAY:
            time.sleep(self.owner.delay_s)
        elif fault is Fault.RESET_BEFORE:
            self._reset()
            return
        elif fault in (Fault.SLOWDOWN, Fault.INTERNAL):
            status, code, message = (
                (503, "SlowDown", "Please reduce your request rate.")
                if fault is Fault.SLOWDOWN
                else (500, "InternalError", "We encountered an internal error. Please try again.")
            )
            payload = b"" if self.command == "HEAD" else _error_body(code, message)
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        try:
            status, reason, answer_headers, answer = self._forward(body)
        except (OSError, http.client.HTTPException):
            self._reset()  # the store itself failed: the client sees a dropped connection
            return
        if fault is Fault.RESET_AFTER:
            self._reset()
            return
        self.send_response_only(status, reason)
        length = str(len(answer))
        for name, value in answer_headers:
            if name.lower() == "content-length" and self.command == "HEAD":
                length = value  # a HEAD's length is the object's, not the (empty) body's
            elif name.lower() not in _HOP_HEADERS:
                self.send_header(name, value)
        self.send_header("Content-Length", length)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(answer)

    def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        """The request, once, on a fresh connection to the store (a kept-alive one that the
        store closed meanwhile would need a resend, which could apply a write twice)."""
        conn = http.client.HTTPConnection(*self.owner.upstream, timeout=60)
        try:
            conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():
                if name.lower() not in _HOP_HEADERS:
                    conn.putheader(name, value)
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            response = conn.getresponse()
            answer = response.read()
            return response.status, response.reason, response.getheaders(), answer
        finally:
            conn.close()
