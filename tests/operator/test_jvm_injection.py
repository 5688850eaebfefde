"""Admission injects the JVM layer (sparkguard's commit protocol and its jar) into opted-in apps.

Pure-function tests of :func:`mutation.mutate` / :func:`mutation.review`: on by default, the conf
is exactly what :func:`sparkconf.build_spark_conf` returns for the app (so keys added there are
injected too), the user's jars are kept, ``sparkguard.io/jvm-layer: "false"`` opts out (and takes
out what an earlier admission added), a bad value or a conflicting commit protocol is denied
naming the field and the fix, and mutating twice changes nothing.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from sparkguard.operator import appmeta, errors, mutation
from sparkguard.operator import config as config_
from sparkguard.spark_lib.spark import sparkconf
from sparkguard.spark_lib.tools import bundle
from tests.operator.apps import spark_app

PROTOCOL = "spark.sql.sources.commitProtocolClass"
JAR = "local:///opt/sparkguard/lib/sparkguard/spark_lib/jars/sparkguard-spark.jar"
OFF = {appmeta.JVM_LAYER: "false"}


def _conf(app: dict[str, Any], config: config_.OperatorConfig) -> dict[str, str]:
    conf: dict[str, str] = mutation.mutate(app, config=config)["spec"]["sparkConf"]
    return conf


def test_the_jar_is_where_the_library_init_container_puts_it() -> None:
    assert mutation.JAR_URI == JAR
    assert f"local://{mutation.LIB_DIR}/{bundle.JAR_IN_BUNDLE}" == mutation.JAR_URI


@pytest.mark.parametrize("marker_type", ["timeline-server", "direct"])
def test_on_by_default_with_the_conf_of_build_spark_conf(
    config: config_.OperatorConfig, marker_type: str
) -> None:
    app = spark_app("etl", namespace="jobs", annotations={appmeta.MARKER_TYPE: marker_type})
    created = mutation.apply_merge_patch(
        app, mutation.review(app, old=None, config=config, owner_id="a1").patch
    )
    conf = created["spec"]["sparkConf"]
    sidecar = marker_type == "timeline-server"
    expected = sparkconf.build_spark_conf(
        "jobs.etl",
        owner="k8s:jobs/etl/a1",
        markers="sidecar" if sidecar else "direct",
        endpoint="http://{driverHost}:7070" if sidecar else None,
        token_file="/var/run/sparkguard/token/token" if sidecar else None,
        journal="s3://warehouse/_journal/jobs",
        jar=JAR,
    )
    assert {k: conf[k] for k in expected} == expected  # every key, every value
    assert conf[PROTOCOL] == sparkconf.PROTOCOL_CLASS
    # Both streaming classes too: the file sink's protocol and the checkpoint manager.
    assert conf[sparkconf.STREAMING_COMMIT_PROTOCOL_KEY] == sparkconf.STREAMING_PROTOCOL_CLASS
    assert conf[sparkconf.CHECKPOINT_MANAGER_KEY] == sparkconf.CHECKPOINT_MANAGER_CLASS
    assert conf["spark.jars"] == JAR
    # The JVM protocol reads the same settings the Python writer gets (one set of keys).
    assert conf["spark.sparkguard.attempt"] == "0"
    assert conf["spark.sparkguard.markers.type"] == (
        "TIMELINE_SERVER_BASED" if sidecar else "DIRECT"
    )
    # Executors load the protocol class too (tasks deserialize it): a local:// jar must be on
    # their disk, so they mount the library volume the same way as the driver.
    spec = created["spec"]
    for role in ("driver", "executor"):
        assert {"name": "sparkguard-lib", "mountPath": mutation.LIB_DIR, "readOnly": True} in (
            spec[role]["volumeMounts"]
        )
        assert mutation.LIB_INIT_NAME in [c["name"] for c in spec[role]["initContainers"]]


def test_whatever_build_spark_conf_returns_is_injected(
    config: config_.OperatorConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key added to build_spark_conf later (e.g. the checkpoint manager) reaches every app."""
    real = sparkconf.build_spark_conf
    extra = {"spark.sql.streaming.checkpointFileManagerClass": "io.sparkguard.spark.Checkpoints"}

    def with_more(*args: Any, **kwargs: Any) -> dict[str, str]:
        return {**real(*args, **kwargs), **extra}

    monkeypatch.setattr(sparkconf, "build_spark_conf", with_more)
    conf = _conf(spark_app(), config)
    assert conf["spark.sql.streaming.checkpointFileManagerClass"] == (
        "io.sparkguard.spark.Checkpoints"
    )
    # ... and a user's other choice there is a conflict, like the commit protocol's.
    mine = spark_app(sparkConf={"spark.sql.streaming.checkpointFileManagerClass": "my.Manager"})
    with pytest.raises(errors.InvalidApplicationError) as caught:
        mutation.mutate(mine, config=config)
    assert [p.field for p in caught.value.problems] == [
        "spec.sparkConf[spark.sql.streaming.checkpointFileManagerClass]"
    ]


