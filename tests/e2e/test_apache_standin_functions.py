"""The Apache stand-in's pure rules against the model's statements (apache-model.md §§ 1-5, 7).

No bench: ``apache_rules.py`` is what the stand-in decides with; each table row is a sentence
of the model (the § named in the test's docstring).
"""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from tests.e2e import apache_rules as rules
from tests.e2e.apache_standin import pod_status
from tests.e2e.kubelet import DriverPod

T0 = datetime.datetime(2026, 11, 25, 12, 0, 0, tzinfo=datetime.UTC)


def _at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def _spec(**restart: Any) -> dict[str, Any]:
    return {"applicationTolerations": {"restartConfig": restart}}


def _ended(state: str, *, info: dict[str, int] | None = None, lasted: float = 10) -> dict[str, Any]:
    """A status whose attempt began (Submitted) at T0 and ended in ``state`` ``lasted`` s later."""
    status = rules.new_status(T0)
    status = rules.append_state(status, rules.app_state("DriverRequested", "", _at(1)))
    status = rules.append_state(status, rules.app_state(state, "", _at(lasted)))
    if info is not None:
        status["currentAttemptSummary"] = {"attemptInfo": info}
    return status


def _info(attempt: int, restarts: int, failures: int = 0, scheduling: int = 0) -> dict[str, int]:
    return {
        "id": attempt, "restartCounter": restarts, "failureRestartCounter": failures,
        "schedulingFailureRestartCounter": scheduling,
    }  # fmt: skip


def test_a_new_status_is_submitted_with_history_zero_and_attempt_zero() -> None:
    """§1, §9 d 2: {0: Submitted}, attempt id 0, counters 0, no previous attempt."""
    status = rules.new_status(T0)
    assert status["currentState"]["currentStateSummary"] == "Submitted"
    assert list(status["stateTransitionHistory"]) == ["0"]
    assert status["currentAttemptSummary"]["attemptInfo"] == _info(0, 0)
    assert "previousAttemptSummary" not in status


def test_each_transition_appends_under_the_last_key_plus_one() -> None:
    """§1, §9 d 3 (AS ``createUpdatedHistoryWithNewState``): keys grow by one, never restart;
    a JSON map's keys are strings, so "10" must follow "9" (numeric, not lexical, order)."""
    status = rules.new_status(T0)
    for n in range(1, 11):
        status = rules.append_state(status, rules.app_state("DriverRequested", "", _at(n)))
    assert rules.last_key(status) == 10
    status = rules.append_state(status, rules.app_state("Failed", "x", _at(11)))
    assert sorted(status["stateTransitionHistory"], key=int)[-1] == "11"
    assert status["currentState"]["message"] == "x"


@pytest.mark.parametrize(
    ("state", "stopping", "failure", "infrastructure", "terminated"),
    [
        ("Submitted", False, False, False, False),
        ("ScheduledToRestart", False, False, False, False),
        ("DriverReady", False, False, False, False),
        ("RunningHealthy", False, False, False, False),
        ("Succeeded", True, False, False, False),
        ("Failed", True, True, False, False),
        ("DriverEvicted", True, True, False, False),
        ("SchedulingFailure", True, True, True, False),
        ("DriverStartTimedOut", True, True, True, False),
        ("ExecutorsStartTimedOut", True, True, True, False),
        ("DriverReadyTimedOut", True, True, False, False),
        ("ResourceReleased", False, False, False, True),
        ("TerminatedWithoutReleaseResources", False, False, False, True),
    ],
)
def test_state_predicates(
    state: str, stopping: bool, failure: bool, infrastructure: bool, terminated: bool
) -> None:
    """§2 (ASS): the predicate table."""
    assert (state in rules.STOPPING) is stopping
    assert (state in rules.FAILURE) is failure
    assert (state in rules.INFRASTRUCTURE_FAILURE) is infrastructure
    assert (state in rules.TERMINATED) is terminated


