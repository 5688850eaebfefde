"""Events off the recovery's critical path: in order per app, a few apps at a time, flushed."""

from __future__ import annotations

import asyncio
from typing import Any

from kubernetes import client

from sparkguard.operator import config as config_
from sparkguard.operator import events, kube, lifecycle, recovery
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
    api = _SlowEvents()
    runtime = runtime_.Runtime(config=config, kube=api)
    apps = [_app(f"app-{i}") for i in range(3 * runtime_.EVENT_POSTS)]
    order = (recovery.Reason.ROLLBACK_STARTED, recovery.Reason.ROLLED_BACK)
    for app in apps:
        for reason in order:  # queued one after the other, as a recovery does
            events.post_soon(runtime, app, _event(reason))
    # The caller never waited; nothing is posted yet, and only a few apps are in flight.
    for _ in range(5):
        await asyncio.sleep(0)
    assert api.posted == []
    assert api.in_flight == runtime_.EVENT_POSTS
    api.release.set()
    for app in apps:
        await events.wait_posted(runtime, runtime_.AppKey.of(app))
    assert api.most == runtime_.EVENT_POSTS
    assert len(api.posted) == 2 * len(apps)
    for app in apps:
        name = app["metadata"]["name"]
        assert [r for n, r in api.posted if n == name] == [r.value for r in order]
    assert runtime.posting == {}


async def test_a_stopping_operator_lets_its_queued_events_out(
    config: config_.OperatorConfig,
) -> None:
    api = _SlowEvents()
    runtime = runtime_.Runtime(config=config, kube=api)
    app = _app("leaving")
    events.post_soon(runtime, app, _event(recovery.Reason.ROLLED_BACK))
    events.post_soon(runtime, app, _event(recovery.Reason.RESUBMITTED))
    stopping = asyncio.get_running_loop().create_task(lifecycle.stop_background(runtime))
    await asyncio.sleep(0.05)
    assert not stopping.done()  # waits for the Events (within EVENT_FLUSH_SECONDS)
    api.release.set()
    await stopping
    assert api.posted == [("leaving", "RolledBack"), ("leaving", "Resubmitted")]
