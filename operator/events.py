"""Kubernetes Events about apps: in order, off the recovery's critical path, each transition once.

An Event is informational: a recovery's next patch never waits for one. :func:`post_soon`
queues an app's Events behind its earlier ones (a few apps at a time); :func:`wait_posted`
waits until they are out. An Event that reports a transition is named after it
(:func:`transition_event_name`), so a copy posted again, by this operator or another, is refused
by the API server as a duplicate. A failure to post is logged, never raised.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Mapping
from typing import Any, Final

import urllib3
from kubernetes.client.exceptions import ApiException

from sparkguard.operator import recovery
from sparkguard.operator import runtime as runtime_

_log = logging.getLogger(__name__)

#: the name of the tasks that post Events (:func:`post_soon`)
TASK_NAME: Final = "sparkguard-events"
#: how many apps' last transition Events :attr:`Runtime.posted` remembers
_POSTED_REMEMBERED: Final = 10_000
#: how many transition Events of one app it remembers (a recovery posts at most three)
_POSTED_PER_APP: Final = 4
#: the seconds between tries of an Event the API server failed to take for a passing reason
#: (5xx, 429, a dropped connection), as client-go's event broadcaster retries its sink
POST_RETRY_DELAYS: Final = (0.5, 1.0, 2.0, 4.0)


def transition_event_name(app: Mapping[str, Any], transition: str) -> str:
    """The name every operator gives the Event of ``transition`` of this very object (uid)."""
    meta = app.get("metadata") or {}
    digest = hashlib.sha256(f"{meta.get('uid')}/{transition}".encode()).hexdigest()[:20]
    return f"{str(meta.get('name'))[:200]}.{digest}"


async def post_spec(
    runtime: runtime_.Runtime, app: Mapping[str, Any], event: recovery.EventSpec | None
) -> None:
    """Post ``event``; one that reports a transition is posted once, by whichever operator.

    Its name comes from the transition, so a copy posted again (a replica took over from one
    killed between writing the phase and posting) is refused by the API server as a duplicate.
    """
    if event is None:
        return
    key = runtime_.AppKey.of(app).id
    name = transition_event_name(app, event.transition) if event.transition else None
    if name is not None and name in runtime.posted.get(key, ()):
        return
    posted = await post(
        runtime, app, type=event.type, reason=event.reason.value, message=event.message, name=name
    )
    if posted and name is not None:
        names = runtime.posted.pop(key, ())
        runtime.posted[key] = (*names, name)[-_POSTED_PER_APP:]
        while len(runtime.posted) > _POSTED_REMEMBERED:
            runtime.posted.pop(next(iter(runtime.posted)))


def post_soon(
    runtime: runtime_.Runtime, app: Mapping[str, Any], *events: recovery.EventSpec | None
) -> None:
    """Post ``events`` after the app's earlier Events, without waiting for them.

    An Event is informational: the recovery's next patch does not wait for it (a request and
    a round trip less on the way from FAILED to the resubmission). The app's Events still go
    out one after the other, in order; :func:`wait_posted` waits for them (a reconcile
    returns only once its Events are out).
    """
    wanted = [e for e in events if e is not None]
    if not wanted:
        return
    key = runtime_.AppKey.of(app).id
    before = runtime.posting.get(key)

    async def post_in_order() -> None:
        if before is not None:
            await asyncio.wait([before])  # its outcome is its own (a failure is logged)
        # A few at a time across all apps: in a burst of failures the patches that make the
        # recoveries go first at the API server, the Events follow
        async with runtime.event_slots():
            for event in wanted:
                await post_spec(runtime, app, event)

    task = runtime.spawn(post_in_order(), name=TASK_NAME)
    runtime.posting[key] = task

    def forget(done: asyncio.Task[None]) -> None:
        if runtime.posting.get(key) is done:
            del runtime.posting[key]

    task.add_done_callback(forget)


async def wait_posted(runtime: runtime_.Runtime, key: runtime_.AppKey) -> None:
    """Wait until the Events :func:`post_soon` queued for the app are out."""
    task = runtime.posting.get(key.id)
    if task is not None:
        await asyncio.wait([task])


async def post(
    runtime: runtime_.Runtime,
    app: Mapping[str, Any],
    *,
    type: str,
    reason: str,
    message: str,
    name: str | None = None,
) -> bool:
    """Post a Kubernetes Event about ``app``; a failure to post is logged, never raised.

    A passing failure (the API server answers 5xx or 429, or the connection drops) is tried
    again after each of :data:`POST_RETRY_DELAYS`; a refusal (4xx) is not. A retried named
    Event that the first try did create is the same Event (409: nothing posted twice).
    ``True`` once the Event exists (posted now, or before under the same ``name``).
    """
    delays = iter(POST_RETRY_DELAYS)
    while True:
        try:
            await runtime.kube.post_event(app, type=type, reason=reason, message=message, name=name)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - an Event is informational
            delay = next(delays, None) if _passing(exc) else None
            if delay is None:
                _log.warning("could not post Event %s: %s", reason, exc)
                return False
            _log.info("posting Event %s failed (%s); trying again in %.1fs", reason, exc, delay)
            await runtime.sleep(delay)
        else:
            return True


def _passing(exc: Exception) -> bool:
    """Whether the API server may take the same request a moment later."""
    if isinstance(exc, ApiException):
        return exc.status in (0, 429) or (exc.status or 0) >= 500
    return isinstance(exc, OSError | urllib3.exceptions.HTTPError)
