"""ApacheOperatorBench: the bench with the Apache Spark Kubernetes Operator (spark.apache.org/v1).

:class:`ApacheOperatorBench` is a :class:`~tests.kubebench.cluster.KubeCluster` without Kubeflow's
operator: kube-apiserver and etcd on 127.0.0.1, inside the network guard, with
kube-controller-manager and kube-scheduler (the operator deletes a finished driver pod with
foreground propagation and waits for it to go: only the garbage collector finishes such a
deletion), serving the release's own CRDs
(SparkApplication and SparkCluster, ``build-tools/helm/spark-kubernetes-operator/crds/``) and
runs **upstream's operator**, release 1.0.0, built from its source by
``build-apache-operator.sh`` (a Maven build of the bench's; java-operator-sdk 5.3.2 where
upstream names 5.5.0: docs/decisions.md, "The Apache operator, built").

The operator runs as a local JVM with what upstream's Helm chart gives its Deployment, rendered
from the release's chart: the chart's ``spark-operator.properties`` and ``log4j2.properties``
(its ConfigMap) with two changes, free loopback ports for the probe and metrics servers; the
chart's RBAC (ServiceAccount, ClusterRole, ClusterRoleBinding, and the Spark workload's
ServiceAccount ``spark`` with its RoleBinding in each watched namespace); its credentials a
token of the chart's ServiceAccount. The chart's JVM options size the heap for a pod of its own
(80 % of the RAM, pre-touched); here the heap is small instead.

There is no kubelet: a driver pod is created, scheduled onto nothing (no Node) and never runs; a
test plays the node's part by patching its status. Pods without a node go at once when deleted
(once the garbage collector has seen to their dependents)::

    with ApacheOperatorBench(job_namespaces=["spark-apps"]) as bench:
        bench.apply_manifest(spark_application)
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Self

from tests.kubebench import bench as kubebench
from tests.kubebench.bench import HERE, JsonObj, KubeBench, KubeBenchError
from tests.kubebench.cluster import KubeCluster, render_chart
from tests.support import netguard

__all__ = [
    "APACHE_OPERATOR_BUILD_SCRIPT",
    "ApacheOperatorBench",
    "ApacheOperatorRelease",
    "ensure_apache_operator",
    "render_apache_operator_chart",
]

APACHE_OPERATOR_BUILD_SCRIPT = HERE / "build-apache-operator.sh"
#: the namespace and Helm release name of upstream's chart on the bench
OPERATOR_NAMESPACE = "spark-operator"
RELEASE_NAME = "spark-kubernetes-operator"
LAUNCHER = "spark-kubernetes-operator"
#: what the chart's ConfigMap holds, written as files the operator reads
_CONF_FILES = ("spark-operator.properties", "log4j2.properties", "metrics.properties")
#: the kinds of the rendered chart applied as they are (not the Deployment: the bench runs it
#: as a local process; not its ConfigMap: the files are written instead; not the chart's
#: `helm test` Pods)
_APPLIED = frozenset({"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"})
#: JVM options in place of the chart's (which size the heap for a pod of its own)
JVM_OPTIONS = ("-Dfile.encoding=UTF8", "-Xmx768m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
#: how long the operator may take to exit on SIGTERM (its shutdown, and the class-data archive
#: it writes when it has none yet) before it is killed
ARCHIVE_EXIT_SECONDS: Final = 90.0
#: the log line JOSDK writes once a controller's informers synced
_STARTED = "'sparkappreconciler' controller started"


@dataclass(frozen=True)
class ApacheOperatorRelease:
    """Upstream's operator as ``build-apache-operator.sh`` left it: the launcher, and the
    release's source tree beside it (``<cache>/apache-operator/<version>/{bin,src}``)."""

    bin_dir: Path

    @property
    def launcher(self) -> Path:
        return self.bin_dir / LAUNCHER

    @property
    def source(self) -> Path:
        return self.bin_dir.parent / "src"

    @property
    def version(self) -> str:
        return self.bin_dir.parent.name

    @property
    def chart(self) -> Path:
        return self.source / "build-tools" / "helm" / "spark-kubernetes-operator"

    @property
    def crd_files(self) -> list[Path]:
        """The release's CRDs: SparkApplication and SparkCluster (the operator watches both)."""
        return sorted((self.chart / "crds").glob("*.yaml"))


def ensure_apache_operator(*, timeout: float = 3 * 3600.0) -> ApacheOperatorRelease:
    """Build upstream's operator if needed (``build-apache-operator.sh``, a no-op when its stamp
    matches) and return it. A failure raises :class:`KubeBenchError`, never a skip."""
    bin_dir = kubebench.run_build_script(
        APACHE_OPERATOR_BUILD_SCRIPT,
        what="the Apache Spark Kubernetes Operator",
        binaries=(LAUNCHER,),
        timeout=timeout,
    )
    release = ApacheOperatorRelease(bin_dir)
    if len(release.crd_files) != 2:
        raise KubeBenchError(f"no CRDs in {release.chart / 'crds'}: the source tree is incomplete")
    return release


def render_apache_operator_chart(
    release: ApacheOperatorRelease, *, job_namespaces: Sequence[str]
) -> list[JsonObj]:
    """Upstream's chart of ``release``, rendered with its default values except the workload
    namespaces (which the bench creates itself)."""
    values = {"workloadResources": {"namespaces": {"create": False, "data": list(job_namespaces)}}}
    return render_chart(release.chart, values, name=RELEASE_NAME, namespace=OPERATOR_NAMESPACE)


