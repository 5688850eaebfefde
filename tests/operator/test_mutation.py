"""Admission mutation: what is added, idempotence, respect for user fields, conflicts."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from sparkguard.operator import appmeta, errors, finalizers, mutation, podsecurity
from sparkguard.operator import config as config_
from tests.operator.apps import apache_app, spark_app

IMAGE = "registry.example/sparkguard:test"


def _named(items: list[dict[str, Any]], name: str) -> dict[str, Any]:
    found = [i for i in items if i.get("name") == name]
    assert len(found) == 1, f"expected one {name!r} in {items}"
    return found[0]


def test_unannotated_app_is_untouched(config: config_.OperatorConfig) -> None:
    app = spark_app(enabled=False)
    assert mutation.build_patch(app, config=config) == {}
    assert mutation.mutate(app, config=config) == app


def test_opted_in_app_gets_everything(config: config_.OperatorConfig) -> None:
    app = spark_app("nightly", namespace="jobs", annotations={appmeta.STORAGE_SECRET: "s3"})
    out = mutation.mutate(app, config=config)
    spec = out["spec"]
    assert spec["sparkConf"] == {
        "spark.sql.shuffle.partitions": "4",
        "spark.sparkguard.jobId": "jobs.nightly",
        "spark.sparkguard.attempt": "0",
        "spark.sparkguard.markers.type": "TIMELINE_SERVER_BASED",
        "spark.sparkguard.markers.endpoint": "http://{driverHost}:7070",
        "spark.sparkguard.markers.tokenFile": "/var/run/sparkguard/token/token",
        "spark.sparkguard.journal": "s3://warehouse/_journal/jobs",
        # the JVM layer (tests/operator/test_jvm_injection.py)
        "spark.sql.sources.commitProtocolClass": "io.sparkguard.spark.SparkguardCommitProtocol",
        "spark.sql.streaming.checkpointFileManagerClass": (
            "io.sparkguard.spark.SparkguardCheckpointFileManager"
        ),
        "spark.sql.streaming.commitProtocolClass": (
            "io.sparkguard.spark.SparkguardStreamingCommitProtocol"
        ),
        "spark.jars": "local:///opt/sparkguard/lib/sparkguard/spark_lib/jars/sparkguard-spark.jar",
        # the tasks' data files through the owned filesystems (spark_lib/jvm/README.md)
        "spark.hadoop.fs.sg-s3a.impl": "io.sparkguard.spark.OwnedFileSystem",
        "spark.hadoop.fs.sg-file.impl": "io.sparkguard.spark.OwnedLocalFileSystem",
        "spark.hadoop.fs.sg-hdfs.impl": "io.sparkguard.spark.OwnedHdfsFileSystem",
    }
    assert out["metadata"]["annotations"][appmeta.JOB_ID] == "jobs.nightly"

    sidecar = _named(spec["driver"]["sidecars"], mutation.SIDECAR_NAME)
    assert sidecar["image"] == IMAGE
    assert sidecar["command"][:2] == ["sparkguard", "sidecar"]
    assert "--token-file" in sidecar["command"]
    assert sidecar["ports"] == [{"name": "markers", "containerPort": 7070, "protocol": "TCP"}]
    assert sidecar["resources"] == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"memory": "256Mi"},
    }
    assert sidecar["envFrom"] == [{"secretRef": {"name": "s3"}}]

    for role in ("driver", "executor"):
        pod = spec[role]
        lib = _named(pod["initContainers"], mutation.LIB_INIT_NAME)
        assert lib["command"] == ["sparkguard", "bundle", "--dest", "/opt/sparkguard/lib"]
        assert {"name": "sparkguard-lib", "mountPath": "/opt/sparkguard/lib", "readOnly": True} in (
            pod["volumeMounts"]
        )
        assert _named(pod["env"], "PYTHONPATH")["value"] == "/opt/sparkguard/lib"
    rollback = _named(spec["driver"]["initContainers"], mutation.ROLLBACK_INIT_NAME)
    assert rollback["command"] == [
        "sparkguard",
        "rollback",
        "--job-id",
        "jobs.nightly",
        "--journal",
        "s3://warehouse/_journal/jobs",
        "--allow-missing-journal",
    ]
    assert rollback["envFrom"] == [{"secretRef": {"name": "s3"}}]
    assert "rollback" not in str(spec["executor"]["initContainers"])
    assert _named(spec["volumes"], mutation.LIB_VOLUME) == {
        "name": "sparkguard-lib",
        "emptyDir": {},
    }
    assert _named(spec["volumes"], mutation.TOKEN_VOLUME) == mutation.build_token_volume(config)
    assert app["spec"]["sparkConf"] == {"spark.sql.shuffle.partitions": "4"}  # input untouched


def test_direct_markers_need_no_sidecar(config: config_.OperatorConfig) -> None:
    app = spark_app(annotations={appmeta.MARKER_TYPE: "direct"})
    spec = mutation.mutate(app, config=config)["spec"]
    assert "sidecars" not in spec["driver"]
    assert spec["sparkConf"]["spark.sparkguard.markers.type"] == "DIRECT"
    assert "spark.sparkguard.markers.endpoint" not in spec["sparkConf"]
    assert [v["name"] for v in spec["volumes"]] == ["sparkguard-lib"]


@pytest.mark.parametrize(
    "app",
    [
        spark_app(),
        spark_app(annotations={appmeta.MARKER_TYPE: "direct", appmeta.STORAGE_SECRET: "s"}),
        spark_app(driver={"env": [{"name": "PYTHONPATH", "value": "/app"}]}),
        spark_app(executor={"envVars": {"PYTHONPATH": "/x"}}),
    ],
)
def test_mutation_is_idempotent(config: config_.OperatorConfig, app: dict[str, Any]) -> None:
    once = mutation.mutate(app, config=config)
    assert mutation.mutate(once, config=config) == once
    assert mutation.build_patch(once, config=config) == {}
    assert mutation.apply_merge_patch(app, mutation.build_patch(app, config=config)) == once


def test_patch_only_adds(config: config_.OperatorConfig) -> None:
    patch = mutation.build_patch(spark_app(), config=config)
    assert set(patch) == {"metadata", "spec"}
    assert "spark.sql.shuffle.partitions" not in patch["spec"]["sparkConf"]
    assert "None" not in repr(patch)  # nothing is removed


def test_user_fields_are_respected(config: config_.OperatorConfig) -> None:
    user_sidecar = {"name": "logs", "image": "fluent-bit"}
    user_init = {"name": "warmup", "image": "busybox"}
    app = spark_app(
        driver={
            "sidecars": [user_sidecar],
            "initContainers": [user_init],
            "env": [{"name": "PYTHONPATH", "value": "/app:/deps"}, {"name": "A", "value": "1"}],
        },
        executor={"envVars": {"PYTHONPATH": "/deps"}},
        sparkConf={
            "spark.sparkguard.markers.endpoint": "http://custom:1234",
            "spark.sparkguard.attempt": "2",
        },
    )
    spec = mutation.mutate(app, config=config)["spec"]
    assert spec["driver"]["sidecars"][0] == user_sidecar
    assert spec["driver"]["initContainers"][0] == user_init
    assert _named(spec["driver"]["env"], "PYTHONPATH")["value"] == "/app:/deps:/opt/sparkguard/lib"
    assert spec["executor"]["envVars"]["PYTHONPATH"] == "/deps:/opt/sparkguard/lib"
    assert "env" not in spec["executor"] or not any(
        e["name"] == "PYTHONPATH" for e in spec["executor"]["env"]
    )
    assert spec["sparkConf"]["spark.sparkguard.markers.endpoint"] == "http://custom:1234"
    assert spec["sparkConf"]["spark.sparkguard.attempt"] == "2"


def test_our_sidecar_with_the_same_image_is_kept_as_the_user_tuned_it(
    config: config_.OperatorConfig,
) -> None:
    tuned = {
        "name": mutation.SIDECAR_NAME,
        "image": IMAGE,
        "resources": {"limits": {"cpu": "2"}},
        "securityContext": {"readOnlyRootFilesystem": False, "runAsUser": 1000},
    }
    app = spark_app(driver={"sidecars": [tuned]})
    (kept,) = mutation.mutate(app, config=config)["spec"]["driver"]["sidecars"]
    # every value the user set stays; what they left out of the hardening is filled in
    assert {k: kept[k] for k in ("name", "image", "resources")} == {
        k: tuned[k] for k in ("name", "image", "resources")
    }
    assert kept["securityContext"] == {
        **podsecurity.restricted(),
        "readOnlyRootFilesystem": False,
        "runAsUser": 1000,
    }
    assert kept["env"] == [dict(e) for e in mutation.INJECTED_ENV]
    assert dict(mutation.TMP_MOUNT) in kept["volumeMounts"]


@pytest.mark.parametrize(
    ("spec_extra", "field", "hint"),
    [
        (
            {"sparkConf": {"spark.sparkguard.jobId": "other"}},
            "spec.sparkConf[spark.sparkguard.jobId]",
            "sparkguard.io/job-id",
        ),
        (
            {"sparkConf": {"spark.sparkguard.markers.type": "DIRECT"}},
            "spec.sparkConf[spark.sparkguard.markers.type]",
            "sparkguard.io/marker-type",
        ),
        (
            {"sparkConf": {"spark.sparkguard.journal": "s3://elsewhere"}},
            "spec.sparkConf[spark.sparkguard.journal]",
            "sparkguard.io/journal",
        ),
        (
            {"sparkConf": {"spark.sparkguard.attempt": "first"}},
            "spec.sparkConf[spark.sparkguard.attempt]",
            "remove it",
        ),
        (
            {"driver": {"sidecars": [{"name": "sparkguard-markers", "image": "mine:1"}]}},
            "spec.driver.sidecars[sparkguard-markers]",
            "rename your container",
        ),
        (
            {"executor": {"initContainers": [{"name": "sparkguard-lib", "image": "mine:1"}]}},
            "spec.executor.initContainers[sparkguard-lib]",
            "rename your container",
        ),
        (
            {"volumes": [{"name": "sparkguard-lib", "hostPath": {"path": "/lib"}}]},
            "spec.volumes[sparkguard-lib]",
            "rename your volume",
        ),
        (
            {"driver": {"volumeMounts": [{"name": "data", "mountPath": "/opt/sparkguard/lib"}]}},
            "spec.driver.volumeMounts[data]",
            "remove your mount",
        ),
        (
            {"driver": {"env": [{"name": "PYTHONPATH", "valueFrom": {"configMapKeyRef": {}}}]}},
            "spec.driver.env[PYTHONPATH]",
            "write it as a value",
        ),
    ],
)
def test_conflicts_are_rejected_naming_the_field(
    config: config_.OperatorConfig, spec_extra: dict[str, Any], field: str, hint: str
) -> None:
    app = spark_app(**spec_extra)
    if "sparkConf" in spec_extra:
        app["spec"]["sparkConf"] = spec_extra["sparkConf"]
    with pytest.raises(errors.InvalidApplicationError) as caught:
        mutation.mutate(app, config=config)
    assert [p.field for p in caught.value.problems] == [field]
    assert hint in str(caught.value)


def test_job_id_annotation_matching_the_conf_is_fine(config: config_.OperatorConfig) -> None:
    app = spark_app(
        annotations={appmeta.JOB_ID: "sales"}, sparkConf={"spark.sparkguard.jobId": "sales"}
    )
    assert mutation.mutate(app, config=config)["spec"]["sparkConf"]["spark.sparkguard.jobId"] == (
        "sales"
    )


def test_review_denies_bad_annotations_on_create(config: config_.OperatorConfig) -> None:
    verdict = mutation.review(
        spark_app(annotations={appmeta.MAX_RETRIES: "ten"}), old=None, config=config, owner_id="x"
    )
    assert not verdict.allowed
    assert verdict.message.startswith("sparkguard: sparkguard.io/max-retries: ")
    assert verdict.patch == {}


def test_review_allows_updates_of_an_app_stored_invalid(config: config_.OperatorConfig) -> None:
    stored = spark_app(annotations={appmeta.MAX_RETRIES: "ten"})
    edited = copy.deepcopy(stored)
    edited["metadata"]["annotations"][appmeta.PHASE] = "Invalid"
    verdict = mutation.review(edited, old=stored, config=config, owner_id="x")
    assert verdict.allowed
    assert verdict.patch == {}
    assert verdict.problems


def test_review_denies_an_update_that_introduces_a_bad_annotation(
    config: config_.OperatorConfig,
) -> None:
    stored = mutation.mutate(spark_app(), config=config)
    edited = copy.deepcopy(stored)
    edited["metadata"]["annotations"][appmeta.MARKER_TYPE] = "carrier-pigeon"
    verdict = mutation.review(edited, old=stored, config=config, owner_id="x")
    assert not verdict.allowed
    assert appmeta.MARKER_TYPE in verdict.message


def test_review_of_the_operators_own_resubmission_adds_nothing(
    config: config_.OperatorConfig,
) -> None:
    stored = mutation.mutate(spark_app(), config=config)
    stored["metadata"]["finalizers"] = [finalizers.FINALIZER]  # as admission stored it
    bumped = copy.deepcopy(stored)
    bumped["spec"]["sparkConf"]["spark.sparkguard.attempt"] = "1"
    verdict = mutation.review(bumped, old=stored, config=config, owner_id="x")
    assert verdict.allowed
    assert verdict.patch == {}


def test_merge_diff_round_trips() -> None:
    old = {"a": {"b": 1, "c": [1]}, "d": 2}
    new = {"a": {"b": 1, "c": [1, 2]}, "e": 3}
    patch = mutation.merge_diff(old, new)
    assert patch == {"a": {"c": [1, 2]}, "d": None, "e": 3}
    assert mutation.apply_merge_patch(old, patch) == new


def _admitted(app: dict[str, Any], verdict: mutation.Review) -> dict[str, Any]:
    assert verdict.allowed, verdict.message
    return mutation.apply_merge_patch(app, verdict.patch)


def test_create_writes_a_fresh_owner_into_annotation_conf_and_rollback(
    config: config_.OperatorConfig,
) -> None:
    app = spark_app("etl", namespace="jobs")
    created = _admitted(app, mutation.review(app, old=None, config=config, owner_id="a1b2"))
    owner = "k8s:jobs/etl/a1b2"
    assert appmeta.storage_owner(created["metadata"]) == owner
    assert created["spec"]["sparkConf"]["spark.sparkguard.owner"] == owner
    rollback = _named(created["spec"]["driver"]["initContainers"], mutation.ROLLBACK_INIT_NAME)
    assert rollback["command"][-2:] == ["--owner", owner]
    # A recreated app (same name) is another owner.
    again = _admitted(app, mutation.review(app, old=None, config=config, owner_id="c3d4"))
    assert appmeta.storage_owner(again["metadata"]) == "k8s:jobs/etl/c3d4"


def test_a_copied_manifest_gets_its_own_owner(config: config_.OperatorConfig) -> None:
    original = spark_app("etl", namespace="jobs")
    stored = _admitted(
        original, mutation.review(original, old=None, config=config, owner_id="aaaa")
    )
    copy_ = copy.deepcopy(stored)
    copy_["metadata"]["name"] = "etl-copy"
    del copy_["metadata"]["annotations"][appmeta.JOB_ID]
    del copy_["spec"]["sparkConf"]["spark.sparkguard.jobId"]
    verdict = mutation.review(copy_, old=None, config=config, owner_id="bbbb")
    created = _admitted(copy_, verdict)
    assert appmeta.OWNER_ANNOTATION in verdict.message  # a warning says it was replaced
    owner = "k8s:jobs/etl-copy/bbbb"
    assert appmeta.storage_owner(created["metadata"]) == owner
    assert created["spec"]["sparkConf"]["spark.sparkguard.owner"] == owner
    rollback = _named(created["spec"]["driver"]["initContainers"], mutation.ROLLBACK_INIT_NAME)
    assert rollback["command"][rollback["command"].index("--job-id") + 1] == "jobs.etl-copy"
    assert rollback["command"][-1] == owner


def test_the_owner_is_immutable_on_update(config: config_.OperatorConfig) -> None:
    app = spark_app("etl", namespace="jobs")
    stored = _admitted(app, mutation.review(app, old=None, config=config, owner_id="aaaa"))
    # Dropped (a replace from the original manifest): restored.
    dropped = copy.deepcopy(stored)
    del dropped["metadata"]["annotations"][appmeta.OWNER_ANNOTATION]
    restored = _admitted(
        dropped, mutation.review(dropped, old=stored, config=config, owner_id="zzzz")
    )
    assert appmeta.storage_owner(restored["metadata"]) == "k8s:jobs/etl/aaaa"
    # Changed: denied, naming the annotation.
    changed = copy.deepcopy(stored)
    changed["metadata"]["annotations"][appmeta.OWNER_ANNOTATION] = "k8s:jobs/etl/other"
    verdict = mutation.review(changed, old=stored, config=config, owner_id="zzzz")
    assert not verdict.allowed
    assert verdict.message.startswith(f"sparkguard: {appmeta.OWNER_ANNOTATION}: ")
    # Unchanged: nothing to do.
    same = mutation.review(stored, old=stored, config=config, owner_id="zzzz")
    assert same.allowed
    assert same.patch == {}
    # Added to an app that never had one (stored while the webhook was down): denied.
    legacy = mutation.mutate(app, config=config)
    added = copy.deepcopy(legacy)
    added["metadata"]["annotations"][appmeta.OWNER_ANNOTATION] = "k8s:jobs/etl/mine"
    assert not mutation.review(added, old=legacy, config=config, owner_id="z").allowed


def test_native_sidecar_is_an_init_container_that_restarts_always(
    config: config_.OperatorConfig,
) -> None:
    app = spark_app()
    spec = mutation.mutate(app, config=config, native_sidecar=True)["spec"]
    assert "sidecars" not in spec["driver"]
    names = [c["name"] for c in spec["driver"]["initContainers"]]
    assert names == [mutation.LIB_INIT_NAME, mutation.ROLLBACK_INIT_NAME, mutation.SIDECAR_NAME]
    sidecar = spec["driver"]["initContainers"][-1]
    assert sidecar["restartPolicy"] == "Always"
    # no startup probe: the driver starts beside it (its marker clients retry a refused
    # connection); readiness is what the probe reports
    assert "startupProbe" not in sidecar
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 7070}
    # Idempotent, and an app mutated before (regular sidecar) keeps it where it is.
    once = mutation.mutate(app, config=config, native_sidecar=True)
    assert mutation.mutate(once, config=config, native_sidecar=True) == once
    legacy = mutation.mutate(app, config=config, native_sidecar=False)
    assert mutation.build_patch(legacy, config=config, native_sidecar=True) == {}


def test_regular_sidecar_ends_with_the_driver_through_a_shared_process_namespace(
    config: config_.OperatorConfig,
) -> None:
    """Kubernetes < 1.29: the sidecar watches for the driver JVM and exits when it is gone."""
    app = spark_app()
    driver = mutation.mutate(app, config=config, native_sidecar=False)["spec"]["driver"]
    assert driver["shareProcessNamespace"] is True
    sidecar = _named(driver["sidecars"], mutation.SIDECAR_NAME)
    assert sidecar["command"][-2:] == ["--exit-with-process", "org.apache.spark.deploy.SparkSubmit"]
    assert "restartPolicy" not in sidecar
    # A native sidecar needs neither: the kubelet stops it.
    native = mutation.mutate(app, config=config, native_sidecar=True)["spec"]["driver"]
    assert "shareProcessNamespace" not in native
    assert (
        "--exit-with-process"
        not in _named(native["initContainers"], mutation.SIDECAR_NAME)["command"]
    )
    # Direct markers have no sidecar, so nothing to share.
    direct = spark_app(annotations={appmeta.MARKER_TYPE: "direct"})
    assert "shareProcessNamespace" not in mutation.mutate(direct, config=config)["spec"]["driver"]
    # Idempotent; the user's own true is kept, a false is denied naming the field.
    once = mutation.mutate(app, config=config)
    assert mutation.build_patch(once, config=config) == {}
    kept = spark_app(driver={"shareProcessNamespace": True})
    assert mutation.mutate(kept, config=config)["spec"]["driver"]["shareProcessNamespace"] is True
    with pytest.raises(errors.InvalidApplicationError) as caught:
        mutation.mutate(spark_app(driver={"shareProcessNamespace": False}), config=config)
    assert "spec.driver.shareProcessNamespace: is False" in str(caught.value)


def test_scheduled_runs_opt_in_by_label_each_with_its_own_job_id_and_owner(
    config: config_.OperatorConfig,
) -> None:
    """A ScheduledSparkApplication's run: its labels plus scheduled-app-name, no annotations."""
    runs = []
    for stamp, unique in (("1763900000000000000", "r1"), ("1763900060000000000", "r2")):
        run = spark_app(f"nightly-{stamp}", namespace="jobs", enabled=False)
        del run["metadata"]["annotations"]
        run["metadata"]["labels"] = {
            appmeta.ENABLED_LABEL: "true",
            "sparkoperator.k8s.io/scheduled-app-name": "nightly",
        }
        runs.append(_admitted(run, mutation.review(run, old=None, config=config, owner_id=unique)))
    job_ids = [r["spec"]["sparkConf"]["spark.sparkguard.jobId"] for r in runs]
    owners = [appmeta.storage_owner(r["metadata"]) for r in runs]
    assert job_ids == ["jobs.nightly-1763900000000000000", "jobs.nightly-1763900060000000000"]
    assert owners == [
        "k8s:jobs/nightly-1763900000000000000/r1",
        "k8s:jobs/nightly-1763900060000000000/r2",
    ]
    assert all(mutation.ROLLBACK_INIT_NAME in str(r["spec"]["driver"]) for r in runs)


