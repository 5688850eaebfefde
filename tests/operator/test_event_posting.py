"""Events off the recovery's critical path: in order per app, a few apps at a time, flushed."""

from __future__ import annotations

import asyncio
from typing import Any

from kubernetes import client

from sparkguard.operator import config as config_
from sparkguard.operator import handlers, kube, recovery
from sparkguard.operator import runtime as runtime_
from tests.operator.apps import spark_app


class _SlowEvents(kube.KubeClient):
    """Records the Events posted, each taking a while; counts how many are in flight."""

    def __init__(self) -> None:
        super().__init__(client.ApiClient(client.Configuration()))
        self.posted: list[tuple[str, str]] = []
        self.in_flight = 0
        self.most = 0
        self.release = asyncio.Event()

    async def post_event(self, app: Any, *, reason: str, **kwargs: Any) -> None:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await self.release.wait()
            self.posted.append((app["metadata"]["name"], reason))
        finally:
            self.in_flight -= 1


def _event(reason: recovery.Reason) -> recovery.EventSpec:
    return recovery.EventSpec(type="Normal", reason=reason, message=reason.value)


def _app(name: str) -> dict[str, Any]:
    app = spark_app(name)
    app["metadata"]["uid"] = f"uid-{name}"
    return app


async def test_events_go_out_in_order_a_few_apps_at_a_time(
    config: config_.OperatorConfig,
) -> None:
    events = _SlowEvents()
    runtime = runtime_.Runtime(config=config, kube=events)
    apps = [_app(f"app-{i}") for i in range(3 * runtime_.EVENT_POSTS)]
    order = (recovery.Reason.ROLLBACK_STARTED, recovery.Reason.ROLLED_BACK)
    for app in apps:
        for reason in order:  # queued one after the other, as a recovery does
            handlers._post_soon(runtime, app, _event(reason))
    # The caller never waited; nothing is posted yet, and only a few apps are in flight.
    for _ in range(5):
        await asyncio.sleep(0)
    assert events.posted == []
    assert events.in_flight == runtime_.EVENT_POSTS
    events.release.set()
    for app in apps:
        await handlers._events_posted(runtime, runtime_.AppKey.of(app))
    assert events.most == runtime_.EVENT_POSTS
    assert len(events.posted) == 2 * len(apps)
    for app in apps:
        name = app["metadata"]["name"]
        assert [r for n, r in events.posted if n == name] == [r.value for r in order]
    assert runtime.posting == {}


async def test_a_stopping_operator_lets_its_queued_events_out(
    config: config_.OperatorConfig,
) -> None:
    events = _SlowEvents()
    runtime = runtime_.Runtime(config=config, kube=events)
    app = _app("leaving")
    handlers._post_soon(runtime, app, _event(recovery.Reason.ROLLED_BACK))
    handlers._post_soon(runtime, app, _event(recovery.Reason.RESUBMITTED))
    stopping = asyncio.get_running_loop().create_task(handlers.stop_background(runtime))
    await asyncio.sleep(0.05)
    assert not stopping.done()  # waits for the Events (within EVENT_FLUSH_SECONDS)
    events.release.set()
    await stopping
    assert events.posted == [("leaving", "RolledBack"), ("leaving", "Resubmitted")]
