"""``sparkguard rollback --app <namespace>/<name>`` against the real kube-apiserver (the kube
bench): the installed command, as a subprocess, with a token kubeconfig for a ServiceAccount
that holds only what docs/operations.md says a hand-runner needs (``get`` on sparkapplications
in the app's namespace), rolls back a killed write of an app of either kind with the job id,
journal and owner admission gave it; a user without ``get``, and an app that does not exist,
get one line each.

The apps are prepared by admission's own decision (:func:`mutation.review`, the code the
webhook runs), applied here before the create: the webhook's round trip is the chart tests'
(tests/chart/test_admission_bench.py), and starting it here would cost an operator per run.
The real API server still validates and prunes them through the bench's CRDs.
"""

from __future__ import annotations

import dataclasses
import subprocess
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from sparkguard.operator import appmeta, mutation
from sparkguard.operator import config as config_
from tests.kubebench.bench import APACHE_SPARK_OPERATOR_CRD, KubeBench
from tests.operator.apps import apache_app, spark_app
from tests.spark_lib.test_cli_locations import one_line, sparkguard
from tests.spark_lib.test_rollback import PARTS, _start, _task

pytestmark = pytest.mark.kube

#: what a hand-runner needs (docs/operations.md): get on both kinds' sparkapplications
HAND_RUNNER = "hand-runner"
#: may list the apps but not get one
NO_GET = "lister"
#: may get Kubeflow's kind only (a cluster that runs only Kubeflow's operator)
KUBEFLOW_ONLY = "kubeflow-reader"


@dataclasses.dataclass(frozen=True)
class Bench:
    namespace: str
    journal: str
    table: Path
    #: kubeconfig per ServiceAccount
    kubeconfigs: Mapping[str, str]
    #: app name -> (job id, owner) as admission wrote them
    apps: Mapping[str, tuple[str, str]]


def _role(namespace: str, name: str, verbs: list[str], groups: list[str]) -> list[dict[str, Any]]:
    rules = [{"apiGroups": groups, "resources": ["sparkapplications"], "verbs": verbs}]
    meta = {"name": name, "namespace": namespace}
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta,
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    ]


@pytest.fixture(scope="module")
def bench(kube_bench: KubeBench, tmp_path_factory: pytest.TempPathFactory) -> Bench:
    namespace = f"cli-app-{uuid.uuid4().hex[:6]}"
    kube_bench.ensure_namespace(namespace)
    kube_bench.apply_manifest(APACHE_SPARK_OPERATOR_CRD.read_text(encoding="utf-8"))
    kube_bench.wait_for_crd(mutation.APACHE.crd_name)
    base = tmp_path_factory.mktemp("cli-app")
    root, table = base / "journal", base / "table"
    config = config_.OperatorConfig(journal_root=str(root))
    apps = {}
    for app in (
        spark_app("nightly", namespace=namespace),
        apache_app("hourly", namespace=namespace),
    ):
        decided = mutation.review(app, old=None, config=config, owner_id=uuid.uuid4().hex[:8])
        assert decided.allowed, decided.problems
        (stored,) = kube_bench.apply_manifest(mutation.apply_merge_patch(app, decided.patch))
        owner = appmeta.storage_owner(stored["metadata"])
        assert decided.job_id
        assert owner
        apps[stored["metadata"]["name"]] = (decided.job_id, owner)
    groups = [kind.group for kind in mutation.KINDS]
    kube_bench.apply_manifest(
        [
            *_role(namespace, HAND_RUNNER, ["get"], groups),
            *_role(namespace, NO_GET, ["list", "watch"], groups),
            *_role(namespace, KUBEFLOW_ONLY, ["get"], [mutation.KUBEFLOW.group]),
        ]
    )
    kubeconfigs = {
        user: kube_bench.service_account_kubeconfig(namespace, user)
        for user in (HAND_RUNNER, NO_GET, KUBEFLOW_ONLY)
    }
    return Bench(f"{namespace}", f"{root}/{namespace}", table, kubeconfigs, apps)


def _table_files(table: Path) -> set[str]:
    return {
        str(p.relative_to(table))
        for p in table.rglob("*.parquet")
        if "_sparkguard" not in p.relative_to(table).parts
    }


def _rollback_app(bench: Bench, name: str, user: str) -> subprocess.CompletedProcess[str]:
    """``sparkguard rollback --app <namespace>/<name>`` as ``user``, its kubeconfig in
    ``KUBECONFIG`` (as kubectl finds it)."""
    kubeconfig = bench.kubeconfigs[user]
    return sparkguard(
        "rollback", "--app", f"{bench.namespace}/{name}", env={"KUBECONFIG": kubeconfig}
    )


@pytest.mark.parametrize("name", ["nightly", "hourly"], ids=["kubeflow", "apache"])
def test_rollback_app_on_the_real_api_server(bench: Bench, name: str) -> None:
    job_id, owner = bench.apps[name]
    table = bench.table / name
    # A write of the app's job, killed after one task: its file is on storage, uncommitted.
    _task(_start(str(table), bench.journal, {}, job_id, owner=owner), 0, PARTS[0])
    assert _table_files(table)
    done = _rollback_app(bench, name, HAND_RUNNER)
    assert done.returncode == 0, done.stderr
    told = f"--job-id {job_id} --journal {bench.journal} --owner {owner}"
    assert told in done.stderr
    assert "rolled back: 1" in done.stdout
    assert "left alone" not in done.stdout
    assert not _table_files(table)


def test_rollback_app_without_get_says_which_permission(bench: Bench) -> None:
    done = _rollback_app(bench, "nightly", NO_GET)
    assert done.returncode != 0
    line = one_line(done.stderr)
    assert f"--app {bench.namespace}/nightly" in line
    # the server's own reason (user, verb, resource, group) and what to grant
    assert f'"system:serviceaccount:{bench.namespace}:{NO_GET}" cannot get resource' in line
    assert f"needs get on sparkapplications in namespace {bench.namespace}" in line


def test_rollback_app_that_does_not_exist(bench: Bench) -> None:
    done = _rollback_app(bench, "gone", HAND_RUNNER)
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert f"no SparkApplication {bench.namespace}/gone" in line
    # A user who may get only Kubeflow's kind: RBAC refuses the Apache read before it looks,
    # which must not read as a refusal of the app.
    done = _rollback_app(bench, "gone", KUBEFLOW_ONLY)
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert f"no SparkApplication {bench.namespace}/gone" in line
    assert 'not checked: sparkapplications.spark.apache.org "gone" is forbidden' in line
