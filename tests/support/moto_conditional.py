"""moto's S3 server, plus what AWS S3 does and moto 5.2.5 does not: conditional bulk deletes.

AWS S3 (general purpose buckets, since 2025) honours an ``ETag`` per key of ``DeleteObjects``:
``*`` deletes the key only if it exists, any other value only if it is the key's current ETag;
a key whose condition fails is reported under ``Errors`` (``NoSuchKey`` when absent,
``PreconditionFailed`` when changed) and left alone. moto ignores the element and reports every
key deleted. This module patches that one operation when a request carries an ``ETag``;
requests without one go to moto unchanged. Run it like ``python -m moto.server``:

    python tests/support/moto_conditional.py -H 127.0.0.1 -p 9000
"""

from __future__ import annotations

import sys
from typing import Any

import xmltodict
from moto import server
from moto.core.responses import ActionResult
from moto.s3.responses import S3Response

_original = S3Response._bucket_response_delete_keys


def _delete_keys(self: Any, bucket_name: str, authenticated: bool = True) -> Any:
    """DeleteObjects; keys with an ``ETag`` are deleted only if their condition holds."""
    body = xmltodict.parse(self.body, strip_whitespace=False)
    objects = body.get("Delete", {}).get("Object", [])
    if not isinstance(objects, list):
        objects = [objects]
    if not authenticated or not any(isinstance(o, dict) and "ETag" in o for o in objects):
        return _original(self, bucket_name, authenticated)
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


S3Response._bucket_response_delete_keys = _delete_keys  # type: ignore[method-assign]

if __name__ == "__main__":
    server.main(sys.argv[1:])
