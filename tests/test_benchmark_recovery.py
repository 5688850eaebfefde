"""benchmarks/recovery.py's reaction time is read from the API server's audit clock: the
FAILED status patch and the operator's resubmission patch, not the benchmark's client or its
watch. Checked on synthetic audit events (the benchmark itself needs the kube bench)."""

from __future__ import annotations

from typing import Any

from tests.test_benchmark_commit_protocol import load

OPERATOR = "system:serviceaccount:bench-operator:operator"


def _patch(name: str, at: str, *, user: str, status: bool = False) -> dict[str, Any]:
    ref = {"resource": "sparkapplications", "name": name}
    if status:
        ref["subresource"] = "status"
    return {
        "verb": "patch",
        "objectRef": ref,
        "user": {"username": user},
        "requestReceivedTimestamp": at,
        "stageTimestamp": at,
    }


def test_reaction_is_timed_between_the_stored_patches() -> None:
    bench = load("recovery")
    at = bench._at
    audit = [
        _patch("app-1", "2026-11-26T08:00:00.000000Z", user="admin", status=True),  # RUNNING
        _patch("app-1", "2026-11-26T08:00:10.000000Z", user="admin", status=True),  # FAILED
        _patch("app-1", "2026-11-26T08:00:10.200000Z", user=OPERATOR),  # claim
        _patch("app-1", "2026-11-26T08:00:10.500000Z", user=OPERATOR),  # resubmission
        _patch("app-1", "2026-11-26T08:00:12.000000Z", user=OPERATOR),  # after the watch saw it
        _patch("app-2", "2026-11-26T08:00:10.000000Z", user="admin", status=True),
    ]
    failed_at = {"app-1": at("2026-11-26T08:00:10.050000Z"), "app-2": 100.0}
    seen_at = {"app-1": at("2026-11-26T08:00:10.900000Z"), "app-2": 105.0}
    times = bench._stored_times(audit, ["app-1", "app-2"], failed_at, seen_at)
    one = times["app-1"]
    assert round(one.failed - at("2026-11-26T08:00:10.000000Z"), 6) == 0
    assert round(one.resubmitted - one.failed, 6) == 0.5  # not 0.95 (the watch) nor 2.0
    # app-2's FAILED patch came after its (made-up) client time, and no operator patch: the
    # client-side times stand
    assert times["app-2"] == bench._Stored(failed=100.0, resubmitted=105.0)
