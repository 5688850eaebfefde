"""Events off the recovery's critical path: in order per app, a few apps at a time, flushed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

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


class _FailingEvents(kube.KubeClient):
    """Fails the first ``failures`` posts with ``error``, then takes them."""

    def __init__(self, error: Exception, failures: int) -> None:
        super().__init__(client.ApiClient(client.Configuration()))
        self.error = error
        self.failures = failures
        self.tries = 0
        self.posted: list[str] = []

    async def post_event(self, app: Any, *, reason: str, **kwargs: Any) -> None:
        self.tries += 1
        if self.tries <= self.failures:
            raise self.error
        self.posted.append(reason)


def _runtime_sleeping_into(
    config: config_.OperatorConfig, api: kube.KubeClient, slept: list[float]
) -> runtime_.Runtime:
    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    return runtime_.Runtime(config=config, kube=api, sleep=sleep)


@pytest.mark.parametrize(
    "error",
    [
        ApiException(status=500, reason="Internal Server Error"),
        ApiException(status=503, reason="Service Unavailable"),
        ApiException(status=429, reason="Too Many Requests"),
        urllib3.exceptions.ProtocolError("Connection aborted.", ConnectionResetError()),
        ConnectionRefusedError(111, "Connection refused"),
    ],
    ids=["500", "503", "429", "reset", "refused"],
)
async def test_an_event_the_api_server_failed_to_take_for_a_moment_is_posted_on_a_later_try(
    config: config_.OperatorConfig, error: Exception
) -> None:
    api = _FailingEvents(error, failures=2)
    slept: list[float] = []
    runtime = _runtime_sleeping_into(config, api, slept)
    events.post_soon(runtime, _app("flaky"), _event(recovery.Reason.RESUBMITTED))
    await events.wait_posted(runtime, runtime_.AppKey.of(_app("flaky")))
    assert api.posted == ["Resubmitted"]
    assert api.tries == 3
    assert slept == list(events.POST_RETRY_DELAYS[:2])


async def test_an_event_is_given_up_after_its_last_try_and_a_refused_one_is_not_tried_again(
    config: config_.OperatorConfig, caplog: pytest.LogCaptureFixture
) -> None:
    down = _FailingEvents(ApiException(status=503, reason="Service Unavailable"), failures=99)
    slept: list[float] = []
    runtime = _runtime_sleeping_into(config, down, slept)
    assert not await events.post(
        runtime, _app("down"), type="Normal", reason="Resubmitted", message="m"
    )
    assert down.tries == 1 + len(events.POST_RETRY_DELAYS)
    assert slept == list(events.POST_RETRY_DELAYS)

    refused = _FailingEvents(ApiException(status=422, reason="Unprocessable Entity"), failures=1)
    slept.clear()
    runtime = _runtime_sleeping_into(config, refused, slept)
    assert not await events.post(
        runtime, _app("refused"), type="Normal", reason="RolledBack", message="m"
    )
    assert (refused.tries, slept) == (1, [])
    assert "could not post Event RolledBack" in caplog.text
