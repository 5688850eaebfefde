"""A stand-in for the Apache Spark Kubernetes Operator (``spark.apache.org/v1``), for the bench.

A *model of upstream* (``apache/spark-kubernetes-operator``, a java-operator-sdk operator, read
in ``tests/e2e/apache-model.md``; §9 d is the checklist this follows, the fidelity table is in
``tests/e2e/README.md``). The decision rules are pure functions in ``apache_rules.py``; this
module is the reconcile loop around them. Upstream files (abbreviations of the model):

* **R** ``spark-operator/.../reconciler/SparkAppReconciler.java`` (``reconcile``,
  ``getReconcileSteps``, ``cleanup``, ``prepareEventSources``)
* **VAL** ``.../reconcilesteps/AppValidateStep.java``; **INIT** ``.../AppInitStep.java``;
  **CU** ``.../AppCleanUpStep.java``; **STEP** ``.../AppReconcileStep.java``
  (``observeDriver``); **UNK** ``.../AppUnknownStateStep.java``
* **OBS** ``.../observers/AppDriverStartObserver.java``, ``AppDriverRunningObserver.java``,
  ``BaseAppDriverObserver.java``, the timeout observer
* **SR** ``spark-operator/.../utils/StatusRecorder.java``; **RU** ``.../ReconcilerUtils.java``
* **RSF** ``.../reconciler/SparkAppResourceSpecFactory.java``; **SW**
  ``spark-submission-worker/.../SparkAppSubmissionWorker.java``

**The bench has no kubelet.** Driver pods are real Pod objects on the apiserver (labels,
ownerReference to the app, ``nodeName`` set so that a deletion is graceful and the object stays
until its containers stopped) whose containers run as local processes through the shared
kubelet (``kubelet.py``, as the Kubeflow stand-in's); the stand-in, as the kubelet, writes the
pod's phase and container statuses into the Pod's status, and the operator's side reads the
Pod from the apiserver, as upstream's informer does. Executors are the light driver's executor
process (GC'd after its driver pod, §9 d 22); no executor pods, Services, Ingresses or
ConfigMaps are created.

Not modelled (see the table): executor thresholds (``AppRunningStep``: DriverReady goes
straight to RunningHealthy), Kueue, ``spec.suspend``, sentinel apps, the per-reconcile default
requeue interval (the stand-in reconciles on events and its own requeues), ClientMode,
pre-resources and driver resources, the security-context decorator, SchedulingFailure's
deletion of every spec resource (the driver pod only).
"""

from __future__ import annotations

import copy
import datetime
import threading
import time
from collections.abc import Mapping
from typing import Any, Final, cast

from kubernetes import client, watch

from tests.e2e import apache_rules as rules
from tests.e2e import sparkpods
from tests.e2e.kubelet import DriverPod, Kubelet, PodSpec

GROUP, VERSION, PLURAL = "spark.apache.org", "v1", "sparkapplications"
#: JOSDK ``ReconcilerUtils.getDefaultFinalizerName``: ``<plural>.<group>/finalizer`` (§8)
FINALIZER: Final = f"{PLURAL}.{GROUP}/finalizer"
#: the operator's labels on its driver pods (Utils, K; CONF ``spark.kubernetes.operator.name``)
OPERATOR_NAME: Final = "spark-kubernetes-operator"
LABEL_OPERATOR: Final = "spark.operator/name"
LABEL_APP: Final = "spark.operator/spark-app-name"
#: the fake node the stand-in's pods are bound to (a bound pod's deletion waits for its kubelet)
NODE: Final = "standin-node"

#: messages (K, Constants)
DRIVER_REQUESTED: Final = "Requested driver from resource scheduler."
DRIVER_REMOVED: Final = (
    "Driver removed. This could caused by 'exit' called in driver process with non-zero code, "
    "involuntary disruptions or unintentional destroy behavior, check Kubernetes events for "
    "more details."
)
SHUTDOWN_REQUESTED: Final = "Spark application has been shutdown as requested."
UNKNOWN_STATE: Final = "Cannot process application status."


