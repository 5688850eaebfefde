"""Patches of a SparkApplication: exactly this object, at exactly this version.

Every write of a recovery or a deletion names the app's uid, so it never lands on an app
recreated under the same name, and carries the resourceVersion it was decided on, so a stale
decision becomes a conflict and a re-read instead of a lost update. The resourceVersions our
patches produce are remembered (``Runtime.written``): their watch echoes are no news.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sparkguard.operator import runtime as runtime_


async def patch_app(
    runtime: runtime_.Runtime, app: Mapping[str, Any], patch: Mapping[str, Any]
) -> dict[str, Any] | None:
    """Patch exactly this object at exactly this version (uid + resourceVersion)."""
    meta = app.get("metadata") or {}
    patched = await runtime.kube.patch_app(
        meta["namespace"],
        meta["name"],
        patch,
        uid=meta.get("uid"),
        resource_version=meta.get("resourceVersion"),
        group=runtime_.AppKey.of(app).group,
    )
    if patched is not None:
        key = runtime_.AppKey.of(patched)
        version = (patched.get("metadata") or {}).get("resourceVersion")
        if version is not None:
            # the last few: the echo of the claim may come after the conclusion's response
            runtime.written[key.id] = (*runtime.written.get(key.id, ()), version)[-4:]
    return patched
