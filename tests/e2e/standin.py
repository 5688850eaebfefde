"""A stand-in for the Kubeflow spark-operator (v2), for a bench with no kubelet.

It is a *model of upstream*, transition by transition: every modelled step names the upstream
function it follows (``kubeflow/spark-operator``, paths below; the reading, with versions, is
``tests/e2e/kubeflow-model.md``, and ``tests/e2e/README.md`` has the fidelity table). Where the
stand-in differs from upstream it says so here and in the table.

**The controller** (``internal/controller/sparkapplication/controller.go``, ≥2.5 as read at
@012a5925): a real watch of the app (the informer) runs the update predicate
(``event_filter.go`` ``EventFilter.Update``) and enqueues; one worker reconciles by
``status.applicationState.state``. Every reconcile re-GETs the app, mutates a copy and writes
the *whole* status with the app's resourceVersion (``Status().Update``), re-running the step on
a conflict (``retry.RetryOnConflict``). Requeues after a retry wait (``RequeueAfter``) or with a
backoff after an error.

**The driver pod** (the kubelet's part) is ``kubelet.py``'s, shared with the Apache stand-in:
the app's *mutated* spec (``spec.driver``, ``spec.volumes``, ``spec.sparkConf``) is run as
local processes, what a driver pod would run (:class:`tests.e2e.kubelet.Kubelet`; the three
driver programs ``demo``, ``plain`` and ``light`` are described there).

Not modelled (see the Gaps in kubeflow-model.md §9 and the table): executor pods and
``executorState`` (Spark runs in local mode inside the "driver", except the light driver's one
executor), the UI Service/Ingress, the pod webhook's own selection of volumes and containers
(the spec is read directly), batch schedulers, suspend/resume, the 1.x controller.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Final, cast

from kubernetes import client, watch

from tests.e2e import transitions
from tests.e2e.kubelet import (
    DriverPod,
    DriverPodStillRunningError,
    Kubelet,
    PidNamespacesUnavailableError,
    PodSpec,
    pid_namespaces_available,
)

__all__ = [
    "DriverPod",
    "DriverPodStillRunningError",
    "PidNamespacesUnavailableError",
    "StandInScheduledController",
    "StandInSparkOperator",
    "pid_namespaces_available",
]

GROUP, VERSION, PLURAL = "sparkoperator.k8s.io", "v1beta2", "sparkapplications"
SCHEDULED_PLURAL: Final = "scheduledsparkapplications"

#: upstream files the model cites (repo kubeflow/spark-operator)
CONTROLLER: Final = "internal/controller/sparkapplication/controller.go"
EVENT_FILTER: Final = "internal/controller/sparkapplication/event_filter.go"
EVENT_HANDLER: Final = "internal/controller/sparkapplication/event_handler.go"
UTIL: Final = "pkg/util/sparkapplication.go"
SCHEDULED_CONTROLLER: Final = "internal/controller/scheduledsparkapplication/controller.go"

#: the label spark-operator puts on the runs of a ScheduledSparkApplication (pkg/common)
SCHEDULED_APP_NAME_LABEL: Final = "sparkoperator.k8s.io/scheduled-app-name"
#: the driver container's name (``GetDriverState`` reads its terminated state)
DRIVER_CONTAINER: Final = "spark-kubernetes-driver"

TERMINAL_STATES: Final = frozenset({"COMPLETED", "FAILED"})


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(text: Any) -> datetime.datetime | None:
    if not isinstance(text, str) or not text:
        return None
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)


def _conflict(exc: client.ApiException) -> bool:
    return bool(exc.status == 409)


# -- pure functions of pkg/util/sparkapplication.go ----------------------------------------------


def restart_policy(spec: Mapping[str, Any]) -> dict[str, Any]:
    """``spec.restartPolicy`` with the defaults spark-operator's SparkApplication webhook gives it.

    Upstream: ``internal/webhook/sparkapplication_defaulter.go`` ``defaultSparkApplication``
    (type Never when unset; both retry intervals 5 s for any other type). A purely computational
    function with no side-effects. A bad type is refused, naming the field.
    """
    policy = dict(spec.get("restartPolicy") or {})
    kind = policy.get("type") or "Never"
    if kind not in ("Never", "OnFailure", "Always"):
        raise ValueError(
            f"spec.restartPolicy.type {kind!r}: use Never, OnFailure or Always (the CRD's enum)"
        )
    policy["type"] = kind
    if kind != "Never":
        policy.setdefault("onFailureRetryInterval", 5)
        policy.setdefault("onSubmissionFailureRetryInterval", 5)
    return policy


def should_retry(app: Mapping[str, Any]) -> bool:
    """Whether spark-operator retries ``app`` in its current state.

    Upstream: ``pkg/util/sparkapplication.go`` ``ShouldRetry``. A purely computational function
    with no side-effects.
    """
    status = app.get("status") or {}
    state = (status.get("applicationState") or {}).get("state")
    policy = restart_policy(app["spec"])
    kind = policy["type"]
    if state == "SUCCEEDING":
        return bool(kind == "Always")
    # The same rule for both failures, each with its own budget and counter.
    budget = {
        "FAILING": ("onFailureRetries", "executionAttempts"),
        "SUBMISSION_FAILED": ("onSubmissionFailureRetries", "submissionAttempts"),
    }.get(state)
    if budget is None:
        return False
    if kind == "Always":
        return True
    retries = policy.get(budget[0])
    return (
        kind == "OnFailure"
        and retries is not None
        and (int(status.get(budget[1]) or 0) <= int(retries))
    )


def time_until_next_retry_due(app: Mapping[str, Any], *, now: datetime.datetime) -> float:
    """Seconds until the next retry of ``app`` is due (≤ 0: due now).

    Upstream: ``pkg/util/sparkapplication.go`` ``TimeUntilNextRetryDue``: the state's interval
    x ``submissionAttempts`` (not executionAttempts), counted from ``lastSubmissionAttemptTime``.
    Raises ``ValueError`` when the interval is unset or the attempts are ≤ 0 (upstream: an error,
    so the reconcile is requeued with backoff and the state never changes). A purely
    computational function with no side-effects.
    """
    status = app.get("status") or {}
    state = (status.get("applicationState") or {}).get("state")
    policy = restart_policy(app["spec"])
    key = "onFailureRetryInterval" if state == "FAILING" else "onSubmissionFailureRetryInterval"
    interval = policy.get(key)
    attempts = int(status.get("submissionAttempts") or 0)
    last = _parse_time(status.get("lastSubmissionAttemptTime"))
    if interval is None or attempts <= 0 or last is None:
        raise ValueError(f"{key} unset or no submission attempt: no retry time")
    wait = float(interval) * attempts
    return wait - (now - last).total_seconds()


def is_expired(app: Mapping[str, Any], *, now: datetime.datetime) -> bool:
    """Whether a terminated app's ``timeToLiveSeconds`` ran out since ``terminationTime``.

    Upstream: ``pkg/util/sparkapplication.go`` ``IsExpired`` (the per-operator default TTL of
    ≥2.5 is not modelled). A purely computational function with no side-effects.
    """
    ttl = app["spec"].get("timeToLiveSeconds")
    ended = _parse_time((app.get("status") or {}).get("terminationTime"))
    return ttl is not None and ended is not None and (now - ended).total_seconds() > float(ttl)


def driver_pod_name(app: Mapping[str, Any]) -> str:
    """Upstream: ``pkg/util/sparkapplication.go`` ``GetDriverPodName``."""
    spec = app["spec"]
    name = (spec.get("driver") or {}).get("podName") or (spec.get("sparkConf") or {}).get(
        "spark.kubernetes.driver.pod.name"
    )
    return str(name or f"{app['metadata']['name']}-driver")


def spec_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether an update event counts as a spec change (a rerun): every spec field but suspend.

    Upstream: ``event_filter.go`` ``EventFilter.Update`` (``equality.Semantic.DeepEqual`` of the
    typed specs; ≥2.4 a change of ``spec.suspend`` alone does not invalidate). The typed spec
    drops nothing the CRD keeps, so comparing the JSON is the same. Metadata never counts.
    """
    drop = ("suspend",)
    left = {k: v for k, v in (old.get("spec") or {}).items() if k not in drop}
    right = {k: v for k, v in (new.get("spec") or {}).items() if k not in drop}
    return left != right


