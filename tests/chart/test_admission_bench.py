"""Admission on the kube-apiserver bench, through the chart's webhook configuration.

The chart is installed with helm watching two namespaces; its operator runs in-process as the
chart's ServiceAccount with the Deployment's environment, and the chart's webhook configuration
(namespaceSelector, matchConditions) is re-pointed at it on 127.0.0.1. Shown here: a job id
that another live app uses is denied naming that app; runs of a
ScheduledSparkApplication, which carry its labels but no annotations, are opted in, each with
its own job id and owner, and recovered; the owner written at CREATE is immutable.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sparkguard.operator import appmeta, finalizers, mutation
from sparkguard.operator import config as config_
from tests.chart.operator_harness import (
    Apps,
    bench_webhook_configuration,
    eventually,
    foreign_spark_webhooks_set_aside,
    free_port,
    install,
    operator_as,
    operator_env_on_bench,
    uninstall,
)
from tests.kubebench.bench import APACHE_SPARK_OPERATOR_CRD, KubeBench
from tests.operator.apps import GROUP, PLURAL, VERSION, apache_app, failed_status, spark_app
from tests.operator.kmocking import FakeRollback

pytestmark = pytest.mark.kube
SCHEDULED_APP_LABEL = "sparkoperator.k8s.io/scheduled-app-name"


@dataclasses.dataclass
class Bench:
    first: Apps
    second: Apps
    rollback: FakeRollback
    #: the operator's settings (what the chart's Deployment gives it)
    config: config_.OperatorConfig


@pytest.fixture(scope="module")
def bench(kube_bench: KubeBench) -> Iterator[Bench]:
    suffix = uuid.uuid4().hex[:6]
    first, second = f"adm-a-{suffix}", f"adm-b-{suffix}"
    for namespace in (first, second):
        kube_bench.ensure_namespace(namespace)
    name = f"adm-{suffix}"
    # The Apache operator's CRD, before the operator starts (kopf resolves its webhook's
    # resource at startup): its apps are admitted through the second webhook of the chart.
    kube_bench.apply_manifest(APACHE_SPARK_OPERATOR_CRD.read_text(encoding="utf-8"))
    kube_bench.wait_for_crd(mutation.APACHE.crd_name)
    release = install(
        kube_bench,
        name=name,
        namespace=f"sparkguard-{name}",
        values={
            "operator": {"journalRoot": "s3://bucket/journal", "watchNamespaces": [first, second]}
        },
    )
    admin = kube_bench.api_client()
    admission = client.AdmissionregistrationV1Api(admin)
    chart_hook = release.one("MutatingWebhookConfiguration")
    bench_hook = f"{chart_hook['metadata']['name']}.bench"
    try:
        with foreign_spark_webhooks_set_aside(kube_bench, keep=name):
            admission.delete_mutating_webhook_configuration(chart_hook["metadata"]["name"])
            port = free_port()
            cert = kube_bench.issue_certificate(f"webhook-{name}", ip_addresses=("127.0.0.1",))
            env = operator_env_on_bench(
                release,
                webhook_port=port,
                cert_file=str(cert.cert_file),
                key_file=str(cert.key_file),
            )
            kubeconfig = kube_bench.service_account_kubeconfig(
                release.namespace, release.service_account
            )
            rollback = FakeRollback()
            with operator_as(kubeconfig, env, rollback) as operator:
                assert operator.ready_flag.wait(30), "the operator did not get ready within 30s"
                kube_bench.request(
                    "POST",
                    "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
                    bench_webhook_configuration(
                        chart_hook,
                        name=bench_hook,
                        url=f"https://127.0.0.1:{port}/sparkapplications",
                        ca_pem=kube_bench.ca_pem,
                    ),
                )
                apps = Bench(
                    Apps(admin, first), Apps(admin, second), rollback, config_.load_config(env)
                )
                _wait_for_webhook(apps.first)
                yield apps
    finally:
        with contextlib.suppress(ApiException):
            admission.delete_mutating_webhook_configuration(bench_hook)
        uninstall(kube_bench, release)
        admin.close()


def _wait_for_webhook(apps: Apps) -> None:
    def mutated() -> bool:
        probe = f"probe-{uuid.uuid4().hex[:6]}"
        created = apps.create(spark_app(probe))
        apps.delete(probe)
        return "spark.sparkguard.jobId" in created["spec"]["sparkConf"]

    eventually(mutated, what="the apiserver to call the operator's webhook on 127.0.0.1")


def _denied(apps: Apps, app: dict[str, Any]) -> str:
    with pytest.raises(ApiException) as caught:
        apps.create(app)
    assert caught.value.status in (400, 403, 422), caught.value
    return str(caught.value.body)


def test_a_job_id_another_live_app_uses_is_denied_naming_it(bench: Bench) -> None:
    shared = {appmeta.JOB_ID: f"orders-{uuid.uuid4().hex[:6]}"}
    bench.first.create(spark_app("orders", annotations=shared))

    # Another namespace, the same explicit job id.
    message = _denied(bench.second, spark_app("orders-copy", annotations=shared))
    assert f"{bench.first.namespace}/orders" in message
    assert appmeta.JOB_ID in message
    # The same namespace: an explicit id equal to another app's derived id.
    bench.first.create(spark_app("daily"))
    derived = {appmeta.JOB_ID: f"{bench.first.namespace}.daily"}
    message = _denied(bench.first, spark_app("daily-again", annotations=derived))
    assert f"{bench.first.namespace}/daily" in message

    # A completed app (marked Succeeded by the operator) no longer holds its job id.
    bench.first.set_status("orders", {"applicationState": {"state": "COMPLETED"}})
    eventually(
        lambda: bench.first.notes("orders").get(appmeta.PHASE) == "Succeeded",
        what="the operator to mark the completed app Succeeded",
    )
    created = bench.second.create(spark_app("orders-copy", annotations=shared))
    assert created["spec"]["sparkConf"]["spark.sparkguard.jobId"] == shared[appmeta.JOB_ID]


def _scheduled_run(scheduled: str, stamp: int) -> dict[str, Any]:
    """A run as spark-operator creates it: the scheduled app's labels, its template spec."""
    run = spark_app(f"{scheduled}-{stamp}", enabled=False)
    del run["metadata"]["annotations"]
    run["metadata"]["labels"] = {appmeta.ENABLED_LABEL: "true", SCHEDULED_APP_LABEL: scheduled}
    return run


