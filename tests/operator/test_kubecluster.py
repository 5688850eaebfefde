"""The kube cluster's pieces that need no cluster: how upstream's chart is turned into processes,
and how build-spark-operator.sh refuses a source that is not the pinned release."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

from tests.kubebench import cluster
from tests.kubebench.cluster import SPARK_OPERATOR_BUILD_SCRIPT


def test_flags_are_set_in_place_and_the_others_appended() -> None:
    args = ["controller", "start", "--namespaces=a,b", "--leader-election=true", "--x=1"]
    out = cluster.with_flags(args, {"--leader-election": "false", "--kubeconfig": "/k"})
    assert out == [
        "controller",
        "start",
        "--namespaces=a,b",
        "--leader-election=false",
        "--x=1",
        "--kubeconfig=/k",
    ]


def test_a_webhook_by_url_keeps_all_but_the_service() -> None:
    hook = {
        "name": "mutate--v1-pod.sparkoperator.k8s.io",
        "clientConfig": {"service": {"name": "svc", "namespace": "ns", "path": "/mutate--v1-pod"}},
        "failurePolicy": "Fail",
        "objectSelector": {"matchLabels": {"a": "b"}},
    }
    config = {"kind": "MutatingWebhookConfiguration", "metadata": {"name": "w"}, "webhooks": [hook]}
    out = cluster.webhook_by_url(config, "https://localhost:9443")
    assert out["webhooks"] == [
        {**hook, "clientConfig": {"url": "https://localhost:9443/mutate--v1-pod"}}
    ]
    assert config["webhooks"][0]["clientConfig"]["service"]["name"] == "svc"  # not mutated


def test_the_private_tmp_keeps_the_entries_of_tmp_the_paths_lie_in() -> None:
    argv, env = cluster.with_private_tmp(
        ["/bin/op", "controller"],
        [Path("/tmp/run-1/bench/kubeconfig"), Path("/tmp/run-1"), Path("/tmp"), Path("/opt/x")],
    )
    assert env == {"KUBECLUSTER_TMP_KEEP": "run-1"}
    assert argv[:5] == ["unshare", "--mount", "--propagation", "private", "--"]
    assert argv[-2:] == ["/bin/op", "controller"]


def test_the_network_policy_grant_is_for_the_controller_in_each_job_namespace() -> None:
    objects = cluster.network_policy_grant(["a", "b"])
    assert [(o["kind"], o["metadata"]["namespace"]) for o in objects] == [
        ("Role", "a"),
        ("RoleBinding", "a"),
        ("Role", "b"),
        ("RoleBinding", "b"),
    ]
    assert objects[1]["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": "spark-operator-controller",
            "namespace": "spark-operator",
        }
    ]


def test_a_source_other_than_the_release_is_refused(tmp_path: Path) -> None:
    """The tarball's tree must hash to go.sum's hash of the module: anything else is refused
    before it is unpacked into the cache (and the module proxy is not asked: GOPROXY=off)."""
    upstream = tmp_path / "upstream"
    upstream.mkdir()
    with tarfile.open(upstream / "kubeflow-spark-operator-v2.5.2.tar.gz", "w:gz") as tar:
        data = b"module github.com/kubeflow/spark-operator/v2\n"
        info = tarfile.TarInfo("spark-operator-2.5.2/go.mod")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    cache = tmp_path / "cache"
    proc = subprocess.run(
        ["bash", str(SPARK_OPERATOR_BUILD_SCRIPT), "--download"],
        env={
            "PATH": _path_with_go(),
            "HOME": str(tmp_path),
            "SPARKGUARD_CACHE": str(cache),
            "SPARKGUARD_UPSTREAM_DIR": str(upstream),
            "GOPROXY": "off",
            "GOFLAGS": "-modcacherw",
            "GOMODCACHE": str(tmp_path / "gomod"),
            "GOCACHE": str(tmp_path / "gocache"),
        },
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert "refusing to build it" in proc.stderr
    assert "GOPROXY=off" in proc.stderr
    assert not (cache / "spark-operator" / "v2.5.2" / "src").exists()
    assert not (cache / "spark-operator" / "v2.5.2" / "src.hash").exists()


def test_the_build_without_go_fails_loudly(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["bash", str(SPARK_OPERATOR_BUILD_SCRIPT)],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SPARKGUARD_CACHE": str(tmp_path)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1
    assert "'go' not found" in proc.stderr
    assert proc.stdout == ""


def _path_with_go() -> str:
    import shutil

    go = shutil.which("go")
    assert go is not None, "go is needed to build the kube bench"
    return f"{Path(go).parent}:/usr/bin:/bin"
