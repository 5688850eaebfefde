"""The Unprotected signal: a driver pod of an opted-in app without sparkguard's containers."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kmock

from sparkguard.operator import appmeta, mutation, protection
from sparkguard.operator import config as config_
from tests.kubebench import bench
from tests.kubebench.crds import generate
from tests.operator import kmocking
from tests.operator.apps import spark_app

PODS = "/api/v1/namespaces/{ns}/pods"


def _mutated(config: config_.OperatorConfig, name: str = "etl") -> dict[str, Any]:
    return mutation.mutate(spark_app(name), config=config, native_sidecar=True)


def driver_pod(
    app: dict[str, Any], *, name: str = "etl-driver", protected: bool, submission: str = "sub-1"
) -> dict[str, Any]:
    """A driver pod as spark-operator creates it (labels of upstream pkg/common), with the
    app's initContainers, sidecars and volumes only when its pod webhook applied them."""
    spec: dict[str, Any] = {"containers": [{"name": "spark-kubernetes-driver", "image": "spark"}]}
    if protected:
        driver = app["spec"]["driver"]
        spec["initContainers"] = copy.deepcopy(driver.get("initContainers") or [])
        spec["containers"] += copy.deepcopy(driver.get("sidecars") or [])
        spec["volumes"] = copy.deepcopy(app["spec"].get("volumes") or [])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": app["metadata"]["namespace"],
            "uid": f"uid-{name}",
            "labels": {
                protection.ROLE_LABEL: protection.DRIVER_ROLE,
                protection.APP_NAME_LABEL: app["metadata"]["name"],
                protection.SUBMISSION_ID_LABEL: submission,
                "sparkoperator.k8s.io/launched-by-spark-operator": "true",
            },
        },
        "spec": spec,
    }


def test_a_pod_without_our_containers_is_unprotected(config: config_.OperatorConfig) -> None:
    app = _mutated(config)
    verdict = protection.check_driver_pod(app, driver_pod(app, protected=False))
    assert verdict.relevant
    assert not verdict.protected
    assert verdict.missing == (
        mutation.LIB_INIT_NAME,
        mutation.ROLLBACK_INIT_NAME,
        mutation.SIDECAR_NAME,
        f"volume {mutation.LIB_VOLUME}",
        f"volume {mutation.TOKEN_VOLUME}",
    )
    assert "driver pod etl-driver lacks sparkguard's sparkguard-lib, sparkguard-rollback" in (
        verdict.message
    )
    assert "webhook.enable=true" in verdict.message
    assert protection.check_driver_pod(app, driver_pod(app, protected=True)).protected


def test_pods_that_say_nothing(config: config_.OperatorConfig) -> None:
    app = _mutated(config)
    app["status"] = {"submissionID": "sub-2"}
    # a pod of an earlier run
    assert not protection.check_driver_pod(app, driver_pod(app, protected=False)).relevant
    # an app that is not opted in
    plain = spark_app("plain", enabled=False)
    assert not protection.check_driver_pod(plain, driver_pod(plain, protected=False)).relevant


def test_an_app_stored_without_admission_says_so(config: config_.OperatorConfig) -> None:
    app = spark_app("etl")  # opted in, but never mutated
    verdict = protection.check_driver_pod(app, driver_pod(app, protected=False))
    assert not verdict.protected
    assert "stored without sparkguard's admission" in verdict.message
    assert "recreate the app" in verdict.message


def test_the_annotations_patch_is_written_once_and_cleared(config: config_.OperatorConfig) -> None:
    app = _mutated(config)
    bad = protection.check_driver_pod(app, driver_pod(app, protected=False))
    patch = protection.annotations_patch(app, bad)
    assert patch == {
        "metadata": {
            "annotations": {
                appmeta.PROTECTION: "unprotected",
                appmeta.PROTECTION_REASON: bad.message,
            }
        }
    }
    marked = mutation.apply_merge_patch(app, patch)
    assert protection.annotations_patch(marked, bad) is None
    good = protection.check_driver_pod(marked, driver_pod(marked, protected=True))
    cleared = protection.annotations_patch(marked, good)
    assert cleared == {"metadata": {"annotations": dict.fromkeys(appmeta.SIGNAL_KEYS)}}
    assert protection.annotations_patch(app, good) is None
    # The annotations are ours: an app carrying them is not invalid.
    assert not appmeta.parse(marked, config=config).problems


def test_the_bench_crd_files_are_what_the_generator_writes() -> None:
    for version, path in bench.SPARK_OPERATOR_CRDS.items():
        assert Path(path).read_text(encoding="utf-8") == generate.render(version), (
            f"{path} is stale: run tests/kubebench/crds/generate.py"
        )


async def _create_pod(server: kmock.KubernetesEmulator, pod: dict[str, Any]) -> None:
    async with server.post(PODS.format(ns=pod["metadata"]["namespace"]), json=pod) as resp:
        assert resp.status < 300, await resp.text()


async def test_the_operator_posts_unprotected_once_per_pod_and_clears_it(
    kmock: kmock.KubernetesEmulator, config: config_.OperatorConfig
) -> None:
    kmocking.declare_resources(kmock)
    app = _mutated(config)
    await kmocking.create_app(kmock, app)
    runtime = kmocking.make_runtime(kmock, config=config, rollback=kmocking.FakeRollback())
    async with kmocking.operating(runtime):
        await _create_pod(kmock, driver_pod(app, protected=False))
        await kmocking.eventually(
            lambda: kmocking.notes(kmock, "jobs", "etl").get(appmeta.PROTECTION)
        )
        notes = kmocking.notes(kmock, "jobs", "etl")
        assert notes[appmeta.PROTECTION] == "unprotected"
        assert "driver pod etl-driver lacks sparkguard's" in notes[appmeta.PROTECTION_REASON]
        await kmocking.eventually(lambda: protection.REASON in kmocking.event_reasons(kmock, "etl"))
        (event,) = [e for e in kmocking.posted_events(kmock) if e["reason"] == protection.REASON]
        assert event["type"] == "Warning"
        assert "etl-driver" in event["message"]
        assert "webhook.enable=true" in event["message"]

        # The same pod changes (its phase): no second Event, no second patch.
        patches = len(kmocking.app_patches(kmock, "etl"))
        async with kmock.patch(
            PODS.format(ns="jobs") + "/etl-driver",
            json={"status": {"phase": "Running"}},
            headers={"Content-Type": "application/merge-patch+json"},
        ) as resp:
            assert resp.status < 300
        # A later, protected driver pod (the webhook fixed) clears the annotations.
        await _create_pod(kmock, driver_pod(app, name="etl-driver-2", protected=True))
        await kmocking.eventually(
            lambda: appmeta.PROTECTION not in kmocking.notes(kmock, "jobs", "etl")
        )
        assert appmeta.PROTECTION_REASON not in kmocking.notes(kmock, "jobs", "etl")
        assert len(kmocking.app_patches(kmock, "etl")) == patches + 1
        assert kmocking.event_reasons(kmock, "etl").count(protection.REASON) == 1
