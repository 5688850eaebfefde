"""Prometheus metrics of the operator, each instance on its own registry."""

from __future__ import annotations

import prometheus_client
from aiohttp import web


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
        self._recovering: set[tuple[str, str]] = set()

    def track_recovery(self, key: tuple[str, str], *, recovering: bool) -> None:
        """Count ``key`` (namespace, name) in the in-recovery gauge, or stop counting it."""
        if recovering:
            self._recovering.add(key)
        else:
            self._recovering.discard(key)
        self.in_recovery.set(len(self._recovering))

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
