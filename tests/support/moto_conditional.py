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
check before the store). Here every key write runs under one lock, so the check and the store
are one step as S3 makes them; reads are not held.

Conditional bulk deletes (``--conditional-deletes``). AWS S3 (general purpose buckets, since
2025) honours an ``ETag`` per key of ``DeleteObjects``: ``*`` deletes the key only if it exists,
any other value only if it is the key's current ETag; a key whose condition fails is reported
under ``Errors`` (``NoSuchKey`` when absent, ``PreconditionFailed`` when changed) and left
alone. moto ignores the element and reports every key deleted. With the flag, that one operation
is patched when a request carries an ``ETag``; requests without one go to moto unchanged.
"""

from __future__ import annotations

import functools
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

_WRITES = threading.Lock()


def _serialized(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` run under the one write lock."""

    @functools.wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _WRITES:
            return method(self, *args, **kwargs)

    return run


def serialize_writes() -> None:
    """Make every key write of moto's S3 (put, copy, multipart completion, deletes) one step."""
    for name in ("_key_response_put", "_key_response_post", "_key_response_delete"):
        setattr(S3Response, name, _serialized(getattr(S3Response, name)))
    S3Response._bucket_response_delete_keys = _serialized(  # type: ignore[method-assign]
        S3Response._bucket_response_delete_keys
    )


_original_delete_keys = S3Response._bucket_response_delete_keys


def _delete_keys(self: Any, bucket_name: str, authenticated: bool = True) -> Any:
    """DeleteObjects; keys with an ``ETag`` are deleted only if their condition holds."""
    body = xmltodict.parse(self.body, strip_whitespace=False)
    objects = body.get("Delete", {}).get("Object", [])
    if not isinstance(objects, list):
        objects = [objects]
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
