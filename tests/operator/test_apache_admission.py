"""Admission of Apache Spark operator apps (``spark.apache.org/v1``): the same
options, validation and conf as Kubeflow apps, with containers and volumes in the pod
templates (tests/e2e/apache-model.md §9a). Pure: :func:`mutation.mutate` / :func:`review`."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkguard.operator import appmeta, finalizers, mutation
from sparkguard.operator import config as config_
from tests.kubebench import bench
from tests.operator.apps import apache_app, spark_app

DRIVER = ("spec", "driverSpec", "podTemplateSpec", "spec")
EXECUTOR = ("spec", "executorSpec", "podTemplateSpec", "spec")
OWNER = "k8s:jobs/nightly/0123456789abcdef"


def _at(obj: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        obj = obj[key]
    return obj


def _names(items: list[dict[str, Any]]) -> list[str]:
    return [item["name"] for item in items]


def _with_owner(app: dict[str, Any]) -> dict[str, Any]:
    app["metadata"]["annotations"][appmeta.OWNER_ANNOTATION] = OWNER
    return app


def test_the_kind_comes_from_the_api_version() -> None:
    assert mutation.kind_of(apache_app()) is mutation.APACHE
    assert mutation.kind_of(spark_app()) is mutation.KUBEFLOW
    assert mutation.kind_of({}) is mutation.KUBEFLOW
    assert mutation.APACHE.crd_name == "sparkapplications.spark.apache.org"


def test_a_minimal_app_gets_everything_in_its_pod_templates(
    config: config_.OperatorConfig,
) -> None:
    app = _with_owner(apache_app())
    mutated = mutation.mutate(app, config=config)
    options = appmeta.parse(mutated, config=config).options
    assert options is not None

    lib_mount = {"name": mutation.LIB_VOLUME, "mountPath": mutation.LIB_DIR, "readOnly": True}
    token_mount = {"name": mutation.TOKEN_VOLUME, "mountPath": mutation.TOKEN_DIR, "readOnly": True}
    volumes = [
        {"name": mutation.LIB_VOLUME, "emptyDir": {}},
        mutation.build_token_volume(config),
    ]

    def spark_container(name: str) -> dict[str, Any]:
        return {
            "name": name,
            "volumeMounts": [lib_mount, token_mount],
            "env": [{"name": "PYTHONPATH", "value": mutation.LIB_DIR}],
        }

    sidecar = mutation.build_sidecar(options, config=config, native=True)
    assert sidecar["restartPolicy"] == "Always"
    assert "--exit-with-process" not in sidecar["command"]
    assert _at(mutated, DRIVER) == {
        "volumes": volumes,
        "initContainers": [
            mutation.build_lib_init(config=config),
            mutation.build_rollback_init(options, config=config, owner=OWNER),
            sidecar,
        ],
        # Spark's own container (a template without containers): only our mounts and env
        "containers": [spark_container("spark-kubernetes-driver")],
    }
    assert _at(mutated, EXECUTOR) == {
        "volumes": volumes,
        "initContainers": [mutation.build_lib_init(config=config)],
        "containers": [spark_container("spark-kubernetes-executor")],
    }
    # Nothing else in the spec changed but sparkConf; no Kubeflow-only field appeared.
    assert set(mutated["spec"]) == set(app["spec"]) | {
        "driverSpec",
        "executorSpec",
        "applicationTolerations",
    }
    assert "shareProcessNamespace" not in _at(mutated, DRIVER)
    assert mutated["metadata"]["labels"] == {
        appmeta.JOB_ID_LABEL: appmeta.job_id_label("jobs.nightly")
    }
    assert mutated["metadata"]["annotations"][appmeta.JOB_ID] == "jobs.nightly"


def test_spark_conf_is_exactly_the_kubeflow_paths(config: config_.OperatorConfig) -> None:
    """The same options give the same spark.sparkguard.* and JVM-layer conf on both kinds."""
    conf = {"spark.sql.shuffle.partitions": "4", "spark.jars": "local:///opt/app/dep.jar"}
    apache = mutation.mutate(_with_owner(apache_app(sparkConf=dict(conf))), config=config)
    kubeflow = mutation.mutate(_with_owner(spark_app(sparkConf=dict(conf))), config=config)
    assert apache["spec"]["sparkConf"] == kubeflow["spec"]["sparkConf"]
    added = set(apache["spec"]["sparkConf"]) - set(conf)
    assert {mutation.CONF_JOB_ID, mutation.CONF_OWNER, mutation.CONF_MARKERS_ENDPOINT} <= added
    assert (
        apache["spec"]["sparkConf"]["spark.jars"] == f"local:///opt/app/dep.jar,{mutation.JAR_URI}"
    )
    assert "spark.app.id" not in apache["spec"]["sparkConf"]  # driver names must not repeat


def test_the_app_jar_stays_in_spark_jars(config: config_.OperatorConfig) -> None:
    """The Apache operator puts spec.jars into spark.jars only when sparkConf has none
    (SparkAppSubmissionWorker.buildDriverConf): ours must not push it out."""
    app = apache_app(jars="local:///opt/app/etl.jar", mainClass="com.example.Etl")
    del app["spec"]["pyFiles"]
    mutated = mutation.mutate(app, config=config)
    assert mutated["spec"]["jars"] == "local:///opt/app/etl.jar"
    jars = mutated["spec"]["sparkConf"]["spark.jars"]
    assert jars == f"local:///opt/app/etl.jar,{mutation.JAR_URI}"
    assert mutation.mutate(mutated, config=config) == mutated
    # Opted out of the JVM layer later: spark.jars goes again (the operator's default is back).
    mutated["metadata"]["annotations"][appmeta.JVM_LAYER] = "false"
    assert "spark.jars" not in mutation.mutate(mutated, config=config)["spec"]["sparkConf"]


def test_readmission_changes_nothing(config: config_.OperatorConfig) -> None:
    once = mutation.mutate(_with_owner(apache_app()), config=config)
    assert mutation.mutate(once, config=config) == once
    once["metadata"]["finalizers"] = [finalizers.FINALIZER]  # what the CREATE added
    verdict = mutation.review(once, old=once, config=config, owner_id="ffff", native_sidecar=False)
    assert verdict.allowed, verdict.message
    assert verdict.patch == {}


def test_the_users_template_is_kept_and_ours_appended(config: config_.OperatorConfig) -> None:
    driver_pod = {
        "serviceAccountName": "spark",
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
        "initContainers": [{"name": "fetch", "image": "busybox", "command": ["true"]}],
        "containers": [
            {"name": "logs", "image": "fluent-bit"},  # named by podTemplateContainerName: not it
            {
                "name": "main",
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                "env": [{"name": "PYTHONPATH", "value": "/opt/app/lib"}],
            },
        ],
    }
    executor_pod = {"containers": [{"name": "exec", "resources": {"limits": {"cpu": "1"}}}]}
    app = apache_app(
        sparkConf={"spark.kubernetes.driver.podTemplateContainerName": "main"},
        driverSpec={"podTemplateSpec": {"metadata": {"labels": {"team": "a"}}, "spec": driver_pod}},
        executorSpec={"podTemplateSpec": {"spec": executor_pod}},
    )
    mutated = mutation.mutate(app, config=config)
    driver = _at(mutated, DRIVER)
    assert driver["serviceAccountName"] == "spark"
    assert mutated["spec"]["driverSpec"]["podTemplateSpec"]["metadata"] == {"labels": {"team": "a"}}
    assert _names(driver["volumes"]) == ["data", mutation.LIB_VOLUME, mutation.TOKEN_VOLUME]
    assert _names(driver["initContainers"]) == [
        "fetch",
        mutation.LIB_INIT_NAME,
        mutation.ROLLBACK_INIT_NAME,
        mutation.SIDECAR_NAME,
    ]
    logs, main = driver["containers"]
    assert logs == {"name": "logs", "image": "fluent-bit"}  # no container added or touched
    assert _names(main["volumeMounts"]) == ["data", mutation.LIB_VOLUME, mutation.TOKEN_VOLUME]
    assert main["env"] == [{"name": "PYTHONPATH", "value": f"/opt/app/lib:{mutation.LIB_DIR}"}]
    (executor,) = _at(mutated, EXECUTOR)["containers"]  # the first container is Spark's
    assert executor["resources"] == {"limits": {"cpu": "1"}}
    assert _names(executor["volumeMounts"]) == [mutation.LIB_VOLUME, mutation.TOKEN_VOLUME]
    assert mutation.mutate(mutated, config=config) == mutated


def test_the_named_spark_container_is_created_with_that_name(
    config: config_.OperatorConfig,
) -> None:
    app = apache_app(sparkConf={"spark.kubernetes.executor.podTemplateContainerName": "exe"})
    mutated = mutation.mutate(app, config=config)
    assert _names(_at(mutated, EXECUTOR)["containers"]) == ["exe"]
    assert _names(_at(mutated, DRIVER)["containers"]) == ["spark-kubernetes-driver"]


def test_direct_markers_need_no_sidecar_and_no_token(config: config_.OperatorConfig) -> None:
    app = apache_app(annotations={appmeta.MARKER_TYPE: "direct"})
    mutated = mutation.mutate(app, config=config)
    driver = _at(mutated, DRIVER)
    assert _names(driver["initContainers"]) == [mutation.LIB_INIT_NAME, mutation.ROLLBACK_INIT_NAME]
    assert _names(driver["volumes"]) == [mutation.LIB_VOLUME]


def test_a_sidecar_of_ours_without_restart_policy_is_made_native(
    config: config_.OperatorConfig,
) -> None:
    """Among initContainers only a native sidecar lets the pod start: ours is fixed up."""
    once = mutation.mutate(apache_app(), config=config)
    stale = copy.deepcopy(once)
    for container in _at(stale, DRIVER)["initContainers"]:
        container.pop("restartPolicy", None)
    assert mutation.mutate(stale, config=config) == once


def test_bad_annotations_are_refused_naming_the_annotation_and_the_fix(
    config: config_.OperatorConfig,
) -> None:
    app = apache_app(annotations={appmeta.MAX_RETRIES: "forever"})
    verdict = mutation.review(app, old=None, config=config, owner_id="0123")
    assert not verdict.allowed
    assert appmeta.MAX_RETRIES in verdict.message
    assert "whole number 0..20" in verdict.message
    # exactly the Kubeflow path's message: one parser, one validation
    kubeflow = spark_app(annotations={appmeta.MAX_RETRIES: "forever"})
    assert (
        verdict.message == mutation.review(kubeflow, old=None, config=config, owner_id="0").message
    )


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (
            {"sparkConf": {mutation.CONF_JOB_ID: "theirs"}},
            "spec.sparkConf[spark.sparkguard.jobId]",
        ),
        (
            {
                "driverSpec": {
                    "podTemplateSpec": {
                        "spec": {
                            "volumes": [{"name": mutation.LIB_VOLUME, "hostPath": {"path": "/x"}}]
                        }
                    }
                }
            },
            f"spec.driverSpec.podTemplateSpec.spec.volumes[{mutation.LIB_VOLUME}]",
        ),
        (
            {
                "executorSpec": {
                    "podTemplateSpec": {
                        "spec": {
                            "initContainers": [
                                {"name": mutation.LIB_INIT_NAME, "image": "someone/else"}
                            ]
                        }
                    }
                }
            },
            f"spec.executorSpec.podTemplateSpec.spec.initContainers[{mutation.LIB_INIT_NAME}]",
        ),
        (
            {
                "driverSpec": {
                    "podTemplateSpec": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "spark",
                                    "volumeMounts": [
                                        {"name": "mine", "mountPath": mutation.LIB_DIR}
                                    ],
                                }
                            ]
                        }
                    }
                }
            },
            "spec.driverSpec.podTemplateSpec.spec.containers[0].volumeMounts[mine]",
        ),
    ],
    ids=["conf", "volume", "init-image", "mount-path"],
)
def test_conflicts_are_refused_naming_the_field(
    config: config_.OperatorConfig, spec: dict[str, Any], field: str
) -> None:
    app = apache_app(annotations={appmeta.JOB_ID: "mine"})
    for key, value in spec.items():
        if key == "sparkConf":
            app["spec"]["sparkConf"].update(value)
        else:
            app["spec"][key] = value
    verdict = mutation.review(app, old=None, config=config, owner_id="0123")
    assert not verdict.allowed
    assert field in verdict.message, verdict.message


def test_apache_apps_get_the_finalizer_as_kubeflow_apps(
    config: config_.OperatorConfig,
) -> None:
    """The operator watches both kinds and handles their deletion (AppKind.finalized)."""
    verdict = mutation.review(apache_app(), old=None, config=config, owner_id="0123")
    assert verdict.allowed
    assert verdict.patch["metadata"]["finalizers"] == [finalizers.FINALIZER]
    kubeflow = mutation.review(spark_app(), old=None, config=config, owner_id="0123")
    assert kubeflow.patch["metadata"]["finalizers"] == [finalizers.FINALIZER]


def test_max_retries_and_backoff_become_the_restart_config(
    config: config_.OperatorConfig,
) -> None:
    """Where the user set no restartConfig: OnFailure, max-retries restarts, a fixed wait of
    the backoff (the Apache operator has no exponential backoff)."""
    app = apache_app(annotations={appmeta.MAX_RETRIES: "2", appmeta.BACKOFF: "1m30s"})
    mutated = mutation.mutate(app, config=config)
    assert mutated["spec"]["applicationTolerations"] == {
        "restartConfig": {
            "restartPolicy": "OnFailure",
            "maxRestartAttempts": 2,
            "restartBackoffMillis": 90_000,
        }
    }
    # the user's own restartConfig (and the rest of applicationTolerations) are kept as given
    mine = {"restartPolicy": "Never"}
    app = apache_app(applicationTolerations={"restartConfig": mine, "ttlAfterStopMillis": 5})
    mutated = mutation.mutate(app, config=config)
    assert mutated["spec"]["applicationTolerations"] == {
        "restartConfig": mine,
        "ttlAfterStopMillis": 5,
    }
    # idempotent: an UPDATE of the mutated app changes nothing
    assert mutation.build_patch(mutated, config=config) == {}


def test_a_recreation_keeps_its_owner_only_when_asked(config: config_.OperatorConfig) -> None:
    """A CREATE replaces a carried owner, unless admission found the resubmission record that
    vouches for it (keep_owner)."""
    app = _with_owner(apache_app())
    fresh = mutation.review(app, old=None, config=config, owner_id="0123")
    assert fresh.patch["metadata"]["annotations"][appmeta.OWNER_ANNOTATION] != OWNER
    kept = mutation.review(app, old=None, config=config, owner_id="0123", keep_owner=True)
    assert kept.allowed
    assert appmeta.OWNER_ANNOTATION not in kept.patch["metadata"].get("annotations", {})


def test_an_app_not_opted_in_passes_untouched(config: config_.OperatorConfig) -> None:
    app = apache_app(enabled=False)
    verdict = mutation.review(app, old=None, config=config, owner_id="0123")
    assert verdict.allowed
    assert verdict.patch == {}


# -- the mutated app against the bench CRD's v1 schema (what the apiserver would keep) ---------


def _crd_schema() -> dict[str, Any]:
    docs = list(yaml.safe_load_all(Path(bench.APACHE_SPARK_OPERATOR_CRD).read_text("utf-8")))
    (crd,) = [d for d in docs if d and d.get("kind") == "CustomResourceDefinition"]
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema: dict[str, Any] = v1["schema"]["openAPIV3Schema"]
    return schema


def _pruned(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    """The paths of ``value`` that a structural schema would prune (unknown fields), or whose
    JSON type it does not allow."""
    if schema.get("x-kubernetes-preserve-unknown-fields") or schema.get(
        "x-kubernetes-int-or-string"
    ):
        return []
    kind = schema.get("type")
    expected = {"object": dict, "array": list, "string": str, "boolean": bool}.get(str(kind))
    if kind == "integer" and not isinstance(value, int):
        return [f"{path}: not an integer"]
    if expected is not None and not isinstance(value, expected):
        return [f"{path}: not a {kind}"]
    found: list[str] = []
    if isinstance(value, dict):
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if properties is not None and key in properties:
                found += _pruned(item, properties[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                found += _pruned(item, extra, f"{path}.{key}")
            else:
                found.append(f"{path}.{key}: pruned")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += _pruned(item, schema.get("items") or {}, f"{path}[{i}]")
    return found


def test_the_mutated_app_is_kept_whole_by_the_apache_crd(config: config_.OperatorConfig) -> None:
    """Every field admission writes exists in the CRD's v1 schema with its type: nothing is
    pruned (in particular the native sidecar's restartPolicy and readinessProbe)."""
    schema = _crd_schema()
    app = _with_owner(apache_app())
    assert _pruned(app["spec"], schema["properties"]["spec"], "spec") == []
    mutated = mutation.mutate(app, config=config)
    assert _pruned(mutated["spec"], schema["properties"]["spec"], "spec") == []
    assert (
        _pruned(
            mutated["metadata"]["annotations"],
            {"type": "object", "additionalProperties": {"type": "string"}},
            "a",
        )
        == []
    )
    # the check itself notices a field the CRD does not know
    broken = copy.deepcopy(mutated)
    _at(broken, DRIVER)["initContainers"][0]["bogus"] = 1
    assert _pruned(broken["spec"], schema["properties"]["spec"], "spec") == [
        "spec.driverSpec.podTemplateSpec.spec.initContainers[0].bogus: pruned"
    ]
