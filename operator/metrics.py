"""Prometheus metrics of the operator, each instance on its own registry.

The chart's Grafana dashboard and PrometheusRule (``charts/sparkguard/dashboards/``,
``templates/prometheusrule.yaml``) query these names; a test checks that every name they use
is one this module (or the sidecar's) exports. Per-app labels are left out on purpose: app
names are unbounded (a scheduled app makes a new one per run), so only the apps gauge carries
the app's namespace; Events and the app's annotations name the app.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Protocol

import prometheus_client
from aiohttp import web

#: files deleted by one rollback: most delete a task's few files, a wide job thousands
_FILES_BUCKETS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 50_000)


class _Summary(Protocol):
    """What :meth:`Metrics.record_rollback` reads of a rollback summary."""

    @property
    def files_deleted(self) -> int: ...

    def to_json(self) -> dict[str, Any]: ...


class Metrics:
    """Counters and gauges of one operator (a private registry, so tests can run several)."""

    def __init__(self) -> None:
        self.registry = prometheus_client.CollectorRegistry()
        self.rollbacks = prometheus_client.Counter(
            "sparkguard_operator_rollbacks",
            "Rollbacks run by the operator, by outcome.",
            ["outcome"],  # rolled_back | nothing_to_do | committed | error
            registry=self.registry,
        )
        self.resubmissions = prometheus_client.Counter(
            "sparkguard_operator_resubmissions",
            "SparkApplications resubmitted after a rollback.",
            registry=self.registry,
        )
        self.failures = prometheus_client.Counter(
            "sparkguard_operator_failures",
            "Failures the operator met, by reason (app states and its own outcomes).",
            ["reason"],
            registry=self.registry,
        )
        self.in_recovery = prometheus_client.Gauge(
            "sparkguard_operator_apps_in_recovery",
            "SparkApplications between a failure and their resubmission.",
            registry=self.registry,
        )
        self.rollback_seconds = prometheus_client.Histogram(
            "sparkguard_operator_rollback_seconds",
            "Duration of rollbacks run by the operator.",
            registry=self.registry,
        )
        self.rollback_queue_seconds = prometheus_client.Histogram(
            "sparkguard_operator_rollback_queue_seconds",
            "Time recoveries waited for one of the SPARKGUARD_MAX_CONCURRENT_ROLLBACKS slots.",
            registry=self.registry,
        )
        self.resubmit_retries = prometheus_client.Counter(
            "sparkguard_operator_resubmit_retries",
            "Resubmissions patched again because the app stayed FAILED past the timeout.",
            registry=self.registry,
        )
        self.conflicts = prometheus_client.Counter(
            "sparkguard_operator_conflicts",
            "Steps not taken because the app changed, was replaced, or another operator "
            "holds its recovery (read again, or left to that operator).",
            ["step"],
            registry=self.registry,
        )
        self.deletions = prometheus_client.Counter(
            "sparkguard_operator_deletions",
            "Deleted opted-in apps let go by the sparkguard.io/rollback finalizer.",
            ["outcome"],  # rolled_back | no_rollback | abandoned
            registry=self.registry,
        )
        self.leader = prometheus_client.Gauge(
            "sparkguard_operator_leader",
            "1 while this replica holds the leader Lease (and runs recoveries), else 0.",
            registry=self.registry,
        )
        self.api_requests = prometheus_client.Counter(
            "sparkguard_operator_api_requests",
            "Kubernetes API requests the operator made itself (kopf's watches excluded).",
            ["request"],  # get | patch | event | secret | lease-get | lease-create | ...
            registry=self.registry,
        )
        self.api_errors = prometheus_client.Counter(
            "sparkguard_operator_api_errors",
            "Kubernetes API requests of the operator that failed, by HTTP status (404: gone, "
            "409: a conflict, both often expected; unreachable: no answer).",
            ["status"],
            registry=self.registry,
        )
        self.leader_changes = prometheus_client.Counter(
            "sparkguard_operator_leader_changes",
            "Times this replica took or lost the leader Lease.",
            registry=self.registry,
        )
        self.apps = prometheus_client.Gauge(
            "sparkguard_operator_apps",
            "Opted-in SparkApplications this replica watches, by the app's namespace and "
            "whether its last driver pod carried sparkguard's containers "
            "(protection: protected | unprotected).",
            ["app_namespace", "protection"],
            registry=self.registry,
        )
        self.oldest_recovery = prometheus_client.Gauge(
            "sparkguard_operator_oldest_recovery_seconds",
            "Age of the longest-running recovery (failure seen, not yet resubmitted or "
            "concluded); 0 when none runs.",
            registry=self.registry,
        )
        self.oldest_recovery.set_function(self._oldest_recovery_age)
        self.instants = prometheus_client.Counter(
            "sparkguard_operator_instants",
            "Instants the operator's rollbacks decided or finished on storage, by what was done: "
            "rolled_back (claimed and cleaned), committed (a commit had decided it: left alone), "
            "rolled_forward (committed, and the rollback finished what its driver left: "
            "files still to publish, superseded files, markers).",
            ["action"],
            registry=self.registry,
        )
        self.late_files_removed = prometheus_client.Counter(
            "sparkguard_operator_late_files_removed",
            "Files of already rolled-back instants found again and deleted (a zombie task "
            "published them after the first pass).",
            registry=self.registry,
        )
        self.rollback_files_deleted = prometheus_client.Histogram(
            "sparkguard_operator_rollback_files_deleted",
            "Files deleted by one rollback.",
            buckets=_FILES_BUCKETS,
            registry=self.registry,
        )
        # The series alerts and panels ask for, exported at 0 from the start: a counter series
        # that first appears at 1 shows no increase() until its next change, so the first
        # exhausted app or failed rollback would never fire an alert.
        for action in ("rolled_back", "committed", "rolled_forward"):
            self.instants.labels(action=action)
        for outcome in ("rolled_back", "nothing_to_do", "committed", "error"):
            self.rollbacks.labels(outcome=outcome)
        for reason in ("RetriesExhausted", "RollbackFailed"):
            self.failures.labels(reason=reason)  # recovery.Reason values
        for step in ("claimed", "conclude", "patch", "finalizer"):
            self.conflicts.labels(step=step)
        self._recovering: dict[tuple[str, str], float] = {}
        self._protection: dict[tuple[str, str], bool] = {}

    def track_recovery(self, key: tuple[str, str], *, recovering: bool) -> None:
        """Count ``key`` (namespace, name) in the in-recovery gauge, or stop counting it."""
        if recovering:
            self._recovering.setdefault(key, time.monotonic())
        else:
            self._recovering.pop(key, None)
        self.in_recovery.set(len(self._recovering))

    def _oldest_recovery_age(self) -> float:
        started = min(self._recovering.values(), default=None)
        return 0.0 if started is None else time.monotonic() - started

    def track_app(self, key: tuple[str, str], *, protected: bool | None) -> None:
        """Count the opted-in app ``key`` (namespace, name) as protected or not; ``None``: the
        app is gone (or no longer opted in)."""
        before = self._protection.get(key)
        if before == protected:
            return  # the common case: an event of an app whose protection did not change
        if protected is None:
            del self._protection[key]
        else:
            self._protection[key] = protected
        namespace = key[0]
        for was, delta in ((before, -1), (protected, 1)):
            if was is not None:
                label = "protected" if was else "unprotected"
                self.apps.labels(app_namespace=namespace, protection=label).inc(delta)
        for label in ("protected", "unprotected"):  # both series, so a 0 is a 0, not absent
            self.apps.labels(app_namespace=namespace, protection=label)

    def record_rollback(self, summary: _Summary) -> None:
        """Count what one finished rollback did on storage (from its summary's details)."""
        self.rollback_files_deleted.observe(summary.files_deleted)
        details = summary.to_json().get("details") or ()
        for detail in details:
            if not isinstance(detail, Mapping):
                continue
            action = detail.get("action")
            deleted = int(detail.get("filesDeleted") or 0)
            if action == "rolled_back":
                self.instants.labels(action="rolled_back").inc()
            elif action == "committed":
                finished = (
                    deleted
                    or int(detail.get("filesPublished") or 0)
                    or int(detail.get("markersDeleted") or 0)
                )
                self.instants.labels(action="rolled_forward" if finished else "committed").inc()
            elif action == "nothing" and deleted:
                self.late_files_removed.inc(deleted)

    def render(self) -> bytes:
        """The exposition text of every metric."""
        return bytes(prometheus_client.generate_latest(self.registry))


async def start_server(metrics: Metrics, *, addr: str, port: int) -> web.AppRunner:
    """Serve ``/metrics`` on ``addr:port``; clean up with ``await runner.cleanup()``."""

    async def serve(_request: web.Request) -> web.Response:
        return web.Response(
            body=metrics.render(),
            headers={"Content-Type": prometheus_client.CONTENT_TYPE_LATEST},
        )

    app = web.Application()
    app.router.add_get("/metrics", serve)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, addr, port).start()
    return runner
