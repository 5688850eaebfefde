"""The recreation of an Apache app (``recreation.recreate`` + ``finish_resubmission``) against an
in-memory API: each step resumable after a crash, none done twice, the owner's name never
taken from someone else. No timing: the record worker's waits end when the test changes the
API (the fake's ``sleep`` records the wait and the test moves on)."""

from __future__ import annotations

import copy
import datetime
import itertools
import logging
from typing import Any

import pytest

from sparkguard.operator import appmeta, errors, finalizers, recovery, recreation, resubmit
from sparkguard.operator import config as config_
from sparkguard.operator import runtime as runtime_
from tests.operator.apps import apache_app

NOW = datetime.datetime(2026, 11, 22, 12, 0, 0, tzinfo=datetime.UTC)
NS = "jobs"
RUN = ("Submitted", "DriverRequested", "RunningHealthy", "Failed", "ResourceReleased")


class FakeKube:
    """The calls the recreation makes, on dicts; ``crash_on`` raises at that call once."""

    def __init__(self) -> None:
        self.apps: dict[str, dict[str, Any]] = {}
        self.maps: dict[str, dict[str, str]] = {}
        self.pods: list[str] = []
        self.calls: list[str] = []
        self.crash_on: str | None = None
        self.on_request: Any = None
        self._uids = itertools.count(2)
        self._versions = itertools.count(100)

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if self.crash_on == name:
            self.crash_on = None
            raise RuntimeError(f"the operator died at {name}")

    async def get_app(self, namespace: str, name: str, *, group: str = "") -> Any:
        self._call("get")
        return copy.deepcopy(self.apps.get(name))

    async def patch_app(self, namespace: str, name: str, patch: Any, **pre: Any) -> Any:
        self._call("patch")
        app = self.apps.get(name)
        if app is None:
            return None
        meta = app["metadata"]
        if pre.get("uid") != meta["uid"] or pre.get("resource_version") not in (
            None,
            meta["resourceVersion"],
        ):
            raise errors.KubeConflictError("changed")
        notes = meta.setdefault("annotations", {})
        for key, value in (patch["metadata"].get("annotations") or {}).items():
            if value is None:
                notes.pop(key, None)
            else:
                notes[key] = value
        if "finalizers" in patch["metadata"]:
            meta["finalizers"] = patch["metadata"]["finalizers"]
        meta["resourceVersion"] = str(next(self._versions))
        return copy.deepcopy(app)

    async def create_config_map(self, namespace: str, body: Any) -> bool:
        self._call("record-create")
        name = body["metadata"]["name"]
        if name in self.maps:
            return False
        self.maps[name] = dict(body["data"])
        return True

    async def read_config_map(self, namespace: str, name: str) -> Any:
        self._call("record-get")
        return copy.deepcopy(self.maps.get(name))

    async def delete_config_map(self, namespace: str, name: str) -> None:
        self._call("record-delete")
        self.maps.pop(name, None)

    async def delete_app(self, namespace: str, name: str, *, uid: str, group: str) -> bool:
        self._call("delete")
        app = self.apps.get(name)
        if app is None or app["metadata"]["uid"] != uid:
            return False
        del self.apps[name]  # no other finalizer in this fake: gone at once
        return True

    async def pod_names(self, namespace: str, selector: str) -> list[str]:
        self._call("pods")
        return list(self.pods)

    async def create_app(self, namespace: str, app: Any) -> Any:
        self._call("create")
        name = app["metadata"]["name"]
        if name in self.apps:
            return None
        created = copy.deepcopy(dict(app))
        created["metadata"].update(uid=f"uid-{next(self._uids)}", resourceVersion="1")
        self.apps[name] = created
        return copy.deepcopy(created)

    async def post_event(self, app: Any, **event: Any) -> None:
        self._call(f"event:{event['reason']}")


def _failed_app() -> dict[str, Any]:
    app = apache_app(annotations={appmeta.MAX_RETRIES: "2", appmeta.BACKOFF: "0"})
    history = {str(i): {"currentStateSummary": s} for i, s in enumerate(RUN)}
    app["status"] = {
        "currentState": {"currentStateSummary": "ResourceReleased"},
        "stateTransitionHistory": history,
        "currentAttemptSummary": {"attemptInfo": {"id": 0}},
    }
    meta = app["metadata"]
    meta.update(uid="uid-1", resourceVersion="7", finalizers=[finalizers.FINALIZER, "theirs"])
    meta["annotations"][appmeta.OWNER_ANNOTATION] = "k8s:jobs/nightly/abc"
    # rolled back already, the backoff over: the next step is the recreation
    meta["annotations"].update(
        {
            appmeta.PHASE: recovery.Phase.ROLLED_BACK.value,
            appmeta.HANDLED_FAILURE: str(recovery.observe(app).failure),
            appmeta.ATTEMPT: "0",
        }
    )
    return app


