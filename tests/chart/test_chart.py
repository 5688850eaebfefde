"""The chart, rendered and linted by the real Helm engine, validated against Kubernetes schemas."""

from __future__ import annotations

import base64
import copy
import itertools
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cryptography import x509

from sparkguard import __version__
from sparkguard.operator import config as operator_config
from sparkguard.operator import podsecurity
from tests.chart.conftest import CHART, FLIPPED, render

#: Kinds without a schema in kubernetes-validate (CRDs of other projects); checked by hand.
FOREIGN_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule", "Certificate", "Issuer"}


def _by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def test_lint_strict_has_no_warnings(value_set: tuple[str, dict[str, Any] | None]) -> None:
    import helm_python as helm

    _, values = value_set
    report = helm.lint(str(CHART), values, strict=True)
    assert report["errors"] == []
    serious = [m for m in report["messages"] if m["severity"] >= 2]
    assert serious == []


def test_rendered_manifests_pass_kubernetes_validate_strict(
    value_set: tuple[str, dict[str, Any] | None],
) -> None:
    _, values = value_set
    objects = render(values)
    assert objects
    version = kubernetes_validate.latest_version()
    for obj in objects:
        if obj["kind"] in FOREIGN_KINDS:
            continue
        kubernetes_validate.validate(obj, version, strict=True)


def test_a_typo_in_a_value_key_fails_against_the_schema() -> None:
    import helm_python as helm

    chart = helm.Chart.load(str(CHART))
    with pytest.raises(helm.HelmValuesError, match="imagee"):
        chart.validate_schema({"imagee": {"tag": "1"}})
    with pytest.raises(helm.HelmValuesError, match="batchIntervalMS"):
        chart.validate_schema({"sidecar": {"batchIntervalMS": 10}})
    with pytest.raises(helm.HelmValuesError, match="failurePolicy"):
        chart.validate_schema({"webhook": {"failurePolicy": "Sometimes"}})
    with pytest.raises(helm.HelmValuesError):
        render({"operator": {"watchNamespaces": ["Not_A_Namespace"]}})


