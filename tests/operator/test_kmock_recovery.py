"""The operator against kmock: FAILED → rollback (fake) → resubmission, retries, backoff."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

import kmock
import pytest

from sparkguard.operator import appmeta, finalizers, kube, reconciliation, recovery
from sparkguard.operator import config as config_
from sparkguard.operator import runtime as runtime_
from tests.operator import kmocking
from tests.operator.apps import failed_status, spark_app

NS = "jobs"


@pytest.fixture
def recovery_config(config: config_.OperatorConfig) -> config_.OperatorConfig:
    return dataclasses.replace(
        config, webhook_mode=config_.WebhookMode.DISABLED, error_backoff_seconds=1.0
    )


async def test_failed_app_is_rolled_back_and_resubmitted(
    k8s: kmock.KubernetesEmulator, recovery_config: config_.OperatorConfig
) -> None:
    rollback = kmocking.FakeRollback()
    runtime = kmocking.make_runtime(k8s, config=recovery_config, rollback=rollback)
    app = spark_app("nightly", namespace=NS, annotations={appmeta.BACKOFF: "0"})
    async with kmocking.operating(runtime):
        await kmocking.create_app(k8s, app)
        await kmocking.patch_app(k8s, NS, "nightly", {"status": failed_status()}, status=True)
        await kmocking.eventually(lambda: kmocking.resubmissions(k8s, "nightly"))
        await kmocking.eventually(
            lambda: kmocking.notes(k8s, NS, "nightly").get(appmeta.PHASE) == "Resubmitted"
        )
        # Events go out after the patches (off the critical path), in order
        await kmocking.eventually(lambda: len(kmocking.event_reasons(k8s, "nightly")) >= 3)
    assert rollback.calls == [("jobs.nightly", "s3://warehouse/_journal/jobs", None)]
    assert kmocking.resubmissions(k8s, "nightly") == ["1"]
    final = kmocking.notes(k8s, NS, "nightly")
    assert final[appmeta.ATTEMPT] == "1"
    assert '"rolledBack": 1' in final[appmeta.LAST_ROLLBACK]
    assert (
        kmocking.stored(k8s, NS, "nightly")["spec"]["sparkConf"]["spark.sparkguard.attempt"] == "1"
    )
    reasons = kmocking.event_reasons(k8s, "nightly")
    assert reasons == ["RollbackStarted", "RolledBack", "Resubmitted"]
    assert runtime.metrics.resubmissions._value.get() == 1


async def test_a_recovery_without_backoff_is_two_patches_and_no_read(
    k8s: kmock.KubernetesEmulator, recovery_config: config_.OperatorConfig
) -> None:
    """The requests of one recovery: the watch event's body is the first read, the
    claim one patch, the conclusion and the resubmission (backoff 0) one more; the three
    Events follow, in order, without holding up the patches."""
    runtime = kmocking.make_runtime(k8s, config=recovery_config, rollback=kmocking.FakeRollback())
    app = spark_app("quick", namespace=NS, annotations={appmeta.BACKOFF: "0"})
    app["metadata"]["finalizers"] = [finalizers.FINALIZER]  # as admission stores it
    async with kmocking.operating(runtime):
        await kmocking.create_app(k8s, app)
        await kmocking.patch_app(k8s, NS, "quick", {"status": failed_status()}, status=True)
        await kmocking.eventually(lambda: len(kmocking.event_reasons(k8s, "quick")) == 3)
    patches = kmocking.app_patches(k8s, "quick")
    assert len(patches) == 2, patches
    claim, conclusion = (p["metadata"]["annotations"] for p in patches)
    assert claim[appmeta.PHASE] == "Recovering"
    assert conclusion[appmeta.PHASE] == "Resubmitted"
    assert appmeta.LAST_ROLLBACK in conclusion
    assert kmocking.resubmissions(k8s, "quick") == ["1"]
    # The claim was decided on the watch event's body: no read of the app came before it.
    # (kmock's objects carry no resourceVersion, so later echoes cannot be told from news
    # here: the reads after the conclusion are the emulator's, the real API server has none.)
    calls = [
        str(r.method).upper().rpartition(".")[2]
        for r in list(k8s)
        if r.resource is not None
        and r.resource.plural == kmocking.PLURAL
        and r.name == "quick"
        and not r.subresource
    ]
    assert calls[0] == "PATCH", calls
    assert kmocking.event_reasons(k8s, "quick") == ["RollbackStarted", "RolledBack", "Resubmitted"]
    assert runtime.metrics.resubmissions._value.get() == 1


async def _fails_once_and_is_resubmitted(k8s: kmock.KubernetesEmulator, name: str) -> None:
    """An app with one retry and no backoff fails; wait until the operator resubmitted it."""
    notes = {appmeta.BACKOFF: "0", appmeta.MAX_RETRIES: "1"}
    await kmocking.create_app(k8s, spark_app(name, namespace=NS, annotations=notes))
    await kmocking.patch_app(k8s, NS, name, {"status": failed_status()}, status=True)
    await kmocking.eventually(
        lambda: kmocking.notes(k8s, NS, name).get(appmeta.PHASE) == "Resubmitted"
    )


async def test_max_retries_is_honoured(
    k8s: kmock.KubernetesEmulator, recovery_config: config_.OperatorConfig
) -> None:
    """The rerun's failure comes right after its RUNNING. Under load this test once waited
    for Exhausted in vain: the worker had read the rerun RUNNING and was waiting for its
    Events when the failure's news came, and left without looking (the next test holds
    that ordering)."""
    rollback = kmocking.FakeRollback()
    runtime = kmocking.make_runtime(k8s, config=recovery_config, rollback=rollback)
    async with kmocking.operating(runtime):
        await _fails_once_and_is_resubmitted(k8s, "flaky")
        # spark-operator reruns it; the rerun fails too (a new submission, a new failure).
        await kmocking.patch_app(
            k8s, NS, "flaky", {"status": {"applicationState": {"state": "RUNNING"}}}, status=True
        )
        rerun = failed_status(submission="sub-2", terminated="2026-11-22T11:00:00Z")
        await kmocking.patch_app(k8s, NS, "flaky", {"status": rerun}, status=True)
        await kmocking.eventually(
            lambda: kmocking.notes(k8s, NS, "flaky").get(appmeta.PHASE) == "Exhausted"
        )
        await kmocking.eventually(  # Events follow the patches
            lambda: "RetriesExhausted" in kmocking.event_reasons(k8s, "flaky")
        )
    assert kmocking.resubmissions(k8s, "flaky") == ["1"]
    assert len(rollback.calls) == 2  # the last attempt's output is rolled back too
    reasons = kmocking.event_reasons(k8s, "flaky")
    assert reasons[-1] == "RetriesExhausted"
    assert reasons.count("Resubmitted") == 1
    assert "max-retries is 1" in kmocking.notes(k8s, NS, "flaky")[appmeta.MESSAGE]


class _HeldEvents(kube.KubeClient):
    """Every Event waits for ``release`` before it is posted; records each state the
    operator read the app in."""

    def __init__(self, api: Any) -> None:
        super().__init__(api)
        self.release = asyncio.Event()
        self.read_states: list[str | None] = []

    async def get_app(self, *args: Any, **kwargs: Any) -> Any:
        app = await super().get_app(*args, **kwargs)
        state = ((app or {}).get("status") or {}).get("applicationState") or {}
        self.read_states.append(state.get("state"))
        return app

    async def post_event(self, app: Any, **kwargs: Any) -> None:
        await self.release.wait()
        await super().post_event(app, **kwargs)


async def test_a_failure_that_comes_while_the_worker_waits_for_its_events_is_handled(
    k8s: kmock.KubernetesEmulator, recovery_config: config_.OperatorConfig
) -> None:
    """The worker reads the rerun RUNNING (nothing to do) and, before it ends, waits for the
    app's Events to go out; the rerun's failure arrives during that wait. Its news only sets
    the running worker's flag (one worker per app), so the worker must look again before it
    ends, or the failure is never handled. Events are held here until that news is in."""
    events = _HeldEvents(kmocking.api_client(k8s))
    decisions: list[recovery.Action] = []
    runtime = runtime_.Runtime(
        config=recovery_config,
        kube=events,
        rollback=kmocking.FakeRollback(),
        clock=kmocking.loop_clock(),
        on_decision=lambda _, decision: decisions.append(decision.action),
    )
    async with kmocking.operating(runtime):
        await _fails_once_and_is_resubmitted(k8s, "held")
        key = runtime_.AppKey.of(kmocking.stored(k8s, NS, "held"))
        assert key.id in runtime.workers  # its Events are held: it cannot have ended
        await kmocking.patch_app(
            k8s, NS, "held", {"status": {"applicationState": {"state": "RUNNING"}}}, status=True
        )
        # The worker looks again (as an echo of its own patch or its nudge timer makes it):
        # it reads RUNNING, decides nothing, and waits for its Events (no await in between).
        reconciliation.wake(runtime, key, logger=logging.getLogger(__name__))
        await kmocking.eventually(lambda: "RUNNING" in events.read_states)
        rerun = failed_status(submission="sub-2", terminated="2026-11-22T11:00:00Z")
        await kmocking.patch_app(k8s, NS, "held", {"status": rerun}, status=True)
        # kopf's handler decided on the failure and woke the worker that is still waiting
        # (usually: the read of RUNNING above is seen before the worker has left its loop for
        # the wait, so now and then the worker is still in its loop, reads the failure itself,
        # and the outcome below is the same; without the fix, the usual ordering fails it)
        await kmocking.eventually(lambda: recovery.Action.GIVE_UP in decisions)
        events.release.set()
        await kmocking.eventually(
            lambda: kmocking.notes(k8s, NS, "held").get(appmeta.PHASE) == "Exhausted"
        )
    assert kmocking.resubmissions(k8s, "held") == ["1"]


@pytest.mark.looptime
async def test_backoff_waits_in_fake_time(
    k8s: kmock.KubernetesEmulator, recovery_config: config_.OperatorConfig
) -> None:
    rollback = kmocking.FakeRollback()
    runtime = kmocking.make_runtime(k8s, config=recovery_config, rollback=rollback)
    notes = {appmeta.BACKOFF: "2m", appmeta.BACKOFF_MAX: "10m"}
    loop = asyncio.get_running_loop()
    async with kmocking.operating(runtime):
        await kmocking.create_app(k8s, spark_app("slow", namespace=NS, annotations=notes))
        await kmocking.patch_app(k8s, NS, "slow", {"status": failed_status()}, status=True)
        await kmocking.eventually(
            lambda: kmocking.notes(k8s, NS, "slow").get(appmeta.PHASE) == "RolledBack",
            within=60,
        )
        rolled_back_at = loop.time()
        next_retry = kmocking.notes(k8s, NS, "slow")[appmeta.NEXT_RETRY_AT]
        assert kmocking.resubmissions(k8s, "slow") == []
        await kmocking.eventually(lambda: kmocking.resubmissions(k8s, "slow"), within=600)
        waited = loop.time() - rolled_back_at
    assert 115 <= waited <= 130, waited  # 2m for attempt 0, in fake time
    assert kmocking.resubmissions(k8s, "slow") == ["1"]
    assert next_retry.endswith("+00:00")


async def test_committed_output_is_resubmitted_too(
    k8s: kmock.KubernetesEmulator, recovery_config: config_.OperatorConfig
) -> None:
    """A rollback that found only a committed write (its driver died after the outcome) is
    RolledBack and resubmitted like any other: the job may have had work left after that
    write, and its rerun skips the committed one (rerun=skip)."""
    rollback = kmocking.FakeRollback(
        summary=kmocking.FakeSummary(
            instants_rolled_back=(), instants_committed=("20261122100000000-jobs.done",)
        )
    )
    runtime = kmocking.make_runtime(k8s, config=recovery_config, rollback=rollback)
    async with kmocking.operating(runtime):
        app = spark_app("done", namespace=NS, annotations={appmeta.BACKOFF: "0"})
        await kmocking.create_app(k8s, app)
        await kmocking.patch_app(k8s, NS, "done", {"status": failed_status()}, status=True)
        await kmocking.eventually(lambda: kmocking.resubmissions(k8s, "done") == ["1"])
        await kmocking.eventually(  # Events follow the patches
            lambda: "Resubmitted" in kmocking.event_reasons(k8s, "done")
        )
    reasons = kmocking.event_reasons(k8s, "done")
    assert "RolledBack" in reasons
    assert "CommittedNotResubmitted" not in reasons
    assert kmocking.notes(k8s, NS, "done")[appmeta.PHASE] == "Resubmitted"


async def test_invalid_annotation_is_reported_once_and_never_crash_loops(
    k8s: kmock.KubernetesEmulator, recovery_config: config_.OperatorConfig
) -> None:
    rollback = kmocking.FakeRollback()
    decisions = kmocking.Decisions()
    runtime = kmocking.make_runtime(
        k8s, config=recovery_config, rollback=rollback, on_decision=decisions
    )
    bad = spark_app("typo", namespace=NS, annotations={appmeta.MARKER_TYPE: "sidecars"})
    async with kmocking.operating(runtime):
        await kmocking.create_app(k8s, bad)  # as if created while the webhook was down
        await kmocking.eventually(
            lambda: kmocking.notes(k8s, NS, "typo").get(appmeta.PHASE) == "Invalid"
        )
        settled = decisions.count("typo", "nothing")
        await kmocking.patch_app(k8s, NS, "typo", {"status": failed_status()}, status=True)
        await kmocking.patch_app(
            k8s, NS, "typo", {"metadata": {"labels": {"x": "y"}}}, status=False
        )
        # The signal: the operator saw both changes (a failure, a label) and decided nothing.
        await kmocking.eventually(
            lambda: decisions.count("typo", "nothing", containing="Invalid") >= settled + 2
        )
    events = [e for e in kmocking.posted_events(k8s) if e["reason"] == "InvalidAnnotation"]
    assert len(events) == 1
    assert events[0]["type"] == "Warning"
    assert "sparkguard.io/marker-type" in events[0]["message"]
    assert rollback.calls == []
    assert kmocking.resubmissions(k8s, "typo") == []


async def test_storage_secret_becomes_storage_options(
    k8s: kmock.KubernetesEmulator, recovery_config: config_.OperatorConfig
) -> None:
    rollback = kmocking.FakeRollback()
    runtime = kmocking.make_runtime(k8s, config=recovery_config, rollback=rollback)
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s3", "namespace": NS},
        "data": {
            "AWS_ACCESS_KEY_ID": kmocking.b64("AKIA"),
            "AWS_SECRET_ACCESS_KEY": kmocking.b64("hush"),
            "AWS_ENDPOINT_URL": kmocking.b64("http://minio:9000"),
        },
    }
    async with k8s.post(f"/api/v1/namespaces/{NS}/secrets", json=secret) as resp:
        assert resp.status < 300
    notes = {appmeta.STORAGE_SECRET: "s3", appmeta.BACKOFF: "0"}
    async with kmocking.operating(runtime):
        await kmocking.create_app(k8s, spark_app("s3job", namespace=NS, annotations=notes))
        await kmocking.patch_app(k8s, NS, "s3job", {"status": failed_status()}, status=True)
        await kmocking.eventually(lambda: kmocking.resubmissions(k8s, "s3job"))
    assert rollback.calls[0][2] == {
        "key": "AKIA",
        "secret": "hush",
        "endpoint_url": "http://minio:9000",
    }


async def test_failed_rollback_is_retried_with_a_warning(
    k8s: kmock.KubernetesEmulator, recovery_config: config_.OperatorConfig
) -> None:
    rollback = kmocking.FakeRollback(error=OSError("storage unreachable"))
    runtime = kmocking.make_runtime(k8s, config=recovery_config, rollback=rollback)
    async with kmocking.operating(runtime):
        await kmocking.create_app(
            k8s, spark_app("retry", namespace=NS, annotations={appmeta.BACKOFF: "0"})
        )
        await kmocking.patch_app(k8s, NS, "retry", {"status": failed_status()}, status=True)
        await kmocking.eventually(lambda: kmocking.resubmissions(k8s, "retry"))
    assert len(rollback.calls) == 2
    assert kmocking.resubmissions(k8s, "retry") == ["1"]
    failed = [e for e in kmocking.posted_events(k8s) if e["reason"] == "RollbackFailed"]
    assert len(failed) == 1
    assert "storage unreachable" in failed[0]["message"]
    assert runtime.metrics.rollbacks.labels(outcome="error")._value.get() == 1


async def test_restart_mid_rollback_resubmits_exactly_once(
    k8s: kmock.KubernetesEmulator, recovery_config: config_.OperatorConfig
) -> None:
    import threading

    gate = threading.Event()
    stuck = kmocking.FakeRollback(gate=gate)
    # The second operator takes over once the first one's claim expired (it died with it).
    recovery_config = dataclasses.replace(recovery_config, claim_ttl_seconds=1.0)
    first = kmocking.make_runtime(k8s, config=recovery_config, rollback=stuck)
    app = spark_app("crashy", namespace=NS, annotations={appmeta.BACKOFF: "0"})
    try:
        async with kmocking.operating(first):
            await kmocking.create_app(k8s, app)
            await kmocking.patch_app(k8s, NS, "crashy", {"status": failed_status()}, status=True)
            await kmocking.eventually(stuck.entered.is_set)
            assert kmocking.notes(k8s, NS, "crashy")[appmeta.PHASE] == "Recovering"
            # the operator stops (a crash, a rollout) while the rollback is running
    finally:
        gate.set()  # the abandoned worker thread ends; its result is discarded
    assert kmocking.resubmissions(k8s, "crashy") == []

    healthy = kmocking.FakeRollback()
    decisions = kmocking.Decisions()
    second = kmocking.make_runtime(
        k8s, config=recovery_config, rollback=healthy, on_decision=decisions
    )
    async with kmocking.operating(second):
        await kmocking.eventually(lambda: kmocking.resubmissions(k8s, "crashy"))
        # The signal: it read the app again after resubmitting (and waits for a rerun).
        await kmocking.eventually(
            lambda: decisions.count("crashy", "wait", containing="resubmitted attempt 1")
        )
    third = kmocking.Decisions()
    async with kmocking.operating(
        kmocking.make_runtime(k8s, config=recovery_config, rollback=healthy, on_decision=third)
    ):
        # A third start reads the handled failure and only waits for spark-operator's rerun.
        await kmocking.eventually(lambda: third.count("crashy", "wait", containing="resubmitted"))
    assert kmocking.resubmissions(k8s, "crashy") == ["1"]
    assert len(healthy.calls) == 1  # the interrupted rollback is redone (idempotent)
    assert kmocking.notes(k8s, NS, "crashy")[appmeta.PHASE] == "Resubmitted"


async def test_unanswered_resubmission_is_patched_again_until_the_app_reruns(
    k8s: kmock.KubernetesEmulator, recovery_config: config_.OperatorConfig
) -> None:
    """spark-operator dropped the rerun (its spec-change filter is best effort): nudge it."""
    config = dataclasses.replace(recovery_config, resubmit_timeout_seconds=0.5)
    decisions = kmocking.Decisions()
    runtime = kmocking.make_runtime(
        k8s, config=config, rollback=kmocking.FakeRollback(), on_decision=decisions
    )
    app = spark_app("dropped", namespace=NS, annotations={appmeta.BACKOFF: "0"})
    async with kmocking.operating(runtime):
        await kmocking.create_app(k8s, app)
        await kmocking.patch_app(k8s, NS, "dropped", {"status": failed_status()}, status=True)
        # Nobody reruns it: it stays FAILED after the resubmission, and is patched again.
        await kmocking.eventually(
            lambda: "ResubmitRetried" in kmocking.event_reasons(k8s, "dropped")
        )
        # spark-operator finally reruns it: the app leaves FAILED, no more nudges.
        await kmocking.patch_app(
            k8s, NS, "dropped", {"status": {"applicationState": {"state": "SUBMITTED"}}},
            status=True,
        )  # fmt: skip
        await kmocking.eventually(
            lambda: decisions.count("dropped", "nothing", containing="SUBMITTED")
        )
        nudges = runtime.metrics.resubmit_retries._value.get()
    patches = kmocking.app_patches(k8s, "dropped")
    nudged = [
        p["spec"]["sparkConf"]["spark.sparkguard.resubmission"]
        for p in patches
        if "spark.sparkguard.resubmission" in ((p or {}).get("spec") or {}).get("sparkConf", {})
    ]
    assert nudged[:1] == ["1.1"]
    assert len(nudged) == nudges >= 1
    assert kmocking.resubmissions(k8s, "dropped") == ["1"]  # the attempt was bumped once
    stored = kmocking.stored(k8s, NS, "dropped")
    assert stored["spec"]["sparkConf"]["spark.sparkguard.attempt"] == "1"
    warnings = [e for e in kmocking.posted_events(k8s) if e["reason"] == "ResubmitRetried"]
    assert len(warnings) == nudges
    assert warnings[0]["type"] == "Warning"


class _DiesBeforePosting(kube.KubeClient):
    """An operator killed right after writing phase RolledBack: its Event never leaves, and
    nothing else it would do next does."""

    def __init__(self, api: Any, *, posts_first: bool) -> None:
        super().__init__(api)
        self.posts_first = posts_first
        #: from the RolledBack Event on, nothing else this replica does reaches the API server
        #: (Events go out off the recovery's path: on a slow machine the backoff could end while
        #: the Event is still on its way, and the dying replica resubmit)
        self.frozen = False
        self.dead = asyncio.Event()

    async def patch_app(self, *args: Any, **kwargs: Any) -> Any:
        if self.frozen:
            await asyncio.Future()
        return await super().patch_app(*args, **kwargs)

    async def get_app(self, *args: Any, **kwargs: Any) -> Any:
        if self.frozen:
            await asyncio.Future()
        return await super().get_app(*args, **kwargs)

    async def post_event(self, app: Any, *, reason: str, **kwargs: Any) -> None:
        if reason != "RolledBack":
            await super().post_event(app, reason=reason, **kwargs)
            return
        self.frozen = True
        if self.posts_first:  # killed just after the Event went out instead
            await super().post_event(app, reason=reason, **kwargs)
        self.dead.set()
        await asyncio.Future()  # never returns: the process is gone


def _stored_event_reasons(server: kmock.KubernetesEmulator, name: str) -> list[str]:
    return [
        obj.raw["reason"]
        for (resource, _, _), obj in list(server.objects.items())
        if resource.plural == "events" and obj.raw["involvedObject"]["name"] == name
    ]


@pytest.mark.parametrize("posts_first", [False, True], ids=["event-lost", "event-posted"])
async def test_the_event_of_a_replica_killed_after_its_conclusion_is_posted_once(
    k8s: kmock.KubernetesEmulator, recovery_config: config_.OperatorConfig, posts_first: bool
) -> None:
    """Phase RolledBack written, the replica killed before (or just after) its Event: the
    operator that takes over posts the RolledBack Event if it was lost, never twice."""
    dying = _DiesBeforePosting(kmocking.api_client(k8s), posts_first=posts_first)
    first = runtime_.Runtime(
        config=recovery_config,
        kube=dying,
        rollback=kmocking.FakeRollback(),
        clock=kmocking.loop_clock(),
    )
    app = spark_app("killed", namespace=NS, annotations={appmeta.BACKOFF: "1s"})
    async with kmocking.operating(first):
        await kmocking.create_app(k8s, app)
        await kmocking.patch_app(k8s, NS, "killed", {"status": failed_status()}, status=True)
        await kmocking.eventually(dying.dead.is_set)
    assert kmocking.notes(k8s, NS, "killed")[appmeta.PHASE] == "RolledBack"
    assert _stored_event_reasons(k8s, "killed").count("RolledBack") == int(posts_first)

    second = kmocking.make_runtime(k8s, config=recovery_config, rollback=kmocking.FakeRollback())
    async with kmocking.operating(second):
        await kmocking.eventually(lambda: kmocking.resubmissions(k8s, "killed"))
        await kmocking.eventually(lambda: "Resubmitted" in _stored_event_reasons(k8s, "killed"))
    reasons = _stored_event_reasons(k8s, "killed")
    assert reasons.count("RolledBack") == 1
    assert reasons.count("Resubmitted") == 1
    assert kmocking.resubmissions(k8s, "killed") == ["1"]


@pytest.mark.parametrize("posts_first", [False, True], ids=["events-lost", "rolled-back-posted"])
async def test_the_events_of_a_merged_conclusion_are_posted_once_after_a_kill(
    k8s: kmock.KubernetesEmulator, recovery_config: config_.OperatorConfig, posts_first: bool
) -> None:
    """backoff 0: the conclusion and the resubmission are one patch (phase RolledBack never
    stored). The replica killed before its RolledBack Event (or just after it): the operator
    that takes over posts RolledBack and Resubmitted if they were lost, never twice, and
    does not resubmit again."""
    dying = _DiesBeforePosting(kmocking.api_client(k8s), posts_first=posts_first)
    first = runtime_.Runtime(
        config=recovery_config,
        kube=dying,
        rollback=kmocking.FakeRollback(),
        clock=kmocking.loop_clock(),
    )
    app = spark_app("merged", namespace=NS, annotations={appmeta.BACKOFF: "0"})
    async with kmocking.operating(first):
        await kmocking.create_app(k8s, app)
        await kmocking.patch_app(k8s, NS, "merged", {"status": failed_status()}, status=True)
        await kmocking.eventually(dying.dead.is_set)
    assert kmocking.notes(k8s, NS, "merged")[appmeta.PHASE] == "Resubmitted"
    assert _stored_event_reasons(k8s, "merged").count("RolledBack") == int(posts_first)
    assert "Resubmitted" not in _stored_event_reasons(k8s, "merged")

    second = kmocking.make_runtime(k8s, config=recovery_config, rollback=kmocking.FakeRollback())
    async with kmocking.operating(second):
        await kmocking.eventually(lambda: "Resubmitted" in _stored_event_reasons(k8s, "merged"))
    reasons = _stored_event_reasons(k8s, "merged")
    assert reasons.count("RolledBack") == 1
    assert reasons.count("Resubmitted") == 1
    assert kmocking.resubmissions(k8s, "merged") == ["1"]
