"""The HTTP marker client: executors create markers through the marker sidecar.

Standard library only (``http.client``): it runs inside Spark executors, where aiohttp may not
be installed. One kept-alive connection per client, re-opened after any failure. Every call is
idempotent on the server (a marker created twice is one marker), so failed attempts are retried
with exponential backoff and full jitter until ``deadline_s``; past it the call raises
:class:`~sparkguard.spark_lib.base.errors.MarkerServiceUnavailableError`, naming the endpoint, the
attempts and the last error. Each attempt's connect and read timeouts are clipped to the time
left, so a call never outlives its deadline by more than a scheduling hiccup.

Answers 408/429/502/503/504 are retried (``Retry-After`` honoured), and so are connection errors
(refused, reset, closed): a sidecar that stops answers new markers 503 while it drains, then
refuses connections until it, or the next one, listens again. Other 4xx/5xx answers raise
:class:`~sparkguard.spark_lib.base.errors.MarkerError` carrying the sidecar's message, at once.
Among them 409: the marker's instant is already committed or rolled back, so the calling task
belongs to a finished write and must fail before it writes its data file (the message names the
instant).
"""

from __future__ import annotations

import http.client
import json
import logging
import random
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any, Final

from sparkguard.spark_lib.base import errors
from sparkguard.spark_lib.storage import markers

logger = logging.getLogger(__name__)

#: 408: the sidecar gave up waiting for the body (a stalled network): a new attempt may pass
_RETRYABLE_STATUSES: Final = frozenset({408, 429, 502, 503, 504})
_CREATE_ROUTES: Final = {
    markers.IOType.CREATE: "create",
    markers.IOType.MERGE: "create-and-merge",
    markers.IOType.APPEND: "append",
}
_BACKOFF_BASE_S: Final = 0.05
_BACKOFF_CAP_S: Final = 2.0