@pytest.fixture
def world(config: config_.OperatorConfig) -> tuple[FakeKube, runtime_.Runtime]:
    kube = FakeKube()
    kube.apps["nightly"] = _failed_app()
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    runtime = runtime_.Runtime(config=config, kube=kube, clock=lambda: NOW, sleep=sleep)  # type: ignore[arg-type]
    return kube, runtime


async def _step(runtime: runtime_.Runtime, kube: FakeKube) -> None:
    """What the app's worker does now: decide on the stored app, act."""
    app = kube.apps["nightly"]
    decision = recovery.decide(app, now=NOW, config=runtime.config, holder=runtime.identity)
    assert decision.action is recovery.Action.RECREATE, decision.reason
    await recreation.recreate(runtime, app=copy.deepcopy(app), decision=decision, logger=_LOG)


_LOG = logging.getLogger(__name__)
RECORD = resubmit.record_name("uid-1")


async def test_a_crash_after_the_release_is_resumed_from_the_old_apps_phase(
    world: tuple[FakeKube, runtime_.Runtime],
) -> None:
    kube, runtime = world
    kube.crash_on = "record-create"  # released (phase Resubmitted, our finalizer off), no record
    with pytest.raises(RuntimeError):
        await _step(runtime, kube)
    old = kube.apps["nightly"]
    assert old["metadata"]["finalizers"] == ["theirs"]
    assert appmeta.of(old)[appmeta.PHASE] == "Resubmitted"
    assert appmeta.of(old)[appmeta.ATTEMPT] == "1"
    assert kube.maps == {}
    # the next leader decides on the old app again: the same recreation, the same attempt
    await _step(runtime, kube)
    assert "nightly" not in kube.apps
    found = resubmit.manifest_of(kube.maps[RECORD])
    assert found is not None
    assert appmeta.of(found[1])[appmeta.ATTEMPT] == "1"


async def test_the_record_waits_for_the_pods_then_creates_once(
    world: tuple[FakeKube, runtime_.Runtime],
) -> None:
    kube, runtime = world
    kube.crash_on = "delete"  # record written, the old app not deleted yet
    with pytest.raises(RuntimeError):
        await _step(runtime, kube)
    assert RECORD in kube.maps
    assert "nightly" in kube.apps
    # the record's worker alone does not delete the old app: it waits (here: gives up leading)
    waits = 0

    def leading() -> bool:
        nonlocal waits
        waits += 1
        return waits <= 2

    runtime.leading = leading  # type: ignore[method-assign]
    await recreation.finish_resubmission(runtime, NS, RECORD, logger=_LOG)
    assert "create" not in kube.calls
    # the app's worker finishes its step; the old driver pod is still there
    runtime.leading = lambda: True  # type: ignore[method-assign]
    await _step(runtime, kube)
    kube.pods = ["nightly-0-driver"]
    waits = 0
    runtime.leading = leading  # type: ignore[method-assign]
    await recreation.finish_resubmission(runtime, NS, RECORD, logger=_LOG)
    assert "create" not in kube.calls  # never beside a pod the new app would adopt
    kube.pods = []
    runtime.leading = lambda: True  # type: ignore[method-assign]
    kube.crash_on = "record-delete"  # created, the record still there
    await recreation.finish_resubmission(runtime, NS, RECORD, logger=_LOG)
    await recreation.finish_resubmission(runtime, NS, RECORD, logger=_LOG)  # the next leader
    assert kube.calls.count("create") == 1
    new = kube.apps["nightly"]
    assert new["metadata"]["uid"] != "uid-1"
    assert appmeta.of(new)[appmeta.RESUBMITTED_FROM] == "uid-1"
    assert appmeta.of(new)[appmeta.OWNER_ANNOTATION] == "k8s:jobs/nightly/abc"
    assert "finalizers" not in new["metadata"]  # admission adds ours at CREATE
    assert "status" not in new
    assert kube.maps == {}
    assert kube.calls.count("event:Resubmitted") == 1
    assert runtime.metrics.resubmissions._value.get() == 1


async def test_an_app_someone_else_created_meanwhile_is_left_alone(
    world: tuple[FakeKube, runtime_.Runtime],
) -> None:
    kube, runtime = world
    await _step(runtime, kube)
    kube.apps["nightly"] = {"metadata": {"name": "nightly", "uid": "gitops", "annotations": {}}}
    await recreation.finish_resubmission(runtime, NS, RECORD, logger=_LOG)
    assert kube.apps["nightly"]["metadata"]["uid"] == "gitops"
    assert "create" not in kube.calls
    assert "event:ResubmissionAbandoned" in kube.calls
    assert kube.maps == {}