def reset_status(status: dict[str, Any], *, case: str) -> None:
    """``resetSparkApplicationStatus`` (controller.go, ≥2.5) for ``case``.

    INVALIDATING: ids, both attempt counters, both times, errorMessage, executorState and
    driverInfo are cleared (submissionID kept). FAILING/SUCCEEDING (≥2.5, PR #2773): ids,
    terminationTime, errorMessage, driverInfo and executorState; the counters stay.
    """
    status["sparkApplicationId"] = ""
    status.pop("terminationTime", None)
    status.setdefault("applicationState", {})["errorMessage"] = ""
    status["driverInfo"] = {}
    status.pop("executorState", None)
    if case == "INVALIDATING":
        status["submissionAttempts"] = 0
        status["executionAttempts"] = 0
        status.pop("lastSubmissionAttemptTime", None)


def driver_state(pod: DriverPod) -> str:
    """The driver's state from its pod: PENDING, RUNNING, COMPLETED, FAILED or UNKNOWN.

    Upstream: ``pkg/util/sparkapplication.go`` ``GetDriverState``: the driver container's exit
    decides while the pod is still Running (a regular sidecar keeps it so).
    """
    if pod.phase == "Pending":
        return "PENDING"
    if pod.phase == "Running":
        if pod.driver_exit is None:
            return "RUNNING"
        return "COMPLETED" if pod.driver_exit == 0 else "FAILED"
    if pod.phase == "Succeeded":
        return "COMPLETED"
    if pod.phase == "Failed":
        return "COMPLETED" if pod.driver_exit == 0 else "FAILED"
    return "UNKNOWN"


#: ``DriverStateToApplicationState`` (pkg/util/sparkapplication.go)
APP_STATE_OF_DRIVER: Final = {
    "PENDING": "SUBMITTED",
    "RUNNING": "RUNNING",
    "COMPLETED": "SUCCEEDING",
    "FAILED": "FAILING",
    "UNKNOWN": "UNKNOWN",
}


