"""Native or regular marker sidecar, from the API server version and the installed CRD."""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import kmock
import pytest
import yaml

from sparkguard.operator import sidecarmode
from tests.kubebench.bench import SPARK_OPERATOR_CRDS
from tests.operator import kmocking

VERSION_1_31 = {
    "major": "1",
    "minor": "31",
    "gitVersion": "v1.31.0",
    "gitCommit": "0",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.23",
    "compiler": "gc",
    "platform": "linux/amd64",
}
CRD_PATH = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{sidecarmode.CRD_NAME}"


def _crd(version: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(Path(SPARK_OPERATOR_CRDS[version]).read_text())
    return loaded


def _init_container_items(crd: dict[str, Any]) -> dict[str, Any]:
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    items: dict[str, Any] = root["properties"]["spec"]["properties"]["driver"]["properties"][
        "initContainers"
    ]["items"]
    return items


@pytest.mark.parametrize(
    ("major", "minor", "native"),
    [("1", "28", False), ("1", "29", True), ("1", "29+", True), ("1", "37", True), ("", "", False)],
)
def test_native_sidecars_from_kubernetes_1_29(major: str, minor: str, native: bool) -> None:
    assert sidecarmode.supports_native_sidecars(major, minor) is native


def test_the_2x_crd_keeps_restart_policy_and_the_1x_crd_prunes_it() -> None:
    kept, where = sidecarmode.keeps_init_container_restart_policy(_crd("2.x"))
    assert kept, where
    assert where == "spec.driver.initContainers.items.restartPolicy is declared"
    kept, where = sidecarmode.keeps_init_container_restart_policy(_crd("1.x"))
    assert not kept
    assert "declares no restartPolicy and prunes unknown fields" in where


def test_preserved_unknown_fields_keep_restart_policy() -> None:
    crd = _crd("1.x")
    _init_container_items(crd)["x-kubernetes-preserve-unknown-fields"] = True
    kept, where = sidecarmode.keeps_init_container_restart_policy(crd)
    assert kept, where
    assert "preserves unknown fields" in where
    # Preserving at driver level does not help: initContainers is declared, and pruned inside.
    crd = _crd("1.x")
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    root["properties"]["spec"]["properties"]["driver"]["x-kubernetes-preserve-unknown-fields"] = (
        True
    )
    assert not sidecarmode.keeps_init_container_restart_policy(crd)[0]
    # ... unless initContainers itself is not declared there.
    del root["properties"]["spec"]["properties"]["driver"]["properties"]["initContainers"]
    assert sidecarmode.keeps_init_container_restart_policy(crd)[0]


def test_a_crd_without_v1beta2_keeps_nothing() -> None:
    crd = _crd("2.x")
    crd["spec"]["versions"][0]["name"] = "v1beta1"
    assert sidecarmode.keeps_init_container_restart_policy(crd) == (
        False,
        "the CRD serves no v1beta2",
    )


def test_decide_needs_both_the_version_and_the_crd() -> None:
    assert sidecarmode.decide(server_version=("1", "31"), crd=_crd("2.x")).native
    old_server = sidecarmode.decide(server_version=("1", "28"), crd=_crd("2.x"))
    assert not old_server.native
    assert "Kubernetes 1.28 runs no native sidecars" in old_server.reason
    old_crd = sidecarmode.decide(server_version=("1", "31"), crd=_crd("1.x"))
    assert not old_crd.native
    assert "would prune an initContainer's restartPolicy" in old_crd.reason
    unreadable = sidecarmode.decide(server_version=("1", "31"), crd=None, unreadable="forbidden")
    assert not unreadable.native
    assert "(forbidden)" in unreadable.reason
    assert "grant the operator get on it" in unreadable.reason


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _serve_crd(server: kmock.KubernetesEmulator, crd: dict[str, Any]) -> None:
    server.resources["apiextensions.k8s.io/v1/customresourcedefinitions"] = kmock.ResourceInfo(
        kind="CustomResourceDefinition", namespaced=False, verbs={"get", "list", "create"}
    )
    key = (
        kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions"),
        None,
        sidecarmode.CRD_NAME,
    )
    server.objects[key] = copy.deepcopy(crd)


async def test_the_cache_reads_the_cluster_and_again_after_the_refresh(
    kmock: kmock.KubernetesEmulator,
) -> None:
    kmock["get /version/"] << VERSION_1_31
    _serve_crd(kmock, _crd("2.x"))
    clock = _Clock()
    cache = sidecarmode.SidecarModeCache(kmocking.api_client(kmock), refresh=300, clock=clock)
    assert (await cache.current()).native
    # spark-operator's CRD is replaced by a 1.x one: seen at the next refresh, not before.
    _serve_crd(kmock, _crd("1.x"))
    clock.now = 299.0
    assert (await cache.current()).native
    clock.now = 300.0
    mode = await cache.current()
    assert not mode.native
    assert "would prune" in mode.reason


async def test_an_unreadable_crd_gives_the_regular_sidecar_and_says_why_once(
    kmock: kmock.KubernetesEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    kmock["get /version/"] << VERSION_1_31
    kmock["get", CRD_PATH] << 403 << {"kind": "Status", "code": 403, "reason": "Forbidden"}
    clock = _Clock()
    cache = sidecarmode.SidecarModeCache(kmocking.api_client(kmock), refresh=300, clock=clock)
    with caplog.at_level(logging.INFO, logger=sidecarmode.__name__):
        for step in range(3):
            clock.now = step * 300.0  # a new read every time
            mode = await cache.current()
            assert not mode.native
    assert "forbidden: RBAC" in mode.reason
    said = [r.getMessage() for r in caplog.records if r.name == sidecarmode.__name__]
    assert len(said) == 1, said
    assert "regular container" in said[0]
