"""Prometheus metrics of one sidecar app, in a registry of its own (tests run many apps)."""

from __future__ import annotations

import dataclasses
from typing import Any

import prometheus_client

_FLUSH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000)


@dataclasses.dataclass(frozen=True)
class SidecarMetrics:
    """The sidecar's instruments; :func:`build_metrics` makes a fresh set."""

    registry: prometheus_client.CollectorRegistry
    requests: prometheus_client.Counter
    acknowledged: prometheus_client.Counter
    flush_duration: prometheus_client.Histogram
    batch_size: prometheus_client.Histogram
    flush_failures: prometheus_client.Counter
    pending: prometheus_client.Gauge
    cached_dirs: prometheus_client.Gauge
    open_connections: prometheus_client.Gauge
    refused_connections: prometheus_client.Counter
    #: pre-bound children: ``labels()`` costs more than the increment on the hot path
    _children: dict[tuple[str, int], Any] = dataclasses.field(default_factory=dict)

    def count_request(self, route: str, status: int) -> None:
        """Count one answered request."""
        child = self._children.get((route, status))
        if child is None:
            child = self.requests.labels(route=route, status=str(status))
            self._children[(route, status)] = child
        child.inc()

    @property
    def acknowledged_written(self) -> Any:
        """Counter child: markers acknowledged after a flush wrote them."""
        return self._child_ack("written")

    @property
    def acknowledged_known(self) -> Any:
        """Counter child: markers acknowledged because they were already on storage."""
        return self._child_ack("known")

    def _child_ack(self, how: str) -> Any:
        key = ("ack:" + how, 0)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self.acknowledged.labels(how=how)
        return child


def build_metrics() -> SidecarMetrics:
    """A fresh registry with every sidecar instrument registered."""
    registry = prometheus_client.CollectorRegistry(auto_describe=True)
    return SidecarMetrics(
        registry=registry,
        requests=prometheus_client.Counter(
            "sparkguard_sidecar_requests",
            "HTTP requests answered, by route and status",
            ["route", "status"],
            registry=registry,
        ),
        acknowledged=prometheus_client.Counter(
            "sparkguard_sidecar_markers_acknowledged",
            "Markers acknowledged as durable; how=written (by a flush) or known (already there)",
            ["how"],
            registry=registry,
        ),
        flush_duration=prometheus_client.Histogram(
            "sparkguard_sidecar_flush_duration_seconds",
            "Time to write one batch (MARKERS.type when first, then one MARKERS<i> file)",
            buckets=_FLUSH_BUCKETS,
            registry=registry,
        ),
        batch_size=prometheus_client.Histogram(
            "sparkguard_sidecar_flush_batch_size",
            "New marker names written by one flush",
            buckets=_BATCH_BUCKETS,
            registry=registry,
        ),
        flush_failures=prometheus_client.Counter(
            "sparkguard_sidecar_flush_failures",
            "Flushes that failed (their requests got 503 and nothing was acknowledged)",
            registry=registry,
        ),
        pending=prometheus_client.Gauge(
            "sparkguard_sidecar_pending_markers",
            "Markers waiting to be durable (queued or being written)",
            registry=registry,
        ),
        cached_dirs=prometheus_client.Gauge(
            "sparkguard_sidecar_cached_marker_dirs",
            "Marker directories whose state is held in memory",
            registry=registry,
        ),
        open_connections=prometheus_client.Gauge(
            "sparkguard_sidecar_open_connections",
            "Client connections currently open",
            registry=registry,
        ),
        refused_connections=prometheus_client.Counter(
            "sparkguard_sidecar_refused_connections",
            "Connections answered 503 and closed at once: max_connections were already open",
            registry=registry,
        ),
    )
