"""The containers sparkguard injects meet Pod Security "restricted"; the app's settings stay.

Pure tests of the admission mutation and its settings; the API server's own PodSecurity
admission judges the pods in tests/operator/test_pod_security.py.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from sparkguard.operator import appmeta, errors, mutation, podsecurity
from sparkguard.operator import config as config_
from tests.operator.apps import apache_app, spark_app

OURS = (mutation.LIB_INIT_NAME, mutation.ROLLBACK_INIT_NAME, mutation.SIDECAR_NAME)
RESTRICTED = podsecurity.restricted()


def injected(app: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every container of ours in a mutated app, with where it is."""
    spec = app["spec"]
    if mutation.kind_of(app) is mutation.APACHE:
        places = {
            role: spec[f"{role}Spec"]["podTemplateSpec"]["spec"] for role in ("driver", "executor")
        }
    else:
        places = {role: spec[role] for role in ("driver", "executor")}
    return [
        (f"{role}.{key}", container)
        for role, pod in places.items()
        for key in ("initContainers", "sidecars", "containers")
        for container in pod.get(key) or []
        if container["name"] in OURS
    ]


APPS = {
    "kubeflow-native": (spark_app(), True),
    "kubeflow-classic": (spark_app(), False),
    "kubeflow-direct": (spark_app(annotations={appmeta.MARKER_TYPE: "direct"}), True),
    "apache": (apache_app(), True),
}


@pytest.mark.parametrize(("app", "native"), list(APPS.values()), ids=list(APPS))
def test_every_injected_container_is_restricted_with_a_writable_tmp(
    config: config_.OperatorConfig, app: dict[str, Any], native: bool
) -> None:
    mutated = mutation.mutate(app, config=config, native_sidecar=native)
    found = injected(mutated)
    names = sorted({c["name"] for _, c in found})
    direct = appmeta.MARKER_TYPE in app["metadata"]["annotations"]
    assert names == sorted(OURS[:2] if direct else OURS)
    for where, container in found:
        assert container["securityContext"] == RESTRICTED, where
        assert "runAsUser" not in json.dumps(container)  # OpenShift assigns the UID
        assert {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"} in container["env"]
        assert {"name": "TMPDIR", "value": "/tmp"} in container["env"]
        assert {"name": mutation.LIB_VOLUME, "mountPath": "/tmp", "subPath": ".tmp"} in container[
            "volumeMounts"
        ], where
        if container["name"] != mutation.SIDECAR_NAME:
            assert container["resources"] == {
                "requests": {"cpu": "100m", "memory": "128Mi"},
                "limits": {"memory": "512Mi"},
            }


def test_the_apps_own_containers_and_pod_settings_are_left_alone(
    config: config_.OperatorConfig,
) -> None:
    """Not restricted itself: admission neither fails nor rewrites it (the app's business)."""
    loose = {"privileged": True, "runAsUser": 0}
    app = spark_app(
        driver={"securityContext": loose, "podSecurityContext": {"fsGroup": 0}},
        executor={"securityContext": loose, "sidecars": [{"name": "logs", "image": "fluentd"}]},
    )
    mutated = mutation.mutate(app, config=config, native_sidecar=True)
    for role in ("driver", "executor"):
        assert mutated["spec"][role]["securityContext"] == loose
    assert mutated["spec"]["driver"]["podSecurityContext"] == {"fsGroup": 0}
    assert mutated["spec"]["executor"]["sidecars"] == [{"name": "logs", "image": "fluentd"}]


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        # what the pod sets is inherited, not overridden (a custom seccomp profile stays)
        (
            {"runAsUser": 1000, "seccompProfile": {"type": "Localhost", "localhostProfile": "p"}},
            {k: v for k, v in RESTRICTED.items() if k != "seccompProfile"},
        ),
        (
            {"runAsNonRoot": True, "fsGroup": 185},
            {k: v for k, v in RESTRICTED.items() if k != "runAsNonRoot"},
        ),
        # a pod that runs as root: ours must not refuse to start in it
        ({"runAsUser": 0}, {k: v for k, v in RESTRICTED.items() if k != "runAsNonRoot"}),
        ({}, RESTRICTED),
    ],
    ids=["uid-and-seccomp", "non-root", "root", "empty"],
)
def test_what_the_pods_security_context_sets_is_inherited(
    config: config_.OperatorConfig, pod: dict[str, Any], expected: dict[str, Any]
) -> None:
    apps = [
        spark_app(driver={"podSecurityContext": pod}, executor={"podSecurityContext": pod}),
        # spark-operator 2.x: the pod template's, when there is no podSecurityContext
        spark_app(
            driver={"template": {"spec": {"securityContext": pod}}},
            executor={"template": {"spec": {"securityContext": pod}}},
        ),
        apache_app(
            driverSpec={"podTemplateSpec": {"spec": {"securityContext": pod}}},
            executorSpec={"podTemplateSpec": {"spec": {"securityContext": pod}}},
        ),
    ]
    for app in apps:
        mutated = mutation.mutate(app, config=config, native_sidecar=True)
        for where, container in injected(mutated):
            assert container.get("securityContext", {}) == expected, where
        assert mutation.mutate(mutated, config=config, native_sidecar=True) == mutated


