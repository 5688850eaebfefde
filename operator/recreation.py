"""Resubmitting an Apache app by recreating it: the steps :mod:`resubmit` decides, done.

:func:`recreate` (steps 1-2: release the old app, write the record, delete the old app) runs
in the app's recovery; :func:`finish_resubmission` (steps 3-4: create the new app once the old
one and its driver pods are gone, drop the record) runs in one worker per record
(:func:`wake_record`), which the records' watch wakes, so a restarted operator finds the
records in its initial listing and goes on.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from sparkguard.operator import events, finalizers, patches, recovery, resubmit
from sparkguard.operator import runtime as runtime_


async def recreate(
    runtime: runtime_.Runtime,
    *,
    app: dict[str, Any],
    decision: recovery.Decision,
    logger: runtime_.Logger,
) -> None:
    """Resubmit an Apache app by recreating it (:mod:`resubmit`), steps 1-2 here.

    The old app is patched first (phase Resubmitted with the new attempt, our finalizer off:
    the deletion is ours and needs no rollback), under its uid and resourceVersion; then the
    record is written from what that patch returned; then the old app is deleted (uid
    precondition). A replica killed between two steps leaves an app in phase Resubmitted,
    which :func:`recovery.decide` sends here again; each step is idempotent.
    """
    meta = app["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    annotations = dict((decision.patch.get("metadata") or {}).get("annotations") or {})
    patch: dict[str, Any] = {
        "metadata": {
            "annotations": annotations,
            "finalizers": finalizers.without_finalizer(finalizers.finalizers_of(app)),
        }
    }
    released = await patches.patch_app(runtime, app, patch)
    if released is None:
        return  # gone meanwhile
    manifest = resubmit.new_manifest(released, annotations={})
    record = resubmit.record(released, manifest)
    if await runtime.kube.create_config_map(namespace, record):
        logger.info("resubmission record %s written", record["metadata"]["name"])
    deleted = await runtime.kube.delete_app(
        namespace, name, uid=str(meta.get("uid")), group=runtime_.AppKey.of(app).group
    )
    logger.info("%s: %s the old app", decision.reason, "deleted" if deleted else "already gone:")
    wake_record(runtime, namespace, record["metadata"]["name"], logger=logger)


def wake_record(
    runtime: runtime_.Runtime, namespace: str, name: str, *, logger: runtime_.Logger
) -> None:
    """Make the worker of one resubmission record go on (starting one if it has none)."""
    key = f"record/{namespace}/{name}"
    flag = runtime.workers.get(key)
    if flag is not None:
        flag.set()
        return
    flag = asyncio.Event()
    runtime.workers[key] = flag

    async def work() -> None:
        try:
            await finish_resubmission(runtime, namespace, name, logger=logger, wakeup=flag)
        finally:
            del runtime.workers[key]

    runtime.spawn(work())


#: how often a resubmission record's worker looks whether the old app and its pods are gone
RECORD_POLL_SECONDS: Final = 0.5


async def finish_resubmission(
    runtime: runtime_.Runtime,
    namespace: str,
    record_name: str,
    *,
    logger: runtime_.Logger,
    wakeup: asyncio.Event | None = None,
) -> None:
    """Steps 3-4 of a resubmission (:mod:`resubmit`): wait until the old app and its driver
    pods are gone, create the new app, drop the record. Errors are retried after
    ``error_backoff``; the worker ends when the record is gone or this replica stops leading.
    """
    wakeup = wakeup if wakeup is not None else asyncio.Event()
    while runtime.leading():
        wakeup.clear()
        try:
            data = await runtime.kube.read_config_map(namespace, record_name)
            if data is None:
                return
            found = resubmit.manifest_of(data)
            if found is None:
                logger.warning("resubmission record %s is unreadable; dropped", record_name)
                await runtime.kube.delete_config_map(namespace, record_name)
                return
            old_uid, manifest = found
            name = manifest["metadata"]["name"]
            group = str(manifest.get("apiVersion") or "").partition("/")[0]
            current = await runtime.kube.get_app(namespace, name, group=group)
            pods = (
                await runtime.kube.pod_names(namespace, f"{resubmit.APACHE_APP_LABEL}={name}")
                if current is None
                else []
            )
            step = resubmit.next_step(old_uid=old_uid, current=current, pods=pods)
            if step.step in (resubmit.Step.WAIT_APP, resubmit.Step.WAIT_PODS):
                logger.debug("resubmission of %s: %s", name, step.reason)
                if not wakeup.is_set():  # news of the record cuts nothing short: pods change
                    await runtime.sleep(RECORD_POLL_SECONDS)  # without it, so look again soon
                continue
            if step.step is resubmit.Step.CREATE:
                created = await runtime.kube.create_app(namespace, manifest)
                if created is not None:
                    runtime.metrics.resubmissions.inc()
                    logger.info("[%s/%s] recreated (resubmission of %s)", namespace, name, old_uid)
                    await events.post_spec(runtime, created, recovery.owed_event(
                        created, now=runtime.clock(), config=runtime.config
                    ))  # fmt: skip
                continue  # read again: DONE (or ABANDON if someone else was first)
            if step.step is resubmit.Step.ABANDON and current is not None:
                logger.warning("resubmission of %s: %s", name, step.reason)
                await events.post(
                    runtime,
                    current,
                    type="Warning",
                    reason="ResubmissionAbandoned",
                    message=f"sparkguard did not recreate {name}: {step.reason}",
                )
            await runtime.kube.delete_config_map(namespace, record_name)
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the API fails in many ways; we retry
            logger.warning("resubmission record %s: %s; retrying", record_name, exc)
            await runtime.sleep(runtime.config.error_backoff_seconds)
