"""The mutating webhook through kopf's admission path, with kmock as the API server."""

from __future__ import annotations

import base64
import copy
import dataclasses
import json
import re
import socket
import uuid
from typing import Any

import aiohttp
import kmock
import kopf
import pytest

from sparkguard.operator import appmeta, finalizers, mutation
from sparkguard.operator import config as config_
from tests.operator import kmocking
from tests.operator.apps import APACHE_GROUP, GROUP, PLURAL, VERSION, apache_app, spark_app

WEBHOOKS = kmock.resource("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _review(obj: dict[str, Any], *, operation: str = "CREATE", old: Any = None) -> dict[str, Any]:
    group, _, version = str(obj.get("apiVersion") or f"{GROUP}/{VERSION}").partition("/")
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": group, "version": version, "kind": "SparkApplication"},
            "resource": {"group": group, "version": version, "resource": PLURAL},
            "namespace": obj["metadata"]["namespace"],
            "name": obj["metadata"]["name"],
            "operation": operation,
            "userInfo": {"username": "alice"},
            "object": obj,
            "oldObject": old,
            "dryRun": False,
        },
    }


@pytest.fixture
async def webhook_url(kmock: kmock.KubernetesEmulator, config: config_.OperatorConfig) -> Any:
    kmocking.declare_resources(kmock)
    server = kopf.WebhookServer(addr="127.0.0.1", port=_free_port(), insecure=True)
    managed = dataclasses.replace(config, webhook_config_name="sparkguard.io", sidecar_native=True)
    runtime = kmocking.make_runtime(
        kmock, config=managed, rollback=kmocking.FakeRollback(), webhook_server=server
    )
    async with kmocking.operating(runtime):

        def configured() -> str | None:
            key = (WEBHOOKS, None, "sparkguard.io")
            if key not in kmock.objects:
                return None
            hooks = dict(kmock.objects[key].raw).get("webhooks") or []
            return hooks[0]["clientConfig"]["url"] if hooks else None

        url = await kmocking.eventually(configured)
        config_obj = dict(kmock.objects[(WEBHOOKS, None, "sparkguard.io")].raw)
        yield url, config_obj


async def _post(url: str, review: dict[str, Any]) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.post(url, json=review) as resp:
        assert resp.status == 200, await resp.text()
        body: dict[str, Any] = (await resp.json())["response"]
        return body