def test_opt_out_injects_no_jvm_layer(config: config_.OperatorConfig) -> None:
    conf = _conf(spark_app(annotations=OFF), config)
    assert PROTOCOL not in conf
    assert "spark.jars" not in conf
    assert conf["spark.sparkguard.jobId"] == "jobs.nightly"  # the Python writer keeps its conf


def test_the_cluster_default_off_leaves_unannotated_apps_out_and_annotated_ones_in(
    config: config_.OperatorConfig,
) -> None:
    """The chart's operator.jvmLayer=false (SPARKGUARD_JVM_LAYER): a rollout switch; an app's
    own annotation always wins."""
    off = dataclasses.replace(config, jvm_layer_default=False)
    assert PROTOCOL not in _conf(spark_app(), off)
    assert _conf(spark_app(annotations={appmeta.JVM_LAYER: "true"}), off)[PROTOCOL] == (
        sparkconf.PROTOCOL_CLASS
    )
    env = {"SPARKGUARD_JVM_LAYER": "false", "SPARKGUARD_WEBHOOK_MODE": "disabled"}
    assert config_.load_config(env).jvm_layer_default is False
    with pytest.raises(errors.ConfigError, match="SPARKGUARD_JVM_LAYER='maybe' must be 'true' or"):
        config_.load_config({**env, "SPARKGUARD_JVM_LAYER": "maybe"})


def test_opt_out_keeps_the_users_own_protocol_and_jars(config: config_.OperatorConfig) -> None:
    mine = {PROTOCOL: "my.Protocol", "spark.jars": "local:///opt/app/extra.jar"}
    conf = _conf(spark_app(annotations=OFF, sparkConf=dict(mine)), config)
    assert {k: conf[k] for k in mine} == mine


def test_opting_out_later_takes_out_only_what_admission_added(
    config: config_.OperatorConfig,
) -> None:
    app = spark_app(
        sparkConf={"spark.jars": "local:///opt/app/extra.jar"},
        deps={"jars": ["local:///opt/app/dep.jar"]},
    )
    stored = mutation.mutate(app, config=config)
    assert stored["spec"]["sparkConf"]["spark.jars"] == f"local:///opt/app/extra.jar,{JAR}"
    edited = copy.deepcopy(stored)
    edited["metadata"]["annotations"][appmeta.JVM_LAYER] = "false"
    verdict = mutation.review(edited, old=stored, config=config, owner_id="x")
    assert verdict.allowed, verdict.message
    out = mutation.apply_merge_patch(edited, verdict.patch)
    assert PROTOCOL not in out["spec"]["sparkConf"]
    assert out["spec"]["sparkConf"]["spark.jars"] == "local:///opt/app/extra.jar"
    assert out["spec"]["deps"]["jars"] == ["local:///opt/app/dep.jar"]
    # Opting in again brings it back.
    edited["metadata"]["annotations"][appmeta.JVM_LAYER] = "true"
    assert mutation.mutate(edited, config=config)["spec"] == stored["spec"]


@pytest.mark.parametrize(
    ("user", "merged"),
    [
        ("local:///opt/app/a.jar", f"local:///opt/app/a.jar,{JAR}"),
        ("s3a://b/a.jar, local:///opt/c.jar", f"s3a://b/a.jar, local:///opt/c.jar,{JAR}"),
        ("local:///opt/app/a.jar,", f"local:///opt/app/a.jar,{JAR}"),
        ("", JAR),
        (f"{JAR},local:///opt/app/a.jar", f"{JAR},local:///opt/app/a.jar"),  # already there
    ],
)
def test_user_spark_jars_are_kept_and_ours_appended(
    config: config_.OperatorConfig, user: str, merged: str
) -> None:
    app = spark_app(sparkConf={"spark.jars": user})
    once = mutation.mutate(app, config=config)
    assert once["spec"]["sparkConf"]["spark.jars"] == merged
    assert mutation.mutate(once, config=config) == once


