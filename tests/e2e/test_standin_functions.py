"""The stand-in's pure functions against the upstream rules they model (no bench needed)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from tests.e2e import standin

NOW = datetime.datetime(2026, 11, 25, 12, 0, 10, tzinfo=datetime.UTC)


def _app(state: str, policy: dict[str, Any] | None = None, **status: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"driver": {}}
    if policy is not None:
        spec["restartPolicy"] = policy
    return {
        "metadata": {"name": "nightly"},
        "spec": spec,
        "status": {"applicationState": {"state": state}, **status},
    }


ON_FAILURE = {"type": "OnFailure", "onFailureRetries": 2, "onSubmissionFailureRetries": 1}


@pytest.mark.parametrize(
    ("state", "policy", "status", "expected"),
    [
        ("FAILING", None, {"executionAttempts": 1}, False),  # Never
        ("FAILING", ON_FAILURE, {"executionAttempts": 2}, True),  # attempts <= retries
        ("FAILING", ON_FAILURE, {"executionAttempts": 3}, False),
        ("FAILING", {"type": "OnFailure"}, {"executionAttempts": 1}, False),  # retries unset
        ("FAILING", {"type": "Always"}, {"executionAttempts": 99}, True),
        ("SUBMISSION_FAILED", ON_FAILURE, {"submissionAttempts": 1}, True),
        ("SUBMISSION_FAILED", ON_FAILURE, {"submissionAttempts": 2}, False),
        ("SUBMISSION_FAILED", None, {"submissionAttempts": 1}, False),
        ("SUCCEEDING", ON_FAILURE, {}, False),
        ("SUCCEEDING", {"type": "Always"}, {}, True),
    ],
)
def test_should_retry(
    state: str, policy: dict[str, Any] | None, status: dict[str, Any], expected: bool
) -> None:
    assert standin.should_retry(_app(state, policy, **status)) is expected


def test_retry_wait_is_the_interval_times_submission_attempts_from_the_last_submission() -> None:
    policy = {"type": "OnFailure", "onFailureRetryInterval": 5}
    app = _app(
        "FAILING", policy, submissionAttempts=3, executionAttempts=1,
        lastSubmissionAttemptTime="2026-11-25T12:00:00Z",
    )  # fmt: skip
    assert standin.time_until_next_retry_due(app, now=NOW) == 5 * 3 - 10


def test_retry_intervals_default_to_5s_unless_never() -> None:
    assert standin.restart_policy({})["type"] == "Never"
    assert "onFailureRetryInterval" not in standin.restart_policy({})
    policy = standin.restart_policy({"restartPolicy": {"type": "OnFailure"}})
    assert (policy["onFailureRetryInterval"], policy["onSubmissionFailureRetryInterval"]) == (5, 5)
    with pytest.raises(ValueError, match=r"spec\.restartPolicy\.type 'Sometimes'"):
        standin.restart_policy({"restartPolicy": {"type": "Sometimes"}})


def test_no_retry_time_without_a_submission() -> None:
    app = _app("FAILING", {"type": "OnFailure"}, submissionAttempts=0)
    with pytest.raises(ValueError, match="no retry time"):
        standin.time_until_next_retry_due(app, now=NOW)


def test_a_spec_change_is_any_field_but_suspend() -> None:
    old = {"spec": {"sparkConf": {"a": "1"}, "suspend": False}, "metadata": {"labels": {}}}
    assert not standin.spec_changed(old, {**old, "spec": {**old["spec"], "suspend": True}})
    assert not standin.spec_changed(old, {**old, "metadata": {"labels": {"x": "y"}}})
    assert standin.spec_changed(old, {**old, "spec": {**old["spec"], "timeToLiveSeconds": 60}})
    assert standin.spec_changed(old, {**old, "spec": {**old["spec"], "sparkConf": {"a": "2"}}})


def test_invalidating_zeroes_the_counters_failing_keeps_them() -> None:
    full = {
        "applicationState": {"state": "X", "errorMessage": "boom"},
        "sparkApplicationId": "spark-1", "submissionID": "sub-1", "submissionAttempts": 2,
        "executionAttempts": 2, "lastSubmissionAttemptTime": "2026-11-25T12:00:00Z",
        "terminationTime": "2026-11-25T12:00:05Z", "driverInfo": {"podName": "p"},
    }  # fmt: skip
    invalidated = {**full, "applicationState": dict(full["applicationState"])}
    standin.reset_status(invalidated, case="INVALIDATING")
    assert (invalidated["submissionAttempts"], invalidated["executionAttempts"]) == (0, 0)
    assert "lastSubmissionAttemptTime" not in invalidated
    assert "terminationTime" not in invalidated
    assert invalidated["submissionID"] == "sub-1"
    failing = {**full, "applicationState": dict(full["applicationState"])}
    standin.reset_status(failing, case="FAILING")
    assert (failing["submissionAttempts"], failing["executionAttempts"]) == (2, 2)
    assert failing["lastSubmissionAttemptTime"] == full["lastSubmissionAttemptTime"]
    assert "terminationTime" not in failing
    assert failing["applicationState"]["errorMessage"] == ""
    assert failing["driverInfo"] == {}


def test_ttl_expiry() -> None:
    app = _app("FAILED", terminationTime="2026-11-25T12:00:00Z")
    assert not standin.is_expired(app, now=NOW)  # no TTL
    app["spec"]["timeToLiveSeconds"] = 9
    assert standin.is_expired(app, now=NOW)
    app["spec"]["timeToLiveSeconds"] = 10
    assert not standin.is_expired(app, now=NOW)


def test_driver_pod_name() -> None:
    app = _app("")
    assert standin.driver_pod_name(app) == "nightly-driver"
    app["spec"]["sparkConf"] = {"spark.kubernetes.driver.pod.name": "from-conf"}
    assert standin.driver_pod_name(app) == "from-conf"
    app["spec"]["driver"]["podName"] = "from-spec"
    assert standin.driver_pod_name(app) == "from-spec"


@pytest.mark.parametrize(
    ("phase", "exit_code", "expected"),
    [
        ("Pending", None, "SUBMITTED"),
        ("Running", None, "RUNNING"),
        ("Running", 0, "SUCCEEDING"),  # a sidecar keeps the pod Running: the exit decides
        ("Running", 137, "FAILING"),
        ("Succeeded", 0, "SUCCEEDING"),
        ("Failed", 0, "SUCCEEDING"),
        ("Failed", None, "FAILING"),  # an initContainer failed: no driver status
    ],
)
def test_driver_state(phase: str, exit_code: int | None, expected: str) -> None:
    pod = standin.DriverPod(name="p", submission="s", index=0, record={})
    pod.phase, pod.driver_exit = phase, exit_code
    assert standin.APP_STATE_OF_DRIVER[standin.driver_state(pod)] == expected


def test_schedules_are_every_n_seconds_only() -> None:
    assert standin.parse_every("@every 2s") == 2.0
    with pytest.raises(ValueError, match=r"spec\.schedule '\*/5 \* \* \* \*'"):
        standin.parse_every("*/5 * * * *")


def test_a_port_is_one_pods_at_a_time_on_the_benchs_host_network() -> None:
    """A second pod's sidecar on the same port waits until the first pod ended (the bench's
    pods share one loopback): its probe is never answered by another pod's sidecar."""
    import threading

    from tests.e2e.kubelet import HostPorts

    ports, first, second = HostPorts(), object(), object()
    ports.hold(26754, first, timeout=1)
    ports.hold(26754, first, timeout=1)  # its own port again: no wait
    ports.hold(26755, second, timeout=1)  # another port: no wait
    with pytest.raises(RuntimeError, match="still held by another pod"):
        ports.hold(26754, second, timeout=0.05)
    got = threading.Event()

    def hold_then_say() -> None:
        ports.hold(26754, second, timeout=10)
        got.set()

    waiter = threading.Thread(target=hold_then_say, daemon=True)
    waiter.start()
    assert not got.wait(0.2)  # waits while the first pod runs
    ports.release(first)
    assert got.wait(5)
    waiter.join(5)
    deleted = threading.Event()
    deleted.set()  # a pod deleted while it waits gives up, holding nothing
    assert ports.hold(26755, first, timeout=10, cancelled=deleted) is False
    ports.release(second)
    assert ports.hold(26755, first, timeout=1) is True
