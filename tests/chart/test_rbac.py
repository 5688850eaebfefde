"""The chart's RBAC is sufficient and minimal.

The chart is installed with helm onto the kube-apiserver bench; the operator then runs
in-process *as the chart's ServiceAccount*, with the environment of the chart's Deployment, and
goes through its whole recovery scenario: admission, an invalid app, a failure rolled back
(reading the storage Secret) and resubmitted, a second failure that exhausts the retries, a
completed app. The apiserver's audit log then shows every request the ServiceAccount made:
none may be forbidden, and every verb the chart grants must have been used.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import uuid
from collections.abc import Iterator
from typing import Any, cast

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sparkguard.operator import appmeta, finalizers
from sparkguard.operator.resubmit import RECORD_LABEL
from tests.chart.operator_harness import (
    Apps,
    Permission,
    Release,
    bench_webhook_configuration,
    describe,
    eventually,
    foreign_spark_webhooks_set_aside,
    free_port,
    install,
    operator_as,
    operator_env_on_bench,
    permission_of,
    table,
    uninstall,
)
from tests.kubebench.bench import APACHE_SPARK_OPERATOR_CRD, KubeBench
from tests.operator.apps import APACHE_GROUP, APACHE_VERSION, apache_app, failed_status, spark_app
from tests.operator.kmocking import FakeRollback

pytestmark = pytest.mark.kube

STORAGE_SECRET = "sparkguard-storage"  # the one name the chart lets the operator read
APACHE_SPARK_OPERATOR_CRD_NAME = "sparkapplications.spark.apache.org"
SECRET_DATA = {"AWS_ACCESS_KEY_ID": "AKIDRBAC", "AWS_SECRET_ACCESS_KEY": "s3cr3t"}
STORAGE_OPTIONS = {"key": "AKIDRBAC", "secret": "s3cr3t"}


@dataclasses.dataclass(frozen=True)
class Variant:
    release: str
    namespace: str  # the release's
    app_namespace: str
    watch_app_namespace_only: bool

    def values(self) -> dict[str, Any]:
        # Defaults otherwise; a journal root only spares the apps a journal annotation.
        operator: dict[str, Any] = {"journalRoot": "s3://warehouse/_journal"}
        if self.watch_app_namespace_only:
            operator["watchNamespaces"] = [self.app_namespace]
        return {"operator": operator}


VARIANTS = {
    # Default values: one ClusterRole + ClusterRoleBinding.
    "clusterwide": Variant("rbac", "sparkguard-rbac", "spark-rbac", False),
    # operator.watchNamespaces: a Role + RoleBinding in the app namespace only.
    "namespaced": Variant("rbac-ns", "sparkguard-rbac-ns", "spark-rbac-ns", True),
}


@pytest.fixture(params=sorted(VARIANTS))
def installed(
    request: pytest.FixtureRequest, kube_bench: KubeBench
) -> Iterator[tuple[Variant, Release]]:
    """The chart installed with helm for one variant; uninstalled afterwards."""
    variant = VARIANTS[request.param]
    kube_bench.ensure_namespace(variant.app_namespace)
    # Admission lists the Apache operator's apps too (one job id across both kinds): with
    # their CRD installed that list succeeds and shows the chart's rule for it is used. Left
    # installed (a CRD of another group; tests that need it absent do not exist).
    kube_bench.apply_manifest(APACHE_SPARK_OPERATOR_CRD.read_text(encoding="utf-8"))
    kube_bench.wait_for_crd(APACHE_SPARK_OPERATOR_CRD_NAME)
    release = install(
        kube_bench, name=variant.release, namespace=variant.namespace, values=variant.values()
    )
    try:
        hook = release.one("MutatingWebhookConfiguration")["metadata"]["name"]
        with foreign_spark_webhooks_set_aside(kube_bench, keep=hook):
            yield variant, release
    finally:
        uninstall(kube_bench, release)


def _wait_for_webhook(apps: Apps) -> None:
    """Until the apiserver calls the operator's webhook (its configuration cache lags)."""
    probe = f"probe-{uuid.uuid4().hex[:6]}"

    def mutated() -> bool:
        apps.delete(probe)
        created = apps.create(spark_app(probe))
        return "spark.sparkguard.jobId" in created["spec"]["sparkConf"]

    eventually(mutated, what="the apiserver to call the operator's webhook on 127.0.0.1")
    apps.delete(probe)


