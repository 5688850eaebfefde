"""The operator's background work: the Lease campaign, and an orderly stop.

With leader election on, every replica campaigns for the Lease (:mod:`leadership`); the one
elected resumes the recoveries (:func:`reconciliation.resync`) and the resubmission records it
saw; one that steps down lets its workers stop at their next step. At the stop, queued Events
get a few seconds to go out and the Lease is released, so another replica takes over at once.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from sparkguard.operator import events, leadership, reconciliation, recreation
from sparkguard.operator import runtime as runtime_

_log = logging.getLogger(__name__)


def start_leader_election(runtime: runtime_.Runtime) -> None:
    """Campaign for the Lease in the background (if configured); resync when elected."""
    config = runtime.config
    runtime.metrics.leader.set(0 if config.leader_election else 1)
    if not config.leader_election or runtime.elector is not None:
        return
    assert config.lease_namespace is not None  # check_config guarantees it

    async def changed(leading: bool) -> None:
        runtime.metrics.leader.set(1 if leading else 0)
        runtime.metrics.leader_changes.inc()
        if leading:
            reconciliation.resync(runtime)
            for namespace, name in list(runtime.records.values()):
                recreation.wake_record(runtime, namespace, name, logger=_log)
        else:  # running workers see it at their next step and stop
            for flag in runtime.workers.values():
                flag.set()

    runtime.elector = leadership.LeaderElector(
        runtime.kube,
        namespace=config.lease_namespace,
        name=config.lease_name,
        identity=runtime.identity,
        timing=leadership.Timing.for_duration(config.lease_duration_seconds),
        on_change=changed,
    )
    runtime.spawn(runtime.elector.run())


#: how long a stopping operator lets the Events it queued go out (a rollout loses none)
EVENT_FLUSH_SECONDS: Final = 5.0


async def stop_background(runtime: runtime_.Runtime) -> None:
    """Stop the campaign and resyncs; let queued Events out (within
    :data:`EVENT_FLUSH_SECONDS`); release the Lease so another replica takes over now."""
    tasks = list(runtime.tasks)
    posting = [t for t in tasks if t.get_name() == events.TASK_NAME]
    for task in tasks:
        if task.get_name() != events.TASK_NAME:
            task.cancel()
    if posting:
        await asyncio.wait(posting, timeout=EVENT_FLUSH_SECONDS)
    for task in posting:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if runtime.rollback_threads is not None:  # running rollbacks end (idempotent) at exit
        runtime.rollback_threads.shutdown(wait=False, cancel_futures=True)
    if runtime.elector is not None:
        await runtime.elector.release()