#: the states ``getReconcileSteps`` observes the driver in (starting and running, R)
OBSERVED: Final = (
    "DriverRequested", "DriverStarted", "DriverReady", "InitializedBelowThresholdExecutors",
    "RunningHealthy", "RunningWithBelowThresholdExecutors",
)  # fmt: skip


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def pod_status(pod: DriverPod, *, container: str) -> dict[str, Any]:
    """What the kubelet reports of the stand-in's driver pod: phase, the (regular)
    initContainers' terminated states, the driver container's state (running and ready until
    it exits). A purely computational function with no side-effects."""
    images = pod.record.get("images") or {}

    def entry(name: str, state: dict[str, Any], *, ready: bool = False) -> dict[str, Any]:
        return {
            "name": name, "image": images.get(name, ""), "imageID": "", "ready": ready,
            "restartCount": 0, "state": state,
        }  # fmt: skip

    def terminated(code: int, reason: str) -> dict[str, Any]:
        return {"terminated": {"exitCode": code, "reason": reason}}

    init = [
        entry(name, terminated(code, "Completed" if code == 0 else "Error"))
        for name, code in pod.record.get("init") or []
    ]
    if pod.driver_exit is not None:
        main = entry(container, terminated(pod.driver_exit, pod.driver_reason or "Error"))
    elif pod.phase == "Running":
        main = entry(container, {"running": {}}, ready=True)
    else:
        main = entry(container, {"waiting": {"reason": "PodInitializing"}})
    status: dict[str, Any] = {"phase": pod.phase, "initContainerStatuses": init}
    if pod.phase != "Pending" or init:
        status["containerStatuses"] = [main]
    return status