@pytest.mark.parametrize(
    ("policy", "state", "restart"),
    [
        ("Never", "Failed", False),
        ("Always", "Succeeded", True),
        ("Always", "Failed", True),
        ("OnFailure", "Succeeded", False),
        ("OnFailure", "Failed", True),
        ("OnFailure", "SchedulingFailure", True),
        ("OnInfrastructureFailure", "Failed", False),
        ("OnInfrastructureFailure", "DriverStartTimedOut", True),
    ],
)
def test_attempt_restart_on_state(policy: str, state: str, restart: bool) -> None:
    """§1 (RP ``attemptRestartOnState``)."""
    assert rules.attempt_restart_on_state(policy, state) is restart


def test_restart_config_defaults_and_refusals() -> None:
    """§1 (RC): Never, 3 attempts, 30 s, reset -1, per-kind limits null; bad values refused."""
    config = rules.restart_config({})
    assert (config["restartPolicy"], config["maxRestartAttempts"]) == ("Never", 3)
    assert (config["restartBackoffMillis"], config["restartCounterResetMillis"]) == (30000, -1)
    assert config["maxRestartOnFailure"] is None
    with pytest.raises(ValueError, match=r"restartConfig\.restartPolicy 'Sometimes'"):
        rules.restart_config(_spec(restartPolicy="Sometimes"))
    with pytest.raises(ValueError, match=r"restartConfig\.maxRestartAttempts='3'"):
        rules.restart_config(_spec(maxRestartAttempts="3"))


@pytest.mark.parametrize(
    ("config", "state", "millis"),
    [
        ({}, "Failed", 30000),
        ({"restartBackoffMillisForFailure": 60000}, "Failed", 60000),
        ({"restartBackoffMillisForFailure": 60000}, "Succeeded", 30000),
        ({"restartBackoffMillisForFailure": 60000}, "SchedulingFailure", 60000),
        (
            {"restartBackoffMillisForFailure": 60000,
             "restartBackoffMillisForSchedulingFailure": 5000},
            "SchedulingFailure", 5000,
        ),
    ],
)  # fmt: skip
def test_effective_backoff(config: dict[str, Any], state: str, millis: int) -> None:
    """§4 (RC ``getEffectiveRestartBackoffMillis``): SchedulingFailure's, else failure's, else
    the default."""
    assert rules.effective_backoff_millis(rules.restart_config(_spec(**config)), state) == millis


@pytest.mark.parametrize(
    ("state", "info", "reset", "expected"),
    [
        ("Failed", _info(0, 0), False, _info(1, 1, 1, 0)),
        ("Failed", _info(2, 2, 2, 0), True, _info(3, 1, 0, 0)),
        ("Succeeded", _info(1, 1, 1, 0), False, _info(2, 2, 0, 0)),
        ("SchedulingFailure", _info(1, 1, 1, 1), False, _info(2, 2, 2, 2)),
        ("DriverEvicted", _info(1, 1, 1, 1), False, _info(2, 2, 2, 0)),
    ],
)
def test_next_attempt_info(
    state: str, info: dict[str, int], reset: bool, expected: dict[str, int]
) -> None:
    """§4 step 4 (AS ``getAttemptInfo``)."""
    assert rules.next_attempt_info(info, state, reset=reset) == expected


def test_terminate_or_restart_refuses_a_state_that_is_not_stopping() -> None:
    with pytest.raises(ValueError, match=r"'RunningHealthy'.*stopping state"):
        rules.terminate_or_restart(
            _ended("RunningHealthy"), rules.restart_config({}), message="", now=_at(11)
        )


def test_no_restart_is_final_resource_released_keeping_the_summaries() -> None:
    """§4 step 2: Never → ResourceReleased appended, history kept, summaries unchanged."""
    status = _ended("Failed")
    final = rules.terminate_or_restart(status, rules.restart_config({}), message="bye", now=_at(11))
    assert final["currentState"]["currentStateSummary"] == "ResourceReleased"
    assert final["currentState"]["message"] == "bye"
    assert [e["currentStateSummary"] for _, e in sorted(
        final["stateTransitionHistory"].items(), key=lambda kv: int(kv[0]))] == [
        "Submitted", "DriverRequested", "Failed", "ResourceReleased"]  # fmt: skip
    assert final["currentAttemptSummary"] == status["currentAttemptSummary"]


def test_a_retained_failure_terminates_without_release() -> None:
    """§4 step 2 (AS, retain policy OnFailure and a failure)."""
    final = rules.terminate_or_restart(
        _ended("Failed"), rules.restart_config({}), message="", now=_at(11), retain="OnFailure"
    )
    assert final["currentState"]["currentStateSummary"] == "TerminatedWithoutReleaseResources"