def test_deps_jars_get_ours_too(config: config_.OperatorConfig) -> None:
    """spark-operator passes spec.deps.jars as --jars, which replaces spark.jars from --conf."""
    app = spark_app(deps={"jars": ["local:///opt/app/dep.jar"], "files": ["x"]})
    spec = mutation.mutate(app, config=config)["spec"]
    assert spec["deps"] == {"jars": ["local:///opt/app/dep.jar", JAR], "files": ["x"]}
    assert spec["sparkConf"]["spark.jars"] == JAR
    # No deps.jars: nothing added there (spark.jars alone reaches spark-submit).
    bare = mutation.mutate(spark_app(deps={"files": ["x"]}), config=config)["spec"]
    assert bare["deps"] == {"files": ["x"]}


def test_a_users_other_commit_protocol_is_denied_naming_the_fix(
    config: config_.OperatorConfig,
) -> None:
    app = spark_app(
        sparkConf={PROTOCOL: "org.apache.spark.internal.io.cloud.PathOutputCommitProtocol"}
    )
    verdict = mutation.review(app, old=None, config=config, owner_id="x")
    assert not verdict.allowed
    assert [p.field for p in verdict.problems] == [f"spec.sparkConf[{PROTOCOL}]"]
    assert "PathOutputCommitProtocol" in verdict.message
    assert 'sparkguard.io/jvm-layer: "false"' in verdict.message
    assert "remove the entry" in verdict.message
    # Ours, written by the user: fine.
    same = spark_app(sparkConf={PROTOCOL: sparkconf.PROTOCOL_CLASS})
    assert _conf(same, config)[PROTOCOL] == sparkconf.PROTOCOL_CLASS


@pytest.mark.parametrize("raw", ["yes", "False", "TRUE", "1", " true", ""])
def test_a_bad_jvm_layer_value_is_denied_naming_the_annotation(
    config: config_.OperatorConfig, raw: str
) -> None:
    verdict = mutation.review(
        spark_app(annotations={appmeta.JVM_LAYER: raw}), old=None, config=config, owner_id="x"
    )
    assert not verdict.allowed
    assert verdict.message.startswith(f"sparkguard: {appmeta.JVM_LAYER}: is ")
    assert verdict.patch == {}
    if raw and raw == raw.strip():
        assert '"true" or "false"' in verdict.message
    else:
        assert "without surrounding spaces" in verdict.message


@pytest.mark.parametrize(
    "app",
    [
        spark_app(),
        spark_app(annotations={appmeta.MARKER_TYPE: "direct"}),
        spark_app(annotations=OFF),
        spark_app(sparkConf={"spark.jars": "local:///opt/app/a.jar"}),
        spark_app(deps={"jars": ["local:///opt/app/dep.jar"]}),
        spark_app(annotations=OFF, sparkConf={PROTOCOL: "my.Protocol"}),
    ],
)
def test_injection_is_idempotent(config: config_.OperatorConfig, app: dict[str, Any]) -> None:
    once = mutation.mutate(app, config=config)
    assert mutation.mutate(once, config=config) == once
    assert mutation.build_patch(once, config=config) == {}
    assert mutation.apply_merge_patch(app, mutation.build_patch(app, config=config)) == once
    created = mutation.apply_merge_patch(
        app, mutation.review(app, old=None, config=config, owner_id="o").patch
    )
    again = mutation.review(created, old=created, config=config, owner_id="p")
    assert again.allowed
    assert again.patch == {}


def test_a_value_build_spark_conf_refuses_is_denied_naming_the_annotation(
    config: config_.OperatorConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No crash: the library's ConfigError becomes a denial naming what set the value."""
    from sparkguard.spark_lib.base import errors as lib_errors

    def refuse(*_: Any, **kwargs: Any) -> dict[str, str]:
        raise lib_errors.ConfigError(f"{kwargs['names']['journal']} 'x' is not valid")

    monkeypatch.setattr(sparkconf, "build_spark_conf", refuse)
    verdict = mutation.review(spark_app(), old=None, config=config, owner_id="x")
    assert not verdict.allowed
    assert verdict.message == (
        f"sparkguard: {appmeta.JVM_LAYER}: cannot be enabled: {appmeta.JOURNAL} 'x' is not valid"
    )
    # Opted out, the JVM layer's conf is never needed.
    opted_out = spark_app(annotations=OFF)
    assert mutation.review(opted_out, old=None, config=config, owner_id="x").allowed
