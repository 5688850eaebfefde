"""moto's S3 server, plus what AWS S3 does and moto 5.2.5 does not: atomic conditional writes
and, optionally, conditional bulk deletes. Run it like ``python -m moto.server``:

    python tests/support/moto_conditional.py [--conditional-deletes] -H 127.0.0.1 -p 9000

Two switches exist for ``tests/test_s3_server.py`` only, to show that its race test can fail:
``--race-window-ms N`` makes every lookup of a missing key take N ms longer (the window between
moto's check and its store, seconds instead of microseconds), and ``--moto-writes`` leaves
moto's own, unserialized writes in place.

Atomic conditional writes (always). AWS S3 decides a conditional write (``If-None-Match: *`` or
``If-Match`` on ``PutObject``, ``CompleteMultipartUpload``, ``DeleteObject``) atomically against
every other write of the key: of racing creates exactly one succeeds. moto checks the condition
and then stores, with nothing between the two, in a threaded server, so two racing creates can
both succeed (``moto/s3/responses.py``, ``S3Response.put_object``: the ``if_none_match == "*"``
check before the store). Here every write of a key runs under that key's lock, so the check and
the store are one step against the key's other writes, as S3 makes them; writes of different
keys and all reads run alongside, as before.

Ignored conditions (always, in buckets named ``ignores-inm-...``; every bucket with
``--ignore-if-none-match``). Some S3-compatible stores (older MinIO and Ceph RGW releases,
some appliances) accept ``If-None-Match: *`` and ignore it: a create over an existing key
replaces it, answered 200. In those buckets the header is dropped before moto reads it, on
``PutObject`` and ``CompleteMultipartUpload`` (``S3Response.put_object`` and
``_key_response_post`` read it), so they behave like such a store; the session's one server
serves both kinds of bucket (a second server would cost seconds per test session).

Conditional bulk deletes (``--conditional-deletes``). AWS S3 (general purpose buckets, since
2025) honours an ``ETag`` per key of ``DeleteObjects``: ``*`` deletes the key only if it exists,
any other value only if it is the key's current ETag; a key whose condition fails is reported
under ``Errors`` (``NoSuchKey`` when absent, ``PreconditionFailed`` when changed) and left
alone. moto ignores the element and reports every key deleted. With the flag, that one operation
is patched when a request carries an ``ETag``; requests without one go to moto unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import xmltodict
from moto import server
from moto.core.responses import ActionResult
from moto.s3.models import S3Backend
from moto.s3.responses import S3Response
from werkzeug.datastructures import Headers

_GUARD = threading.Lock()
_KEY_LOCKS: dict[tuple[str, str], threading.Lock] = {}


def _key_lock(bucket: str, key: str) -> threading.Lock:
    """The one lock of ``bucket``/``key`` (made on first use; a test server's keys are few)."""
    with _GUARD:
        return _KEY_LOCKS.setdefault((bucket, key), threading.Lock())


def _one_key(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method``, a write of one key, run under that key's lock. Where its ``bucket_name`` and
    ``key_name`` arguments sit is read once here, not bound on every request (moto's CPU is
    what its server is short of)."""
    names = list(inspect.signature(method).parameters)[1:]  # without self
    key_at = names.index("key_name")
    bucket_at = names.index("bucket_name") if "bucket_name" in names else None

    def argument(args: tuple[Any, ...], kwargs: dict[str, Any], name: str, at: int) -> Any:
        return kwargs[name] if name in kwargs else args[at]

    @functools.wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        key = argument(args, kwargs, "key_name", key_at)
        bucket = (
            self.bucket_name
            if bucket_at is None
            else argument(args, kwargs, "bucket_name", bucket_at)
        )
        with _key_lock(str(bucket), str(key)):
            return method(self, *args, **kwargs)

    return run


def _deleted_objects(body: Any) -> list[Any]:
    """The ``<Object>`` entries of a DeleteObjects request's body (one entry is not a list)."""
    objects = xmltodict.parse(body, strip_whitespace=False).get("Delete", {}).get("Object", [])
    return objects if isinstance(objects, list) else [objects]


def _many_keys(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method``, a DeleteObjects, run under the locks of all its keys (taken in sorted order,
    the only place that holds more than one: no two requests wait for each other)."""

    @functools.wraps(method)
    def run(self: Any, bucket_name: str, *args: Any, **kwargs: Any) -> Any:
        objects = _deleted_objects(self.body)
        keys = sorted({str(o["Key"]) for o in objects if isinstance(o, dict) and "Key" in o})
        with contextlib.ExitStack() as held:
            for key in keys:
                held.enter_context(_key_lock(bucket_name, key))
            return method(self, bucket_name, *args, **kwargs)

    return run


def serialize_writes() -> None:
    """Make every key write of moto's S3 (put, copy, multipart completion, deletes) one step
    against the other writes of the same key, as S3 does; writes of other keys run alongside."""
    for name in ("_key_response_put", "_key_response_post", "_key_response_delete"):
        setattr(S3Response, name, _one_key(getattr(S3Response, name)))
    S3Response._bucket_response_delete_keys = _many_keys(  # type: ignore[method-assign]
        S3Response._bucket_response_delete_keys
    )


_original_delete_keys = S3Response._bucket_response_delete_keys


def _delete_keys(self: Any, bucket_name: str, authenticated: bool = True) -> Any:
    """DeleteObjects; keys with an ``ETag`` are deleted only if their condition holds."""
    objects = _deleted_objects(self.body)
    if not authenticated or not any(isinstance(o, dict) and "ETag" in o for o in objects):
        return _original_delete_keys(self, bucket_name, authenticated)
    deleted: list[dict[str, Any]] = []
    failed: list[dict[str, str]] = []
    for entry in objects:
        key_name = str(entry["Key"])
        condition = str(entry.get("ETag", "")).strip('"')
        if "ETag" in entry:
            current = self.backend.get_object(bucket_name, key_name)
            if current is None:
                failed.append(
                    {"Key": key_name, "Code": "NoSuchKey", "Message": "The key does not exist"}
                )
                continue
            if condition != "*" and condition != current.etag.strip('"'):
                failed.append(
                    {"Key": key_name, "Code": "PreconditionFailed", "Message": "ETag differs"}
                )
                continue
        self.backend.delete_object(bucket_name, key_name)
        deleted.append({"Key": key_name})
    self.data["Action"] = "DeleteObjects"
    return self.serialized(ActionResult({"Deleted": deleted, "Errors": failed}))


#: buckets whose name starts with this ignore ``If-None-Match`` (``""``: every bucket)
IGNORING_PREFIX = "ignores-inm-"
_ignoring = [IGNORING_PREFIX]


def _without_if_none_match(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` with the request's ``If-None-Match`` header gone in an ignoring bucket, as a
    store that ignores it."""

    @functools.wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if str(getattr(self, "bucket_name", "")).startswith(_ignoring[0]):
            headers = Headers(self.headers)  # case-insensitive, as moto reads it
            headers.remove("If-None-Match")
            self.headers = headers
        return method(self, *args, **kwargs)

    return run


def ignore_if_none_match(prefix: str = IGNORING_PREFIX) -> None:
    """Make buckets named ``prefix...`` ignore ``If-None-Match`` on writes, as stores that do
    not honour it do: the second create of a key replaces the first."""
    _ignoring[0] = prefix
    S3Response.put_object = _without_if_none_match(S3Response.put_object)  # type: ignore[method-assign]
    S3Response._key_response_post = _without_if_none_match(  # type: ignore[method-assign]
        S3Response._key_response_post
    )


def widen_race_window(milliseconds: int) -> None:
    """Every lookup of a key that is missing answers ``milliseconds`` later."""
    lookup = S3Backend.get_object

    @functools.wraps(lookup)
    def slow_lookup(self: Any, *args: Any, **kwargs: Any) -> Any:
        found = lookup(self, *args, **kwargs)
        if found is None:
            time.sleep(milliseconds / 1000)
        return found

    S3Backend.get_object = slow_lookup  # type: ignore[method-assign]


def main(argv: list[str]) -> None:
    if "--conditional-deletes" in argv:
        argv.remove("--conditional-deletes")
        S3Response._bucket_response_delete_keys = _delete_keys  # type: ignore[method-assign]
    if "--ignore-if-none-match" in argv:
        argv.remove("--ignore-if-none-match")
        ignore_if_none_match("")
    else:
        ignore_if_none_match()
    if "--race-window-ms" in argv:
        at = argv.index("--race-window-ms")
        widen_race_window(int(argv[at + 1]))
        del argv[at : at + 2]
    if "--moto-writes" in argv:
        argv.remove("--moto-writes")
    else:
        serialize_writes()
    server.main(argv)


if __name__ == "__main__":
    main(list(sys.argv[1:]))