def test_a_restart_trims_the_history_into_the_previous_attempt() -> None:
    """§4 step 6: ScheduledToRestart under key last + 1, alone in the history; the previous
    summary has the ended attempt's info and its whole history; the new attempt is id 1."""
    status = _ended("Failed")
    restarted = rules.terminate_or_restart(
        status, rules.restart_config(_spec(restartPolicy="OnFailure")), message="", now=_at(11)
    )
    assert restarted["currentState"]["currentStateSummary"] == "ScheduledToRestart"
    assert list(restarted["stateTransitionHistory"]) == ["3"]
    previous = restarted["previousAttemptSummary"]
    assert previous["attemptInfo"] == _info(0, 0)
    assert previous["stateTransitionHistory"] == status["stateTransitionHistory"]
    assert restarted["currentAttemptSummary"]["attemptInfo"] == _info(1, 1, 1, 0)


def test_without_trimming_the_history_grows_and_the_attempt_moves_to_previous() -> None:
    status = _ended("Failed")
    restarted = rules.terminate_or_restart(
        status, rules.restart_config(_spec(restartPolicy="OnFailure")), message="",
        now=_at(11), trim=False,
    )  # fmt: skip
    assert sorted(restarted["stateTransitionHistory"], key=int) == ["0", "1", "2", "3"]
    assert restarted["previousAttemptSummary"] == status["currentAttemptSummary"]


@pytest.mark.parametrize(
    ("config", "state", "info", "lasted", "expected", "message"),
    [
        # maxRestartAttempts 3: the 4th restart (counter 4 > 3) is refused, at attempt id 3
        ({"maxRestartAttempts": 3}, "Failed", _info(3, 3, 3), 10, "ResourceReleased",
         "The maximum number of restart attempts (3) has been exceeded."),
        ({"maxRestartAttempts": 3}, "Failed", _info(2, 2, 2), 10, "ScheduledToRestart", ""),
        ({"maxRestartAttempts": 1}, "Failed", _info(0, 0), 10, "ScheduledToRestart", ""),
        ({"maxRestartAttempts": 1}, "Failed", _info(1, 1, 1), 10, "ResourceReleased",
         "The maximum number of restart attempts (1) has been exceeded."),
        # a long attempt resets the counters: the budget starts again
        ({"maxRestartAttempts": 1, "restartCounterResetMillis": 5000}, "Failed",
         _info(1, 1, 1), 10, "ScheduledToRestart", ""),
        ({"maxRestartAttempts": 1, "restartCounterResetMillis": 60000}, "Failed",
         _info(1, 1, 1), 10, "ResourceReleased",
         "The maximum number of restart attempts (1) has been exceeded."),
        # consecutive failures: a Succeeded in between zeroes the failure counter
        ({"maxRestartAttempts": 9, "maxRestartOnFailure": 1}, "Failed", _info(1, 1, 1), 10,
         "ResourceReleased",
         "The maximum number of restart attempts on consecutive failures (1) has been exceeded."),
        ({"maxRestartAttempts": 9, "maxRestartOnFailure": 1}, "Failed", _info(1, 1, 0), 10,
         "ScheduledToRestart", ""),
        ({"maxRestartAttempts": 9, "maxRestartOnFailure": 0}, "Succeeded", _info(1, 1, 1), 10,
         "ScheduledToRestart", ""),
        # SchedulingFailure with its own limit set: only that limit is checked
        ({"maxRestartAttempts": 9, "maxRestartOnFailure": 0,
          "maxRestartOnSchedulingFailure": 2}, "SchedulingFailure", _info(1, 1, 1, 1), 10,
         "ScheduledToRestart", ""),
        ({"maxRestartAttempts": 9, "maxRestartOnSchedulingFailure": 1}, "SchedulingFailure",
         _info(1, 1, 1, 1), 10, "ResourceReleased",
         "The maximum number of restart attempts on consecutive scheduling failures (1) has "
         "been exceeded."),
    ],
)  # fmt: skip
def test_terminate_or_restart_limits(  # noqa: PLR0917 - one row of the table
    config: dict[str, Any],
    state: str,
    info: dict[str, int],
    lasted: float,
    expected: str,
    message: str,
) -> None:
    """§4 steps 3 and 5 (AS ``terminateOrRestart``): reset, then the three limits in order."""
    status = _ended(state, info=info, lasted=lasted)
    spec = _spec(restartPolicy="Always", **config)
    after = rules.terminate_or_restart(
        status, rules.restart_config(spec), message="", now=_at(lasted + 1)
    )
    assert after["currentState"]["currentStateSummary"] == expected
    assert after["currentState"]["message"] == message
    if expected == "ResourceReleased":  # the summaries are kept: the last attempt's id
        assert after["currentAttemptSummary"]["attemptInfo"] == info
        assert "previousAttemptSummary" not in after


