"""Admission refuses what the JVM layer would refuse at the first write, with its message.

The rules and their words are one file (``spark_lib/spark/first_write_rules.json``), which the
JVM layer reads from its jar (``FirstWriteRules``) and admission through
:mod:`sparkguard.spark_lib.spark.firstwrite`.
"""

from __future__ import annotations

import json

import pytest

from sparkguard.operator import appmeta, mutation
from sparkguard.operator import config as config_
from sparkguard.spark_lib.spark import firstwrite
from tests.operator.apps import apache_app, spark_app

RULES = {r["id"]: r for r in json.loads(firstwrite.RULES_FILE.read_text())["rules"]}


def _verdict(conf: dict[str, str], *, journal: str, **annotations: str) -> mutation.Review:
    config = config_.OperatorConfig(image="registry.example/sparkguard:test")
    app = spark_app(annotations={appmeta.JOURNAL: journal, **annotations})
    app["spec"]["sparkConf"].update(conf)
    return mutation.review(app, old=None, config=config, owner_id="o1")


def _expected(rule: str, *, where: str, value: str = "") -> str:
    text = str(RULES[rule]["message"])
    return text.replace("{where}", where).replace("{value}", value)


@pytest.mark.parametrize("value", ["true", " TRUE"])
def test_speculation_on_an_object_store_is_refused_with_the_jvm_layers_message(
    value: str,
) -> None:
    verdict = _verdict({"spark.speculation": value}, journal="s3://warehouse/_journal")
    assert not verdict.allowed
    (problem,) = verdict.problems
    assert problem.field == "spec.sparkConf[spark.speculation]"
    assert problem.message == _expected("speculation", where="a table on s3:// (as the journal)")
    assert "\n" not in verdict.message  # one line


def test_rerun_rewrite_on_an_object_store_and_a_bad_rerun_value_are_refused() -> None:
    rewrite = _verdict({"spark.sparkguard.rerun": "rewrite"}, journal="gs://lake/j")
    (problem,) = rewrite.problems
    assert problem.message == _expected("rerun-rewrite", where="a table on gs:// (as the journal)")
    bad = _verdict({"spark.sparkguard.rerun": "Always"}, journal="hdfs://nn/j")
    (problem,) = bad.problems
    assert problem.message == _expected("rerun-value", where="", value="always")


def test_what_rename_stores_and_the_python_writer_accept_is_admitted() -> None:
    conf = {"spark.speculation": "true", "spark.sparkguard.rerun": "rewrite"}
    assert _verdict(conf, journal="hdfs://nn/sparkguard/journal").allowed
    assert _verdict(conf, journal="/mnt/shared/journal").allowed
    # without the JVM layer nothing of Spark's own writes goes through these rules
    off = _verdict(conf, journal="s3://warehouse/j", **{appmeta.JVM_LAYER: "false"})
    assert off.allowed, off.message
    assert _verdict({"spark.speculation": "false"}, journal="s3://warehouse/j").allowed


def test_an_apache_app_is_refused_alike() -> None:
    config = config_.OperatorConfig(image="registry.example/sparkguard:test")
    app = apache_app(annotations={appmeta.JOURNAL: "s3a://warehouse/j"})
    app["spec"]["sparkConf"]["spark.speculation"] = "true"
    verdict = mutation.review(app, old=None, config=config, owner_id="o1")
    assert not verdict.allowed
    assert "spark.speculation=false" in verdict.message