def _phase(apps: Apps, name: str, phase: str, *, timeout: float = 30.0) -> None:
    eventually(
        lambda: apps.notes(name).get(appmeta.PHASE) == phase,
        what=f"app {name} to reach phase {phase} (annotations now: {apps.notes(name)})",
        timeout=timeout,
    )


def _events(apps: Apps, name: str, *reasons: str) -> None:
    eventually(
        lambda: set(reasons) <= set(apps.event_reasons(name)),
        what=f"Events {reasons} on app {name} (found {apps.event_reasons(name)})",
    )


def _run_scenario(bench: KubeBench, release: Release, app_namespace: str) -> FakeRollback:
    """The operator's whole failure-recovery scenario, run as the chart's ServiceAccount."""
    admin = bench.api_client()
    admission = client.AdmissionregistrationV1Api(admin)
    apps = Apps(admin, app_namespace)
    chart_hook = release.one("MutatingWebhookConfiguration")
    bench_hook_name = f"{chart_hook['metadata']['name']}.bench"
    sa_kubeconfig = bench.service_account_kubeconfig(release.namespace, release.service_account)

    # The chart's webhook calls an in-cluster Service that has no pod (and no network) on the
    # bench, and with failurePolicy Fail it would deny every SparkApplication: replace it by an
    # equivalent configuration (same rules, failurePolicy, timeouts, selectors) whose
    # clientConfig.url is the operator's webhook on 127.0.0.1, trusted through the bench CA.
    admission.delete_mutating_webhook_configuration(chart_hook["metadata"]["name"])
    port = free_port()
    cert = bench.issue_certificate(f"webhook-{release.name}", ip_addresses=("127.0.0.1",))
    env = operator_env_on_bench(
        release, webhook_port=port, cert_file=str(cert.cert_file), key_file=str(cert.key_file)
    )
    assert env["SPARKGUARD_WEBHOOK_MODE"] == "external", env

    client.CoreV1Api(admin).create_namespaced_secret(
        app_namespace,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name=STORAGE_SECRET),
            string_data=SECRET_DATA,
        ),
    )
    # Stored while no webhook of ours is registered (as when the webhook was down): the operator can
    # only mark it Invalid, with a Warning Event.
    apps.create(spark_app("invalid", annotations={appmeta.MAX_RETRIES: "forever"}))

    rollback = FakeRollback()
    try:
        with operator_as(sa_kubeconfig, env, rollback) as operator:
            assert operator.ready_flag.wait(30), "the operator did not get ready within 30s"
            _phase(apps, "invalid", "Invalid")
            _events(apps, "invalid", "InvalidAnnotation")

            bench.request(
                "POST",
                "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
                bench_webhook_configuration(
                    chart_hook,
                    name=bench_hook_name,
                    url=f"https://127.0.0.1:{port}/sparkapplications",
                    ca_pem=bench.ca_pem,
                ),
            )
            _wait_for_webhook(apps)

            notes = {
                appmeta.BACKOFF: "0",
                appmeta.MAX_RETRIES: "1",
                appmeta.STORAGE_SECRET: STORAGE_SECRET,
            }
            created = apps.create(spark_app("etl", annotations=notes))
            conf = created["spec"]["sparkConf"]
            assert conf["spark.sparkguard.jobId"] == f"{app_namespace}.etl", conf
            assert conf["spark.sparkguard.attempt"] == "0", conf
            # Kubernetes >= 1.29: the marker sidecar is a native sidecar (restartPolicy Always).
            native = [
                c["name"]
                for c in created["spec"]["driver"]["initContainers"]
                if c.get("restartPolicy") == "Always"
            ]
            assert native == ["sparkguard-markers"], created["spec"]["driver"]
            assert created["metadata"]["annotations"][appmeta.OWNER_ANNOTATION].startswith(
                f"k8s:{app_namespace}/etl/"
            )

            # First failure: rolled back (with the Secret's credentials) and resubmitted.
            apps.set_status("etl", failed_status(submission="sub-1"))
            _phase(apps, "etl", "Resubmitted")
            _events(apps, "etl", "RollbackStarted", "RolledBack", "Resubmitted")
            assert apps.get("etl")["spec"]["sparkConf"]["spark.sparkguard.attempt"] == "1"

            # Second failure: max-retries 1 is used up, rolled back and given up.
            apps.set_status(
                "etl", failed_status(submission="sub-2", terminated="2026-11-22T11:00:00Z")
            )
            _phase(apps, "etl", "Exhausted")
            _events(apps, "etl", "RetriesExhausted")
            assert apps.get("etl")["spec"]["sparkConf"]["spark.sparkguard.attempt"] == "1"

            # A completed app is marked Succeeded.
            apps.create(spark_app("done"))
            apps.set_status("done", {"applicationState": {"state": "COMPLETED"}})
            _phase(apps, "done", "Succeeded")

            _apache_scenario(admin, app_namespace)
    finally:
        with contextlib.suppress(ApiException):
            admission.delete_mutating_webhook_configuration(bench_hook_name)
        admin.close()
    return rollback