def test_on_failure_max_restart_attempts_three_gives_attempts_zero_to_three() -> None:
    """§4's counting example: OnFailure, maxRestartAttempts 3, every attempt Failed: attempts
    0..3, then ResourceReleased with attempt id 3; history keys keep growing across attempts."""
    config = rules.restart_config(_spec(restartPolicy="OnFailure", maxRestartAttempts=3))
    status = rules.new_status(T0)
    attempts, t = [], 0.0
    while True:
        attempts.append(rules.attempt_id(status))
        status = rules.append_state(status, rules.app_state("Failed", "", _at(t := t + 1)))
        status = rules.terminate_or_restart(status, config, message="", now=_at(t := t + 1))
        if status["currentState"]["currentStateSummary"] != "ScheduledToRestart":
            break
    assert attempts == [0, 1, 2, 3]
    assert status["currentState"]["currentStateSummary"] == "ResourceReleased"
    assert rules.attempt_id(status) == 3
    # keys: 0 Submitted, 1 Failed, {2} ScheduledToRestart, 3, {4}, 5, {6}, 7 Failed, 8 final
    assert sorted(status["stateTransitionHistory"], key=int) == ["6", "7", "8"]


def test_the_restart_waits_the_backoff_from_scheduled_to_restart() -> None:
    """§4, INIT: the wait counts from ScheduledToRestart's time; none for the first attempt."""
    config = rules.restart_config(_spec(restartPolicy="OnFailure", restartBackoffMillis=2000))
    assert rules.restart_wait_millis(rules.new_status(T0), config, now=T0) == 0
    restarted = rules.terminate_or_restart(_ended("Failed"), config, message="", now=_at(20))
    assert rules.restart_wait_millis(restarted, config, now=_at(20.5)) == 1500
    assert rules.restart_wait_millis(restarted, config, now=_at(23)) == -1000


def test_ttl_counts_from_the_state_before_the_terminal_one() -> None:
    """§7 (CU ``checkEarlyExitForTerminatedApp``): none without a TTL; else from the previous
    history entry's time."""
    final = rules.terminate_or_restart(
        _ended("Failed", lasted=10), rules.restart_config({}), message="", now=_at(30)
    )
    assert rules.ttl_wait_millis(final, {}, now=_at(31)) is None
    spec = {"applicationTolerations": {"ttlAfterStopMillis": 5000}}
    assert rules.ttl_wait_millis(final, spec, now=_at(31)) == (10 + 5 - 31) * 1000


@pytest.mark.parametrize(
    ("name", "attempt", "conf", "pod"),
    [
        ("nightly", 0, {}, "nightly-0-driver"),
        ("nightly", 2, {}, "nightly-2-driver"),
        ("nightly", 2, {"spark.app.id": "fixed"}, "fixed-driver"),
        ("nightly", 2, {"spark.kubernetes.driver.pod.name": "mine"}, "mine"),
    ],
)
def test_driver_pod_names(name: str, attempt: int, conf: dict[str, str], pod: str) -> None:
    """§5 (SW ``generateSparkAppId``; Spark's ``<prefix>-driver``)."""
    status = rules.new_status(T0)
    status["currentAttemptSummary"]["attemptInfo"]["id"] = attempt
    app = {
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"sparkConf": conf},
        "status": status,
    }
    assert rules.driver_pod_name(app) == pod


