"""What every handler of one running operator shares: settings, clients, clock, limits."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
from collections.abc import Awaitable, Callable
from typing import Any

from sparkguard.operator import config as config_
from sparkguard.operator import kube, metrics, rollbacks


def utcnow() -> datetime.datetime:
    """The wall clock, in UTC."""
    return datetime.datetime.now(datetime.UTC)


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

    def rollback_slots(self) -> asyncio.Semaphore:
        """The semaphore that bounds concurrent rollbacks (created on first use)."""
        if self.slots is None:
            self.slots = asyncio.Semaphore(self.config.max_concurrent_rollbacks)
        return self.slots
