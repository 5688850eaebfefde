"""The bench's CRD of the Apache Spark Kubernetes Operator (spark.apache.org/v1): the file is
what its generator writes, and it declares the fields tests/e2e/apache-model.md says sparkguard
touches. No bench: the file is only parsed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.kubebench import bench
from tests.kubebench.crds import generate_apache


def _crd() -> dict[str, Any]:
    docs = list(yaml.safe_load_all(Path(bench.APACHE_SPARK_OPERATOR_CRD).read_text("utf-8")))
    assert len(docs) == 1, f"expected one CRD document, found {len(docs)}"
    crd: dict[str, Any] = docs[0]
    return crd


def _at(schema: dict[str, Any], *path: str) -> dict[str, Any]:
    """The schema at ``path`` ("[]" steps into array items), failing with the path walked."""
    node = schema
    walked: list[str] = []
    for step in path:
        walked.append(step)
        node = node["items"] if step == "[]" else node.get("properties", {}).get(step)
        assert isinstance(node, dict), f"the CRD has no {'.'.join(walked)}"
    return node


def _v1_schema() -> dict[str, Any]:
    (v1,) = [v for v in _crd()["spec"]["versions"] if v["name"] == "v1"]
    schema: dict[str, Any] = v1["schema"]["openAPIV3Schema"]
    return schema


def test_the_file_is_what_the_generator_writes() -> None:
    text = Path(bench.APACHE_SPARK_OPERATOR_CRD).read_text(encoding="utf-8")
    assert text == generate_apache.render(), (
        f"{bench.APACHE_SPARK_OPERATOR_CRD} is stale: run tests/kubebench/crds/generate_apache.py"
    )
    assert generate_apache.SOURCE.split("@")[1] in text.split("---")[0], "header lacks the commit"


def test_group_kind_and_v1_served_as_storage() -> None:
    crd = _crd()
    assert crd["metadata"]["name"] == "sparkapplications.spark.apache.org"
    assert crd["spec"]["group"] == "spark.apache.org"
    assert crd["spec"]["names"]["kind"] == "SparkApplication"
    assert crd["spec"]["scope"] == "Namespaced"
    versions = {v["name"]: v for v in crd["spec"]["versions"]}
    assert versions["v1"]["served"] is True
    assert versions["v1"]["storage"] is True
    assert [name for name, v in versions.items() if v["storage"]] == ["v1"]
    assert versions["v1"]["subresources"] == {"status": {}}


def test_the_fields_sparkguard_writes_are_declared() -> None:
    spec = _at(_v1_schema(), "spec")
    assert _at(spec, "sparkConf")["additionalProperties"] == {"type": "string"}
    for side in ("driverSpec", "executorSpec"):
        pod = _at(spec, side, "podTemplateSpec", "spec")
        for kind in ("initContainers", "containers"):
            container = _at(pod, kind, "[]")
            # a native sidecar is an initContainer with restartPolicy Always: it must survive
            assert _at(container, "restartPolicy") == {"type": "string"}
            for field in ("name", "image", "command", "args", "env", "volumeMounts"):
                _at(container, field)
        for field in ("emptyDir", "secret", "configMap", "persistentVolumeClaim"):
            _at(pod, "volumes", "[]", field)
        _at(pod, "shareProcessNamespace")
        _at(spec, side, "podTemplateSpec", "metadata", "annotations")


def test_restart_config_and_tolerations_as_upstream_v1_has_them() -> None:
    tolerations = _at(_v1_schema(), "spec", "applicationTolerations")
    restart = _at(tolerations, "restartConfig")
    assert _at(restart, "restartPolicy")["enum"] == [
        "Always",
        "Never",
        "OnFailure",
        "OnInfrastructureFailure",
    ]
    for field in (
        "maxRestartAttempts",
        "maxRestartOnFailure",
        "maxRestartOnSchedulingFailure",
        "restartBackoffMillis",
        "restartBackoffMillisForFailure",
        "restartBackoffMillisForSchedulingFailure",
    ):
        assert _at(restart, field) == {"type": "integer"}, field
    # @Default("-1") in RestartConfig / ApplicationTolerations: the apiserver fills these in
    assert _at(restart, "restartCounterResetMillis")["default"] == -1
    assert _at(tolerations, "ttlAfterStopMillis")["default"] == -1
    assert _at(tolerations, "resourceRetainDurationMillis")["default"] == -1
    assert _at(tolerations, "resourceRetainPolicy")["enum"] == ["Always", "Never", "OnFailure"]


def test_the_status_sparkguard_reads_is_declared() -> None:
    status = _at(_v1_schema(), "status")
    assert _at(status, "currentState", "currentStateSummary") == {"type": "string"}
    history = _at(status, "stateTransitionHistory")
    assert _at(history["additionalProperties"], "lastTransitionTime") == {"type": "string"}
    for summary in ("currentAttemptSummary", "previousAttemptSummary"):
        info = _at(status, summary, "attemptInfo")
        for field in ("id", "restartCounter", "failureRestartCounter"):
            assert _at(info, field) == {"type": "integer"}, f"{summary}.attemptInfo.{field}"
    assert "x-kubernetes-preserve-unknown-fields" not in yaml.safe_dump(_crd())
