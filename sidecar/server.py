"""Serving the sidecar app on TCP with bounded connections, bounded read times and signals.

``aiohttp.web.run_app`` holds every connection a client opens for as long as the client
likes. Here:

* at most ``max_connections`` connections are open (fewer if the open-files limit leaves less
  room): the one past the limit is answered ``503`` with ``Retry-After`` and closed at once;
* a connection must complete each request head within ``header_timeout_s`` of opening (or of
  the previous answer on a kept-alive connection), else it is closed: aiohttp's keep-alive
  timer, and for the first request also a timer of our own (aiohttp arms its timer before the
  first request only in recent releases);
* the request body must arrive within ``body_timeout_s`` (``408``, in the app);
* shedding, and ``accept()`` failing for want of file descriptors, is logged as one line at
  most every few seconds, never as a traceback per connection.

SIGTERM and SIGINT first drain the batcher (:func:`~sparkguard.sidecar.app.start_draining`)
with the listener still open: ``/readyz`` and new markers are answered ``503`` with
``Retry-After`` while queued markers are written and their requests answered. Then the listener
closes (new connections are refused) and the remaining connections are closed. With
``exit_with_process`` set, the end of the watched driver process (see
:mod:`~sparkguard.sidecar.process_watch`) stops the sidecar the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import resource
import signal
import time
from collections.abc import Callable
from typing import Any, Final

from aiohttp import http_exceptions, web

from sparkguard.sidecar import app, config, errors, metrics, process_watch

logger = logging.getLogger(__name__)
#: what aiohttp's connection handlers log (parse errors, connections lost mid-request)
http_logger = logging.getLogger("sparkguard.sidecar.http")

#: open files the sidecar needs besides its connections: std streams, the event loop, the
#: listener, imports, and per storage thread a temp file, a directory and a socket or two
_FD_RESERVE_BASE: Final = 64
_FD_PER_IO_THREAD: Final = 2
_LOG_EVERY_S: Final = 10.0
_RESOURCE_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
#: errors that are what a client sent (or how it left), not the sidecar's
_CLIENT_FAULTS: Final = (
    http_exceptions.HttpProcessingError,
    web.RequestPayloadError,
    ConnectionError,
)


def _refusal() -> bytes:
    body = json.dumps(
        {
            "error": "the sidecar has too many open connections "
            "(SPARKGUARD_SIDECAR_MAX_CONNECTIONS); retry in a moment",
            "status": 503,
        }
    ).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Retry-After: 1\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


_REFUSAL: Final = _refusal()


class RateLimitedLog:
    """Log a warning at most once per ``interval_s``, counting the ones held back."""

    def __init__(self, interval_s: float = _LOG_EVERY_S) -> None:
        self.interval_s = interval_s
        self._last = -float("inf")
        self._held_back = 0

    def warning(self, message: str, *args: object) -> None:
        """Log ``message`` now, or count it if one was logged less than the interval ago."""
        now = time.monotonic()
        if now - self._last < self.interval_s:
            self._held_back += 1
            return
        held_back, self._held_back, self._last = self._held_back, 0, now
        logger.warning("%s (%s similar since the last report)", message % args, held_back)


class ClientFaultFilter(logging.Filter):
    """Turn aiohttp's traceback for a malformed request into one INFO line naming its 400.

    aiohttp answers a request it cannot parse (a bad request line, a header over 8190 bytes, a
    broken chunked body) with 400 itself, then logs the parser's exception at ERROR with its
    traceback: a flood of bad requests would become a flood of tracebacks. A body that fails
    while aiohttp discards its unread rest (a broken compressed body, after the app answered)
    logs again for a request already answered and logged by the app: that one goes to DEBUG.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, _CLIENT_FAULTS):
            return True
        detail = " ".join(str(exc).split())[:300]
        if isinstance(exc, web.RequestPayloadError):
            # Only a request's body stream raises it, and the app answers every exception of
            # its handlers: this one comes from aiohttp reading the body after the answer.
            level = logging.DEBUG
            record.msg = f"{record.getMessage()} after the answer: {type(exc).__name__}: {detail}"
        elif isinstance(exc, http_exceptions.HttpProcessingError):
            level = logging.INFO  # aiohttp answers every parse error with 400
            record.msg = f"{record.getMessage()}: refused with 400 by the HTTP parser: "
            record.msg += f"{type(exc).__name__}: {detail}"
        else:
            level = logging.INFO
            record.msg = f"{record.getMessage()}: {type(exc).__name__}: {detail}"
        record.args = ()
        record.exc_info = None
        record.exc_text = None
        record.levelno = level
        record.levelname = logging.getLevelName(level)
        return http_logger.isEnabledFor(level)


