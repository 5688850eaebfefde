"""The Apache Spark Kubernetes Operator's decision rules, as pure functions (no API, no clock).

The stand-in (``apache_standin.py``) runs these against the bench; ``test_apache_standin_
functions.py`` checks them against the model (``apache-model.md``, whose § numbers and source
tags the docstrings cite). Upstream repo ``apache/spark-kubernetes-operator``; abbreviations:

* **AS** ``spark-operator-api/.../status/ApplicationStatus.java`` (newest, ≥ PR #514)
* **ASS** ``.../status/ApplicationStateSummary.java``; **RP** ``.../spec/RestartPolicy.java``
* **RC** ``.../spec/RestartConfig.java``; **AT** ``.../spec/ApplicationTolerations.java``
* **TC** ``.../spec/ApplicationTimeoutConfig.java``; **MU** ``.../utils/ModelUtils.java``
* **OBS** ``spark-operator/.../observers/BaseAppDriverObserver.java``
* **SW** ``spark-submission-worker/.../SparkAppSubmissionWorker.java``
* **CU** ``spark-operator/.../reconcilesteps/AppCleanUpStep.java``

Times are ISO-8601 strings (``ApplicationState.lastTransitionTime`` is ``Instant.toString``).
Every function here is purely computational, with no side-effects; a bad input is refused with
a ``ValueError`` naming the field.
"""

from __future__ import annotations

import copy
import datetime
import hashlib
from collections.abc import Mapping
from typing import Any, Final

#: ``ApplicationStateSummary`` in ordinal order (ASS @026bc0fa; ``RunningWithPartialCapacity``
#: of 2026 ``main`` is left out: no reconciler in the index handles it, model §3)
STATES: Final = (
    "Submitted", "ScheduledToRestart", "DriverRequested", "DriverStarted", "DriverReady",
    "InitializedBelowThresholdExecutors", "RunningHealthy", "RunningWithBelowThresholdExecutors",
    "DriverStartTimedOut", "ExecutorsStartTimedOut", "DriverReadyTimedOut", "Succeeded",
    "Failed", "SchedulingFailure", "DriverEvicted", "ResourceReleased",
    "TerminatedWithoutReleaseResources",
)  # fmt: skip
#: ASS ``isInitializing``
INITIALIZING: Final = frozenset({"Submitted", "ScheduledToRestart"})
#: ASS ``isFailure``
FAILURE: Final = frozenset({
    "DriverStartTimedOut", "ExecutorsStartTimedOut", "SchedulingFailure", "DriverEvicted",
    "Failed", "DriverReadyTimedOut",
})  # fmt: skip
#: ASS ``isInfrastructureFailure``
INFRASTRUCTURE_FAILURE: Final = frozenset(
    {"DriverStartTimedOut", "ExecutorsStartTimedOut", "SchedulingFailure"}
)
#: ASS ``isTerminated``
TERMINATED: Final = frozenset({"ResourceReleased", "TerminatedWithoutReleaseResources"})
#: ASS ``isStopping``: after RunningWithBelowThresholdExecutors and not terminated
STOPPING: Final = (
    frozenset(STATES[STATES.index("RunningWithBelowThresholdExecutors") + 1 :]) - TERMINATED
)
#: ASS ``isStarting``: strictly between ScheduledToRestart and RunningHealthy
STARTING: Final = frozenset(
    STATES[STATES.index("DriverRequested") : STATES.index("RunningHealthy")]
)

RESTART_POLICIES: Final = ("Always", "Never", "OnFailure", "OnInfrastructureFailure")
RETAIN_POLICIES: Final = ("Always", "Never", "OnFailure")

#: Constants ``EXCEED_MAX_RETRY_ATTEMPT_MESSAGE`` and its per-kind siblings (K, ≥ PR #514)
EXCEED_MAX_RETRY: Final = "The maximum number of restart attempts ({}) has been exceeded."
EXCEED_MAX_RETRY_ON_FAILURE: Final = (
    "The maximum number of restart attempts on consecutive failures ({}) has been exceeded."
)
EXCEED_MAX_RETRY_ON_SCHEDULING_FAILURE: Final = (
    "The maximum number of restart attempts on consecutive scheduling failures ({}) has been "
    "exceeded."
)
#: AS ``terminateAppWithoutReleaseResource``
WITHOUT_RELEASE: Final = "Application is terminated without releasing resources as configured."

