"""benchmarks/recovery.py's reaction time is read from the API server's audit clock: the
FAILED status patch and the operator's resubmission patch, not the benchmark's client or its
watch. Checked on synthetic audit events (the benchmark itself needs the kube bench)."""

from __future__ import annotations

from typing import Any

from tests.test_benchmark_commit_protocol import load, run_benchmark

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


def test_real_operator_mode_times_from_the_first_running_task_line() -> None:
    """``--real-operator`` reads the next driver's first task from its executor's CRI
    container log (the runtime's own timestamps, nanoseconds, UTC); lines before it and other
    lines do not count; a log without a task gives None."""
    restart = load("_restart")
    log = "\n".join(
        [
            "2026-12-07T13:20:00.598796296Z stderr F 26/12/07 13:20:00 INFO SparkContext: x",
            "2026-12-07T13:20:01.250000000Z stderr F 26/12/07 13:20:01 INFO Executor: "
            "Running task 0.0 in stage 0.0 (TID 0)",
            "2026-12-07T13:20:02.000000000Z stderr F 26/12/07 13:20:02 INFO Executor: "
            "Running task 1.0 in stage 0.0 (TID 1)",
        ]
    )
    at = restart.first_task_at(log)
    assert at is not None
    assert round(at - 1796649600.0, 6) == 1.25  # 2026-12-07T13:20:00Z is 1796649600
    assert restart.first_task_at(log.splitlines()[0]) is None
    assert restart.first_task_at("") is None


def test_real_operator_mode_refuses_no_rounds() -> None:
    result = run_benchmark("recovery", "--real-operator", "--rounds", "0")
    assert result.returncode == 2
    assert "--rounds must be >= 1" in result.stdout
