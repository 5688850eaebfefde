"""SparkApplication bodies for the operator's tests (plain dicts, as the API returns them)."""

from __future__ import annotations

import copy
from typing import Any

from sparkguard.operator import appmeta

GROUP, VERSION, PLURAL = "sparkoperator.k8s.io", "v1beta2", "sparkapplications"


def spark_app(
    name: str = "nightly",
    *,
    namespace: str = "jobs",
    annotations: dict[str, str] | None = None,
    enabled: bool = True,
    state: str | None = None,
    status: dict[str, Any] | None = None,
    **spec_extra: Any,
) -> dict[str, Any]:
    """A minimal valid SparkApplication; opted in unless ``enabled=False``."""
    notes = {appmeta.ENABLED: "true"} if enabled else {}
    notes.update(annotations or {})
    app: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SparkApplication",
        "metadata": {"name": name, "namespace": namespace, "annotations": notes},
        "spec": {
            "type": "Python",
            "mode": "cluster",
            "image": "spark:4.0.0-python3",
            "mainApplicationFile": "local:///opt/app/job.py",
            "sparkVersion": "4.3.0",
            "sparkConf": {"spark.sql.shuffle.partitions": "4"},
            "driver": {"cores": 1, "memory": "512m", "serviceAccount": "spark"},
            "executor": {"cores": 1, "instances": 2, "memory": "512m"},
            **copy.deepcopy(spec_extra),
        },
    }
    if state is not None or status is not None:
        app["status"] = {**(status or {})}
        if state is not None:
            app["status"]["applicationState"] = {"state": state}
    return app


APACHE_GROUP, APACHE_VERSION = "spark.apache.org", "v1"


def apache_app(
    name: str = "nightly",
    *,
    namespace: str = "jobs",
    annotations: dict[str, str] | None = None,
    enabled: bool = True,
    **spec_extra: Any,
) -> dict[str, Any]:
    """A minimal valid Apache Spark operator SparkApplication (``spark.apache.org/v1``), a
    PySpark app without pod templates; opted in unless ``enabled=False``."""
    notes = {appmeta.ENABLED: "true"} if enabled else {}
    notes.update(annotations or {})
    return {
        "apiVersion": f"{APACHE_GROUP}/{APACHE_VERSION}",
        "kind": "SparkApplication",
        "metadata": {"name": name, "namespace": namespace, "annotations": notes},
        "spec": {
            "pyFiles": "local:///opt/app/job.py",
            "runtimeVersions": {"sparkVersion": "4.3.0"},
            "sparkConf": {
                "spark.kubernetes.container.image": "spark:4.0.0-python3",
                "spark.sql.shuffle.partitions": "4",
            },
            **copy.deepcopy(spec_extra),
        },
    }


def failed_status(
    *, state: str = "FAILED", submission: str = "sub-1", terminated: str = "2026-11-22T10:00:00Z"
) -> dict[str, Any]:
    """A terminal status as spark-operator writes it."""
    return {
        "applicationState": {"state": state, "errorMessage": "driver exited with code 1"},
        "submissionID": submission,
        "sparkApplicationId": f"spark-{submission}",
        "submissionAttempts": 1,
        "executionAttempts": 1,
        "lastSubmissionAttemptTime": "2026-11-22T09:00:00Z",
        "terminationTime": terminated,
    }