class HttpMarkerClient:
    """A :class:`~sparkguard.spark_lib.storage.markers.MarkerClient` talking to the marker sidecar.

    ``endpoint`` is the sidecar's base URL (``http://host:port``); ``token`` or ``token_file``
    (read at first use and again after a 401) supplies the bearer token. Thread-safe: calls on
    one client are serialised over its single connection. ``clock`` and ``sleep`` (default
    ``time.monotonic`` and ``time.sleep``) measure the deadline and wait out the backoff.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        token: str | None = None,
        token_file: str | None = None,
        deadline_s: float = 60.0,
        connect_timeout_s: float = 2.0,
        request_timeout_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        parsed = urllib.parse.urlsplit(endpoint.strip() if isinstance(endpoint, str) else "")
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise errors.ConfigError(
                f"marker endpoint {endpoint!r} is not an http(s) URL; give e.g. "
                "http://127.0.0.1:26754 (spark.sparkguard.markers.endpoint)"
            )
        if token is not None and token_file is not None:
            raise errors.ConfigError("give the marker sidecar token or token_file, not both")
        for name, value in (
            ("deadline_s", deadline_s),
            ("connect_timeout_s", connect_timeout_s),
            ("request_timeout_s", request_timeout_s),
        ):
            if not value > 0:
                raise errors.ConfigError(f"HttpMarkerClient {name}={value!r} must be > 0")
        self.endpoint = endpoint.rstrip("/")
        self._https = parsed.scheme == "https"
        self._host = parsed.hostname
        self._port = parsed.port or (443 if self._https else 80)
        self._base = parsed.path.rstrip("/") + "/v1/markers/"
        self._token = token
        self._token_file = token_file
        self.deadline_s = deadline_s
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        #: the deadline's clock and the backoff's sleep (tests inject a fake pair: no wall time)
        self._clock = clock
        self._sleep = sleep
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()

    # -- MarkerClient ---------------------------------------------------------------------------
    def create(
        self,
        directory: str,
        data_file: str,
        io_type: markers.IOType = markers.IOType.CREATE,
    ) -> None:
        """Return once the sidecar has made the marker durable (a retry of a done one is fine)."""
        name = markers.marker_name(data_file, io_type)
        self._call("POST", _CREATE_ROUTES[io_type], {"markerdir": directory, "markername": name})

    def all_marked(self, directory: str) -> set[str]:
        """Data files marked in ``directory``, as acknowledged by the sidecar."""
        return self._marked(self._call("GET", "all", {"markerdir": directory}))

    def seal(self, directory: str) -> set[str]:
        """The commit's read (W8): data files marked in ``directory``, after which the sidecar
        acknowledges no marker of it (a straggler's is refused with 409)."""
        try:
            answer = self._call("POST", "dir/seal", {"markerdir": directory})
        except _NoSuchRouteError:
            logger.warning(
                "marker sidecar %s has no seal route (an older version): reading %s unsealed; a "
                "straggler's marker is acknowledged until the outcome exists",
                self.endpoint,
                directory,
            )
            return self.all_marked(directory)
        return self._marked(answer)

    def _marked(self, answer: dict[str, Any]) -> set[str]:
        """The data files of an ``all`` or ``dir/seal`` answer's marker names."""
        names = answer.get("markers")
        if not isinstance(names, list):
            raise errors.MarkerError(f"marker sidecar {self.endpoint} sent no marker list")
        return {markers.parse_marker_name(str(name))[0] for name in names}

    def dir_exists(self, directory: str) -> bool:
        """Whether the marker directory exists on storage."""
        return bool(self._call("GET", "dir/exists", {"markerdir": directory}).get("exists"))

    def delete_dir(self, directory: str) -> None:
        """Remove the marker directory (idempotent)."""
        self._call("POST", "dir/delete", {"markerdir": directory})

    def close(self) -> None:
        """Close the kept-alive connection."""
        with self._lock:
            self._reset()

    def __enter__(self) -> HttpMarkerClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- transport ------------------------------------------------------------------------------
    def _call(self, method: str, route: str, params: dict[str, str]) -> dict[str, Any]:
        with self._lock:
            return self._call_locked(method, route, params)

    def _call_locked(self, method: str, route: str, params: dict[str, str]) -> dict[str, Any]:
        deadline = self._clock() + self.deadline_s
        attempts = 0
        last_error = "no attempt was made"
        token_reloaded = False
        while True:
            attempts += 1
            reused = self._conn is not None
            retry_after = 0.0
            try:
                status, headers, body = self._send(method, route, params, deadline)
            except (OSError, http.client.HTTPException) as exc:
                self._reset()
                last_error = f"{type(exc).__name__}: {exc}"
                if reused and attempts == 1 and self._clock() < deadline:
                    continue  # a kept-alive connection the server closed: retry at once
            else:
                if status < 300:
                    return _decode(body, endpoint=self.endpoint)
                message = _error_message(body, status)
                if status == 401 and self._token_file is not None and not token_reloaded:
                    token_reloaded = True
                    self._token = None  # the secret may have been rotated: read it again
                    continue
                if status not in _RETRYABLE_STATUSES:
                    raise (_NoSuchRouteError if status == 404 else errors.MarkerError)(
                        f"marker sidecar {self.endpoint} refused {method} {route} "
                        f"{_describe(params)}: HTTP {status}: {message}"
                    )
                last_error = f"HTTP {status}: {message}"
                retry_after = _retry_after(headers.get("Retry-After"))
            delay = max(retry_after, random.uniform(0, _backoff(attempts)))  # noqa: S311
            if self._clock() + delay >= deadline:
                raise errors.MarkerServiceUnavailableError(
                    f"marker sidecar {self.endpoint} did not complete {method} {route} "
                    f"{_describe(params)} within {self.deadline_s:g} s ({attempts} attempts); "
                    f"last error: {last_error}. Check that the sidecar is running and reachable "
                    "at that endpoint; the task fails so Spark can retry it"
                )
            logger.debug(
                "marker %s %s failed (%s); retrying in %.3f s", method, route, last_error, delay
            )
            self._sleep(delay)

    def _send(
        self, method: str, route: str, params: dict[str, str], deadline: float
    ) -> tuple[int, http.client.HTTPMessage, bytes]:
        remaining = deadline - self._clock()
        if remaining <= 0:
            raise TimeoutError("deadline reached before the attempt")
        if self._conn is None:
            conn_class = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            conn = conn_class(
                self._host, self._port, timeout=min(self.connect_timeout_s, remaining)
            )
            conn.connect()
            self._conn = conn
        conn = self._conn
        if conn.sock is not None:
            conn.sock.settimeout(min(self.request_timeout_s, max(remaining, 0.001)))
        headers = {"Accept": "application/json"}
        token = self._read_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        path = self._base + route
        body: bytes | None = None
        if method == "GET":
            path += "?" + urllib.parse.urlencode(params)
        else:
            body = json.dumps(params).encode()
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
        if response.will_close:
            self._reset()
        return response.status, response.headers, data

    def _read_token(self) -> str | None:
        if self._token is None and self._token_file is not None:
            try:
                with open(self._token_file, encoding="utf-8") as handle:
                    self._token = handle.read().strip()
            except OSError as exc:
                raise errors.ConfigError(
                    f"cannot read the marker sidecar token file {self._token_file!r} "
                    f"({exc.strerror}); mount the token secret there"
                ) from None
        return self._token

    def _reset(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


def _backoff(attempt: int) -> float:
    return min(_BACKOFF_CAP_S, _BACKOFF_BASE_S * 2.0 ** min(attempt - 1, 16))


def _retry_after(value: str | None) -> float:
    try:
        seconds = float(value) if value else 0.0
    except ValueError:
        return 0.0
    return min(_BACKOFF_CAP_S * 5, max(0.0, seconds))


def _describe(params: dict[str, str]) -> str:
    return " ".join(f"{key}={value!r}" for key, value in params.items())


def _decode(body: bytes, *, endpoint: str) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        value = None
    if not isinstance(value, dict):
        raise errors.MarkerError(f"marker sidecar {endpoint} answered with non-JSON {body[:200]!r}")
    return value


def _error_message(body: bytes, status: int) -> str:
    try:
        value = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return body[:500].decode("utf-8", "replace") or http.client.responses.get(status, "")
    if isinstance(value, dict) and "error" in value:
        return str(value["error"])
    return body[:500].decode("utf-8", "replace")


class _NoSuchRouteError(errors.MarkerError):
    """The sidecar answered 404: it has no such route (the sidecar answers 404 for nothing
    else)."""
