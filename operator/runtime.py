"""What every handler of one running operator shares: settings, clients, clock, limits."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import datetime
import functools
import logging
import secrets
import socket
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Final

from sparkguard.operator import appmeta, kube, leadership, metrics, rollbacks
from sparkguard.operator import config as config_

#: apps whose Events are posted at once: Events are informational, and in a burst of
#: failures the patches that make the recoveries should not queue behind them at the API server
EVENT_POSTS: Final = 4

#: the loggers the handlers pass on: kopf's per-object adapter, or a module's own logger
Logger = logging.Logger | logging.LoggerAdapter[Any]


def utcnow() -> datetime.datetime:
    """The wall clock, in UTC."""
    return datetime.datetime.now(datetime.UTC)


@dataclasses.dataclass(frozen=True)
class AppKey:
    """One SparkApplication object: its name, and its uid (a recreated app is another key)."""

    namespace: str
    name: str
    uid: str | None
    #: the API group of its kind (Kubeflow's unless the app says otherwise)
    group: str = "sparkoperator.k8s.io"

    @property
    def id(self) -> str:
        """The uid, or ``namespace/name`` where the server assigns none (test emulators)."""
        return self.uid or f"{self.namespace}/{self.name}"

    @classmethod
    def of(cls, app: Any) -> AppKey:
        """The key of an app body."""
        meta = app.get("metadata") or {}
        group = str(app.get("apiVersion") or "").partition("/")[0] or cls.group
        return cls(
            str(meta.get("namespace")), str(meta.get("name")), meta.get("uid") or None, group
        )


@dataclasses.dataclass(kw_only=True)
class Runtime:
    """The operator's dependencies; tests swap the rollback, the clock or the webhook server."""

    config: config_.OperatorConfig
    kube: kube.KubeClient
    rollback: rollbacks.RollbackFn = rollbacks.rollback_job
    metrics: metrics.Metrics = dataclasses.field(default_factory=metrics.Metrics)
    clock: Callable[[], datetime.datetime] = utcnow
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep
    #: a ready ``kopf.WebhookServer`` (or tunnel) instead of one built from the config
    webhook_server: Any = None
    #: bounds concurrent rollbacks across all apps; made inside the operator's event loop
    slots: asyncio.Semaphore | None = None
    #: the threads rollbacks run in, one per slot (asyncio's default executor has only
    #: cpu count + 4: more slots than that would queue there, unseen)
    rollback_threads: concurrent.futures.ThreadPoolExecutor | None = None
    #: this process in Leases and claims; default: ``<pod name or hostname>-<random>``
    identity: str = ""
    #: the Lease campaign (with leader election on), set up at operator start
    elector: leadership.LeaderElector | None = None
    #: apps whose last seen state needs a recovery step: uid (or namespace/name) -> key
    pending: dict[str, AppKey] = dataclasses.field(default_factory=dict)
    #: kopf's view of the resources it serves (set by ``main.run``; :mod:`crdwatch` adds a
    #: kind installed after the start)
    insights: Any = None
    #: resubmission records seen (:mod:`resubmit`): ``namespace/name`` -> (namespace, name)
    records: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    #: one reconciling task per app at most: its key id -> wake-up flag (set on news)
    workers: dict[str, asyncio.Event] = dataclasses.field(default_factory=dict)
    #: resourceVersions our last few patches of an app produced (their watch echoes are no
    #: news), newest last
    written: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    #: the last transition Events this process posted (or found posted) per app: key id ->
    #: Event names, newest last (bounded: the oldest apps go first)
    posted: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    #: per app, the task posting its latest Event: Events go out in order, off the recovery's
    #: critical path (the next patch does not wait for them); key id -> task
    posting: dict[str, asyncio.Task[None]] = dataclasses.field(default_factory=dict)
    #: bounds how many apps' Events are posted at once (made inside the event loop)
    posting_slots: asyncio.Semaphore | None = None
    #: background tasks of this process (the campaign, workers), cancelled at shutdown
    tasks: set[asyncio.Task[None]] = dataclasses.field(default_factory=set)
    #: called with (key, decision) each time this process decided about an app (tests wait
    #: for it instead of sleeping)
    on_decision: Callable[[AppKey, Any], None] | None = None

    def decided(self, key: AppKey, decision: Any) -> None:
        """Report a decision to ``on_decision`` (if set)."""
        if self.on_decision is not None:
            self.on_decision(key, decision)

    def __post_init__(self) -> None:
        if not self.identity:
            base = self.config.pod_name or socket.gethostname() or "sparkguard"
            # A fresh suffix per process: a restarted container never mistakes the claims of
            # its previous incarnation (same pod name) for its own.
            self.identity = f"{base}-{secrets.token_hex(3)}"
        self.kube.on_request = lambda request: self.metrics.api_requests.labels(
            request=request
        ).inc()
        self.kube.on_error = lambda status: self.metrics.api_errors.labels(status=status).inc()

    def leading(self) -> bool:
        """Whether this process runs recoveries now (always, without leader election)."""
        return self.elector is None or self.elector.is_leader

    def spawn(
        self, work: Coroutine[Any, Any, None], *, name: str | None = None
    ) -> asyncio.Task[None]:
        """Run ``work`` as a background task of this process (in :attr:`tasks`, which the
        operator's stop cancels)."""
        task = asyncio.get_running_loop().create_task(work, name=name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def rollback_slots(self) -> asyncio.Semaphore:
        """The semaphore that bounds concurrent rollbacks (created on first use)."""
        if self.slots is None:
            self.slots = asyncio.Semaphore(self.config.max_concurrent_rollbacks)
        return self.slots

    def event_slots(self) -> asyncio.Semaphore:
        """The semaphore that bounds how many apps' Events are being posted at once."""
        if self.posting_slots is None:
            self.posting_slots = asyncio.Semaphore(EVENT_POSTS)
        return self.posting_slots

    def rollback_executor(self) -> concurrent.futures.ThreadPoolExecutor:
        """The threads rollbacks run in, as many as there are slots (created on first use)."""
        if self.rollback_threads is None:
            self.rollback_threads = concurrent.futures.ThreadPoolExecutor(
                max_workers=self.config.max_concurrent_rollbacks,
                thread_name_prefix="sparkguard-rollback",
            )
        return self.rollback_threads

    async def rollback_call(
        self, app: Mapping[str, Any], options: appmeta.Options
    ) -> Callable[[], rollbacks.RollbackSummary]:
        """The app's rollback as a call for a rollback thread: its job, journal and storage owner,
        and the storage options of the Secret its annotations name (read now, in the app's
        namespace; :class:`errors.OperatorError` when that Secret is missing)."""
        meta = app.get("metadata") or {}
        storage_options = await rollbacks.read_storage_options(
            self.kube, meta["namespace"], options
        )
        return functools.partial(
            self.rollback,
            options.job_id,
            options.journal,
            owner=appmeta.storage_owner(meta),
            storage_options=storage_options,
        )