class StandInSparkOperator(Kubelet):
    """spark-operator's SparkApplication controller for one app, and the kubelet of its driver.

    ``serve(stop)`` runs the controller until ``stop``; ``run_driver_pod()`` serves the app until
    its first driver pod ended (the driver-pod tests). Test hooks (faults the real system has):
    ``kill_runs`` (runs whose driver is SIGKILLed at ``kill_point`` or when ``kill_when`` says),
    ``fail_submissions`` (spark-submit fails that many times: the pod webhook down, say),
    ``conflict_spec_updates`` (that many spec-change events meet a status write that raced
    them: the rerun is dropped), ``watch_paused`` (the informer lags: set it and update events
    wait in the watch stream).
    """

    #: ``--driver-pod-creation-grace-period`` (cmd/operator/controller/start.go, default 10 s)
    driver_pod_creation_grace_s = 10.0

    def __init__(self, api: client.ApiClient, **where: Any) -> None:
        """``where``: the app and its pods (namespace, name, workdir, table, rows, partitions,
        job: :class:`tests.e2e.kubelet.Kubelet`)."""
        super().__init__(api, **where)
        self.fail_submissions = 0
        self.conflict_spec_updates = 0
        #: the 1.x update predicate (1.x ``pkg/controller/sparkapplication/controller.go``
        #: ``onUpdate``): the INVALIDATING write re-reads and retries on a conflict instead of
        #: dropping the rerun. Only this predicate is 1.x; the rest of the model stays v2.
        self.retry_spec_updates = False
        self.watch_paused = threading.Event()
        #: set ``watch_paused`` once the stand-in has written this state (one-shot)
        self.pause_watch_on: str | None = None
        #: (reason, message) of every Event the stand-in posted, in order
        self.events: list[tuple[str, str]] = []
        #: every status state the stand-in wrote, in order (FAILED must never appear between)
        self.states: list[str] = []
        #: what it did to the driver pod, as ``transitions.driver_pod_actions`` reads upstream's
        #: from the audit log: created (spark-submit's pod), deleted (a pod that still existed)
        self.driver_pods: list[str] = []

    # -- the API side -----------------------------------------------------------------------
    def app(self) -> dict[str, Any]:
        found = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, self.name
        )
        return cast("dict[str, Any]", found)

    def _update_status(self, app: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        """``updateSparkApplicationStatus``: ``Status().Update``, a full status replace with
        the app's resourceVersion as precondition (a 409 when the app changed meanwhile)."""
        body = {**copy.deepcopy(dict(app)), "status": dict(status)}
        self.custom.replace_namespaced_custom_object_status(
            GROUP, VERSION, self.namespace, PLURAL, self.name, body
        )
        state = str((status.get("applicationState") or {}).get("state"))
        self.states.append(state)
        if state == self.pause_watch_on:  # the informer starts lagging right after this write
            self.pause_watch_on = None
            self.watch_paused.set()

    def _event(self, app: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        """``recordSparkApplicationEvent``: a Kubernetes Event on the app."""
        self.events.append((reason, message))
        meta = app["metadata"]
        self.core.create_namespaced_event(
            self.namespace,
            client.CoreV1Event(
                metadata=client.V1ObjectMeta(generate_name=f"{self.name}."),
                involved_object=client.V1ObjectReference(
                    api_version=f"{GROUP}/{VERSION}",
                    kind="SparkApplication",
                    name=meta["name"],
                    namespace=self.namespace,
                    uid=meta.get("uid"),
                ),
                reason=reason,
                message=message,
                type=kind,
                source=client.V1EventSource(component="spark-operator-standin"),
                first_timestamp=datetime.datetime.now(datetime.UTC),
                last_timestamp=datetime.datetime.now(datetime.UTC),
                count=1,
            ),
        )

    # -- the informer: watch + update predicate ---------------------------------------------
    def _watch(self) -> None:
        """The informer: a list, then a watch; every MODIFIED event goes through the update
        predicate with the cached object as ``old`` (``event_filter.go`` ``EventFilter``)."""
        cached: dict[str, Any] | None = None
        version = ""
        while not self._halt.is_set():
            try:
                if cached is None:
                    cached = self.app()
                    version = cached["metadata"]["resourceVersion"]
                    self.enqueue()  # the informer's initial list: a Create event
                stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
                    self.custom.list_namespaced_custom_object, GROUP, VERSION, self.namespace,
                    PLURAL, field_selector=f"metadata.name={self.name}",
                    resource_version=version, timeout_seconds=2,
                )  # fmt: skip
                for event in stream:
                    while self.watch_paused.is_set() and not self._halt.is_set():
                        time.sleep(0.05)  # a lagging informer: events wait in the stream
                    if self._halt.is_set():
                        return
                    obj = event["object"]
                    version = obj["metadata"]["resourceVersion"]
                    if event["type"] == "DELETED":
                        self.enqueue()
                        return
                    if event["type"] == "MODIFIED" and cached is not None:
                        self._on_update(cached, obj)
                    else:
                        self.enqueue()
                    cached = obj
            except client.ApiException as exc:
                if exc.status == 404:
                    return
                if exc.status == 410:  # expired resourceVersion: list again
                    cached = None
                time.sleep(0.1)
            except Exception:  # a broken stream: watch again, like the informer
                time.sleep(0.1)

    def _on_update(self, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        """Upstream: ``event_filter.go`` ``EventFilter.Update`` (v2). A spec change sets
        INVALIDATING with one ``Status().Update`` of the event's object (its resourceVersion);
        no retry: on any error an Event ``SparkApplicationSpecUpdateFailed`` and the update is
        dropped (the rerun is lost until the next spec change)."""
        if spec_changed(old, new):
            if self.conflict_spec_updates > 0:
                self.conflict_spec_updates -= 1
                self._race_status_write()
            status = copy.deepcopy(new.get("status") or {})
            status.setdefault("applicationState", {})["state"] = "INVALIDATING"
            try:
                if self.retry_spec_updates:
                    self._retry_on_conflict(self._invalidate_latest)
                else:
                    self._update_status(new, status)
            except client.ApiException as exc:
                self._event(
                    new, "Warning", "SparkApplicationSpecUpdateFailed",
                    f"Failed to update spec for SparkApplication {self.name}: "
                    f"{exc.status} {exc.reason}",
                )  # fmt: skip
                return
        self.enqueue()

    def _invalidate_latest(self) -> None:
        """1.x: ``updateApplicationStatusWithRetries``: re-GET, set INVALIDATING, write."""
        app = self.app()
        status = copy.deepcopy(app.get("status") or {})
        status.setdefault("applicationState", {})["state"] = "INVALIDATING"
        self._update_status(app, status)

    def _race_status_write(self) -> None:
        """Another status write lands between the spec change and the predicate's write: the
        worker's ``updateExecutorState`` of a terminated app (``reconcileTerminatedSparkApp``),
        the way a real conflict happens."""
        app = self.app()
        status = copy.deepcopy(app.get("status") or {})
        status["executorState"] = {f"{self.name}-exec-1": "FAILED"}
        self._update_status(app, status)
        self.states.pop()  # not a state transition

    def serve(self, stop: threading.Event) -> None:
        """Run the controller (informer + one worker) until ``stop`` is set. A reconcile's
        error is requeued with backoff (e.g. TimeUntilNextRetryDue without an interval:
        upstream stalls so)."""
        self._serve(stop, [self._watch])

    def _retry_on_conflict(self, step: Callable[[], None]) -> None:
        """``retry.RetryOnConflict(retry.DefaultRetry, …)``: the whole step again on a 409."""
        for attempt in range(5):
            try:
                step()
                return
            except client.ApiException as exc:
                if not _conflict(exc) or attempt == 4:
                    raise
                time.sleep(0.01)

    def _reconcile(self) -> None:
        """Upstream: ``controller.go`` ``Reconcile``: an app being deleted (held by another's
        finalizer, sparkguard's) has its driver pod deleted (``handleSparkApplicationDeletion``:
        ``deleteSparkResources``); else dispatch on the state."""
        app = self.app()
        if (app.get("metadata") or {}).get("deletionTimestamp"):
            self._delete_resources(app)
            return
        state = ((app.get("status") or {}).get("applicationState") or {}).get("state", "")
        handlers: dict[str, Callable[[], None]] = {
            "": self._reconcile_new,
            "SUBMISSION_FAILED": self._reconcile_failed_submission,
            "PENDING_RERUN": self._reconcile_pending_rerun,
            "INVALIDATING": self._reconcile_invalidating,
            "SUCCEEDING": self._reconcile_succeeding,
            "FAILING": self._reconcile_failing,
            "COMPLETED": self._reconcile_terminated,
            "FAILED": self._reconcile_terminated,
        }
        if state in ("SUBMITTED", "RUNNING", "UNKNOWN"):
            self._reconcile_driver(state)
            return
        handler = handlers.get(state)
        if handler is not None:
            handler()

    def _step(self, expected: str, body: Callable[[dict[str, Any], dict[str, Any]], None]) -> None:
        """One reconcile step: re-GET, return unless still ``expected``, mutate a copy of the
        status, write it (``Status().Update``); all of it again on a conflict."""

        def attempt() -> None:
            app = self.app()
            status = copy.deepcopy(app.get("status") or {})
            if (status.get("applicationState") or {}).get("state", "") != expected:
                return
            body(app, status)
            self._update_status(app, status)

        self._retry_on_conflict(attempt)

    # -- the reconcile functions (controller.go, ≥2.5) -------------------------------------
    def _reconcile_new(self) -> None:
        """Upstream: ``reconcileNewSparkApplication``: submit."""
        self._step("", self._submit)

    def _reconcile_driver(self, state: str) -> None:
        """Upstream: ``reconcileSubmittedSparkApplication``/``reconcileRunningSparkApplication``
        /``reconcileUnknownSparkApplication`` → ``updateSparkApplicationState``
        (``updateDriverState``); each returns unless the app is still in *its* state."""
        self._step(state, self._update_driver_state)

    def _update_driver_state(self, app: dict[str, Any], status: dict[str, Any]) -> None:
        """Upstream: ``updateDriverState``: the pod's driver state → the app state; FAILING
        records terminationTime (if unset) and the driver's exit; a missing pod is FAILING
        "driver pod not found" once the creation grace period is over."""
        state = status["applicationState"]["state"]
        pod = self.pods.get((status.get("driverInfo") or {}).get("podName") or "")
        if pod is None or pod.submission != status.get("submissionID"):
            last = _parse_time(status.get("lastSubmissionAttemptTime"))
            age = (datetime.datetime.now(datetime.UTC) - last).total_seconds() if last else 1e9
            if state == "SUBMITTED" and age <= self.driver_pod_creation_grace_s:
                raise client.ApiException(status=500, reason="driver pod not found yet")
            status["applicationState"] = {
                "state": "FAILING",
                "errorMessage": "driver pod not found",
            }
            status["terminationTime"] = _now()
            self._event(app, "Warning", "SparkDriverNotFound", f"Driver {self.name} not found")
            return
        new_state = APP_STATE_OF_DRIVER[driver_state(pod)]
        if new_state in ("FAILING", "SUCCEEDING") and not status.get("terminationTime"):
            status["terminationTime"] = _now()
        if new_state == "FAILING":
            message = (
                f"driver container failed with ExitCode: {pod.driver_exit}, Reason: "
                f"{pod.driver_reason or 'Error'}"
                if pod.driver_exit is not None
                else "driver container status missing"
            )
            status["applicationState"] = {"state": "FAILING", "errorMessage": message}
        else:
            status["applicationState"] = {"state": new_state}
        if new_state != state:
            reason = {
                "SUBMITTED": ("Normal", "SparkDriverPending"),
                "RUNNING": ("Normal", "SparkDriverRunning"),
                "SUCCEEDING": ("Normal", "SparkDriverCompleted"),
                "FAILING": ("Warning", "SparkDriverFailed"),
                "UNKNOWN": ("Warning", "SparkDriverUnknown"),
            }[new_state]
            self._event(app, reason[0], reason[1], f"Driver {pod.name} is {new_state}")

    def _reconcile_failed_submission(self) -> None:
        """Upstream: ``reconcileFailedSubmissionSparkApplication``: retried (interval x
        submissionAttempts after the last attempt) while ``ShouldRetry``, once the old driver
        pod is gone (``validateSparkResourceDeletion``, else ``deleteSparkResources``); else
        FAILED with terminationTime = now and Event ``SparkApplicationFailed``."""
        requeue: list[float] = []

        def body(app: dict[str, Any], status: dict[str, Any]) -> None:
            if should_retry(app):
                wait = time_until_next_retry_due(app, now=datetime.datetime.now(datetime.UTC))
                if wait > 0:
                    requeue.append(wait)
                    return
                if not self._resources_deleted(app):
                    self._delete_resources(app)
                    raise client.ApiException(status=500, reason="resources still exist")
                self._submit(app, status)
                return
            status["applicationState"]["state"] = "FAILED"
            status["terminationTime"] = _now()
            message = status["applicationState"].get("errorMessage", "")
            self._event(app, "Warning", "SparkApplicationFailed", f"failed: {message}")

        self._step("SUBMISSION_FAILED", body)
        if requeue:
            self.enqueue(after=requeue[0])

    def _reconcile_pending_rerun(self) -> None:
        """Upstream: ``reconcilePendingRerunSparkApplication`` (≥2.5): once the driver pod is
        gone, Event ``SparkApplicationPendingRerun`` and submit; else nothing (progress comes
        from the pod's deletion event)."""

        def body(app: dict[str, Any], status: dict[str, Any]) -> None:
            if self._resources_deleted(app):
                self._event(app, "Warning", "SparkApplicationPendingRerun", "rerun")
                self._submit(app, status)

        self._step("PENDING_RERUN", body)

    def _reconcile_invalidating(self) -> None:
        """Upstream: ``reconcileInvalidatingSparkApplication``: delete the driver pod
        (``deleteSparkResources``), reset the status (INVALIDATING case: the attempt counters
        and times zeroed), PENDING_RERUN."""

        def body(app: dict[str, Any], status: dict[str, Any]) -> None:
            self._delete_resources(app)
            reset_status(status, case="INVALIDATING")
            status["applicationState"]["state"] = "PENDING_RERUN"

        self._step("INVALIDATING", body)

    def _reconcile_succeeding(self) -> None:
        """Upstream: ``reconcileSucceedingSparkApplication``: rerun under Always, else
        COMPLETED (no Event)."""

        def body(app: dict[str, Any], status: dict[str, Any]) -> None:
            if should_retry(app):
                self._delete_resources(app)
                reset_status(status, case="SUCCEEDING")
                status["applicationState"]["state"] = "PENDING_RERUN"
            else:
                status["applicationState"]["state"] = "COMPLETED"

        self._step("SUCCEEDING", body)

    def _reconcile_failing(self) -> None:
        """Upstream: ``reconcileFailingSparkApplication``: while ``ShouldRetry``, wait until
        ``TimeUntilNextRetryDue``, then delete the driver pod, reset (FAILING case) and
        PENDING_RERUN; else FAILED, keeping terminationTime and errorMessage, no Event."""
        requeue: list[float] = []

        def body(app: dict[str, Any], status: dict[str, Any]) -> None:
            if should_retry(app):
                wait = time_until_next_retry_due(app, now=datetime.datetime.now(datetime.UTC))
                if wait > 0:
                    requeue.append(wait)
                    return
                self._delete_resources(app)
                reset_status(status, case="FAILING")
                status["applicationState"]["state"] = "PENDING_RERUN"
            else:
                status["applicationState"]["state"] = "FAILED"

        self._step("FAILING", body)
        if requeue:
            self.enqueue(after=requeue[0])

    def _reconcile_terminated(self) -> None:
        """Upstream: ``reconcileTerminatedSparkApplication``: an expired app
        (``timeToLiveSeconds`` after terminationTime, ``IsExpired``) is deleted (no finalizer of
        spark-operator's; dependents by GC); else requeued for when it expires."""
        app = self.app()
        state = ((app.get("status") or {}).get("applicationState") or {}).get("state")
        if state not in TERMINAL_STATES:  # ``util.IsTerminated``
            return
        now = datetime.datetime.now(datetime.UTC)
        if is_expired(app, now=now):
            deleted = self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, self.name
            )
            # Held by a finalizer (sparkguard's): upstream's next Reconcile, which the
            # deletion's own event starts at once, deletes the driver pod
            # (handleSparkApplicationDeletion). The model takes that step now: its event
            # would race the finalizer's holder, which upstream's at-once reconcile never
            # loses to a rollback.
            if isinstance(deleted, dict) and (deleted.get("metadata") or {}).get(
                "deletionTimestamp"
            ):
                self._delete_resources(app)
            return
        ttl = app["spec"].get("timeToLiveSeconds")
        ended = _parse_time((app.get("status") or {}).get("terminationTime"))
        if ttl is not None and ended is not None and float(ttl) > 0:
            survival = (now - ended).total_seconds()
            self.enqueue(after=max(0.0, float(ttl) - survival) + 1.0)  # seconds-resolution times

    # -- submission and the driver pod's resources ------------------------------------------
    def _submit(self, app: dict[str, Any], status: dict[str, Any]) -> None:
        """Upstream: ``submitSparkApplication``: new submissionID, driverInfo.podName,
        lastSubmissionAttemptTime, submissionAttempts+1; then spark-submit (here: create the
        driver pod). Success: SUBMITTED, executionAttempts+1, Event SparkApplicationSubmitted;
        failure: SUBMISSION_FAILED with the error, Event SparkApplicationSubmissionFailed. A
        driver pod of the same name that still exists makes spark-submit fail (409)."""
        submission = str(uuid.uuid4())
        pod_name = driver_pod_name(app)
        status["submissionID"] = submission
        status["driverInfo"] = {"podName": pod_name}
        status["lastSubmissionAttemptTime"] = _now()
        status["submissionAttempts"] = int(status.get("submissionAttempts") or 0) + 1
        error = None
        if self.fail_submissions > 0:
            self.fail_submissions -= 1
            error = "failed to run spark-submit: admission webhook denied the driver pod"
        elif pod_name in self.pods:
            error = f"failed to run spark-submit: driver pod {pod_name} already exist"
        if error is not None:
            status["applicationState"] = {"state": "SUBMISSION_FAILED", "errorMessage": error}
            self._event(app, "Warning", "SparkApplicationSubmissionFailed", error)
            return
        self._start_pod_of(app, pod_name=pod_name, submission=submission)
        status["applicationState"] = {"state": "SUBMITTED"}
        status["executionAttempts"] = int(status.get("executionAttempts") or 0) + 1
        status["sparkApplicationId"] = f"spark-{submission[:8]}"
        self.runs[-1]["executionAttempts"] = status["executionAttempts"]
        self._event(app, "Normal", "SparkApplicationSubmitted", f"submitted {submission}")

    def _resources_deleted(self, app: Mapping[str, Any]) -> bool:
        """Upstream: ``validateSparkResourceDeletion``: the driver pod is NotFound (a pod being
        deleted still exists)."""
        return driver_pod_name(app) not in self.pods

    def _delete_resources(self, app: Mapping[str, Any]) -> None:
        """Upstream: ``deleteSparkResources``: delete the driver pod (its default grace
        period); NotFound is fine. Executors go later, by GC (``executor_linger_s``)."""
        pod = self.pods.get(driver_pod_name(app))
        if pod is not None:
            self._driver_pod_action(transitions.DELETED)
            self._delete_pod(pod)

    def _driver_pod_action(self, action: str) -> None:
        if not self.driver_pods or self.driver_pods[-1] != action:
            self.driver_pods.append(action)

    def _start_pod_of(self, app: Mapping[str, Any], *, pod_name: str, submission: str) -> None:
        """spark-submit's effect: the driver pod exists, the kubelet starts it."""
        self._driver_pod_action(transitions.CREATED)
        spec = copy.deepcopy(app["spec"])
        driver = spec["driver"]
        super()._start_pod(
            pod_name=pod_name,
            submission=submission,
            record={"generation": app["metadata"]["generation"], "submission": submission},
            spec=PodSpec(
                init_containers=driver.get("initContainers") or [],
                sidecars=driver.get("sidecars") or [],
                driver=driver,
                volumes=spec.get("volumes") or [],
                share_process_namespace=driver.get("shareProcessNamespace") is True,
                conf=spec.get("sparkConf") or {},
                # spark-operator puts spec.driver.annotations on the driver pod
                annotations=driver.get("annotations") or {},
            ),
        )

    def run_driver_pod(self, *, timeout: float = 300) -> str:
        """Serve the app until its first driver pod has ended and the app is terminal; return
        that state. Raises :class:`DriverPodStillRunningError` when the driver container ended
        but a regular sidecar kept the pod Running."""
        stop = threading.Event()
        worker = threading.Thread(target=self.serve, args=(stop,), daemon=True)
        worker.start()
        deadline = time.monotonic() + timeout
        state = None
        try:
            while time.monotonic() < deadline:
                state = ((self.app().get("status") or {}).get("applicationState") or {}).get(
                    "state"
                )
                if self.runs and "exit" in self.runs[0] and state in TERMINAL_STATES:
                    break
                time.sleep(0.1)
            else:
                raise RuntimeError(
                    f"app {self.name} not terminal within {timeout:g} s: {state}; runs "
                    f"{self.runs}, states {self.states}, errors {self.errors[-5:]}"
                )
        finally:
            stop.set()
            worker.join(30)
        record = self.runs[0]
        if record.get("pod_phase") == "Running":
            stuck = [s["name"] for s in self.app()["spec"]["driver"].get("sidecars") or []]
            raise DriverPodStillRunningError(
                f"the driver container exited ({record['exit']}) but the pod stays Running: "
                f"sidecar container(s) {stuck} did not exit within {self.sidecar_grace_s:g} s"
            )
        return str(state)


def parse_every(schedule: str) -> float:
    """The period of a ``@every <n>s`` schedule, in seconds.

    Upstream parses any robfig/cron schedule (``cron.ParseStandard``); the stand-in models only
    the ``@every`` descriptor, enough for a bench that cannot wait for a minute. Anything else is
    refused, naming the field. A purely computational function with no side-effects.
    """
    text = schedule.strip()
    if not (text.startswith("@every ") and text.endswith("s") and text[7:-1].isdigit()):
        raise ValueError(
            f"spec.schedule {schedule!r}: the stand-in models only '@every <n>s' (e.g. '@every 2s')"
        )
    return float(text[7:-1])


class StandInScheduledController:
    """spark-operator's ScheduledSparkApplication controller for one scheduled app.

    Upstream: ``internal/controller/scheduledsparkapplication/controller.go`` (``Reconcile``,
    ``shouldStartNextRun``, ``createSparkApplication``, ``checkAndUpdatePastRuns``). Each run it
    creates is served by the SparkApplication stand-in ``serve_run(name)`` returns (started in
    a thread, stopped when the run is deleted).
    """

    def __init__(
        self,
        api: client.ApiClient,
        *,
        namespace: str,
        name: str,
        serve_run: Callable[[str], StandInSparkOperator],
    ) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.namespace = namespace
        self.name = name
        self.serve_run = serve_run
        #: every run created, in order, and the stand-in serving it
        self.runs: dict[str, StandInSparkOperator] = {}
        #: the runs pruned by the history limits
        self.deleted: list[str] = []
        #: (last run's name, its state, started?) for every due slot
        self.decisions: list[tuple[str | None, str | None, bool]] = []
        self._threads: dict[str, tuple[threading.Thread, threading.Event]] = {}

    def _scheduled(self) -> dict[str, Any]:
        found = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, SCHEDULED_PLURAL, self.name
        )
        return cast("dict[str, Any]", found)

    def _runs(self) -> list[dict[str, Any]]:
        """``listSparkApplications`` + ``sortSparkApplicationsInPlace``: newest first (by
        creationTimestamp; the name's nanoseconds break the ties of its 1 s resolution)."""
        found = self.custom.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL,
            label_selector=f"{SCHEDULED_APP_NAME_LABEL}={self.name}",
        )  # fmt: skip
        items = cast("list[dict[str, Any]]", cast("dict[str, Any]", found)["items"])
        return sorted(
            items,
            key=lambda a: (a["metadata"]["creationTimestamp"], a["metadata"]["name"]),
            reverse=True,
        )

    @staticmethod
    def _state(app: Mapping[str, Any]) -> str | None:
        state = ((app.get("status") or {}).get("applicationState") or {}).get("state")
        return str(state) if state is not None else None

    def _should_start_next_run(self, scheduled: Mapping[str, Any]) -> bool:
        """Upstream: ``shouldStartNextRun``: Allow → yes; Forbid → only if the newest run is
        COMPLETED or FAILED (``hasLastRunFinished``: any other state counts as running);
        Replace → delete an unfinished newest run, then yes; unset → no (2.0 to 2025 code)."""
        runs = self._runs()
        if not runs:
            self.decisions.append((None, None, True))
            return True
        last = runs[0]
        finished = self._state(last) in TERMINAL_STATES
        policy = scheduled["spec"].get("concurrencyPolicy")
        start = policy == "Allow" or (policy == "Forbid" and finished)
        if policy == "Replace":
            if not finished:
                self._delete_run(last["metadata"]["name"])
            start = True
        self.decisions.append((last["metadata"]["name"], self._state(last), start))
        return start

    def _create_run(self, scheduled: Mapping[str, Any], now: datetime.datetime) -> str:
        """Upstream: ``createSparkApplication``: ``<name>-<UnixNano>``, the scheduled app's
        labels plus ``sparkoperator.k8s.io/scheduled-app-name`` (annotations are *not* copied),
        an ownerReference (no controller flag), ``spec`` = ``spec.template``."""
        meta = scheduled["metadata"]
        name = f"{self.name}-{int(now.timestamp() * 1e9)}"
        labels = {**(meta.get("labels") or {}), SCHEDULED_APP_NAME_LABEL: self.name}
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SparkApplication",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": labels,
                "ownerReferences": [
                    {
                        "apiVersion": f"{GROUP}/{VERSION}",
                        "kind": "ScheduledSparkApplication",
                        "name": self.name,
                        "uid": meta["uid"],
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": copy.deepcopy(scheduled["spec"]["template"]),
        }
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, body)
        self._start(name)
        return name

    def _check_and_update_past_runs(self, scheduled: Mapping[str, Any]) -> dict[str, list[str]]:
        """Upstream: ``checkAndUpdatePastRuns``/``bookkeepPastRuns``: of the COMPLETED and the
        FAILED runs keep the newest ``successfulRunHistoryLimit``/``failedRunHistoryLimit``
        (default 1 each), delete the others (grace 0)."""
        spec = scheduled["spec"]
        kept: dict[str, list[str]] = {}
        for state, key, limit_key in (
            ("COMPLETED", "pastSuccessfulRunNames", "successfulRunHistoryLimit"),
            ("FAILED", "pastFailedRunNames", "failedRunHistoryLimit"),
        ):
            limit = spec.get(limit_key)
            limit = 1 if limit is None else int(limit)
            names = [r["metadata"]["name"] for r in self._runs() if self._state(r) == state]
            kept[key] = names[:limit]
            for name in names[limit:]:
                self._delete_run(name)
        return kept

    def _delete_run(self, name: str) -> None:
        with contextlib.suppress(client.ApiException):
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, name, grace_period_seconds=0
            )
        self.deleted.append(name)

    def _start(self, name: str) -> None:
        standin = self.serve_run(name)
        self.runs[name] = standin
        stop = threading.Event()
        thread = threading.Thread(target=standin.serve, args=(stop,), daemon=True)
        thread.start()
        self._threads[name] = (thread, stop)

    def reconcile(self) -> float:
        """Upstream: ``Reconcile``: New → Scheduled with nextRun; when nextRun is due, start a
        run if ``shouldStartNextRun`` (else the slot is skipped), record lastRun, lastRunName,
        nextRun and the past runs (``Status().Update``). Returns the requeue delay."""
        scheduled = self._scheduled()
        spec = scheduled["spec"]
        if spec.get("suspend") is True:
            return 0.5
        status = copy.deepcopy(scheduled.get("status") or {})
        try:
            period = parse_every(spec["schedule"])
        except ValueError as exc:
            status.update(scheduleState="FailedValidation", reason=str(exc))
            self._update_status(scheduled, status)
            return 5.0
        now = datetime.datetime.now(datetime.UTC)
        nxt = now + datetime.timedelta(seconds=period)
        if status.get("scheduleState") != "Scheduled":
            status.update(scheduleState="Scheduled", nextRun=nxt.strftime("%Y-%m-%dT%H:%M:%SZ"))
            self._update_status(scheduled, status)
            return period
        due = _parse_time(status.get("nextRun"))
        if due is not None and due > now:
            return (due - now).total_seconds()
        if self._should_start_next_run(scheduled):
            status["lastRunName"] = self._create_run(scheduled, now)
            status["lastRun"] = _now()
            status.update(self._check_and_update_past_runs(scheduled))
        status["nextRun"] = nxt.strftime("%Y-%m-%dT%H:%M:%SZ")
        self._update_status(scheduled, status)
        return period

    def _update_status(self, scheduled: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        body = {**copy.deepcopy(dict(scheduled)), "status": dict(status)}
        self.custom.replace_namespaced_custom_object_status(
            GROUP, VERSION, self.namespace, SCHEDULED_PLURAL, self.name, body
        )

    def serve(self, stop: threading.Event) -> None:
        """Reconcile until ``stop``; stop the stand-in of every run that was deleted."""
        while not stop.is_set():
            try:
                delay = self.reconcile()
            except client.ApiException as exc:
                if exc.status == 404:
                    return
                delay = 0.2
            for name in self.deleted:
                if name in self._threads:
                    self._threads[name][1].set()
            stop.wait(min(delay, 0.5))

    def close(self) -> None:
        """Stop every run's stand-in and what it runs."""
        for thread, run_stop in self._threads.values():
            run_stop.set()
            thread.join(30)
        for standin in self.runs.values():
            standin.cleanup()