def test_scheduled_runs_are_opted_in_by_label_each_its_own_job_and_owner(bench: Bench) -> None:
    ns = bench.first.namespace
    runs = [
        bench.first.create(_scheduled_run("nightly", stamp))
        for stamp in (1763900000000000000, 1763900060000000000)
    ]
    job_ids = [r["spec"]["sparkConf"]["spark.sparkguard.jobId"] for r in runs]
    assert job_ids == [f"{ns}.nightly-1763900000000000000", f"{ns}.nightly-1763900060000000000"]
    owners = [r["metadata"]["annotations"][appmeta.OWNER_ANNOTATION] for r in runs]
    assert owners[0].startswith(f"k8s:{ns}/nightly-1763900000000000000/")
    assert owners[1].startswith(f"k8s:{ns}/nightly-1763900060000000000/")
    for run, owner in zip(runs, owners, strict=True):
        assert run["spec"]["sparkConf"]["spark.sparkguard.owner"] == owner
        inits = {c["name"]: c for c in run["spec"]["driver"]["initContainers"]}
        assert inits["sparkguard-rollback"]["command"][-2:] == ["--owner", owner]

    # The run is recovered like any opted-in app (backoff shortened for the test).
    name = runs[0]["metadata"]["name"]
    client.CustomObjectsApi(bench.first.api).patch_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, name, {"metadata": {"annotations": {appmeta.BACKOFF: "0"}}}
    )
    bench.first.set_status(name, failed_status())
    eventually(
        lambda: bench.first.notes(name).get(appmeta.PHASE) == "Resubmitted",
        what=f"the scheduled run {name} to be rolled back and resubmitted",
    )
    assert any(call[0] == job_ids[0] for call in bench.rollback.calls), bench.rollback.calls


