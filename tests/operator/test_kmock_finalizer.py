"""The ``sparkguard.io/rollback`` finalizer against kmock: a deleted app is rolled back first.

kmock keeps an object with finalizers after a DELETE (``deletionTimestamp`` set) and removes it
once they are gone, like the API server. The rollback is :class:`kmocking.FakeRollback`.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, cast

import kmock
import pytest

from sparkguard.operator import appmeta, finalizers, reconciliation
from sparkguard.operator import config as config_
from tests.operator import kmocking
from tests.operator.apps import PLURAL, failed_status, spark_app

NS = "jobs"
OURS = finalizers.FINALIZER


@pytest.fixture
def recovery_config(config: config_.OperatorConfig) -> config_.OperatorConfig:
    return dataclasses.replace(
        config, webhook_mode=config_.WebhookMode.DISABLED, error_backoff_seconds=0.2
    )


def _finalizers(k8s: kmock.KubernetesEmulator, name: str) -> list[str]:
    return list(kmocking.stored(k8s, NS, name)["metadata"].get("finalizers") or [])


def _finalizer_patches(k8s: kmock.KubernetesEmulator, name: str) -> list[list[str]]:
    """The finalizer lists the operator's PATCHes of the app wrote, in order."""
    return [
        p["metadata"]["finalizers"]
        for p in kmocking.app_patches(k8s, name)
        if "finalizers" in ((p or {}).get("metadata") or {})
    ]


def _events(k8s: kmock.KubernetesEmulator, reason: str) -> list[dict[str, Any]]:
    return [e for e in kmocking.posted_events(k8s) if e["reason"] == reason]


def _request_order(k8s: kmock.KubernetesEmulator, name: str) -> list[str]:
    """``event:<reason>`` and ``finalizers:<list>`` for the app, in the order kmock saw them."""
    order = []
    for r in list(k8s):
        if r.resource is None or not str(r.method).upper().endswith(("POST", "PATCH")):
            continue
        if (
            r.resource.plural == "events"
            and (r.data or {}).get("involvedObject", {}).get("name") == name
        ):
            order.append(f"event:{r.data['reason']}")
        elif r.resource.plural == PLURAL and r.name == name and not r.subresource:
            meta = (r.data or {}).get("metadata") or {}
            if "finalizers" in meta:
                order.append(f"finalizers:{','.join(meta['finalizers'])}")
    return order


async def _held_app(
    k8s: kmock.KubernetesEmulator, name: str, *, status: dict[str, Any] | None = None, **kw: Any
) -> None:
    """Create an opted-in app (as admission stores it: with our finalizer) and set its status."""
    app = spark_app(name, namespace=NS, **kw)
    app["metadata"]["finalizers"] = [OURS]
    await kmocking.create_app(k8s, app)
    if status is not None:
        await kmocking.patch_app(k8s, NS, name, {"status": status}, status=True)


async def test_the_operator_adds_the_finalizer_to_opted_in_apps_only(
    k8s: kmock.KubernetesEmulator, recovery_config: config_.OperatorConfig
) -> None:
    decisions = kmocking.Decisions()
    runtime = kmocking.make_runtime(
        k8s, config=recovery_config, rollback=kmocking.FakeRollback(), on_decision=decisions
    )
    async with kmocking.operating(runtime):
        # Admitted before the finalizer existed (or while the webhook was down).
        old = spark_app("old", namespace=NS)
        old["metadata"]["finalizers"] = ["example.com/keep"]
        await kmocking.create_app(k8s, old)
        await kmocking.create_app(k8s, spark_app("plain", namespace=NS, enabled=False))
        await kmocking.eventually(lambda: OURS in _finalizers(k8s, "old"))
        # The signal: the operator looked at the app again after its patch and was content.
        await kmocking.eventually(lambda: decisions.count("old", "nothing"))
    assert _finalizers(k8s, "old") == ["example.com/keep", OURS]
    assert _finalizer_patches(k8s, "old") == [["example.com/keep", OURS]]  # one PATCH
    assert "finalizers" not in kmocking.stored(k8s, NS, "plain")["metadata"]
    assert kmocking.app_patches(k8s, "plain") == []