def test_the_job_id_label_is_ours(config: config_.OperatorConfig) -> None:
    app = spark_app("etl", namespace="jobs")
    app["metadata"]["labels"] = {appmeta.JOB_ID_LABEL: "forged", "team": "data"}
    labels = mutation.mutate(app, config=config)["metadata"]["labels"]
    assert labels == {appmeta.JOB_ID_LABEL: appmeta.job_id_label("jobs.etl"), "team": "data"}
    assert len(labels[appmeta.JOB_ID_LABEL]) <= 63


#: a table (or the journal) on a volume of the app's own, mounted into the driver container
DATA_MOUNT = {"name": "warehouse", "mountPath": "/data"}


@pytest.mark.parametrize("native", [True, False])
def test_the_rollback_and_the_sidecar_see_the_drivers_own_volumes(
    config: config_.OperatorConfig, native: bool
) -> None:
    """In a pod each container sees only what is mounted into it: a table on a volume of the
    app (a PersistentVolumeClaim) must be where the rollback initContainer and the marker
    sidecar look, or the rollback finds no journal and undoes nothing (seen on a real kubelet).
    sparkguard's own mounts are not copied, and a path they take is not mounted twice."""
    tmp_mount = {"name": "scratch", "mountPath": mutation.TMP_DIR}
    app = spark_app(driver={"volumeMounts": [DATA_MOUNT, tmp_mount]})
    once = mutation.mutate(app, config=config, native_sidecar=native)
    driver = once["spec"]["driver"]
    sidecar = _named(driver["initContainers" if native else "sidecars"], mutation.SIDECAR_NAME)
    for container in (_named(driver["initContainers"], mutation.ROLLBACK_INIT_NAME), sidecar):
        mounts = container["volumeMounts"]
        assert DATA_MOUNT in mounts
        paths = [m["mountPath"] for m in mounts]
        assert len(paths) == len(set(paths)), paths
        assert mutation.LIB_DIR not in paths
    # the executors' library initContainer copies the bundle only: no data volume
    lib = _named(once["spec"]["executor"]["initContainers"], mutation.LIB_INIT_NAME)
    assert DATA_MOUNT not in lib["volumeMounts"]
    assert mutation.mutate(once, config=config, native_sidecar=native) == once


def test_an_apache_apps_rollback_and_sidecar_see_its_spark_containers_volumes(
    config: config_.OperatorConfig,
) -> None:
    template = {"spec": {"containers": [{"name": "spark", "volumeMounts": [DATA_MOUNT]}]}}
    app = apache_app(driverSpec={"podTemplateSpec": template})
    once = mutation.mutate(app, config=config)
    inits = once["spec"]["driverSpec"]["podTemplateSpec"]["spec"]["initContainers"]
    for name in (mutation.ROLLBACK_INIT_NAME, mutation.SIDECAR_NAME):
        assert DATA_MOUNT in _named(inits, name)["volumeMounts"], name
    assert mutation.mutate(once, config=config) == once