def test_an_app_admitted_before_gets_the_hardening_on_its_next_admission(
    config: config_.OperatorConfig,
) -> None:
    """Our containers as an older sparkguard wrote them: what they lack is filled in."""
    current = mutation.mutate(spark_app(), config=config, native_sidecar=True)
    older = copy.deepcopy(current)
    for _, container in injected(older):
        del container["securityContext"]
        container.pop("resources", None)
        del container["env"]
        container["volumeMounts"] = [
            m for m in container["volumeMounts"] if m["mountPath"] != "/tmp"
        ]
    assert mutation.mutate(older, config=config, native_sidecar=True) == current


def test_the_configured_security_context_and_resources_are_injected() -> None:
    environ = {
        "SPARKGUARD_WEBHOOK_MODE": "managed",
        "SPARKGUARD_INJECTED_SECURITY_CONTEXT": json.dumps(
            {**RESTRICTED, "runAsUser": 1001, "seLinuxOptions": {"level": "s0:c1,c2"}}
        ),
        "SPARKGUARD_INIT_CPU_REQUEST": "50m",
        "SPARKGUARD_INIT_MEMORY_REQUEST": "96Mi",
        "SPARKGUARD_INIT_CPU_LIMIT": "1",
        "SPARKGUARD_INIT_MEMORY_LIMIT": "1Gi",
        "SPARKGUARD_JOURNAL_ROOT": "s3://warehouse/_journal",
    }
    config = config_.load_config(environ)
    mutated = mutation.mutate(spark_app(), config=config, native_sidecar=True)
    for where, container in injected(mutated):
        assert container["securityContext"]["runAsUser"] == 1001, where
        assert container["securityContext"]["seLinuxOptions"] == {"level": "s0:c1,c2"}
        if container["name"] != mutation.SIDECAR_NAME:
            assert container["resources"] == {
                "requests": {"cpu": "50m", "memory": "96Mi"},
                "limits": {"cpu": "1", "memory": "1Gi"},
            }
    # an empty context injects none; empty quantities leave resources out
    environ |= {
        "SPARKGUARD_INJECTED_SECURITY_CONTEXT": "{}",
        **{f"SPARKGUARD_INIT_{k}": "" for k in ("CPU_REQUEST", "MEMORY_REQUEST", "MEMORY_LIMIT")},
        "SPARKGUARD_INIT_CPU_LIMIT": "",
    }
    mutated = mutation.mutate(spark_app(), config=config_.load_config(environ))
    for where, container in injected(mutated):
        assert "securityContext" not in container, where
        if container["name"] != mutation.SIDECAR_NAME:
            assert "resources" not in container


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("not json", "must be a JSON object"),
        ('["ALL"]', "securityContext must be an object"),
        ('{"allowPrivilegeEscalation": "no"}', "securityContext.allowPrivilegeEscalation must"),
        ('{"runAsUser": -1}', "securityContext.runAsUser must be an integer >= 0"),
        ('{"runAsUser": true}', "securityContext.runAsUser must be an integer >= 0"),
        ('{"capabilities": {"drop": "ALL"}}', "securityContext.capabilities.drop must be a list"),
        ('{"capabilities": {"drop": [1]}}', "securityContext.capabilities.drop[0] must be"),
        ('{"seccompProfile": {"type": "Default"}}', "securityContext.seccompProfile.type must"),
        ('{"readOnlyRootFileSystem": true}', "securityContext.readOnlyRootFileSystem is not a"),
    ],
)
def test_a_bad_security_context_is_named_field_by_field(raw: str, message: str) -> None:
    with pytest.raises(errors.ConfigError) as caught:
        config_.load_config(
            {"SPARKGUARD_WEBHOOK_MODE": "managed", "SPARKGUARD_INJECTED_SECURITY_CONTEXT": raw}
        )
    assert "SPARKGUARD_INJECTED_SECURITY_CONTEXT=" in str(caught.value)
    assert message in str(caught.value)


def test_bad_init_resources_are_named() -> None:
    with pytest.raises(errors.ConfigError, match="SPARKGUARD_INIT_MEMORY_LIMIT='lots'"):
        config_.load_config(
            {"SPARKGUARD_WEBHOOK_MODE": "managed", "SPARKGUARD_INIT_MEMORY_LIMIT": "lots"}
        )