#: SW: ``DEFAULT_ID_LENGTH_LIMIT``, ``DEFAULT_HASH_BASED_IDENTIFIER_LENGTH_LIMIT``, base 36
ID_LENGTH_LIMIT: Final = 46
HASH_LENGTH: Final = 36
#: Spark's default driver container name (``Constants.DEFAULT_DRIVER_CONTAINER_NAME``)
DRIVER_CONTAINER: Final = "spark-kubernetes-driver"


def iso(when: datetime.datetime) -> str:
    """``Instant.toString``: UTC, ``Z``."""
    return when.astimezone(datetime.UTC).isoformat().replace("+00:00", "Z")


def parse_iso(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


# -- spec: the restart config, its defaults (RC, AT, TC) -------------------------------------


def _long(value: Any, field: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{field}={value!r}: use an integer (milliseconds or a count)")
    return value


def restart_config(spec: Mapping[str, Any]) -> dict[str, Any]:
    """``spec.applicationTolerations.restartConfig`` with RC's Java defaults (Never, 3 attempts,
    30 s backoff, counter reset -1, the per-kind limits and backoffs null)."""
    given = ((spec.get("applicationTolerations") or {}).get("restartConfig")) or {}
    field = "spec.applicationTolerations.restartConfig"
    policy = given.get("restartPolicy") or "Never"
    if policy not in RESTART_POLICIES:
        raise ValueError(
            f"{field}.restartPolicy {policy!r}: use one of {', '.join(RESTART_POLICIES)}"
        )
    config: dict[str, Any] = {"restartPolicy": policy}
    defaults = {
        "maxRestartAttempts": 3, "restartBackoffMillis": 30000, "restartCounterResetMillis": -1,
        "maxRestartOnFailure": None, "restartBackoffMillisForFailure": None,
        "maxRestartOnSchedulingFailure": None, "restartBackoffMillisForSchedulingFailure": None,
    }  # fmt: skip
    for key, default in defaults.items():
        value = _long(given.get(key), f"{field}.{key}")
        config[key] = default if value is None else value
    return config


def retain_policy(spec: Mapping[str, Any]) -> str:
    """``applicationTolerations.resourceRetainPolicy`` (AT; default Never)."""
    policy = (spec.get("applicationTolerations") or {}).get("resourceRetainPolicy") or "Never"
    if policy not in RETAIN_POLICIES:
        raise ValueError(
            f"spec.applicationTolerations.resourceRetainPolicy {policy!r}: use one of "
            f"{', '.join(RETAIN_POLICIES)}"
        )
    return str(policy)


def ttl_after_stop_millis(spec: Mapping[str, Any]) -> int:
    """``applicationTolerations.ttlAfterStopMillis`` (AT; -1: never)."""
    tolerations = spec.get("applicationTolerations") or {}
    value = _long(
        tolerations.get("ttlAfterStopMillis"), "spec.applicationTolerations.ttlAfterStopMillis"
    )
    return -1 if value is None else value


def attempt_restart_on_state(policy: str, state: str) -> bool:
    """RP ``attemptRestartOnState``: Always any stopping state; OnFailure a failure;
    OnInfrastructureFailure an infrastructure failure; Never none."""
    return {
        "Always": True,
        "Never": False,
        "OnFailure": state in FAILURE,
        "OnInfrastructureFailure": state in INFRASTRUCTURE_FAILURE,
    }[policy]


def effective_backoff_millis(config: Mapping[str, Any], state: str) -> int:
    """RC ``getEffectiveRestartBackoffMillis``: the SchedulingFailure backoff if set for it,
    else the failure backoff if set for a failure, else ``restartBackoffMillis``."""
    scheduling = config.get("restartBackoffMillisForSchedulingFailure")
    if state == "SchedulingFailure" and scheduling is not None:
        return int(scheduling)
    failure = config.get("restartBackoffMillisForFailure")
    if state in FAILURE and failure is not None:
        return int(failure)
    return int(config["restartBackoffMillis"])


# -- status: new, append, terminateOrRestart (BS, AS) ----------------------------------------


def attempt_info(attempt_id: int = 0) -> dict[str, int]:
    """AI ``ApplicationAttemptInfo``: id and the three restart counters (0 at first)."""
    return {
        "id": attempt_id, "restartCounter": 0, "failureRestartCounter": 0,
        "schedulingFailureRestartCounter": 0,
    }  # fmt: skip


def app_state(summary: str, message: str, now: datetime.datetime) -> dict[str, Any]:
    """An ``ApplicationState``: summary, message, ``lastTransitionTime`` = now."""
    if summary not in STATES:
        raise ValueError(f"currentStateSummary {summary!r}: not an ApplicationStateSummary")
    return {"currentStateSummary": summary, "lastTransitionTime": iso(now), "message": message}


def new_status(now: datetime.datetime) -> dict[str, Any]:
    """BS/AS ``new ApplicationStatus()`` as ``AppValidateStep`` persists it for an app without
    status: Submitted, history {0: Submitted}, attempt 0 with counters 0, no previous attempt."""
    state = app_state("Submitted", "", now)
    return {
        "currentState": state,
        "stateTransitionHistory": {"0": copy.deepcopy(state)},
        "currentAttemptSummary": {"attemptInfo": attempt_info()},
    }


def last_key(status: Mapping[str, Any]) -> int:
    """The largest key of ``stateTransitionHistory`` (JSON keys are strings of longs)."""
    history = status.get("stateTransitionHistory") or {}
    if not history:
        raise ValueError("status.stateTransitionHistory is empty: a status starts at {0: ...}")
    return max(int(key) for key in history)


def append_state(status: Mapping[str, Any], state: Mapping[str, Any]) -> dict[str, Any]:
    """AS ``appendNewState`` / ``createUpdatedHistoryWithNewState``: the state becomes current
    and is added under key = last key + 1 (keys never restart)."""
    updated = copy.deepcopy(dict(status))
    updated["currentState"] = copy.deepcopy(dict(state))
    history = dict(updated.get("stateTransitionHistory") or {})
    history[str(last_key(status) + 1)] = copy.deepcopy(dict(state))
    updated["stateTransitionHistory"] = history
    return updated


def summary_of(status: Mapping[str, Any]) -> str:
    return str((status.get("currentState") or {}).get("currentStateSummary") or "")


def current_attempt_duration(status: Mapping[str, Any]) -> datetime.timedelta:
    """AS ``calculateCurrentAttemptDuration``: from the newest initializing entry of the
    history (``findFirstStateOfCurrentAttempt``; the first entry if none) to the current
    state's ``lastTransitionTime``."""
    history = status["stateTransitionHistory"]
    keys = sorted(history, key=int)
    first = history[keys[0]]
    for key in reversed(keys):
        if history[key]["currentStateSummary"] in INITIALIZING:
            first = history[key]
            break
    return parse_iso(status["currentState"]["lastTransitionTime"]) - parse_iso(
        first["lastTransitionTime"]
    )


def next_attempt_info(info: Mapping[str, Any], state: str, *, reset: bool) -> dict[str, int]:
    """AS ``getAttemptInfo``: id + 1 always; restartCounter 1 on a reset, else + 1;
    failureRestartCounter 0 on a reset or a non-failure, else + 1 (SchedulingFailure too);
    schedulingFailureRestartCounter + 1 on SchedulingFailure, else 0."""
    restart = 1 if reset else int(info.get("restartCounter") or 0) + 1
    failures = int(info.get("failureRestartCounter") or 0)
    scheduling = int(info.get("schedulingFailureRestartCounter") or 0)
    if reset:
        failures, scheduling = 0, 0
    elif state == "SchedulingFailure":
        failures, scheduling = failures + 1, scheduling + 1
    elif state in FAILURE:
        failures, scheduling = failures + 1, 0
    else:
        failures, scheduling = 0, 0
    return {
        "id": int(info.get("id") or 0) + 1, "restartCounter": restart,
        "failureRestartCounter": failures, "schedulingFailureRestartCounter": scheduling,
    }  # fmt: skip


def retained(policy: str, state: str) -> bool:
    """AS/CU: whether ``resourceRetainPolicy`` keeps the resources of an attempt ending in
    ``state`` (Always; OnFailure and a failure state)."""
    return policy == "Always" or (policy == "OnFailure" and state in FAILURE)


def terminate_or_restart(
    status: Mapping[str, Any],
    config: Mapping[str, Any],
    *,
    message: str,
    now: datetime.datetime,
    retain: str = "Never",
    trim: bool = True,
) -> dict[str, Any]:
    """AS ``terminateOrRestart``: the status after an attempt ended in a stopping state.

    1. not stopping → error; 2. the policy does not restart this state → ResourceReleased with
    ``message`` (TerminatedWithoutReleaseResources if ``retain`` keeps it), summaries unchanged;
    3. reset when ``restartCounterResetMillis`` ≥ 0 and the attempt lasted that long;
    4. the next attempt's info (:func:`next_attempt_info`); 5. the limits, first match:
    restartCounter > maxRestartAttempts; else (SchedulingFailure, its limit set) its counter;
    else (a failure, ``maxRestartOnFailure`` set) the failure counter → final with the limit's
    message + ``message``, summaries kept; 6. ScheduledToRestart (message ``message``) with the
    next attempt; trimmed (CONF ``trimStateTransitionHistoryEnabled``, default true): the
    previous summary gets the ending attempt's info and the whole history, the history is
    {last key + 1: ScheduledToRestart}; untrimmed: the history grows, the ending attempt summary
    becomes the previous one.
    """
    state = summary_of(status)
    if state not in STOPPING:
        raise ValueError(
            f"status.currentState.currentStateSummary {state!r}: an application cannot be "
            "terminated or restarted unless it is in a stopping state"
        )

    def final(summary_message: str) -> dict[str, Any]:
        if retained(retain, state):
            end = app_state(
                "TerminatedWithoutReleaseResources", WITHOUT_RELEASE + summary_message, now
            )
        else:
            end = app_state("ResourceReleased", summary_message, now)
        return append_state(status, end)

    if not attempt_restart_on_state(config["restartPolicy"], state):
        return final(message)
    reset_after = int(config.get("restartCounterResetMillis", -1))
    reset = reset_after >= 0 and current_attempt_duration(status) >= datetime.timedelta(
        milliseconds=reset_after
    )
    current = status.get("currentAttemptSummary") or {"attemptInfo": attempt_info()}
    nxt = next_attempt_info(current.get("attemptInfo") or attempt_info(), state, reset=reset)
    exceeded, limit_message = False, ""
    if nxt["restartCounter"] > int(config["maxRestartAttempts"]):
        exceeded = True
        limit_message = EXCEED_MAX_RETRY.format(config["maxRestartAttempts"])
    elif config.get("maxRestartOnSchedulingFailure") is not None and state == "SchedulingFailure":
        limit = int(config["maxRestartOnSchedulingFailure"])
        exceeded = nxt["schedulingFailureRestartCounter"] > limit
        limit_message = EXCEED_MAX_RETRY_ON_SCHEDULING_FAILURE.format(limit)
    elif config.get("maxRestartOnFailure") is not None and state in FAILURE:
        limit = int(config["maxRestartOnFailure"])
        exceeded = nxt["failureRestartCounter"] > limit
        limit_message = EXCEED_MAX_RETRY_ON_FAILURE.format(limit)
    if exceeded:
        return final(limit_message + message)
    restart = app_state("ScheduledToRestart", message, now)
    if trim:
        return {
            "currentState": restart,
            "stateTransitionHistory": {str(last_key(status) + 1): copy.deepcopy(restart)},
            "previousAttemptSummary": {
                "attemptInfo": copy.deepcopy(current.get("attemptInfo") or attempt_info()),
                "stateTransitionHistory": copy.deepcopy(status["stateTransitionHistory"]),
            },
            "currentAttemptSummary": {"attemptInfo": nxt},
        }
    updated = append_state(status, restart)
    updated["previousAttemptSummary"] = copy.deepcopy(current)
    updated["currentAttemptSummary"] = {"attemptInfo": nxt}
    return updated


def restart_wait_millis(
    status: Mapping[str, Any], config: Mapping[str, Any], *, now: datetime.datetime
) -> float:
    """``AppInitStep``: milliseconds left before a restart's driver may be requested (≤ 0: now):
    ScheduledToRestart's ``lastTransitionTime`` + the effective backoff for the previous
    attempt's last state. No wait for the first attempt (no ``previousAttemptSummary``)."""
    previous = status.get("previousAttemptSummary")
    if not previous:
        return 0.0
    history = previous.get("stateTransitionHistory") or {}
    if history:
        ended = history[max(history, key=int)]["currentStateSummary"]
    else:  # untrimmed: the ending state is the one before ScheduledToRestart
        entries = status["stateTransitionHistory"]
        keys = sorted(entries, key=int)
        ended = entries[keys[-2]]["currentStateSummary"] if len(keys) > 1 else "Failed"
    since = parse_iso(status["currentState"]["lastTransitionTime"])
    due = since + datetime.timedelta(milliseconds=effective_backoff_millis(config, ended))
    return (due - now).total_seconds() * 1000


def ttl_wait_millis(
    status: Mapping[str, Any], spec: Mapping[str, Any], *, now: datetime.datetime
) -> float | None:
    """CU ``checkEarlyExitForTerminatedApp`` for ResourceReleased: ``None`` without a TTL
    (``ttlAfterStopMillis`` < 0: stop reconciling); else milliseconds until the app is to be
    deleted (≤ 0: delete now), counted from the **previous** history entry's time (the state
    before the terminal one)."""
    ttl = ttl_after_stop_millis(spec)
    if ttl < 0:
        return None
    history = status["stateTransitionHistory"]
    keys = sorted(history, key=int)
    before = history[keys[-2]] if len(keys) > 1 else history[keys[-1]]
    due = parse_iso(before["lastTransitionTime"]) + datetime.timedelta(milliseconds=ttl)
    return (due - now).total_seconds() * 1000


# -- names (SW, Spark) ------------------------------------------------------------------------


def attempt_id(status: Mapping[str, Any] | None) -> int:
    """``currentAttemptSummary.attemptInfo.id`` (0 when absent)."""
    summary = (status or {}).get("currentAttemptSummary") or {}
    return int((summary.get("attemptInfo") or {}).get("id") or 0)


def generated_app_id(namespace: str, name: str, attempt: int) -> str:
    """SW ``generateSparkAppId``: ``<name>-<attemptId>``; longer than 46 characters: its first
    9 characters, ``-``, and the first 36 base-36 digits of SHA-256(``ns/name/attemptId``)
    (``generateHashBasedId``)."""
    preferred = f"{name}-{attempt}"
    if len(preferred) <= ID_LENGTH_LIMIT:
        return preferred
    prefix = preferred[: ID_LENGTH_LIMIT - HASH_LENGTH - 1]
    digest = hashlib.sha256(f"{namespace}/{name}/{attempt}".encode()).digest()
    number, digits = int.from_bytes(digest, "big"), ""
    while number:
        number, rest = divmod(number, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[rest] + digits
    return f"{prefix}-{(digits or '0')[:HASH_LENGTH]}"


def spark_app_id(app: Mapping[str, Any]) -> str:
    """SW ``buildDriverConf``: the user's ``spark.app.id`` if set (set-if-missing), else the
    generated one for the current attempt."""
    conf = app["spec"].get("sparkConf") or {}
    meta = app["metadata"]
    return str(
        conf.get("spark.app.id")
        or generated_app_id(meta["namespace"], meta["name"], attempt_id(app.get("status")))
    )


def driver_pod_name(app: Mapping[str, Any]) -> str:
    """Spark's rule on ``SparkAppDriverConf.resourceNamePrefix`` (= the app id, SW):
    ``spark.kubernetes.driver.pod.name`` if set, else ``<app id>-driver``; so by default
    ``<name>-<attemptId>-driver``, a new name per attempt (model §5; Spark not read)."""
    conf = app["spec"].get("sparkConf") or {}
    return str(conf.get("spark.kubernetes.driver.pod.name") or f"{spark_app_id(app)}-driver")


# -- observers (OBS, MU) ----------------------------------------------------------------------


def _main_statuses(pod: Mapping[str, Any], conf: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """MU ``findDriverMainContainerStatus``: every container status, or only the one named by
    ``spark.kubernetes.driver.podTemplateContainerName`` when that conf is set."""
    statuses = list((pod.get("status") or {}).get("containerStatuses") or [])
    named = conf.get("spark.kubernetes.driver.podTemplateContainerName")
    return [s for s in statuses if s.get("name") == named] if named else statuses


def driver_started(pod: Mapping[str, Any], conf: Mapping[str, Any]) -> bool:
    """``AppDriverStartObserver``: the driver's main container(s) are ready."""
    mains = _main_statuses(pod, conf)
    return bool(mains) and all(s.get("ready") is True for s in mains)


def _exit(status: Mapping[str, Any]) -> int | None:
    terminated = (status.get("state") or {}).get("terminated")
    return None if terminated is None else int(terminated.get("exitCode") or 0)


def observe_driver_termination(  # noqa: PLR0911 - one return per upstream rule
    pod: Mapping[str, Any], conf: Mapping[str, Any], *, was_ready: bool
) -> tuple[str, str] | None:
    """OBS ``observeDriverTermination``: the stopping state (and message) a driver pod shows, or
    ``None``. First match: no container statuses → None; phase Failed → Failed (DriverEvicted if
    the reason is Evicted); phase Succeeded → Succeeded if the driver had been ready, else
    Failed; an initContainer terminated with exit > 0 → Failed; a main container terminated →
    Failed if any exit > 0, else Succeeded; a main container restarted → Failed."""
    status = pod.get("status") or {}
    if not status.get("containerStatuses"):
        return None
    phase = status.get("phase")
    if phase == "Failed":
        if status.get("reason") == "Evicted":
            return "DriverEvicted", "Driver pod evicted."
        return "Failed", "Driver has failed."
    if phase == "Succeeded":
        if was_ready:
            return "Succeeded", "Driver has completed."
        return "Failed", ("Driver terminated without SparkContext / SparkSession initialization.")
    for init in status.get("initContainerStatuses") or []:
        code = _exit(init)
        if code is not None and code > 0:
            return "Failed", "Driver has failed init container(s)."
    mains = _main_statuses(pod, conf)
    exits = [code for code in (_exit(s) for s in mains) if code is not None]
    if exits:
        if any(code > 0 for code in exits):
            return "Failed", "Driver container(s) failed."
        return "Succeeded", "Driver has completed."
    if any(int(s.get("restartCount") or 0) > 0 for s in mains):
        return "Failed", "Driver container restarted unexpectedly."
    return None


def timed_out(
    status: Mapping[str, Any], spec: Mapping[str, Any], *, now: datetime.datetime
) -> str | None:
    """The timeout observer (TC): DriverRequested → DriverStartTimedOut, DriverStarted →
    DriverReadyTimedOut, DriverReady / InitializedBelowThresholdExecutors →
    ExecutorsStartTimedOut, once ``lastTransitionTime`` + the timeout (> 0; default 300 s) is
    past."""
    timeouts = (spec.get("applicationTolerations") or {}).get("applicationTimeoutConfig") or {}
    rule = {
        "DriverRequested": ("driverStartTimeoutMillis", "DriverStartTimedOut"),
        "DriverStarted": ("driverReadyTimeoutMillis", "DriverReadyTimedOut"),
        "DriverReady": ("executorStartTimeoutMillis", "ExecutorsStartTimedOut"),
        "InitializedBelowThresholdExecutors": (
            "executorStartTimeoutMillis", "ExecutorsStartTimedOut",
        ),
    }.get(summary_of(status))  # fmt: skip
    if rule is None:
        return None
    limit = timeouts.get(rule[0])
    limit = 300_000 if limit is None else int(limit)
    since = parse_iso(status["currentState"]["lastTransitionTime"])
    if limit > 0 and now > since + datetime.timedelta(milliseconds=limit):
        return rule[1]
    return None