async def test_a_failed_app_deleted_mid_backoff_is_rolled_back_before_it_goes(
    k8s: kmock.KubernetesEmulator, recovery_config: config_.OperatorConfig
) -> None:
    rollback = kmocking.FakeRollback()
    runtime = kmocking.make_runtime(k8s, config=recovery_config, rollback=rollback)
    async with kmocking.operating(runtime):
        await _held_app(k8s, "ttl", status=failed_status(), annotations={appmeta.BACKOFF: "5m"})
        await kmocking.eventually(
            lambda: kmocking.notes(k8s, NS, "ttl").get(appmeta.PHASE) == "RolledBack"
        )
        assert len(rollback.calls) == 1
        # spark-operator's timeToLiveSeconds deletes it while sparkguard waits to resubmit.
        await kmocking.delete_app(k8s, NS, "ttl")
        await kmocking.eventually(lambda: not kmocking.exists(k8s, NS, "ttl"))
    assert len(rollback.calls) == 2  # the deletion's own rollback (idempotent)
    assert rollback.calls[1][:2] == ("jobs.ttl", "s3://warehouse/_journal/jobs")
    (event,) = _events(k8s, "RolledBackOnDelete")
    assert event["type"] == "Normal"
    assert "1 instant(s) rolled back, 2 file(s) deleted" in event["message"]
    # Recorded (Event) before the finalizer went; never resubmitted.
    order = _request_order(k8s, "ttl")
    assert order[-2:] == ["event:RolledBackOnDelete", "finalizers:"], order
    assert kmocking.resubmissions(k8s, "ttl") == []
    assert runtime.metrics.deletions.labels(outcome="rolled_back")._value.get() == 1


async def test_a_completed_app_goes_at_once_without_a_rollback(
    k8s: kmock.KubernetesEmulator, recovery_config: config_.OperatorConfig
) -> None:
    rollback = kmocking.FakeRollback()
    runtime = kmocking.make_runtime(k8s, config=recovery_config, rollback=rollback)
    async with kmocking.operating(runtime):
        await _held_app(k8s, "done", status={"applicationState": {"state": "COMPLETED"}})
        await kmocking.eventually(
            lambda: kmocking.notes(k8s, NS, "done").get(appmeta.PHASE) == "Succeeded"
        )
        await kmocking.delete_app(k8s, NS, "done")
        await kmocking.eventually(lambda: not kmocking.exists(k8s, NS, "done"))
    assert rollback.calls == []
    assert _events(k8s, "RolledBackOnDelete") == []
    assert runtime.metrics.deletions.labels(outcome="no_rollback")._value.get() == 1


async def test_a_rollback_that_hangs_past_the_timeout_lets_the_app_go_with_a_warning(
    k8s: kmock.KubernetesEmulator, recovery_config: config_.OperatorConfig
) -> None:
    gate = threading.Event()
    stuck = kmocking.FakeRollback(gate=gate)
    config = dataclasses.replace(recovery_config, delete_rollback_timeout_seconds=1.0)
    runtime = kmocking.make_runtime(k8s, config=config, rollback=stuck)
    try:
        async with kmocking.operating(runtime):
            await _held_app(k8s, "hung", status={"applicationState": {"state": "RUNNING"}})
            await kmocking.eventually(lambda: _finalizers(k8s, "hung") == [OURS])
            await kmocking.delete_app(k8s, NS, "hung")
            await kmocking.eventually(lambda: not kmocking.exists(k8s, NS, "hung"))
    finally:
        gate.set()
    assert len(stuck.calls) == 1
    (warning,) = _events(k8s, "RollbackOnDeleteAbandoned")
    assert warning["type"] == "Warning"
    assert "did not finish within SPARKGUARD_DELETE_ROLLBACK_TIMEOUT=1s" in warning["message"]
    assert (
        "sparkguard rollback --job-id jobs.hung --journal s3://warehouse/_journal/jobs"
        in (warning["message"])
    )
    assert _events(k8s, "RolledBackOnDelete") == []
    assert runtime.metrics.deletions.labels(outcome="abandoned")._value.get() == 1


async def test_a_storage_error_is_retried_within_the_timeout(
    k8s: kmock.KubernetesEmulator, recovery_config: config_.OperatorConfig
) -> None:
    rollback = kmocking.FakeRollback(error=OSError("storage unreachable"))
    runtime = kmocking.make_runtime(k8s, config=recovery_config, rollback=rollback)
    async with kmocking.operating(runtime):
        await _held_app(k8s, "flaky", status={"applicationState": {"state": "RUNNING"}})
        await kmocking.delete_app(k8s, NS, "flaky")
        await kmocking.eventually(lambda: not kmocking.exists(k8s, NS, "flaky"))
    assert len(rollback.calls) == 2  # failed once, retried
    assert len(_events(k8s, "RolledBackOnDelete")) == 1
    assert _events(k8s, "RollbackOnDeleteAbandoned") == []
    assert runtime.metrics.rollbacks.labels(outcome="error")._value.get() == 1