class StandInApacheOperator(Kubelet):
    """The Apache operator's SparkApplication reconciler for one app, and its pods' kubelet.

    ``serve(stop)`` runs it until ``stop``. Records for tests: ``runs`` (one per driver pod
    started), ``writes`` (every status it wrote), ``conflicts`` (409s on status writes),
    ``errors`` (failed reconciles, retried with backoff). Test hook: ``fail_pod_creations``
    (that many driver pod creations fail: SchedulingFailure).
    """

    #: ``API_STATUS_PATCH_MAX_ATTEMPTS`` (CONF; value not read, model §10) and the wait between
    API_RETRIES = 3
    API_RETRY_WAIT_S = 0.1
    #: ``trimStateTransitionHistoryEnabled`` (CONF, default true)
    trim_history = True

    def __init__(self, api: client.ApiClient, **where: Any) -> None:
        """``where``: the app and its pods (namespace, name, workdir, table, rows, partitions,
        job ``light`` unless given: :class:`tests.e2e.kubelet.Kubelet`)."""
        super().__init__(api, **{"job": "light", **where})
        self.fail_pod_creations = 0
        self.writes: list[dict[str, Any]] = []
        self.conflicts = 0
        #: SR's status cache (one app: the key namespace/name is implicit); None: empty
        self._cache: dict[str, Any] | None = None

    # -- the API side ------------------------------------------------------------------------
    def app(self) -> dict[str, Any]:
        found = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, self.name
        )
        return cast("dict[str, Any]", found)

    def _persist(self, app: dict[str, Any], status: dict[str, Any]) -> None:
        """SR ``persistStatus`` → ``patchAndStatusWithVersionLocked``: nothing if equal to the
        cache; else a full replace of ``/status`` locked to the resourceVersion last seen,
        retried with the *same* object (a 409 repeats) up to ``API_RETRIES`` times, then the
        reconcile fails; on success the cache holds the new status."""
        if self._cache is not None and status == self._cache:
            return
        body = {**copy.deepcopy(app), "status": copy.deepcopy(status)}
        for attempt in range(self.API_RETRIES):
            try:
                stored = self.custom.replace_namespaced_custom_object_status(
                    GROUP, VERSION, self.namespace, PLURAL, self.name, body
                )
                break
            except client.ApiException as exc:
                if exc.status == 409:
                    self.conflicts += 1
                if attempt == self.API_RETRIES - 1:
                    raise
                time.sleep(self.API_RETRY_WAIT_S)
        app["metadata"] = cast("dict[str, Any]", stored)["metadata"]
        app["status"] = copy.deepcopy(status)
        self._cache = copy.deepcopy(status)
        self.writes.append(copy.deepcopy(status))

    def _pod(self, pod_name: str) -> dict[str, Any] | None:
        try:
            found = self.core.api_client.sanitize_for_serialization(
                self.core.read_namespaced_pod(pod_name, self.namespace)
            )
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return cast("dict[str, Any]", found)

    def _driver_pods(self) -> list[dict[str, Any]]:
        """STEP ``observeDriver``: the driver pod found by labels (the informer's cache)."""
        selector = f"{LABEL_APP}={self.name},{LABEL_OPERATOR}={OPERATOR_NAME},spark-role=driver"
        listed = self.core.list_namespaced_pod(self.namespace, label_selector=selector)
        pods = self.core.api_client.sanitize_for_serialization(listed)["items"]
        return cast("list[dict[str, Any]]", pods)

    # -- the kubelet's reports ----------------------------------------------------------------
    def _pod_changed(self, pod: DriverPod) -> None:
        """The kubelet writes the pod's status; the pod informer's event reconciles the app."""
        try:
            if pod.gone.is_set():  # the containers stopped: the kubelet confirms the deletion
                self.core.delete_namespaced_pod(pod.name, self.namespace, grace_period_seconds=0)
            else:
                body = {"status": pod_status(pod, container=self._container_name(pod))}
                self.core.patch_namespaced_pod_status(pod.name, self.namespace, body)
        except client.ApiException as exc:
            if exc.status != 404:
                self.errors.append(f"kubelet: pod {pod.name}: {exc.status} {exc.body}")
        self.enqueue()

    def _container_name(self, pod: DriverPod) -> str:
        return str(pod.record.get("container") or rules.DRIVER_CONTAINER)

    # -- informers ----------------------------------------------------------------------------
    def _watch_app(self) -> None:
        """JOSDK's app informer with the generation-aware filter (R; §9 d 20): a reconcile on
        creation, deletion (``deletionTimestamp``) and spec changes (a new generation), not on
        status- or metadata-only changes."""
        seen: tuple[int, bool] | None = None
        version = ""
        while not self._halt.is_set():
            try:
                stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
                    self.custom.list_namespaced_custom_object, GROUP, VERSION, self.namespace,
                    PLURAL, field_selector=f"metadata.name={self.name}",
                    resource_version=version or None, timeout_seconds=2,
                )  # fmt: skip
                for event in stream:
                    if self._halt.is_set():
                        return
                    obj = event["object"]
                    version = obj["metadata"]["resourceVersion"]
                    key = (
                        int(obj["metadata"].get("generation") or 0),
                        bool(obj["metadata"].get("deletionTimestamp")),
                    )
                    if event["type"] == "DELETED" or key != seen:
                        self.enqueue()
                    seen = key
            except client.ApiException as exc:
                if exc.status == 410:
                    version = ""
                time.sleep(0.1)
            except Exception:  # a broken stream: watch again, like the informer
                time.sleep(0.1)

    def _watch_pods(self) -> None:
        """The pod informer (R ``prepareEventSources``: selector ``spark.operator/name``, mapped
        by ``spark.operator/spark-app-name``): every event reconciles the app. As the kubelet:
        a pod with a ``deletionTimestamp`` has its containers stopped (SIGTERM, then SIGKILL)."""
        selector = f"{LABEL_APP}={self.name},{LABEL_OPERATOR}={OPERATOR_NAME}"
        while not self._halt.is_set():
            try:
                stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
                    self.core.list_namespaced_pod, self.namespace, label_selector=selector,
                    timeout_seconds=2,
                )  # fmt: skip
                for event in stream:
                    if self._halt.is_set():
                        return
                    meta = event["object"].metadata
                    local = self.pods.get(meta.name)
                    if local is not None and meta.deletion_timestamp is not None:
                        self._delete_pod(local)
                    self.enqueue()
            except Exception:
                time.sleep(0.1)

    # -- the worker -----------------------------------------------------------------------------
    def serve(self, stop: threading.Event) -> None:
        """Run the reconciler (app and pod informers + one worker) until ``stop`` is set; a
        reconcile that threw is retried with backoff (JOSDK's retry)."""
        self.enqueue()
        self._serve(stop, [self._watch_app, self._watch_pods])

    def _app_gone(self) -> None:
        self._cache = None  # R ``cleanup`` dropped it; the app is gone

    def _reconcile(self) -> None:
        """R ``reconcile`` (JOSDK adds the finalizer first, R ``cleanup`` on deletion): the
        cached status replaces the API's (SR ``updateStatusFromCache``), then the steps of
        ``getReconcileSteps`` in order; the first that completes ends the reconcile."""
        app = self.app()
        meta = app["metadata"]
        if meta.get("deletionTimestamp"):
            self._cleanup(app)
            return
        if FINALIZER not in (meta.get("finalizers") or []):
            self._add_finalizer(app)
            app = self.app()
        if self._cache is not None:  # SR ``updateStatusFromCache``
            app["status"] = copy.deepcopy(self._cache)
        else:
            self._cache = copy.deepcopy(app.get("status")) if app.get("status") else None
        # VAL: an empty status becomes a new one, persisted
        if not (app.get("status") or {}).get("currentState"):
            self._persist(app, rules.new_status(_now()))
        if self._clean_up(app):
            return
        state = rules.summary_of(app["status"])
        if state in rules.INITIALIZING:
            self._init(app)
        elif state in OBSERVED:
            self._observe(app)
        else:  # UNK: any other state
            self._append(app, "Failed", UNKNOWN_STATE)
            self.enqueue()

    def _add_finalizer(self, app: Mapping[str, Any]) -> None:
        """JOSDK: a ``Cleaner`` reconciler's finalizer is added before the first reconcile."""
        finalizers = [*(app["metadata"].get("finalizers") or []), FINALIZER]
        self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, self.name,
            {"metadata": {"finalizers": finalizers,
                          "resourceVersion": app["metadata"]["resourceVersion"]}},
        )  # fmt: skip

    def _append(
        self, app: dict[str, Any], summary: str, message: str, **extra: Any
    ) -> dict[str, Any]:
        state = {**rules.app_state(summary, message, _now()), **extra}
        status = rules.append_state(app["status"], state)
        self._persist(app, status)
        return status

    # -- steps ----------------------------------------------------------------------------------
    def _clean_up(self, app: dict[str, Any]) -> bool:
        """CU ``reconcile``: only for stopping or terminated states (else proceed: False).

        Terminated: ``checkEarlyExitForTerminatedApp`` (TTL from the previous entry's time;
        without TTL the cache is dropped and reconciling stops). Stopping: the retain policy
        (Never restart: TerminatedWithoutReleaseResources, pod kept); else request the driver
        pod's deletion (grace 0 past ``forceTerminationGracePeriodMillis``), **without waiting**
        for it, then ``terminateOrRestart``, persist and requeue (the effective backoff after
        ScheduledToRestart, else ``terminationRequeuePeriodMillis``)."""
        status, spec = app["status"], app["spec"]
        state = rules.summary_of(status)
        if state in rules.TERMINATED:
            self._terminated(app)
            return True
        if state not in rules.STOPPING:
            return False
        config = rules.restart_config(spec)
        retain = rules.retain_policy(spec)
        timeouts = (spec.get("applicationTolerations") or {}).get("applicationTimeoutConfig") or {}
        requeue_ms = int(timeouts.get("terminationRequeuePeriodMillis") or 2000)
        if rules.retained(retain, state) and config["restartPolicy"] == "Never":
            self._append(app, "TerminatedWithoutReleaseResources", rules.WITHOUT_RELEASE)
            self.enqueue(after=requeue_ms / 1000)
            return True
        force_ms = int(timeouts.get("forceTerminationGracePeriodMillis") or 300_000)
        since = rules.parse_iso(status["currentState"]["lastTransitionTime"])
        grace = 0 if _now() > since + datetime.timedelta(milliseconds=force_ms) else None
        for pod in self._driver_pods():
            self._delete_driver_pod(pod["metadata"]["name"], grace=grace)
        updated = rules.terminate_or_restart(
            status, config, message="", now=_now(), trim=self.trim_history
        )
        self._persist(app, updated)
        if rules.summary_of(updated) == "ScheduledToRestart":
            requeue_ms = rules.effective_backoff_millis(config, state)
        self.enqueue(after=requeue_ms / 1000)
        return True

    def _delete_driver_pod(self, pod_name: str, *, grace: int | None) -> None:
        """RU ``deleteResourceIfExists``: NotFound ignored; the kubelet stops the containers."""
        try:
            self.core.delete_namespaced_pod(pod_name, self.namespace, grace_period_seconds=grace)
        except client.ApiException as exc:
            if exc.status != 404:
                raise
        local = self.pods.get(pod_name)
        if local is not None:
            self._delete_pod(local)

    def _terminated(self, app: dict[str, Any]) -> None:
        """CU ``checkEarlyExitForTerminatedApp``: ResourceReleased with a TTL deletes the app
        (grace 0) once due, else requeues for the rest; without a TTL, or
        TerminatedWithoutReleaseResources (no retain duration modelled), stop: the cache is
        dropped (``clearCacheAndFinishReconcileForApplication``)."""
        status = app["status"]
        if rules.summary_of(status) == "ResourceReleased":
            wait = rules.ttl_wait_millis(status, app["spec"], now=_now())
            if wait is not None and wait > 0:
                self.enqueue(after=wait / 1000)
                return
            if wait is not None:
                self.custom.delete_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, PLURAL, self.name, grace_period_seconds=0
                )
        self._cache = None

    def _cleanup(self, app: dict[str, Any]) -> None:
        """R ``cleanup`` (JOSDK ``Cleaner``): not yet terminated → ``AppCleanUpStep`` with reason
        ``appCancelled`` (delete the driver pod, ResourceReleased "shutdown as requested"),
        the finalizer kept until the next call; terminated → remove the finalizer, drop the
        cache."""
        if self._cache is not None:
            app["status"] = copy.deepcopy(self._cache)
        status = app.get("status") or {}
        if status.get("currentState") and rules.summary_of(status) not in rules.TERMINATED:
            for pod in self._driver_pods():
                self._delete_driver_pod(pod["metadata"]["name"], grace=None)
            self._persist(
                app,
                rules.append_state(
                    status, rules.app_state("ResourceReleased", SHUTDOWN_REQUESTED, _now())
                ),
            )
            self.enqueue(after=0.5)  # ``terminationRequeuePeriodMillis`` (2 s upstream)
            return
        finalizers = [f for f in app["metadata"].get("finalizers") or [] if f != FINALIZER]
        self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, self.name,
            {"metadata": {"finalizers": finalizers,
                          "resourceVersion": app["metadata"]["resourceVersion"]}},
        )  # fmt: skip
        self._cache = None

    def _init(self, app: dict[str, Any]) -> None:
        """INIT ``reconcile``: on a restart wait until ScheduledToRestart + the effective
        backoff; then get-or-create the driver pod (RU ``getOrCreateSecondaryResource``: an
        existing pod of that name is adopted); DriverRequested, or SchedulingFailure if it
        cannot be created."""
        status, spec = app["status"], app["spec"]
        wait = rules.restart_wait_millis(status, rules.restart_config(spec), now=_now())
        if wait > 0:
            self.enqueue(after=wait / 1000)
            return
        pod_name = rules.driver_pod_name(app)
        try:
            if self._pod(pod_name) is None:
                self._create_driver_pod(app, pod_name)
        except Exception as exc:  # INIT: an exception is a SchedulingFailure with its trace
            self._append(app, "SchedulingFailure", f"Failed to request driver: {exc}")
            self.enqueue()
            return
        self._append(app, "DriverRequested", DRIVER_REQUESTED)
        self.enqueue()

    def _create_driver_pod(self, app: Mapping[str, Any], pod_name: str) -> None:
        """RSF ``buildResourceSpec`` + SW ``buildDriverConf``: the driver pod of the *current*
        spec: ``driverSpec.podTemplateSpec`` with Spark's container merged into its first (or
        ``podTemplateContainerName``'s) container, ``sparkConf`` as the driver's conf with the
        operator's overrides, the operator labels, an ownerReference to the app (Utils,
        ``OwnerResourceDecorator``). Then the kubelet runs it."""
        if self.fail_pod_creations > 0:
            self.fail_pod_creations -= 1
            raise RuntimeError(f"driver pod {pod_name} was refused by the apiserver")
        spec = copy.deepcopy(dict(app["spec"]))
        template = copy.deepcopy((spec.get("driverSpec") or {}).get("podTemplateSpec") or {})
        pod_spec = template.get("spec") or {}
        conf = {
            **(spec.get("sparkConf") or {}),
            "spark.kubernetes.namespace": self.namespace,
            "spark.app.id": rules.spark_app_id(app),
        }
        pod_spec, index = sparkpods.apache_template_pod(pod_spec, role="driver", conf=conf)
        containers = pod_spec["containers"]
        driver = containers[index]
        meta = app["metadata"]
        labels = {
            **((template.get("metadata") or {}).get("labels") or {}),
            LABEL_OPERATOR: OPERATOR_NAME, LABEL_APP: self.name, "spark-role": "driver",
            "spark-app-selector": conf["spark.app.id"], "spark-app-name": self.name,
        }  # fmt: skip
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "namespace": self.namespace,
                "labels": labels,
                "annotations": (template.get("metadata") or {}).get("annotations") or {},
                "ownerReferences": [
                    {
                        "apiVersion": f"{GROUP}/{VERSION}",
                        "kind": "SparkApplication",
                        "name": self.name,
                        "uid": meta["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": {
                **pod_spec,
                "containers": containers,
                "nodeName": NODE,
                "restartPolicy": "Never",
            },
        }
        self.core.create_namespaced_pod(self.namespace, cast("client.V1Pod", body))
        sidecars = [c for i, c in enumerate(containers) if i != index]
        self._start_pod(
            pod_name=pod_name,
            submission=conf["spark.app.id"],
            record={
                "generation": meta.get("generation"),
                "attempt": rules.attempt_id(app["status"]),
                "container": driver["name"],
                "images": {
                    c["name"]: c.get("image", "")
                    for c in [*(pod_spec.get("initContainers") or []), *containers]
                },
            },
            spec=PodSpec(
                init_containers=pod_spec.get("initContainers") or [],
                sidecars=sidecars,
                driver=driver,
                volumes=pod_spec.get("volumes") or [],
                share_process_namespace=pod_spec.get("shareProcessNamespace") is True,
                conf=conf,
                # Spark's pod template file keeps the template's metadata on the driver pod
                annotations=(template.get("metadata") or {}).get("annotations") or {},
            ),
        )

    def _observe(self, app: dict[str, Any]) -> None:
        """STEP ``observeDriver`` with the start, ready, running and timeout observers: no
        driver pod → Failed "Driver removed…"; else the states they return are appended in order
        (DriverStarted, DriverReady on a ready driver, then RunningHealthy: executor thresholds
        not modelled; a termination, with ``lastObservedDriverStatus``; else a timeout) and
        persisted once."""
        status, spec = app["status"], app["spec"]
        conf = spec.get("sparkConf") or {}
        wanted = rules.driver_pod_name(app)
        pods = [p for p in self._driver_pods() if p["metadata"]["name"] == wanted]
        if not pods:
            self._append(app, "Failed", DRIVER_REMOVED)
            self.enqueue()
            return
        pod = pods[0]
        now = _now()
        appended: list[dict[str, Any]] = []
        state = rules.summary_of(status)
        if rules.driver_started(pod, conf):
            for step in ("DriverStarted", "DriverReady", "RunningHealthy"):
                if rules.STATES.index(state) < rules.STATES.index(step):
                    appended.append(rules.app_state(step, "", now))
                    state = step
        ready = rules.STATES.index(state) >= rules.STATES.index("DriverReady")
        ended = rules.observe_driver_termination(pod, conf, was_ready=ready)
        if ended is not None:
            appended.append({
                **rules.app_state(ended[0], ended[1], now),
                "lastObservedDriverStatus": pod.get("status") or {},
            })  # fmt: skip
        elif not appended:
            timeout = rules.timed_out(status, spec, now=now)
            if timeout is not None:
                appended.append(rules.app_state(timeout, "", now))
        if not appended:
            return
        for entry in appended:
            status = rules.append_state(status, entry)
        self._persist(app, status)
        self.enqueue()

    # -- running it -----------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        return cast("dict[str, Any]", self.app().get("status") or {})
