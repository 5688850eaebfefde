"""The chart's webhook never blocks what sparkguard does not protect.

The chart is installed with helm on the kube-apiserver bench with ``failurePolicy: Fail`` and
no operator behind its webhook Service: exactly "the operator is down". Apps that did not opt
in, apps in namespaces the operator does not watch, the operator's own patches and metadata-only
patches (a finalizer) must all still go through; an opted-in app in a watched namespace is the
only thing refused.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sparkguard.operator import appmeta, kube
from tests.chart.operator_harness import (
    Apps,
    Release,
    eventually,
    foreign_spark_webhooks_set_aside,
    install,
    uninstall,
)
from tests.kubebench.bench import KubeBench
from tests.operator.apps import GROUP, PLURAL, VERSION, spark_app

pytestmark = pytest.mark.kube


def _labelled(name: str) -> dict[str, Any]:
    """Opted in by the label only, as a ScheduledSparkApplication's run is."""
    app = spark_app(name, enabled=False)
    app["metadata"]["labels"] = {appmeta.ENABLED_LABEL: "true"}
    return app


@pytest.fixture
def operator_down(kube_bench: KubeBench) -> Iterator[tuple[Release, str, str]]:
    """The chart installed watching one namespace, with nothing serving its webhook."""
    suffix = uuid.uuid4().hex[:6]
    watched, unwatched = f"scope-{suffix}", f"elsewhere-{suffix}"
    for namespace in (watched, unwatched):
        kube_bench.ensure_namespace(namespace)
    name = f"scope-{suffix}"
    with foreign_spark_webhooks_set_aside(kube_bench, keep=name):
        admin = kube_bench.api_client()
        try:
            # Stored before the chart exists: an opted-in app the operator will patch.
            Apps(admin, watched).create(spark_app("stored"))
        finally:
            admin.close()
        release = install(
            kube_bench,
            name=name,
            namespace=f"sparkguard-{name}",
            values={
                "operator": {"journalRoot": "s3://bucket/journal", "watchNamespaces": [watched]}
            },
        )
        try:
            assert (
                release.one("MutatingWebhookConfiguration")["webhooks"][0]["failurePolicy"]
                == "Fail"
            )
            yield release, watched, unwatched
        finally:
            uninstall(kube_bench, release)


def _refused(apps: Apps, app: dict[str, Any]) -> bool:
    try:
        apps.create(app)
    except ApiException as exc:
        return "sparkguard" in str(exc.body) and exc.status >= 400
    apps.delete(app["metadata"]["name"])
    return False


def test_operator_down_blocks_only_opted_in_apps_of_watched_namespaces(
    kube_bench: KubeBench, operator_down: tuple[Release, str, str]
) -> None:
    release, watched, unwatched = operator_down
    admin = kube_bench.api_client()
    try:
        here, there = Apps(admin, watched), Apps(admin, unwatched)
        # The webhook is in force (the apiserver's configuration cache lags a little): an
        # opted-in app of the watched namespace is refused while nothing serves the webhook.
        eventually(
            lambda: _refused(here, spark_app(f"probe-{uuid.uuid4().hex[:6]}")),
            what="the chart's webhook to refuse an opted-in app while the operator is down",
        )
        assert _refused(here, _labelled("labelled"))  # the label opts in as well

        plain = here.create(spark_app("plain", enabled=False))
        assert plain["spec"] == spark_app("plain", enabled=False)["spec"]
        opted_elsewhere = there.create(spark_app("opted-elsewhere"))
        assert "spark.sparkguard.jobId" not in opted_elsewhere["spec"]["sparkConf"]

        # A metadata-only patch (a finalizer) of an opted-in app passes, and so does its removal.
        custom = client.CustomObjectsApi(admin)
        for finalizers in (["example.com/cleanup"], None):
            custom.patch_namespaced_custom_object(
                GROUP, VERSION, watched, PLURAL, "stored", {"metadata": {"finalizers": finalizers}}
            )
        assert not here.get("stored")["metadata"].get("finalizers")
    finally:
        admin.close()

    # The operator's own patches (progress annotations, the resubmission's spec change) pass.
    sa_kubeconfig = kube_bench.service_account_kubeconfig(
        release.namespace, release.service_account
    )
    operator_api = kube.load_api_client(kubeconfig=sa_kubeconfig)
    try:
        patched = client.CustomObjectsApi(operator_api).patch_namespaced_custom_object(
            GROUP,
            VERSION,
            watched,
            PLURAL,
            "stored",
            {
                "metadata": {"annotations": {appmeta.PHASE: "Resubmitted"}},
                "spec": {"sparkConf": {"spark.sparkguard.attempt": "1"}},
            },
        )
    finally:
        operator_api.close()
    assert patched["metadata"]["annotations"][appmeta.PHASE] == "Resubmitted"
    assert patched["spec"]["sparkConf"]["spark.sparkguard.attempt"] == "1"