def connection_limit(settings: config.SidecarConfig) -> int:
    """``max_connections``, lowered to what the process's open-files limit can hold.

    Raises the soft limit towards the hard one first when it is too low; raises
    :class:`~sparkguard.sidecar.errors.ConfigError` when not even one connection fits.
    """
    reserve = _FD_RESERVE_BASE + _FD_PER_IO_THREAD * (settings.batch_threads + 4)
    wanted = settings.max_connections + reserve
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
        if raised > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
                soft = raised
            except (ValueError, OSError):
                pass
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return settings.max_connections
    limit = soft - reserve
    if limit < 1:
        raise errors.ConfigError(
            f"the open-files limit ({soft}) leaves no room for connections: the sidecar needs "
            f"{reserve} for itself; raise it (ulimit -n) to at least {reserve + 16}, or lower "
            "SPARKGUARD_SIDECAR_BATCH_THREADS"
        )
    logger.warning(
        "the open-files limit (%s) holds only %s connections; serving at most that many "
        "(SPARKGUARD_SIDECAR_MAX_CONNECTIONS=%s)",
        soft,
        limit,
        settings.max_connections,
    )
    return limit


class ConnectionLimiter:
    """A protocol factory around aiohttp's: at most ``limit`` connections open at a time."""

    def __init__(
        self,
        factory: Callable[[], asyncio.Protocol],
        *,
        limit: int,
        header_timeout_s: float,
        instruments: metrics.SidecarMetrics,
    ) -> None:
        self._factory = factory
        self.limit = limit
        self.header_timeout_s = header_timeout_s
        self.open = 0
        self._metrics = instruments
        self._log = RateLimitedLog()

    def __call__(self) -> asyncio.Protocol:
        if self.open >= self.limit:
            self._metrics.refused_connections.inc()
            self._log.warning(
                "%s connections are open (SPARKGUARD_SIDECAR_MAX_CONNECTIONS); refusing new "
                "ones with 503",
                self.open,
            )
            return _Refuser()
        self.open += 1
        self._metrics.open_connections.set(self.open)
        return _Counted(self, self._factory())

    def release(self) -> None:
        """One counted connection ended."""
        self.open -= 1
        self._metrics.open_connections.set(self.open)


class _Counted(asyncio.Protocol):
    """aiohttp's protocol for one connection, counted by a :class:`ConnectionLimiter`; closed
    if its first request head is not complete within the limiter's header timeout."""

    def __init__(self, limiter: ConnectionLimiter, inner: asyncio.Protocol) -> None:
        self._limiter: ConnectionLimiter | None = limiter
        self._inner = inner
        self._transport: asyncio.BaseTransport | None = None
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        if self._limiter is not None:
            self._head_timer = asyncio.get_running_loop().call_later(
                self._limiter.header_timeout_s, self._head_too_slow
            )
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._head_timer is not None:
            seen = self._head_tail + data
            if b"\r\n\r\n" in seen:
                self._head_timer.cancel()  # later heads: aiohttp's keep-alive timer
                self._head_timer = None
            else:
                self._head_tail = seen[-3:]
        self._inner.data_received(data)

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self._transport is not None:
            self._transport.close()

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        if self._limiter is not None:
            self._limiter.release()
            self._limiter = None
        self._inner.connection_lost(exc)