def _patched(obj: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    import jsonpatch

    if "patch" not in response:
        return obj
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    result: dict[str, Any] = jsonpatch.apply_patch(obj, ops)
    return result


async def test_kopf_registers_the_webhook(webhook_url: Any) -> None:
    _, configuration = webhook_url
    hooks = configuration["webhooks"]
    # one per kind: Kubeflow's and the Apache operator's SparkApplications
    assert sorted(h["rules"][0]["apiGroups"][0] for h in hooks) == [APACHE_GROUP, GROUP]
    for hook in hooks:
        assert hook["rules"][0]["resources"] == [PLURAL]
        assert sorted(hook["rules"][0]["operations"]) == ["CREATE", "UPDATE"]
        assert hook["failurePolicy"] == "Fail"
        assert hook["sideEffects"] == "None"


async def test_annotated_app_is_mutated(webhook_url: Any, config: config_.OperatorConfig) -> None:
    url, _ = webhook_url
    app = spark_app("nightly", namespace="jobs")
    response = await _post(url, _review(app))
    assert response["allowed"] is True
    mutated = _patched(app, response)
    owner = mutated["metadata"]["annotations"][appmeta.OWNER_ANNOTATION]
    assert re.fullmatch(r"k8s:jobs/nightly/[0-9a-f]{16}", owner), owner
    with_owner = copy.deepcopy(app)
    with_owner["metadata"]["annotations"][appmeta.OWNER_ANNOTATION] = owner
    token = mutation.marker_token_of(mutated)  # the app's own, random
    assert token is not None
    assert len(token) >= 32
    expected = mutation.mutate(with_owner, config=config, native_sidecar=True, marker_token=token)
    expected["metadata"]["finalizers"] = [finalizers.FINALIZER]  # rolled back when deleted
    assert mutated == expected
    assert mutated["spec"]["sparkConf"]["spark.sparkguard.jobId"] == "jobs.nightly"
    assert mutated["spec"]["sparkConf"]["spark.sparkguard.owner"] == owner
    again = _patched(app, await _post(url, _review(app)))
    assert again["metadata"]["annotations"][appmeta.OWNER_ANNOTATION] != owner  # fresh per CREATE
    assert mutation.marker_token_of(again) != token  # and so is the marker token


async def test_unannotated_app_passes_untouched(webhook_url: Any) -> None:
    url, _ = webhook_url
    response = await _post(url, _review(spark_app("plain", namespace="jobs", enabled=False)))
    assert response["allowed"] is True
    assert "patch" not in response


async def test_mutated_app_is_not_patched_again(
    webhook_url: Any, config: config_.OperatorConfig
) -> None:
    url, _ = webhook_url
    once = mutation.mutate(spark_app("again", namespace="jobs"), config=config, native_sidecar=True)
    once["metadata"]["finalizers"] = [finalizers.FINALIZER]
    response = await _post(url, _review(once, operation="UPDATE", old=once))
    assert response["allowed"] is True
    assert "patch" not in response


async def test_bad_annotation_is_denied_naming_it(webhook_url: Any) -> None:
    url, _ = webhook_url
    app = spark_app("bad", namespace="jobs", annotations={appmeta.MAX_RETRIES: "forever"})
    response = await _post(url, _review(app))
    assert response["allowed"] is False
    assert response["status"]["code"] == 422
    assert "sparkguard.io/max-retries" in response["status"]["message"]
    assert "whole number 0..20" in response["status"]["message"]


async def test_conflict_is_denied_naming_the_field(webhook_url: Any) -> None:
    url, _ = webhook_url
    app = spark_app(
        "clash",
        namespace="jobs",
        annotations={appmeta.JOB_ID: "mine"},
        sparkConf={"spark.sparkguard.jobId": "theirs"},
    )
    response = await _post(url, _review(app))
    assert response["allowed"] is False
    assert "spec.sparkConf[spark.sparkguard.jobId]" in response["status"]["message"]


async def test_the_finalizer_is_added_once_and_other_finalizers_are_kept(
    webhook_url: Any, config: config_.OperatorConfig
) -> None:
    url, _ = webhook_url
    app = spark_app("held", namespace="jobs")
    app["metadata"]["finalizers"] = ["example.com/keep", finalizers.FINALIZER]
    created = _patched(app, await _post(url, _review(app)))
    assert created["metadata"]["finalizers"] == ["example.com/keep", finalizers.FINALIZER]
    # An app admitted before the finalizer existed gets it at its next UPDATE...
    before = mutation.mutate(spark_app("old", namespace="jobs"), config=config)
    before["metadata"]["finalizers"] = ["example.com/keep"]
    updated = _patched(before, await _post(url, _review(before, operation="UPDATE", old=before)))
    assert updated["metadata"]["finalizers"] == ["example.com/keep", finalizers.FINALIZER]
    # ...but an UPDATE that removes it (the operator, or someone by hand) is never undone.
    removed = copy.deepcopy(updated)
    removed["metadata"]["finalizers"] = ["example.com/keep"]
    response = await _post(url, _review(removed, operation="UPDATE", old=updated))
    assert _patched(removed, response)["metadata"]["finalizers"] == ["example.com/keep"]


async def test_no_finalizer_for_apps_not_opted_in_or_being_deleted(
    webhook_url: Any, config: config_.OperatorConfig
) -> None:
    url, _ = webhook_url
    plain = spark_app("plain", namespace="jobs", enabled=False)
    assert "finalizers" not in _patched(plain, await _post(url, _review(plain)))["metadata"]
    # The API server refuses new finalizers on an object being deleted.
    going = mutation.mutate(spark_app("going", namespace="jobs"), config=config)
    going["metadata"]["deletionTimestamp"] = "2026-11-22T10:00:00Z"
    response = await _post(url, _review(going, operation="UPDATE", old=going))
    assert "finalizers" not in _patched(going, response)["metadata"]


def _apache_url(url: str) -> str:
    """The Apache kind's webhook path (its kopf handler id) instead of Kubeflow's."""
    return url.rsplit("/", 1)[0] + "/apache-sparkapplications"


async def test_an_apache_app_is_mutated_through_its_own_webhook(
    webhook_url: Any, config: config_.OperatorConfig
) -> None:
    url, configuration = webhook_url
    (hook,) = [h for h in configuration["webhooks"] if h["rules"][0]["apiGroups"] == [APACHE_GROUP]]
    assert hook["clientConfig"]["url"] == _apache_url(url)
    app = apache_app("nightly", namespace="jobs")
    response = await _post(_apache_url(url), _review(app))
    assert response["allowed"] is True, response
    mutated = _patched(app, response)
    owner = mutated["metadata"]["annotations"][appmeta.OWNER_ANNOTATION]
    with_owner = copy.deepcopy(app)
    with_owner["metadata"]["annotations"][appmeta.OWNER_ANNOTATION] = owner
    with_owner["metadata"]["finalizers"] = [finalizers.FINALIZER]  # as for Kubeflow apps
    assert mutated == mutation.mutate(
        with_owner, config=config, marker_token=mutation.marker_token_of(mutated)
    )
    driver = mutated["spec"]["driverSpec"]["podTemplateSpec"]["spec"]
    assert driver["initContainers"][-1]["name"] == mutation.SIDECAR_NAME
    assert driver["initContainers"][-1]["restartPolicy"] == "Always"
    # re-admission (an UPDATE of the admitted app) changes nothing
    response = await _post(_apache_url(url), _review(mutated, operation="UPDATE", old=mutated))
    assert response["allowed"] is True
    assert "patch" not in response


async def test_a_bad_apache_app_is_denied_naming_the_annotation(webhook_url: Any) -> None:
    url, _ = webhook_url
    app = apache_app("bad", namespace="jobs", annotations={appmeta.MAX_RETRIES: "forever"})
    response = await _post(_apache_url(url), _review(app))
    assert response["allowed"] is False
    assert response["status"]["code"] == 422
    assert "sparkguard.io/max-retries" in response["status"]["message"]


@pytest.mark.parametrize("first", ["kubeflow", "apache"])
async def test_one_job_id_across_both_kinds(
    webhook_url: Any, kmock: kmock.KubernetesEmulator, config: config_.OperatorConfig, first: str
) -> None:
    """A Kubeflow app and an Apache app cannot share a job id, whichever came first; an app
    of the other kind with the same namespace/name is another app, not the app itself."""
    url, _ = webhook_url
    shared = {appmeta.JOB_ID: "orders", appmeta.OWNER_ANNOTATION: "k8s:jobs/orders/00"}
    build = {"kubeflow": spark_app, "apache": apache_app}
    stored = mutation.mutate(
        build[first]("orders", namespace="jobs", annotations=shared), config=config
    )
    group, version = (GROUP, VERSION) if first == "kubeflow" else (APACHE_GROUP, "v1")
    async with kmock.post(f"/apis/{group}/{version}/namespaces/jobs/{PLURAL}", json=stored) as resp:
        assert resp.status < 300, await resp.text()

    second = "apache" if first == "kubeflow" else "kubeflow"
    app = build[second]("orders-copy", namespace="jobs", annotations={appmeta.JOB_ID: "orders"})
    target = _apache_url(url) if second == "apache" else url
    response = await _post(target, _review(app))
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert f"jobs/orders ({group})" in message, message
    assert appmeta.JOB_ID in message
    # The same namespace/name under the other kind is not "itself": refused too.
    twin = build[second]("orders", namespace="jobs")
    twin["metadata"]["annotations"][appmeta.JOB_ID] = "orders"
    assert (await _post(target, _review(twin)))["allowed"] is False
    # Another job id passes.
    other = build[second]("orders-copy", namespace="jobs", annotations={appmeta.JOB_ID: "other"})
    assert (await _post(target, _review(other)))["allowed"] is True