def with_properties(text: str, overrides: Mapping[str, str]) -> str:
    """A Java properties file's ``text`` with each ``key=value`` line named in ``overrides``
    set to the new value, and the other overrides appended. A purely computational function."""
    left = dict(overrides)
    out: list[str] = []
    for line in text.splitlines():
        key = line.split("=", 1)[0].strip()
        if "=" in line and not line.lstrip().startswith("#") and key in left:
            out.append(f"{key}={left.pop(key)}")
        else:
            out.append(line)
    out.extend(f"{key}={value}" for key, value in left.items())
    return "\n".join(out) + "\n"


class ApacheOperatorBench(KubeCluster):
    """A :class:`KubeCluster`'s control plane with the Apache release's CRDs and its operator
    watching ``job_namespaces`` (instead of Kubeflow's); see the module's docstring.
    :meth:`start` builds what is missing; :meth:`stop` ends every process."""

    def __init__(
        self,
        *,
        job_namespaces: Sequence[str] = ("default",),
        properties: Mapping[str, str] | None = None,
        **bench_args: Any,
    ) -> None:
        super().__init__(job_namespaces=job_namespaces, **bench_args)
        #: operator properties over the chart's, e.g. reconciler intervals
        self._property_overrides = dict(properties or {})
        self.apache: ApacheOperatorRelease | None = None
        self._operator: kubebench._Process | None = None

    def start(self) -> Self:
        """Build (if needed) and start the bench with the release's CRDs,
        kube-controller-manager and kube-scheduler, apply the chart's RBAC, then start the
        operator and wait until its SparkApplication controller started (its informers
        synced). Idempotent."""
        if self.started:
            return self
        try:
            netguard.require_guard("the Apache operator bench")
        except netguard.NetGuardError as exc:
            raise KubeBenchError(str(exc)) from None
        self.apache = ensure_apache_operator(timeout=self._build_timeout)
        self._crd_files = self.apache.crd_files
        KubeBench.start(self)  # the apiserver and etcd, not Kubeflow's operator
        try:
            deadline = time.monotonic() + self._startup_timeout
            self._start_control_plane(deadline)
            self._start_node(deadline)
            objects = render_apache_operator_chart(self.apache, job_namespaces=self.job_namespaces)
            for namespace in (OPERATOR_NAMESPACE, *self.job_namespaces):
                self.ensure_namespace(namespace)
            self.apply_manifest([o for o in objects if o["kind"] in _APPLIED])
            self._start_operator(objects, deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """The operator first, given time to exit on its SIGTERM (its first exit writes the
        class-data archive), then the control plane and the bench."""
        operator, self._operator = self._operator, None
        if operator is not None:
            operator.stop(timeout=ARCHIVE_EXIT_SECONDS)
        super().stop()

    def _start_operator(self, objects: Sequence[JsonObj], deadline: float) -> None:
        assert self.apache is not None
        conf_dir = self.workdir / "apache-operator-conf"
        conf_dir.mkdir(exist_ok=True)
        data = _chart_configmap(objects)
        overrides = {
            "spark.kubernetes.operator.health.probePort": str(kubebench._free_port()),
            "spark.kubernetes.operator.metrics.port": str(kubebench._free_port()),
            **self._property_overrides,
        }
        for name in _CONF_FILES:
            text = data.get(name, "")
            if name == "spark-operator.properties":
                text = with_properties(text, overrides)
            (conf_dir / name).write_text(text, encoding="utf-8")
        account = _operator_service_account(objects)
        kubeconfig = self.service_account_kubeconfig(OPERATOR_NAMESPACE, account)
        argv = [
            str(self.apache.launcher),
            *JVM_OPTIONS,
            # a class-data archive of the operator's classes, written at its first exit beside
            # the build and used (or rewritten when stale) by every later start: the start is
            # mostly class loading (AutoCreateSharedArchive, JDK 19 and later)
            "-XX:+AutoCreateSharedArchive",
            f"-XX:SharedArchiveFile={self.apache.launcher.parent / 'operator-classes.jsa'}",
            "-Xlog:cds=off,cds+dynamic=off",
            f"-Dlog4j.configurationFile={conf_dir / 'log4j2.properties'}",
            f"-Dspark.kubernetes.operator.basePropertyFileName={conf_dir / _CONF_FILES[0]}",
            f"-Dspark.kubernetes.operator.metrics.propertyFileName={conf_dir / _CONF_FILES[2]}",
            f"-Djava.io.tmpdir={self.workdir}",
        ]
        env = {"KUBECONFIG": kubeconfig, "SPARK_USER": "spark"}
        proc = self._operator = self._start("apache-operator", argv, env)

        def started() -> bool:
            self._check_alive(proc)
            return _STARTED in proc.log_path.read_text(encoding="utf-8", errors="replace")

        self._wait_for(started, deadline, "the Apache operator's SparkApplication controller", proc)

    def operator_log(self) -> str:
        """What the operator wrote so far (log4j's console appender: its stderr)."""
        return self.component_log("apache-operator")


def _chart_configmap(objects: Sequence[JsonObj]) -> dict[str, str]:
    for obj in objects:
        if (
            obj["kind"] == "ConfigMap"
            and obj["metadata"]["name"] == f"{RELEASE_NAME}-configuration"
        ):
            return {str(k): str(v) for k, v in (obj.get("data") or {}).items()}
    raise KubeBenchError(f"upstream's chart rendered no ConfigMap {RELEASE_NAME}-configuration")


def _operator_service_account(objects: Sequence[JsonObj]) -> str:
    for obj in objects:
        if obj["kind"] == "Deployment" and obj["metadata"]["name"] == RELEASE_NAME:
            return str(obj["spec"]["template"]["spec"]["serviceAccountName"])
    raise KubeBenchError(f"upstream's chart rendered no Deployment {RELEASE_NAME}")
