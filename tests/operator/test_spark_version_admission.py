"""Admission reads the app's Spark version (Kubeflow ``spec.sparkVersion``, Apache
``spec.runtimeVersions.sparkVersion``): an unsupported one is denied naming that field, the
supported lines and the fix; a supported one gets the JVM layer of its line (on Spark 4.0
without the streaming classes; an ``s3a://`` journal denied there)."""

from __future__ import annotations

from typing import Any

import pytest

from sparkguard.operator import appmeta, errors, mutation
from sparkguard.operator import config as config_
from sparkguard.spark_lib.spark import sparkconf
from tests.operator.apps import apache_app, spark_app


def _kubeflow(version: str, **notes: str) -> dict[str, Any]:
    app = spark_app("etl", annotations=notes)
    app["spec"]["sparkVersion"] = version
    return app


def _apache(version: str, **notes: str) -> dict[str, Any]:
    app = apache_app("etl", annotations=notes)
    app["spec"]["runtimeVersions"]["sparkVersion"] = version
    return app


@pytest.mark.parametrize(
    ("make", "field"),
    [(_kubeflow, "spec.sparkVersion"), (_apache, "spec.runtimeVersions.sparkVersion")],
)
def test_an_unsupported_spark_is_denied_naming_the_field(
    config: config_.OperatorConfig, make: Any, field: str
) -> None:
    with pytest.raises(errors.InvalidApplicationError) as caught:
        mutation.mutate(make("3.5.1"), config=config)
    assert [str(p) for p in caught.value.problems] == [
        f"{field}: is '3.5.1', a Spark sparkguard's JVM layer does not support (supported: "
        "Spark 4.0, 4.1, 4.2, 4.3): run the app on a supported Spark, or set "
        'sparkguard.io/jvm-layer: "false"'
    ]
    # Opted out of the JVM layer, nothing of it is injected: the app is admitted.
    mutation.mutate(make("3.5.1", **{appmeta.JVM_LAYER: "false"}), config=config)


@pytest.mark.parametrize("make", [_kubeflow, _apache])
def test_spark_4_0_gets_the_layer_without_the_streaming_classes(
    config: config_.OperatorConfig, make: Any
) -> None:
    conf = mutation.mutate(make("4.0.5"), config=config)["spec"]["sparkConf"]
    assert conf[sparkconf.COMMIT_PROTOCOL_KEY] == sparkconf.PROTOCOL_CLASS
    assert sparkconf.CHECKPOINT_MANAGER_KEY not in conf
    assert sparkconf.STREAMING_COMMIT_PROTOCOL_KEY not in conf
    newest = mutation.mutate(make("4.3.0"), config=config)["spec"]["sparkConf"]
    assert newest[sparkconf.CHECKPOINT_MANAGER_KEY] == sparkconf.CHECKPOINT_MANAGER_CLASS


def test_spark_4_0_with_an_s3a_journal_is_denied_in_one_line(
    config: config_.OperatorConfig,
) -> None:
    app = _kubeflow("4.0.5", **{appmeta.JOURNAL: "s3a://warehouse/_journal"})
    with pytest.raises(errors.InvalidApplicationError) as caught:
        mutation.mutate(app, config=config)
    (problem,) = caught.value.problems
    assert "\n" not in str(problem)
    assert "needs Spark 4.1 or newer" in str(problem)
    assert "Python writer" in str(problem)
