"""A small S3 proxy for benchmarks: adds per-request latency and throttles like S3.

Every request is forwarded to an upstream S3 endpoint (the moto server) after ``--latency-ms``
(default 20 ms). Each prefix (bucket + first key segment: the table, as in a fresh S3 partition)
gets 3,500 write and 5,500 read requests per second; past that the proxy answers 503 SlowDown
like S3, and S3 clients back off and retry. Requests are counted by category (markers, data,
other) and by S3 operation (``op:HEAD``, ``op:LIST``, ``op:GET``, ``op:PUT``, ``op:COPY``,
``op:DELETE``, ``op:MPU``: multipart initiate/complete/abort) at ``GET /_proxy/stats``;
``GET /_proxy/requests`` lists the last 100,000 forwarded requests (method, key path, query,
whether a copy, whether conditional, status), for tests and benchmarks that count requests per
file; ``POST /_proxy/reset`` zeroes both.

Run: ``python benchmarks/_s3proxy.py --port 9100 --upstream http://127.0.0.1:9000``
(127.0.0.1 only).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import time
import urllib.parse

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

MARKERS_SEGMENT = "/_sparkguard/markers/"
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-length",
        "host",
        "content-encoding",
        "expect",  # the proxy already read the body; a forwarded 100-continue desyncs the pool
    }
)
_SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


class TokenBucket:
    """``rate`` requests per second with a burst of a tenth of a second."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.capacity = max(1.0, rate / 10)
        self.tokens = self.capacity
        self.stamp = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


def classify(path: str, query: str, body: bytes) -> str:
    """markers | sparkguard | data | other, by the key, the listing prefix or the bulk-delete
    body (sparkguard: the table's other ``_sparkguard/`` files, e.g. the sidecar's reads of the
    instant's outcome before each flush)."""
    prefix = urllib.parse.parse_qs(query).get("prefix", [""])[0]
    if MARKERS_SEGMENT in path or MARKERS_SEGMENT.lstrip("/") in prefix:
        return "markers"
    if b"_sparkguard/markers/" in body[:4096]:
        return "markers"
    if "/_sparkguard/" in path or "_sparkguard/" in prefix:
        return "sparkguard"
    parts = path.lstrip("/").split("/", 1)
    return "data" if len(parts) == 2 and parts[1] else "other"


def operation(method: str, path: str, query: str, headers: dict[str, str]) -> str:
    """The S3 operation of a request, coarsely: what a commit protocol's cost is made of."""
    params = urllib.parse.parse_qs(query, keep_blank_values=True)
    has_key = len(path.lstrip("/").split("/", 1)) == 2 and bool(path.lstrip("/").split("/", 1)[1])
    if method == "HEAD":
        return "HEAD"
    if method == "GET":
        return "GET" if has_key and "uploadId" not in params else "LIST"
    if method == "POST":
        return "DELETE" if "delete" in params else "MPU"
    if method == "DELETE":
        return "MPU" if "uploadId" in params else "DELETE"
    if method == "PUT":
        lowered = {k.lower() for k in headers}
        return "COPY" if "x-amz-copy-source" in lowered else "PUT"
    return method


def build_app(
    upstream: str, latency_s: float, write_rate: float, read_rate: float
) -> web.Application:
    stats: collections.Counter[str] = collections.Counter()
    requests: collections.deque[dict[str, object]] = collections.deque(maxlen=100_000)
    buckets: dict[tuple[str, str], TokenBucket] = {}
    session_box: list[ClientSession] = []

    async def session_ctx(app: web.Application):  # type: ignore[no-untyped-def]
        session = ClientSession(
            connector=TCPConnector(limit=512),
            auto_decompress=False,
            timeout=ClientTimeout(total=120),
        )
        session_box.append(session)
        yield
        await session.close()

    async def get_stats(request: web.Request) -> web.Response:
        return web.json_response(dict(stats))

    async def get_requests(request: web.Request) -> web.Response:
        return web.json_response(list(requests))

    async def reset(request: web.Request) -> web.Response:
        stats.clear()
        requests.clear()
        return web.json_response({})

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        category = classify(request.path, request.query_string, body)
        segments = request.path.lstrip("/").split("/", 2)
        prefix = "/".join(segments[:2])
        kind = "read" if request.method in ("GET", "HEAD") else "write"
        bucket = buckets.get((prefix, kind))
        if bucket is None:
            bucket = buckets[(prefix, kind)] = TokenBucket(
                read_rate if kind == "read" else write_rate
            )
        if not bucket.take():
            stats["throttled"] += 1
            return web.Response(status=503, body=_SLOW_DOWN, content_type="application/xml")
        stats[category] += 1
        stats["op:" + operation(request.method, request.path, request.query_string,
                                dict(request.headers))] += 1  # fmt: skip
        stats["total"] += 1
        await asyncio.sleep(latency_s)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        url = upstream + request.rel_url.raw_path_qs
        started = asyncio.get_running_loop().time()
        async with session_box[0].request(
            request.method, url, headers=headers, data=body if body else None
        ) as answer:
            data = await answer.read()
            # The upstream's own time (moto's), apart from the added latency and the client's.
            elapsed_us = int((asyncio.get_running_loop().time() - started) * 1e6)
            stats["upstream_us:" + category] += elapsed_us
            requests.append(
                {
                    "method": request.method,
                    "path": urllib.parse.unquote(request.path),
                    "query": request.query_string,
                    "copy": "x-amz-copy-source" in request.headers,
                    "conditional": "If-None-Match" in request.headers,
                    "status": answer.status,
                    "at": time.time(),  # when the answer came (the publication windows)
                }
            )
            out = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP_BY_HOP}
            if request.method == "HEAD":
                # No body, but the object's size is in Content-Length: pass it on as is.
                response = web.StreamResponse(status=answer.status, headers=out)
                response.content_length = answer.content_length or 0
                await response.prepare(request)
                await response.write_eof()
                return response
            return web.Response(status=answer.status, body=data, headers=out)

    app = web.Application(client_max_size=1024**3)
    app.cleanup_ctx.append(session_ctx)
    app.router.add_get("/_proxy/stats", get_stats)
    app.router.add_get("/_proxy/requests", get_requests)
    app.router.add_post("/_proxy/reset", reset)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--write-rate", type=float, default=3500.0)
    parser.add_argument("--read-rate", type=float, default=5500.0)
    args = parser.parse_args()
    app = build_app(
        args.upstream.rstrip("/"), args.latency_ms / 1000, args.write_rate, args.read_rate
    )
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