def test_the_owner_is_written_once_and_kept(bench: Bench) -> None:
    apps = bench.second
    created = apps.create(spark_app("kept"))
    owner = created["metadata"]["annotations"][appmeta.OWNER_ANNOTATION]
    assert owner.startswith(f"k8s:{apps.namespace}/kept/")
    custom = client.CustomObjectsApi(apps.api)
    with pytest.raises(ApiException) as caught:
        custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            apps.namespace,
            PLURAL,
            "kept",
            {"metadata": {"annotations": {appmeta.OWNER_ANNOTATION: "k8s:elsewhere/x/1"}}},
        )
    assert appmeta.OWNER_ANNOTATION in str(caught.value.body)
    # A replace with a manifest that lacks it (as `kubectl replace -f` of the original) keeps it.
    stored = apps.get("kept")
    replaced = copy.deepcopy(stored)
    del replaced["metadata"]["annotations"][appmeta.OWNER_ANNOTATION]
    replaced["spec"]["image"] = "spark:4.0.1-python3"
    after = custom.replace_namespaced_custom_object(
        GROUP, VERSION, apps.namespace, PLURAL, "kept", replaced
    )
    assert after["metadata"]["annotations"][appmeta.OWNER_ANNOTATION] == owner
    # Recreated under the same name: another owner. (The operator lets the deleted app go at
    # once: it never started, so its finalizer needs no rollback.)
    apps.delete("kept")
    eventually(lambda: not apps.exists("kept"), what="the deleted app to be gone")
    again = apps.create(spark_app("kept"))
    assert again["metadata"]["annotations"][appmeta.OWNER_ANNOTATION] != owner


def test_an_apache_app_is_admitted_and_stored_whole(bench: Bench) -> None:
    """An Apache Spark operator app created through the real apiserver reaches the chart's
    second webhook, is mutated (pod templates, sparkConf), and the real CRD keeps every field
    (the native sidecar's restartPolicy included); a Kubeflow app's job id is refused to it."""
    custom = client.CustomObjectsApi(bench.first.api)
    namespace = bench.first.namespace
    kind = mutation.APACHE

    def create(app: dict[str, Any]) -> dict[str, Any]:
        return dict(
            custom.create_namespaced_custom_object(
                kind.group, kind.version, namespace, kind.plural, app
            )
        )

    stored = create(apache_app("apache-etl", namespace=namespace))
    owner = stored["metadata"]["annotations"][appmeta.OWNER_ANNOTATION]
    expected = apache_app("apache-etl", namespace=namespace)
    expected["metadata"]["annotations"][appmeta.OWNER_ANNOTATION] = owner
    expected = mutation.mutate(
        expected, config=bench.config, marker_token=mutation.marker_token_of(stored)
    )
    # the CRD's defaults of applicationTolerations, which admission now writes into (the
    # mapped restartConfig): the counter reset, retention and TTL off
    tolerations = expected["spec"]["applicationTolerations"]
    tolerations["restartConfig"]["restartCounterResetMillis"] = -1
    tolerations.update(resourceRetainDurationMillis=-1, ttlAfterStopMillis=-1)
    assert stored["spec"] == expected["spec"]  # nothing pruned, nothing else defaulted
    sidecar = stored["spec"]["driverSpec"]["podTemplateSpec"]["spec"]["initContainers"][-1]
    assert (sidecar["name"], sidecar["restartPolicy"]) == (mutation.SIDECAR_NAME, "Always")
    assert stored["metadata"]["finalizers"] == [finalizers.FINALIZER]

    # One job id across both kinds: a Kubeflow app's id is refused to an Apache app.
    shared = {appmeta.JOB_ID: f"both-{uuid.uuid4().hex[:6]}"}
    bench.first.create(spark_app("kubeflow-holder", annotations=shared))
    with pytest.raises(ApiException) as caught:
        create(apache_app("apache-copy", namespace=namespace, annotations=shared))
    assert f"{namespace}/kubeflow-holder ({GROUP})" in str(caught.value.body)