def test_operator_pod_is_locked_down() -> None:
    (deployment,) = _by_kind(render(None), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert container["resources"]["requests"]
    assert container["resources"]["limits"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]


@pytest.mark.parametrize("values", [None, FLIPPED], ids=["default", "flipped"])
def test_operator_accepts_the_environment_the_chart_gives_it(values: dict[str, Any] | None) -> None:
    (deployment,) = _by_kind(render(values), "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    loaded = operator_config.load_config(env)
    if values:
        assert loaded.namespaces == ("spark-a", "spark-b")
        assert loaded.sidecar_port == 7171
        assert loaded.sidecar_batch_threads == 8
        assert loaded.image == "registry.example.com/sidecar:1.2.3"
        assert loaded.journal_root == "s3://bucket/sparkguard/journal"
        assert loaded.metrics_port == 9191
        assert loaded.sidecar_allowed_roots == ("s3://warehouse/", "s3://staging/")
        assert loaded.jvm_layer_default is False
        # Helm merges the keys given with the defaults (null removes one)
        assert loaded.injected_security_context == {
            **podsecurity.restricted(),
            **values["injected"]["containers"]["securityContext"],
        }
        assert (loaded.init_cpu_request, loaded.init_memory_request) == ("50m", "96Mi")
        assert (loaded.init_cpu_limit, loaded.init_memory_limit) == ("1", "1Gi")
    else:
        assert loaded.namespaces == ()
        assert loaded.jvm_layer_default is True
        # the defaults of the chart are the operator's: Pod Security "restricted"
        assert loaded.injected_security_context == podsecurity.restricted()
        defaults = operator_config.OperatorConfig()
        assert (loaded.init_cpu_request, loaded.init_memory_request) == (
            defaults.init_cpu_request,
            defaults.init_memory_request,
        )
        assert (loaded.init_cpu_limit, loaded.init_memory_limit) == (
            defaults.init_cpu_limit,
            defaults.init_memory_limit,
        )
        assert loaded.image == "ghcr.io/sparkguard/sparkguard:0.1.0"
        assert loaded.webhook_port == 9443
        assert loaded.delete_rollback_timeout_seconds == 120


def _images(objects: list[dict[str, Any]]) -> tuple[str, str]:
    """The operator's image and the image it injects (sidecar and initContainers)."""
    (deployment,) = _by_kind(objects, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    return container["image"], env["SPARKGUARD_IMAGE"]


def test_default_image_tag_follows_the_chart_app_version(tmp_path: Path) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["tag"] == ""  # no hard-coded tag to forget at a release
    assert values["sidecar"]["image"]["tag"] == ""
    chart_dir = tmp_path / "sparkguard"
    shutil.copytree(CHART, chart_dir)
    meta = yaml.safe_load((chart_dir / "Chart.yaml").read_text())
    meta["appVersion"] = "7.7.7"
    (chart_dir / "Chart.yaml").write_text(yaml.safe_dump(meta))
    repo = values["image"]["repository"]
    assert _images(render(None, chart_dir=chart_dir)) == (f"{repo}:7.7.7", f"{repo}:7.7.7")
    # An explicit tag still wins, for both.
    pinned = render({"image": {"tag": "1.2.3"}}, chart_dir=chart_dir)
    assert _images(pinned) == (f"{repo}:1.2.3", f"{repo}:1.2.3")


def test_chart_app_version_is_the_version_the_image_is_built_from() -> None:
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert meta["appVersion"] == __version__
    assert operator_config.DEFAULT_IMAGE.endswith(f":{meta['appVersion']}")


def test_webhook_ca_bundle_signs_the_served_certificate() -> None:
    objects = render(None)
    (secret,) = [o for o in _by_kind(objects, "Secret") if o["type"] == "kubernetes.io/tls"]
    (hook,) = _by_kind(objects, "MutatingWebhookConfiguration")
    webhook = hook["webhooks"][0]
    assert webhook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    service = webhook["clientConfig"]["service"]
    assert f"{service['name']}.{service['namespace']}.svc" in names.get_values_for_type(
        x509.DNSName
    )
    assert webhook["rules"][0]["resources"] == ["sparkapplications"]


def test_one_webhook_per_spark_application_kind() -> None:
    """Kubeflow's and the Apache operator's SparkApplications, each to its own kopf handler
    path (the ids in operator/handlers.py), with the same policy and selectors; matchPolicy
    Equivalent sends the Apache CRD's v1alpha1/v1beta1 requests converted to v1."""
    from sparkguard.operator import handlers, mutation

    for values in (None, FLIPPED):
        (hook,) = _by_kind(render(values), "MutatingWebhookConfiguration")
        kubeflow, apache = hook["webhooks"]
        for webhook, kind in ((kubeflow, mutation.KUBEFLOW), (apache, mutation.APACHE)):
            assert webhook["matchPolicy"] == "Equivalent"
            (rule,) = webhook["rules"]
            assert rule == {
                "apiGroups": [kind.group],
                "apiVersions": [kind.version],
                "resources": [kind.plural],
                "operations": ["CREATE", "UPDATE"],
                "scope": "Namespaced",
            }
            assert (
                webhook["clientConfig"]["service"]["path"] == "/" + handlers.WEBHOOK_IDS[kind.name]
            )
        assert kubeflow["name"] != apache["name"]
        # everything but the name, the rule and the path is shared
        for webhook in (kubeflow, apache):
            del webhook["name"], webhook["rules"], webhook["clientConfig"]["service"]["path"]
        assert kubeflow == apache


def test_rbac_for_apache_apps_covers_their_recovery_and_never_their_status() -> None:
    """Apache apps are watched, read and patched as Kubeflow's, and created/deleted for their
    resubmission by recreation (with its record ConfigMaps); never their status (the Apache
    operator overwrites it). test_rbac.py proves every verb is used."""
    for values, kind in ((None, "ClusterRole"), (FLIPPED, "Role")):
        rules = [
            rule
            for role in _by_kind(render(values), kind)
            for rule in role["rules"]
            if "spark.apache.org" in rule["apiGroups"] or "configmaps" in rule["resources"]
        ]
        expected = [
            (["sparkapplications"], ["get", "list", "watch", "patch", "create", "delete"]),
            (["configmaps"], ["get", "list", "watch", "create", "delete"]),
        ]
        assert [(r["resources"], r["verbs"]) for r in rules] == expected * (len(rules) // 2 or 1)
        assert not [r for r in rules if any("/" in res for res in r["resources"])]


def test_cert_manager_mode_uses_a_certificate() -> None:
    objects = render(FLIPPED)
    (hook,) = _by_kind(objects, "MutatingWebhookConfiguration")
    assert "caBundle" not in hook["webhooks"][0]["clientConfig"]
    assert hook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    assert _by_kind(objects, "Certificate")
    assert _by_kind(objects, "Issuer")  # self-signed issuer when no issuerRef is given
    assert not [o for o in _by_kind(objects, "Secret") if o.get("type") == "kubernetes.io/tls"]


def test_namespaced_rbac_when_namespaces_are_listed() -> None:
    objects = render(FLIPPED)
    # Only the CRD reader is cluster-wide (a CRD is cluster-scoped), limited to two CRDs by name.
    (crd_reader,) = _by_kind(objects, "ClusterRole")
    assert crd_reader["metadata"]["name"].endswith("-crd-reader")
    assert crd_reader["rules"] == CRD_READER_RULES
    roles = [  # the leader-election Role (release namespace) is tested in test_ha.py
        r
        for r in _by_kind(objects, "Role")
        if not r["metadata"]["name"].endswith("-leader-election")
    ]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["spark-a", "spark-b"]
    resources = {res for r in roles for rule in r["rules"] for res in rule["resources"]}
    assert "secrets" not in resources  # readStorageSecrets: false
    assert not _by_kind(objects, "ServiceAccount")  # serviceAccount.create: false


CRD_READER_RULES = [
    {
        "apiGroups": ["apiextensions.k8s.io"],
        "resources": ["customresourcedefinitions"],
        "resourceNames": [
            "sparkapplications.sparkoperator.k8s.io",
            "sparkapplications.spark.apache.org",
        ],
        "verbs": ["get"],
    }
]


def test_clusterwide_rbac_by_default_and_every_rule_is_commented() -> None:
    objects = render(None)
    role, crd_reader = sorted(
        _by_kind(objects, "ClusterRole"),
        key=lambda r: r["metadata"]["name"].endswith("-crd-reader"),
    )
    assert crd_reader["rules"] == CRD_READER_RULES
    verbs = {
        (res, verb) for rule in role["rules"] for res in rule["resources"] for verb in rule["verbs"]
    }
    assert ("sparkapplications", "patch") in verbs
    assert ("secrets", "get") in verbs
    assert {("pods", "list"), ("pods", "watch")} <= verbs
    assert ("pods", "get") not in verbs
    assert not any(verb in ("*", "deletecollection") for _, verb in verbs)
    # delete only what the resubmission of an Apache app recreates: the app and its record
    assert {res for res, verb in verbs if verb == "delete"} == {"sparkapplications", "configmaps"}
    deleting = [r for r in role["rules"] if "delete" in r["verbs"]]
    assert sorted(g for r in deleting for g in r["apiGroups"]) == ["", "spark.apache.org"]
    source = (CHART / "templates" / "rbac.yaml").read_text()
    rules_block = source[source.index('define "sparkguard.rules"') :]
    for line_no, line in enumerate(rules_block.splitlines()):
        if line.lstrip().startswith("- apiGroups"):
            previous = rules_block.splitlines()[line_no - 1].strip()
            assert previous.startswith("#"), f"rule without a why-comment: {line}"


def test_minimal_install_has_no_webhook_and_no_service() -> None:
    objects = render({"webhook": {"enabled": False}, "metrics": {"enabled": False}})
    kinds = {o["kind"] for o in objects}
    assert "MutatingWebhookConfiguration" not in kinds
    assert "Service" not in kinds
    (deployment,) = _by_kind(objects, "Deployment")
    env = {
        e["name"]: e.get("value")
        for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["SPARKGUARD_WEBHOOK_MODE"] == "disabled"
    assert env["SPARKGUARD_METRICS_PORT"] == "0"


def test_values_file_documents_every_value() -> None:
    """Each value has a `# --` comment, or sits inside a documented one (its defaults)."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    documented: list[tuple[int, bool]] = []  # (indent, has a doc) of the keys above
    for number, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "-")):
            continue  # comments and list items
        indent = len(line) - len(line.lstrip())
        documented = [(i, d) for i, d in documented if i < indent]
        comments = itertools.takewhile(
            lambda above: above.strip().startswith("#"), reversed(lines[:number])
        )
        has_doc = any(above.strip().startswith("# --") for above in comments)
        documented.append((indent, has_doc))
        if stripped.endswith(":") and not has_doc:
            continue  # a section header
        assert any(d for _, d in documented), f"value without '# --' doc: {line}"


def test_flipped_values_do_not_mutate_defaults() -> None:
    before = copy.deepcopy(FLIPPED)
    render(FLIPPED)
    assert before == FLIPPED


#: a typo inside each free-form Kubernetes object of the values
K8S_TYPOS = {
    "affinity": {"operator": {"affinity": {"nodeAfinity": {}}}},
    "tolerations": {"operator": {"tolerations": [{"keyy": "spark", "operator": "Exists"}]}},
    "extraEnv": {"operator": {"extraEnv": [{"nam": "AWS_REGION", "value": "eu-west-1"}]}},
    "resources": {"operator": {"resources": {"limit": {"cpu": "1"}}}},
    "imagePullSecrets": {"imagePullSecrets": [{"nmae": "regcred"}]},
    "namespaceSelector": {"webhook": {"namespaceSelector": {"matchLabel": {"a": "b"}}}},
    "issuerRef": {"webhook": {"certManager": {"enabled": True, "issuerRef": {"nam": "ca"}}}},
    "securityContext": {
        "injected": {"containers": {"securityContext": {"readOnlyRootFileSystem": True}}}
    },
    "initResources": {"injected": {"initContainers": {"resources": {"limit": {"cpu": "1"}}}}},
}


@pytest.mark.parametrize("values", list(K8S_TYPOS.values()), ids=list(K8S_TYPOS))
def test_a_typo_inside_a_kubernetes_object_fails_the_render(values: dict[str, Any]) -> None:
    import helm_python as helm

    with pytest.raises(helm.HelmValuesError, match="additional properties"):
        render(values)


def test_kubernetes_objects_in_values_are_accepted_whole() -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["ops"]}]}
                ]
            }
        },
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": {"app": "sparkguard"}},
                    },
                }
            ]
        },
    }
    env = [
        {"name": "AWS_REGION", "value": "eu-west-1"},
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    (deployment,) = _by_kind(
        render({"operator": {"affinity": affinity, "extraEnv": env}}), "Deployment"
    )
    pod = deployment["spec"]["template"]["spec"]
    assert pod["affinity"] == affinity
    assert env[1] in pod["containers"][0]["env"]


def test_the_schema_is_generated_from_the_kubernetes_schemas() -> None:
    """values.schema.json is what scripts/chart-schema.py makes of it (no hand drift)."""
    script = CHART.parents[1] / "scripts" / "chart-schema.py"
    done = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("namespaces", [[], ["spark-a", "spark-b"]], ids=["clusterwide", "ns"])
def test_notes_say_exactly_what_to_grant_without_rbac(namespaces: list[str]) -> None:
    import helm_python as helm

    values: dict[str, Any] = {
        "rbac": {"create": False},
        "operator": {"watchNamespaces": namespaces},
    }
    notes = _notes_of(helm, values)
    _, _, tail = notes.partition("RBAC: rbac.create=false")
    assert "system:serviceaccount:ops:sg-sparkguard" in tail
    _, _, rules_text = tail.partition(" to it")
    rules_text, _, lease_text = rules_text.split(":\n", 1)[1].partition("\nand, for leader")
    rules_text, _, crd_text = rules_text.partition("\nand, to read the SparkApplication CRD")
    assert yaml.safe_load(crd_text.split(":\n", 1)[1]) == CRD_READER_RULES
    granted_by_chart = render({"operator": {"watchNamespaces": namespaces}})
    kind = "Role" if namespaces else "ClusterRole"
    roles = [
        r
        for r in _by_kind(granted_by_chart, kind)
        if "leader" not in r["metadata"]["name"] and "crd-reader" not in r["metadata"]["name"]
    ]
    assert yaml.safe_load(rules_text) == roles[0]["rules"]
    (lease_role,) = [
        r for r in _by_kind(granted_by_chart, "Role") if "leader" in r["metadata"]["name"]
    ]
    assert lease_role["metadata"]["namespace"] == "sparkguard"
    assert yaml.safe_load(lease_text.split(":\n", 1)[1]) == lease_role["rules"]
    if namespaces:
        assert "spark-a, spark-b" in tail
    assert "RBAC:" not in _notes_of(helm, {})


def _notes_of(helm: Any, values: dict[str, Any]) -> str:
    rendered = helm.Chart.load(str(CHART)).render(
        values, name="sg", namespace="ops", is_install=True
    )
    return next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))


def test_an_injected_security_context_field_set_to_null_is_left_out() -> None:
    """Helm drops a default set to null: the operator gets the rest (or, for the whole
    context, none)."""

    def injected(values: dict[str, Any]) -> str:
        (deployment,) = _by_kind(render({"injected": {"containers": values}}), "Deployment")
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        return str(env["SPARKGUARD_INJECTED_SECURITY_CONTEXT"])

    raw = injected({"securityContext": {"readOnlyRootFilesystem": None}})
    loose = {k: v for k, v in podsecurity.restricted().items() if k != "readOnlyRootFilesystem"}
    assert podsecurity.parse(raw) == loose
    assert podsecurity.parse(injected({"securityContext": None})) == {}
