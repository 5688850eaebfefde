"""The aiohttp application: routes, auth, error answers and the batcher's lifecycle.

:func:`create_app` is used identically by ``python -m sparkguard.sidecar`` and by the tests.
Handlers are thin: they parse parameters (:mod:`~sparkguard.sidecar.validation`) and call the
:class:`~sparkguard.sidecar.batcher.MarkerBatcher`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Final

import prometheus_client
from aiohttp import http_exceptions, web

from sparkguard.sidecar import batcher, config, errors, metrics, validation
from sparkguard.spark_lib.storage import markers

logger = logging.getLogger(__name__)

CONFIG_KEY: Final = web.AppKey("config", config.SidecarConfig)
METRICS_KEY: Final = web.AppKey("metrics", metrics.SidecarMetrics)
BATCHER_KEY: Final = web.AppKey("batcher", batcher.MarkerBatcher)
READY_KEY: Final = web.AppKey("ready", list[bool])
#: raw markerdir -> validated directory; validation is pure, so its results can be reused
DIR_CACHE_KEY: Final = web.AppKey("dir_cache", dict[str, validation.MarkerDir])
_DIR_CACHE_SIZE: Final = 4096

PREFIX: Final = "/v1/markers/"
_BODY_TYPES: Final = frozenset(
    {"application/json", "application/x-www-form-urlencoded", "multipart/form-data"}
)
_UNAUTHENTICATED: Final = frozenset({"/healthz", "/readyz", "/metrics"})

routes = web.RouteTableDef()
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# -- parameters -------------------------------------------------------------------------------
async def read_params(request: web.Request) -> dict[str, str]:
    """``markerdir``/``markername`` from the query string and, for POST, a JSON or form body.

    A parameter given twice with different values (in the query string, the body, a JSON
    object's keys, or across them) is refused rather than guessed. Whatever the client sends
    (bytes or percent-escapes that are not UTF-8, an unknown charset, JSON nested a million
    deep, a multipart body without boundary, a body that never arrives or stops half way) is
    answered with a 4xx naming the problem, never with a 500.
    """
    params: dict[str, str] = {}
    # The raw query, not request.query: that one decodes escapes of non-UTF-8 bytes to U+FFFD.
    query = request.rel_url.raw_query_string
    if query:  # a POST's parameters are usually all in its body
        for key, value in _parse_urlencoded(query, where="query string"):
            _put_param(params, key, value)
    if request.method == "POST" and request.can_read_body:
        for name, field in await _read_body(request):
            if not isinstance(field, str):
                raise errors.BadRequestError(f"parameter {name!r} must be a string")
            _put_param(params, name, field)
    return params


def _parse_urlencoded(text: str, *, where: str) -> list[tuple[str, str]]:
    """The ``name=value`` pairs of a query string or form body, in order, duplicates kept.

    Splits on ``&`` and reads ``+`` as a space like aiohttp's ``request.query``, but a
    percent-escape of bytes that are not UTF-8 is refused: decoded with replacement, ``%FF`` and
    ``%FE`` would both become U+FFFD, a name of neither file the client writes.
    """
    pairs = []
    for field in text.split("&"):
        if field:
            raw_name, _, raw_value = field.partition("=")
            name = _unquote(raw_name, raw=field, what=f"a parameter name in the {where}")
            value = _unquote(raw_value, raw=field, what=f"parameter {name!r} in the {where}")
            pairs.append((name, value))
    return pairs


def _unquote(text: str, *, raw: str, what: str) -> str:
    # surrogateescape: raw bytes that are not UTF-8, should a parser let them through, stay
    # bytes and are refused below like their escapes.
    data = urllib.parse.unquote_to_bytes(text.replace("+", " ").encode("utf-8", "surrogateescape"))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = "".join(f"%{byte:02X}" for byte in data[exc.start : exc.end])
        raise errors.BadRequestError(
            f"{what} has a percent-escape that is not UTF-8 ({bad} in {raw[:120]!r}); "
            "send UTF-8 percent-encoding: percent-encode the value's UTF-8 bytes, as "
            "urllib.parse.quote and encodeURIComponent do"
        ) from None


async def _read_body(request: web.Request) -> list[tuple[str, Any]]:
    content_type = request.content_type
    if content_type not in _BODY_TYPES:
        raise errors.BadRequestError(
            f"unsupported body type {content_type!r}; send application/json, a "
            "form, or the parameters in the query string"
        )
    charset = (request.charset or "utf-8").lower()
    if charset not in ("utf-8", "utf8", "us-ascii", "ascii"):
        raise errors.BadRequestError(
            f"unsupported charset {charset[:40]!r}; send the body in UTF-8 (charset=utf-8)"
        )
    timeout_s = request.app[CONFIG_KEY].body_timeout_s
    try:
        if content_type != "multipart/form-data" and request.content.is_eof():
            # The whole body arrived with the head (a marker's always does): nothing to wait
            # for, so no timer to arm and cancel.
            raw = await request.read()
        else:
            async with asyncio.timeout(timeout_s):
                if content_type == "multipart/form-data":
                    return await _read_multipart(request)
                raw = await request.read()
    except TimeoutError:
        raise errors.RequestTimeoutError(
            f"the request body did not arrive within {timeout_s:g} s "
            "(SPARKGUARD_SIDECAR_BODY_TIMEOUT_S); send the whole body at once"
        ) from None
    except (ConnectionError, web.RequestPayloadError, http_exceptions.HttpProcessingError) as exc:
        detail = " ".join(str(exc).split())[:200]
        raise errors.BadRequestError(
            f"the request body could not be read ({type(exc).__name__}: {detail}); the client "
            "closed the connection or sent a malformed body"
        ) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise errors.BadRequestError(
            f"the request body is not valid UTF-8 (byte {exc.start}); send UTF-8 text"
        ) from None
    if content_type == "application/x-www-form-urlencoded":
        return list(_parse_urlencoded(text, where="form body"))
    try:
        body = _JSON.decode(text)
    except ValueError as exc:  # JSONDecodeError, or an integer of more than 4300 digits
        raise errors.BadRequestError(f"the JSON body cannot be parsed ({exc})"[:300]) from None
    except RecursionError:
        raise errors.BadRequestError(
            'the JSON body is nested too deeply; send a flat object {"markerdir": ..., '
            '"markername": ...}'
        ) from None
    if not isinstance(body, dict):
        raise errors.BadRequestError(
            'the JSON body must be an object, e.g. {"markerdir": ..., "markername": ...}'
        )
    return list(body.items())


def _refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads keeps the last of two equal keys: refuse them like two query parameters.
    found: dict[str, Any] = {}
    for key, value in pairs:
        _refuse_conflict(found, key, value)
        found[key] = value
    return found


#: one decoder for every body (``json.loads`` with a hook builds a new one per call)
_JSON: Final = json.JSONDecoder(object_pairs_hook=_refuse_duplicate_keys)


async def _read_multipart(request: web.Request) -> list[tuple[str, Any]]:
    try:
        return list((await request.post()).items())
    except (ValueError, LookupError) as exc:  # no boundary, bad part encoding, bad charset
        raise errors.BadRequestError(
            f"the multipart body cannot be parsed ({type(exc).__name__}: {str(exc)[:120]}); "
            "send application/json instead"
        ) from None


def _put_param(params: dict[str, str], key: str, value: str) -> None:
    if key not in ("markerdir", "markername"):
        raise errors.BadRequestError(
            f"unknown parameter {key!r}; the marker routes take markerdir and markername"
        )
    _refuse_conflict(params, key, value)
    params[key] = value


def _refuse_conflict(params: Mapping[str, object], key: str, value: object) -> None:
    if key in params and params[key] != value:
        raise errors.BadRequestError(f"parameter {key!r} is given twice with different values")


async def _marker_dir(request: web.Request, params: Mapping[str, str]) -> validation.MarkerDir:
    raw = params.get("markerdir")
    cache = request.app[DIR_CACHE_KEY]
    found = cache.get(raw) if raw is not None else None
    if found is None:
        found = validation.validate_marker_dir(
            raw, allowed_roots=request.app[CONFIG_KEY].allowed_roots
        )
        if len(cache) >= _DIR_CACHE_SIZE:
            cache.clear()  # executors of one job name a handful of dirs: rarely reached
        cache[str(raw)] = found
    return found


# -- marker routes ----------------------------------------------------------------------------
async def _create(request: web.Request, io_type: markers.IOType, *, any_io: bool) -> web.Response:
    params = await read_params(request)
    marker_dir = await _marker_dir(request, params)
    name = validation.validate_marker_name(params.get("markername"), io_type=io_type, any_io=any_io)
    # The sender's connection: the adaptive policy flushes once every recent sender waits.
    peer = request.transport.get_extra_info("peername") if request.transport else None
    written = await request.app[BATCHER_KEY].create(marker_dir, name, client=peer)
    return web.json_response({"markername": name, "created": written})


@routes.post(PREFIX + "create", name="create")
async def create(request: web.Request) -> web.Response:
    """Record a marker (IO type from the name's suffix; CREATE for a bare data file)."""
    return await _create(request, markers.IOType.CREATE, any_io=True)


@routes.post(PREFIX + "create-and-merge", name="create_and_merge")
async def create_and_merge(request: web.Request) -> web.Response:
    """Record a MERGE marker."""
    return await _create(request, markers.IOType.MERGE, any_io=False)


@routes.post(PREFIX + "append", name="append")
async def append(request: web.Request) -> web.Response:
    """Record an APPEND marker."""
    return await _create(request, markers.IOType.APPEND, any_io=False)


@routes.get(PREFIX + "all", name="all")
async def all_markers(request: web.Request) -> web.Response:
    """Every acknowledged marker name of the directory."""
    params = await read_params(request)
    names = await request.app[BATCHER_KEY].all_names(await _marker_dir(request, params))
    return web.json_response({"markers": names})


@routes.post(PREFIX + "dir/seal", name="dir_seal")
async def dir_seal(request: web.Request) -> web.Response:
    """The commit's read of its markers (W8): every acknowledged marker name of the directory,
    after which the sidecar acknowledges no marker of it (409)."""
    params = await read_params(request)
    names = await request.app[BATCHER_KEY].seal(await _marker_dir(request, params))
    return web.json_response({"markers": names})


@routes.get(PREFIX + "dir/exists", name="dir_exists")
async def dir_exists(request: web.Request) -> web.Response:
    """Whether the marker directory exists on storage."""
    params = await read_params(request)
    exists = await request.app[BATCHER_KEY].dir_exists(await _marker_dir(request, params))
    return web.json_response({"exists": exists})


@routes.post(PREFIX + "dir/delete", name="dir_delete")
async def dir_delete(request: web.Request) -> web.Response:
    """Delete the marker directory (idempotent). A sealed one (its commit read the markers)
    is deleted after the answer (``"background": true``, ``"deleted": null``): the commit does
    not wait for W10."""
    params = await read_params(request)
    batcher_ = request.app[BATCHER_KEY]
    marker_dir = await _marker_dir(request, params)
    if batcher_.deletes_in_background(marker_dir):
        batcher_.start_delete(marker_dir)
        return web.json_response({"deleted": None, "background": True})
    deleted = await batcher_.delete_dir(marker_dir)
    return web.json_response({"deleted": deleted, "background": False})


# -- operational routes -----------------------------------------------------------------------
@routes.get("/healthz", name="healthz")
async def healthz(request: web.Request) -> web.Response:
    """Liveness: the event loop answers."""
    return web.json_response({"status": "ok"})


@routes.get("/readyz", name="readyz")
async def readyz(request: web.Request) -> web.Response:
    """Readiness: started and not draining."""
    if not request.app[READY_KEY][0] or request.app[BATCHER_KEY].draining:
        return web.json_response({"status": "not ready"}, status=503)
    return web.json_response({"status": "ready", "pending": request.app[BATCHER_KEY].pending})


@routes.get("/metrics", name="metrics")
async def metrics_route(request: web.Request) -> web.Response:
    """Prometheus text exposition of this app's registry."""
    body = prometheus_client.generate_latest(request.app[METRICS_KEY].registry)
    return web.Response(body=body, headers={"Content-Type": prometheus_client.CONTENT_TYPE_LATEST})


# -- middlewares ------------------------------------------------------------------------------
def _error_response(status: int, message: str, **headers: str) -> web.Response:
    return web.json_response({"error": message, "status": status}, status=status, headers=headers)


@web.middleware
async def answer_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn errors into JSON answers, log every 4xx as one INFO line, count every request.

    A 4xx is the client's fault: one line, no traceback, at INFO so a flood stays quiet.
    """
    route = request.match_info.route.name or "unmatched"
    try:
        response = await handler(request)
    except errors.UnavailableError as exc:
        retry_after = str(max(1, math.ceil(exc.retry_after_s)))
        response = _error_response(exc.status, str(exc), **{"Retry-After": retry_after})
    except errors.InstantDecidedError as exc:
        _log_refusal(request, exc.status, str(exc))
        response = web.json_response(
            {"error": str(exc), "status": exc.status, "instant": exc.instant}, status=exc.status
        )
    except errors.SidecarError as exc:
        if exc.status >= 500:
            logger.error("%s %s failed: %s", request.method, request.path, exc)
        else:
            _log_refusal(request, exc.status, str(exc))
        response = _error_response(exc.status, str(exc))
        if isinstance(exc, errors.RequestTimeoutError | errors.BadRequestError):
            response.force_close()  # the body may be half read: don't reuse the connection
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[CONFIG_KEY].max_body_bytes
        message = (
            f"the request body is larger than {limit} bytes "
            "(SPARKGUARD_SIDECAR_MAX_BODY_BYTES); send one marker per request"
        )
        _log_refusal(request, 413, message)
        response = _error_response(413, message)
    except web.HTTPException as exc:  # 404 no such route, 405 wrong method
        if 400 <= exc.status < 500:
            _log_refusal(request, exc.status, exc.reason)
        response = _error_response(exc.status, exc.reason)
    except Exception as exc:
        logger.exception("%s %s failed unexpectedly", request.method, request.path)
        response = _error_response(500, f"internal error: {type(exc).__name__}: {exc}")
    request.app[METRICS_KEY].count_request(route, response.status)
    return response


def _log_refusal(request: web.Request, status: int, message: str) -> None:
    logger.info(
        "%s %s refused with %s: %.300s",
        request.method,
        request.path,
        status,
        " ".join(message.split()),
    )


@web.middleware
async def require_token(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Bearer-token auth on every route but /healthz, /readyz and /metrics."""
    settings = request.app[CONFIG_KEY]
    if settings.auth_disabled or request.path in _UNAUTHENTICATED or settings.token is None:
        return await handler(request)
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise errors.UnauthorizedError(
            "missing bearer token: send 'Authorization: Bearer <token>' with the sidecar's token"
        )
    token = token.strip()
    if not token.isascii():
        # Header bytes that are not ASCII arrive as text no token can equal; comparing
        # their encoding would fail on the surrogates they decode to.
        raise errors.UnauthorizedError(
            "the bearer token contains non-ASCII characters: send the sidecar's token as is"
        )
    if not hmac.compare_digest(token.encode(), settings.token.encode()):
        raise errors.UnauthorizedError("wrong bearer token: use the token the sidecar was given")
    return await handler(request)


# -- lifecycle --------------------------------------------------------------------------------
async def run_batcher(app: web.Application) -> AsyncIterator[None]:
    """cleanup_ctx: start the batcher; on cleanup drain whatever is still pending."""
    app[BATCHER_KEY].start()
    app[READY_KEY][0] = True
    yield
    app[READY_KEY][0] = False
    await app[BATCHER_KEY].drain(app[CONFIG_KEY].shutdown_timeout_s / 2)
    await app[BATCHER_KEY].close()


async def start_draining(app: web.Application) -> None:
    """Stop taking markers (503), write the queued ones while their handlers wait.

    The server calls it on a stop while it still listens; it is also the app's on_shutdown
    hook, which returns at once when the drain already ran (its budget is spent once).
    """
    app[READY_KEY][0] = False
    if app[BATCHER_KEY].draining:
        return
    await app[BATCHER_KEY].drain(app[CONFIG_KEY].shutdown_timeout_s / 2)


def create_app(settings: config.SidecarConfig) -> web.Application:
    """The sidecar application for ``settings`` (routes, auth, metrics, batcher lifecycle)."""
    # answer_errors is outermost so auth failures are answered and counted like the rest.
    app = web.Application(
        middlewares=[answer_errors, require_token], client_max_size=settings.max_body_bytes
    )
    app[CONFIG_KEY] = settings
    app[METRICS_KEY] = metrics.build_metrics()
    app[BATCHER_KEY] = batcher.MarkerBatcher(settings, app[METRICS_KEY])
    app[READY_KEY] = [False]
    app[DIR_CACHE_KEY] = {}
    app.add_routes(routes)
    app.cleanup_ctx.append(run_batcher)
    app.on_shutdown.append(start_draining)
    return app