class _Refuser(asyncio.Protocol):
    """Answer 503 without reading the request, then close."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(_REFUSAL)
        transport.close()

    def data_received(self, data: bytes) -> None:
        pass


def _quiet_exception_handler(log: RateLimitedLog) -> Callable[..., None]:
    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in _RESOURCE_ERRNOS:
            # asyncio pauses accept() for a second and logs a traceback per attempt.
            log.warning(
                "%s (%s); lower SPARKGUARD_SIDECAR_MAX_CONNECTIONS or raise the open-files limit",
                context.get("message", "out of resources"),
                exc,
            )
            return
        loop.default_exception_handler(context)

    return handle


async def _stop_with_process(settings: config.SidecarConfig, stop: asyncio.Event) -> None:
    assert settings.exit_with_process is not None
    try:
        await process_watch.wait_for_exit(
            settings.exit_with_process, appear_within_s=settings.exit_with_process_wait_s
        )
    except Exception:
        # Serving on (as without the option) beats dropping markers the driver still sends.
        logger.exception("watching for the driver process failed; serving until SIGTERM")
        return
    stop.set()


async def serve(settings: config.SidecarConfig) -> None:
    """Serve the sidecar on ``settings.host:port`` until SIGTERM/SIGINT, then stop gracefully.

    With ``settings.exit_with_process``, also once the watched process has come and gone (or
    never came within ``exit_with_process_wait_s``): the same graceful stop, every marker
    acknowledged before it is durable and every pending request is answered.
    """
    stop = asyncio.Event()
    # Watch from the very start: a short driver may come and go while the app starts.
    watcher = (
        asyncio.create_task(_stop_with_process(settings, stop))
        if settings.exit_with_process is not None
        else None
    )
    try:
        await _serve_until(settings, stop)
    finally:
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher


def install_log_filter() -> None:
    """Put :class:`ClientFaultFilter` on :data:`http_logger` (once)."""
    if not any(isinstance(f, ClientFaultFilter) for f in http_logger.filters):
        http_logger.addFilter(ClientFaultFilter())


def runner_options(settings: config.SidecarConfig) -> dict[str, Any]:
    """The ``web.AppRunner`` keyword arguments the server uses (tests serve the app with them).

    No access log (the app logs every 4xx itself), aiohttp's own lines on :data:`http_logger`
    (see :func:`install_log_filter`), the header timeout as keep-alive timeout.
    """
    return {
        "handle_signals": False,
        "access_log": None,
        "logger": http_logger,
        "keepalive_timeout": settings.header_timeout_s,
        "shutdown_timeout": settings.shutdown_timeout_s,
    }


async def _serve_until(settings: config.SidecarConfig, stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(_quiet_exception_handler(RateLimitedLog()))
    limit = connection_limit(settings)
    install_log_filter()
    application = app.create_app(settings)
    runner = web.AppRunner(application, **runner_options(settings))
    await runner.setup()
    assert runner.server is not None
    limiter = ConnectionLimiter(
        runner.server,
        limit=limit,
        header_timeout_s=settings.header_timeout_s,
        instruments=application[app.METRICS_KEY],
    )
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        listener = await loop.create_server(
            limiter, host=settings.host, port=settings.port, reuse_address=True
        )
        try:
            logger.info(
                "serving on %s:%s (at most %s connections)", settings.host, settings.port, limit
            )
            await stop.wait()
            # Listening on while queued markers are written: a request racing the stop (the
            # pod's endpoints are removed while SIGTERM arrives) gets 503 + Retry-After, which
            # says why, rather than a refused connection. Both are retried by the client.
            logger.info("stopping: new markers get 503 while queued ones are written")
            await app.start_draining(application)
        finally:
            listener.close()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        await runner.cleanup()
