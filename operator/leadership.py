"""Leader election on a ``coordination.k8s.io/v1`` Lease: which replica recovers apps.

Every replica serves admission; only the holder of the Lease runs recoveries. The algorithm is
the one of client-go's ``leaderelection``: a replica takes the Lease when it is free, or when
its record has not changed for ``lease_duration`` *as this replica observed it* (its own
monotonic clock, so clocks of different nodes never need to agree); every write carries the
Lease's resourceVersion, so of two replicas racing for it exactly one wins. The leader renews
every ``retry_period`` and steps down by itself when it could not renew for ``renew_deadline``
(shorter than ``lease_duration``), i.e. before anyone else may take over; on a clean shutdown
it releases the Lease so the other replica takes over at once.

A lease is no fence: a leader paused longer than the lease (GC, a frozen node) may act after
another took over. Recovery steps therefore never rely on it: see :mod:`recovery` (claims) and
the preconditions in :mod:`patches`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from kubernetes import client

from sparkguard.operator import kube

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Timing:
    """How long a Lease lasts, when the leader gives up renewing, how often everyone tries."""

    lease_duration: float
    renew_deadline: float
    retry_period: float

    @classmethod
    def for_duration(cls, lease_duration: float) -> Timing:
        """client-go's proportions (15 s / 10 s / 2 s) scaled to ``lease_duration``.

        A purely computational function with no side-effects.
        """
        return cls(
            lease_duration=lease_duration,
            renew_deadline=lease_duration * 2 / 3,
            retry_period=max(0.05, lease_duration * 2 / 15),
        )


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class LeaderElector:
    """Campaigns for one Lease until stopped; ``is_leader`` says whether we hold it now."""

    def __init__(
        self,
        kube_client: kube.KubeClient,
        *,
        namespace: str,
        name: str,
        identity: str,
        timing: Timing,
        on_change: Callable[[bool], Awaitable[None] | None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self.kube = kube_client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.timing = timing
        self.on_change = on_change
        self._monotonic = monotonic
        self._sleep = sleep
        self.is_leader = False
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._renewed_at = 0.0

    async def run(self) -> None:
        """Try to acquire or renew every ``retry_period`` until cancelled."""
        while True:
            try:
                # Bounded, as client-go bounds each attempt by the renew deadline: a request
                # that hangs (etcd frozen, the API server waiting on it) must not keep this
                # replica leading past the deadline, when another may take over.
                held = await asyncio.wait_for(
                    self._try_acquire_or_renew(), timeout=self.timing.renew_deadline
                )
            except asyncio.CancelledError:
                raise
            except TimeoutError:
                logger.warning(
                    "lease %s/%s: no answer within %.1fs",
                    self.namespace,
                    self.name,
                    self.timing.renew_deadline,
                )
                held = False
            except Exception as exc:  # noqa: BLE001 - the apiserver fails in many ways; retry
                logger.warning("lease %s/%s: %s", self.namespace, self.name, exc)
                held = False
            now = self._monotonic()
            if held:
                self._renewed_at = now
                await self._set(True)
            elif self.is_leader:
                overdue = now - self._renewed_at >= self.timing.renew_deadline
                taken = self._observed_holder() not in (None, "", self.identity)
                if overdue or taken:
                    logger.warning(
                        "lost the lease %s/%s (%s); stepping down",
                        self.namespace,
                        self.name,
                        f"held by {self._observed_holder()}"
                        if taken
                        else f"not renewed for {now - self._renewed_at:.1f}s",
                    )
                    await self._set(False)
            await self._sleep(self.timing.retry_period)

    async def release(self) -> None:
        """Give the Lease up (if we hold it), so another replica takes over without waiting."""
        was_leader = self.is_leader
        await self._set(False)
        if not was_leader:
            return
        try:
            lease = await self.kube.get_lease(self.namespace, self.name)
            if lease is None or lease.spec is None or lease.spec.holder_identity != self.identity:
                return
            lease.spec.holder_identity = ""
            lease.spec.lease_duration_seconds = 1
            await self.kube.replace_lease(self.namespace, lease)
            logger.info("released the lease %s/%s", self.namespace, self.name)
        except Exception as exc:  # noqa: BLE001 - best effort: it expires anyway
            logger.warning("could not release the lease %s/%s: %s", self.namespace, self.name, exc)

    def _observed_holder(self) -> str | None:
        return None if self._observed is None else str(self._observed[0] or "")

    async def _set(self, leading: bool) -> None:
        if leading == self.is_leader:
            return
        self.is_leader = leading
        logger.info(
            "%s the lease %s/%s as %s",
            "acquired" if leading else "gave up",
            self.namespace,
            self.name,
            self.identity,
        )
        if self.on_change is not None:
            result = self.on_change(leading)
            if result is not None:
                await result

    def _spec(self, *, acquired: datetime.datetime, transitions: int) -> client.V1LeaseSpec:
        return client.V1LeaseSpec(
            holder_identity=self.identity,
            lease_duration_seconds=max(1, round(self.timing.lease_duration)),
            acquire_time=acquired,
            renew_time=_now(),
            lease_transitions=transitions,
        )

    async def _try_acquire_or_renew(self) -> bool:
        lease = await self.kube.get_lease(self.namespace, self.name)
        if lease is None:
            fresh = client.V1Lease(
                metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
                spec=self._spec(acquired=_now(), transitions=0),
            )
            created = await self.kube.create_lease(self.namespace, fresh)
            self._observe(created)
            return created is not None
        self._observe(lease)
        spec = lease.spec or client.V1LeaseSpec()
        holder = spec.holder_identity or ""
        duration = float(spec.lease_duration_seconds or self.timing.lease_duration)
        mine = holder == self.identity
        expired = self._monotonic() - self._observed_at >= duration
        if holder and not mine and not expired:
            return False
        lease.spec = self._spec(
            acquired=spec.acquire_time if mine and spec.acquire_time else _now(),
            transitions=(spec.lease_transitions or 0) + (0 if mine else 1),
        )
        replaced = await self.kube.replace_lease(self.namespace, lease)
        if replaced is None:
            return False
        self._observe(replaced)
        return True

    def _observe(self, lease: client.V1Lease | None) -> None:
        if lease is None:
            return
        spec = lease.spec or client.V1LeaseSpec()
        version = lease.metadata.resource_version if lease.metadata is not None else None
        record = (spec.holder_identity, spec.renew_time, version)
        if record != self._observed:
            self._observed = record
            self._observed_at = self._monotonic()
