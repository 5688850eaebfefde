"""The pure parts of admission with the cluster in view (the I/O is tested on the bench)."""

from __future__ import annotations

import pytest

from sparkguard.operator import admission, appmeta, sidecarmode
from tests.operator.apps import spark_app


@pytest.mark.parametrize(
    ("major", "minor", "native"),
    [("1", "28", False), ("1", "29", True), ("1", "29+", True), ("1", "37", True), ("", "", False)],
)
def test_native_sidecars_from_kubernetes_1_29(major: str, minor: str, native: bool) -> None:
    assert sidecarmode.supports_native_sidecars(major, minor) is native


def test_effective_job_id_and_liveness() -> None:
    assert admission.effective_job_id(spark_app("etl", namespace="jobs")) == "jobs.etl"
    given = spark_app(annotations={appmeta.JOB_ID: "sales"})
    assert admission.effective_job_id(given) == "sales"
    assert admission.effective_job_id(spark_app(enabled=False)) is None
    assert admission.is_live(spark_app())
    done = spark_app(annotations={appmeta.PHASE: "Succeeded"})
    assert not admission.is_live(done)
    deleting = spark_app()
    deleting["metadata"]["deletionTimestamp"] = "2026-11-23T10:00:00Z"
    assert not admission.is_live(deleting)


async def test_apps_of_unwatched_namespaces_pass_untouched() -> None:
    from sparkguard.operator import config as config_

    config = config_.OperatorConfig(
        namespaces=("jobs",),
        webhook_mode=config_.WebhookMode.MANAGED,
        journal_root="s3://j",
        sidecar_native=True,
    )
    admit = admission.Admission(config, api_client=None)  # type: ignore[arg-type]
    verdict = await admit.review(spark_app("etl", namespace="elsewhere"), old=None)
    assert verdict.allowed
    assert verdict.patch == {}