def _apache_scenario(admin: client.ApiClient, namespace: str) -> None:
    """An Apache app's final failure (ResourceReleased after Failed), its rollback and its
    resubmission by recreation (record ConfigMap, delete, create keeping the owner), then
    the recreated app's deletion rolled back by the finalizer: the Apache and ConfigMap verbs."""
    custom = client.CustomObjectsApi(admin)
    group, version, plural = APACHE_GROUP, APACHE_VERSION, "sparkapplications"

    def get(name: str) -> dict[str, Any] | None:
        try:
            found = custom.get_namespaced_custom_object(group, version, namespace, plural, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return cast(dict[str, Any], found)

    notes = {appmeta.BACKOFF: "0", appmeta.MAX_RETRIES: "1", appmeta.STORAGE_SECRET: STORAGE_SECRET}
    app = apache_app("apache-etl", namespace=namespace, annotations=notes)
    app["spec"]["applicationTolerations"] = {"restartConfig": {"restartPolicy": "Never"}}
    created = custom.create_namespaced_custom_object(group, version, namespace, plural, app)
    old_uid = created["metadata"]["uid"]
    assert finalizers.FINALIZER in created["metadata"]["finalizers"]
    history = {
        str(i): {"currentStateSummary": s, "lastTransitionTime": "2026-11-22T10:00:00Z"}
        for i, s in enumerate(["Submitted", "DriverRequested", "Failed", "ResourceReleased"])
    }
    status = {
        "currentState": {"currentStateSummary": "ResourceReleased"},
        "stateTransitionHistory": history,
        "currentAttemptSummary": {"attemptInfo": {"id": 0}},
    }
    custom.patch_namespaced_custom_object_status(
        group, version, namespace, plural, "apache-etl", {"status": status}
    )

    def recreated() -> bool:
        found = get("apache-etl")
        return (
            found is not None
            and appmeta.of(found).get(appmeta.RESUBMITTED_FROM) == old_uid
            and not client.CoreV1Api(admin)
            .list_namespaced_config_map(namespace, label_selector=f"{RECORD_LABEL}=true")
            .items
        )

    eventually(recreated, what="the Apache app to be recreated and its record dropped")
    new = get("apache-etl")
    assert new is not None
    assert (
        new["metadata"]["annotations"][appmeta.OWNER_ANNOTATION]
        == created["metadata"]["annotations"][appmeta.OWNER_ANNOTATION]
    )
    custom.delete_namespaced_custom_object(group, version, namespace, plural, "apache-etl")
    eventually(lambda: get("apache-etl") is None, what="the recreated app to be let go")


#: what kopf asks for when its cluster scanning is on (settings.scanning.disabled false)
KOPF_SCANNING = {
    ("apiextensions.k8s.io", "customresourcedefinitions"),
    ("", "namespaces"),
}


def _forbidden(events: list[dict[str, Any]]) -> list[str]:
    """Each forbidden request once (with its count), plus a hint when it is kopf's scanning."""
    denied = [e for e in events if (e.get("responseStatus") or {}).get("code") == 403]
    counts = collections.Counter(describe(e) for e in denied)
    lines = [f"{request} (x{n})" for request, n in sorted(counts.items())]
    scanning = {p[:2] for p in map(permission_of, denied) if p is not None} & KOPF_SCANNING
    if scanning:
        lines.append(
            f"{sorted(scanning)}: kopf observes CRDs/namespaces unless settings.scanning."
            "disabled is set; sparkguard watches one fixed CRD in exact namespaces, so the "
            "operator should disable scanning (a namespaced Role cannot grant these)"
        )
    return lines


def test_the_chart_rbac_is_sufficient_and_minimal(
    kube_bench: KubeBench, installed: tuple[Variant, Release]
) -> None:
    variant, release = installed
    user = release.username
    try:
        rollback = _run_scenario(kube_bench, release, variant.app_namespace)
    except AssertionError as exc:
        forbidden = _forbidden(kube_bench.audit_events(user=user))
        if forbidden:  # the likely cause: name it
            raise AssertionError(
                f"{exc}\n{user} was forbidden these requests:\n" + "\n".join(forbidden)
            ) from exc
        raise

    expected_call = (
        f"{variant.app_namespace}.etl",
        f"s3://warehouse/_journal/{variant.app_namespace}",
        STORAGE_OPTIONS,
    )
    apache_call = (f"{variant.app_namespace}.apache-etl", *expected_call[1:])
    # Kubeflow's two failures; the Apache app's final failure, then its recreation's deletion
    # A cluster-wide operator also sees apps other modules left on the same bench (their
    # namespaces are not this test's): only this test's namespace is its business.
    ours = [c for c in rollback.calls if c[0].startswith(f"{variant.app_namespace}.")]
    assert ours == [expected_call] * 2 + [apache_call] * 2, rollback.calls

    granted = release.granted()
    role_kind = "Role" if variant.watch_app_namespace_only else "ClusterRole"
    app_roles = [
        r
        for r in release.of_kind(role_kind)
        # the Lease (release namespace); the CRD reader (always cluster-wide, one CRD by name)
        if not r["metadata"]["name"].endswith(("-leader-election", "-crd-reader"))
    ]
    assert [r["metadata"].get("namespace") for r in app_roles] == [
        variant.app_namespace if variant.watch_app_namespace_only else None
    ], f"expected one {role_kind} in release {release.name}"

    def requests() -> list[dict[str, Any]]:
        return kube_bench.audit_events(user=user)

    # A watch is audited when it ends: once the operator stopped, its watches show up.
    watched = {p for p in granted if p[2] == "watch"}
    eventually(
        lambda: watched <= {permission_of(e) for e in requests()},
        what=f"the audit log to show {user}'s watch requests {sorted(watched)}",
        timeout=15,
    )
    events = requests()
    assert events, f"no audit events for {user}"

    forbidden = _forbidden(events)
    used: dict[Permission, str] = {}
    for event in events:
        permission = permission_of(event)
        code = event["responseStatus"].get("code", 0)
        if permission is not None and code < 400:
            used.setdefault(permission, "used")
    rows = [(p, "used" if p in used else "GRANTED, NEVER USED") for p in granted]
    rows += [(p, "used, not granted by the chart") for p in used if p not in granted]
    print(f"\n{user} ({'namespaced' if variant.watch_app_namespace_only else 'clusterwide'}):")
    print(table(rows))

    assert forbidden == [], (
        f"{user} was forbidden these requests; the chart's RBAC lacks them:\n"
        + "\n".join(forbidden)
    )
    # Every Event on the apps was posted by the operator's ServiceAccount.
    posted = [
        e
        for e in events
        if permission_of(e) == ("", "events", "create")
        and e["objectRef"].get("namespace") == variant.app_namespace
    ]
    admin = kube_bench.api_client()
    try:
        stored = Apps(admin, variant.app_namespace)
        on_apps = [ev for app in ("invalid", "etl") for ev in stored.events(app)]
    finally:
        admin.close()
    assert len(on_apps) >= 6, [e.reason for e in on_apps]
    assert len(posted) >= len(on_apps), f"{len(on_apps)} Events, {len(posted)} posted by {user}"

    unused = sorted(granted - used.keys())
    assert unused == [], (
        "the chart grants verbs the operator never used in the whole scenario "
        f"(remove them, or extend the scenario to the code path that needs them): {unused}"
    )
