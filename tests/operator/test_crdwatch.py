"""A CRD is served by the operator only once the apiserver serves it (``crdwatch.established``):
a watch started earlier answers 404, and kopf's failed watcher stops the whole operator."""

from __future__ import annotations

from typing import Any

from sparkguard.operator import crdwatch


def _crd(*conditions: tuple[str, str], deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "sparkapplications.spark.apache.org"}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-26T04:00:00Z"
    return {
        "metadata": meta,
        "status": {"conditions": [{"type": t, "status": s} for t, s in conditions]},
    }


def test_only_an_established_crd_not_being_deleted_is_served() -> None:
    assert crdwatch.established(_crd(("NamesAccepted", "True"), ("Established", "True")))
    assert not crdwatch.established(_crd(("NamesAccepted", "True")))  # just created
    assert not crdwatch.established(_crd(("Established", "False")))
    assert not crdwatch.established(_crd(("Established", "True"), deleting=True))
    assert not crdwatch.established({"metadata": {}})