def test_a_long_app_id_is_hashed_to_46_characters() -> None:
    """§5 (SW ``generateHashBasedId``): 9 characters of ``<name>-<attempt>``, ``-``, 36 base-36
    digits of SHA-256("ns/name/attempt"); deterministic, different per attempt."""
    name = "a-very-long-application-name-for-the-nightly-job"
    first = rules.generated_app_id("ns", name, 0)
    assert len(first) == 46
    assert first.startswith("a-very-lo-")
    assert first == rules.generated_app_id("ns", name, 0)
    assert first != rules.generated_app_id("ns", name, 1)
    assert rules.generated_app_id("ns", "short", 1) == "short-1"


def _pod(
    phase: str, *, init: tuple[int, ...] = (), main: int | None = None, **extra: Any
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, **extra}
    status["initContainerStatuses"] = [
        {"name": f"init-{i}", "state": {"terminated": {"exitCode": c}}} for i, c in enumerate(init)
    ]
    state = {"running": {}} if main is None else {"terminated": {"exitCode": main}}
    status["containerStatuses"] = [{"name": "spark", "state": state, "ready": main is None}]
    return {"status": status}


@pytest.mark.parametrize(
    ("pod", "was_ready", "expected"),
    [
        ({"status": {"phase": "Pending"}}, False, None),
        (_pod("Failed", main=1), True, "Failed"),
        (_pod("Failed", main=0, reason="Evicted"), True, "DriverEvicted"),
        (_pod("Succeeded", main=0), True, "Succeeded"),
        (_pod("Succeeded", main=0), False, "Failed"),
        # a native sidecar that died with 143 at shutdown turns a success into Failed (§9 a)
        (_pod("Running", init=(0, 143), main=0), True, "Failed"),
        (_pod("Running", init=(0,), main=0), True, "Succeeded"),
        (_pod("Running", init=(0,), main=137), True, "Failed"),
        (_pod("Running", init=(0,)), True, None),
    ],
)
def test_observe_driver_termination(
    pod: dict[str, Any], was_ready: bool, expected: str | None
) -> None:
    """§3 (OBS ``observeDriverTermination``): first match wins."""
    found = rules.observe_driver_termination(pod, {}, was_ready=was_ready)
    assert (found[0] if found else None) == expected


def test_the_main_container_is_the_named_one_when_the_conf_names_it() -> None:
    """§3 step 5 (MU ``findDriverMainContainerStatus``)."""
    pod = _pod("Running", main=0)
    pod["status"]["containerStatuses"].append(
        {"name": "helper", "state": {"terminated": {"exitCode": 2}}}
    )
    assert rules.observe_driver_termination(pod, {}, was_ready=True) == (
        "Failed", "Driver container(s) failed."
    )  # fmt: skip
    conf = {"spark.kubernetes.driver.podTemplateContainerName": "spark"}
    assert rules.observe_driver_termination(pod, conf, was_ready=True) == (
        "Succeeded", "Driver has completed."
    )  # fmt: skip


@pytest.mark.parametrize(
    ("state", "since", "expected"),
    [
        ("DriverRequested", 301, "DriverStartTimedOut"),
        ("DriverRequested", 299, None),
        ("DriverStarted", 301, "DriverReadyTimedOut"),
        ("DriverReady", 301, "ExecutorsStartTimedOut"),
        ("RunningHealthy", 9999, None),
    ],
)
def test_timeouts(state: str, since: float, expected: str | None) -> None:
    """§3 (the timeout observer, TC defaults 300 s)."""
    status = rules.append_state(rules.new_status(T0), rules.app_state(state, "", T0))
    assert rules.timed_out(status, {}, now=_at(since)) == expected


def test_the_kubelets_report_of_a_stand_in_pod() -> None:
    """The stand-in's pod status: the driver container is ready while it runs, its exit and
    the initContainers' exits are terminated states the observer reads."""
    pod = DriverPod(name="p", submission="s", index=0, record={"init": [("lib", 0)]})
    pod.phase = "Running"
    running = {"status": pod_status(pod, container="spark")}
    assert rules.driver_started(running, {})
    assert rules.observe_driver_termination(running, {}, was_ready=True) is None
    pod.driver_exit, pod.driver_reason = 137, "Error"
    ended = {"status": pod_status(pod, container="spark")}
    assert rules.observe_driver_termination(ended, {}, was_ready=True) == (
        "Failed", "Driver container(s) failed."
    )  # fmt: skip