async def test_an_opted_out_app_loses_the_finalizer_and_others_are_kept(
    k8s: kmock.KubernetesEmulator, recovery_config: config_.OperatorConfig
) -> None:
    rollback = kmocking.FakeRollback()
    runtime = kmocking.make_runtime(k8s, config=recovery_config, rollback=rollback)
    async with kmocking.operating(runtime):
        app = spark_app("leaving", namespace=NS)
        app["metadata"]["finalizers"] = ["a.io/x", OURS, "b.io/y"]
        await kmocking.create_app(k8s, app)
        await kmocking.patch_app(
            k8s, NS, "leaving", {"metadata": {"annotations": {appmeta.ENABLED: None}}}, status=False
        )
        await kmocking.eventually(lambda: OURS not in _finalizers(k8s, "leaving"))
    assert _finalizers(k8s, "leaving") == ["a.io/x", "b.io/y"]
    assert rollback.calls == []


async def test_a_deleted_app_keeps_other_controllers_finalizers(
    k8s: kmock.KubernetesEmulator, recovery_config: config_.OperatorConfig
) -> None:
    rollback = kmocking.FakeRollback()
    decisions = kmocking.Decisions()
    runtime = kmocking.make_runtime(
        k8s, config=recovery_config, rollback=rollback, on_decision=decisions
    )
    async with kmocking.operating(runtime):
        await _held_app(k8s, "shared", status=failed_status(), annotations={appmeta.BACKOFF: "5m"})
        await kmocking.patch_app(
            k8s, NS, "shared", {"metadata": {"finalizers": ["example.com/keep", OURS]}},
            status=False,
        )  # fmt: skip
        await kmocking.eventually(
            lambda: kmocking.notes(k8s, NS, "shared").get(appmeta.PHASE) == "RolledBack"
        )
        await kmocking.delete_app(k8s, NS, "shared")
        await kmocking.eventually(lambda: _finalizers(k8s, "shared") == ["example.com/keep"])
        # The signal: it saw the app held by the other finalizer only, and let it be.
        await kmocking.eventually(
            lambda: decisions.count("shared", "finalizer-nothing", containing="being deleted")
        )
    assert kmocking.exists(k8s, NS, "shared")  # held by the other controller
    assert len(_events(k8s, "RolledBackOnDelete")) == 1
    assert kmocking.resubmissions(k8s, "shared") == []


class _Follower:
    """A Lease campaign that never wins (until told to)."""

    is_leader = False

    async def release(self) -> None:
        return None


async def test_a_follower_does_nothing_and_takes_over_when_it_leads(
    k8s: kmock.KubernetesEmulator, recovery_config: config_.OperatorConfig
) -> None:
    rollback = kmocking.FakeRollback()
    decisions = kmocking.Decisions()
    runtime = kmocking.make_runtime(
        k8s, config=recovery_config, rollback=rollback, on_decision=decisions
    )
    follower = _Follower()
    runtime.elector = cast(Any, follower)
    async with kmocking.operating(runtime):
        old = spark_app("idle", namespace=NS)
        await kmocking.create_app(k8s, old)
        await _held_app(k8s, "gone", status={"applicationState": {"state": "RUNNING"}})
        await kmocking.delete_app(k8s, NS, "gone")
        # The signal: the follower saw both apps needing a finalizer step, and remembered them.
        await kmocking.eventually(lambda: decisions.count("idle", "finalizer-add"))
        await kmocking.eventually(lambda: decisions.count("gone", "finalizer-roll-back"))
        assert kmocking.app_patches(k8s, "idle") == []
        assert kmocking.app_patches(k8s, "gone") == []
        assert rollback.calls == []
        assert _finalizers(k8s, "gone") == [OURS]
        # It becomes the leader: it finishes what it saw.
        follower.is_leader = True
        reconciliation.resync(runtime)
        await kmocking.eventually(lambda: not kmocking.exists(k8s, NS, "gone"))
        await kmocking.eventually(lambda: OURS in _finalizers(k8s, "idle"))
    assert len(rollback.calls) == 1


async def test_a_replica_killed_mid_rollback_leaves_the_next_one_to_finish(
    k8s: kmock.KubernetesEmulator, recovery_config: config_.OperatorConfig
) -> None:
    gate = threading.Event()
    stuck = kmocking.FakeRollback(gate=gate)
    first = kmocking.make_runtime(k8s, config=recovery_config, rollback=stuck)
    try:
        async with kmocking.operating(first):
            await _held_app(k8s, "killed", status={"applicationState": {"state": "RUNNING"}})
            await kmocking.delete_app(k8s, NS, "killed")
            await kmocking.eventually(stuck.entered.is_set)
            # the replica dies here, mid-rollback
    finally:
        stuck.abandoned.set()
        gate.set()
    assert _finalizers(k8s, "killed") == [OURS]  # the finalizer goes last: still held
    healthy = kmocking.FakeRollback()
    second = kmocking.make_runtime(k8s, config=recovery_config, rollback=healthy)
    async with kmocking.operating(second):
        await kmocking.eventually(lambda: not kmocking.exists(k8s, NS, "killed"))
    assert len(healthy.calls) == 1
    assert len(_events(k8s, "RolledBackOnDelete")) == 1
