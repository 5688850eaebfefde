"""KubeCluster: the bench with the rest of a cluster around it and upstream's spark-operator.

:class:`KubeCluster` is a :class:`~tests.kubebench.bench.KubeBench` that also runs, on 127.0.0.1
and inside the network guard:

* **kube-controller-manager** and **kube-scheduler**, built by ``build.sh`` from the module graph
  the bench pins (garbage collection through ownerReferences, namespace deletion, ServiceAccount
  and root-CA ConfigMaps per namespace, the job and TTL controllers; binding of pods to nodes);
* **upstream's Kubeflow spark-operator** (``build-spark-operator.sh``: release v2.5.2): its
  controller (``spark-operator controller start``), which runs the real ``spark-submit
  --deploy-mode cluster`` from the PySpark wheel, and its webhook (``spark-operator webhook
  start``). Both start with the arguments upstream's Helm chart gives them, rendered from the
  release's own chart, and run as the chart's ServiceAccounts under the chart's RBAC (plus one
  grant, :func:`network_policy_grant`, that Spark 4.3's spark-submit needs). The CRDs are the
  release's (``charts/spark-operator-chart/crds/``), not the bench's generated ones.

The webhook is registered as the chart registers it, but by ``url`` (``https://localhost:<port>``)
instead of a Service: upstream's webhook makes its own CA and serving certificate (names
``localhost`` and ``<service>.<namespace>.svc``), stores them in its Secret and writes its CA into
both webhook configurations' ``caBundle`` itself (``pkg/certificate``, and the
``mutatingwebhookconfiguration``/``validatingwebhookconfiguration`` controllers).

By default there is no kubelet: pods are created, scheduled onto nothing (no Node) and never
run, and a test drives a pod's life by patching its status. With ``node=True`` the cluster has a
node (:class:`~tests.kubebench.node.KubeNode`: the real kubelet and the bench's container
runtime), and pods run. Processes and logs live in the bench's temp dir
(``<workdir>/*.log``), so the bench's check of dialled addresses covers them::

    with KubeCluster(job_namespaces=["spark-jobs"]) as cluster:
        cluster.apply_manifest(spark_application)
"""

from __future__ import annotations

import ssl
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from tests.kubebench import bench as kubebench
from tests.kubebench.bench import HERE, JsonObj, KubeBench, KubeBenchError
from tests.kubebench.node import KubeNode, pyspark_home
from tests.support import cached_jars, jvm_options, netguard

__all__ = [
    "SPARK_OPERATOR_BUILD_SCRIPT",
    "KubeCluster",
    "SparkOperatorRelease",
    "ensure_spark_operator",
    "render_chart",
    "render_spark_operator_chart",
]

SPARK_OPERATOR_BUILD_SCRIPT = HERE / "build-spark-operator.sh"
#: the namespace and Helm release name of upstream's chart on the bench
OPERATOR_NAMESPACE = "spark-operator"
RELEASE_NAME = "spark-operator"
#: the webhook configurations of upstream's chart (applied by url once the webhook runs)
_WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
#: the kinds of the rendered chart applied as they are: not the Deployments (the bench runs
#: their containers as local processes), the webhook's Service (the webhook is called by url),
#: nor the webhook configurations (by url, once the webhook runs)
_NOT_APPLIED = frozenset({"Deployment", "Service", *_WEBHOOK_KINDS})


@dataclass(frozen=True)
class SparkOperatorRelease:
    """Upstream's spark-operator as ``build-spark-operator.sh`` left it: the binary, and the
    release's source tree beside it (``<cache>/spark-operator/<version>/{bin,src}``)."""

    bin_dir: Path

    @property
    def binary(self) -> Path:
        return self.bin_dir / "spark-operator"

    @property
    def source(self) -> Path:
        return self.bin_dir.parent / "src"

    @property
    def version(self) -> str:
        return self.bin_dir.parent.name

    @property
    def chart(self) -> Path:
        return self.source / "charts" / "spark-operator-chart"

    @property
    def crd_files(self) -> list[Path]:
        """The release's CRDs: SparkApplication, ScheduledSparkApplication, SparkConnect."""
        return sorted((self.chart / "crds").glob("*.yaml"))


def ensure_spark_operator(*, timeout: float = 3 * 3600.0) -> SparkOperatorRelease:
    """Build upstream's spark-operator if needed (``build-spark-operator.sh``, a no-op when its
    stamp matches) and return it. A failure raises :class:`KubeBenchError`, never a skip."""
    bin_dir = kubebench.run_build_script(
        SPARK_OPERATOR_BUILD_SCRIPT,
        what="the spark-operator",
        binaries=("spark-operator",),
        timeout=timeout,
    )
    release = SparkOperatorRelease(bin_dir)
    if not release.crd_files:
        raise KubeBenchError(f"no CRDs in {release.chart / 'crds'}: the source tree is incomplete")
    return release


def render_spark_operator_chart(
    release: SparkOperatorRelease, *, job_namespaces: Sequence[str]
) -> list[JsonObj]:
    """Upstream's chart of ``release``, rendered with its default values except
    ``spark.jobNamespaces`` (Helm's engine, as the tests of our own chart render it)."""
    values = {"spark": {"jobNamespaces": list(job_namespaces)}}
    return render_chart(release.chart, values, name=RELEASE_NAME, namespace=OPERATOR_NAMESPACE)


def render_chart(
    chart_dir: Path, values: Mapping[str, Any], *, name: str, namespace: str
) -> list[JsonObj]:
    """The objects of the chart in ``chart_dir`` installed as release ``name`` in
    ``namespace`` with ``values`` over its defaults (Helm's engine), in file order."""
    import helm_python as helm

    from tests.support import yamlfast

    chart = helm.Chart.load(str(chart_dir))
    rendered = chart.render(dict(values), name=name, namespace=namespace, is_install=True)
    objects: list[JsonObj] = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(doc for doc in yamlfast.load_all(text) if doc)
    return objects


def network_policy_grant(job_namespaces: Sequence[str]) -> list[JsonObj]:
    """The one grant the bench adds to upstream's chart: its controller's spark-submit may
    write NetworkPolicies in the job namespaces. Spark 4.3.0's submission client (the PySpark
    wheel's, the bench's SPARK_HOME) always creates one per driver (``KubernetesDriverBuilder``
    runs ``NetworkPolicyFeatureStep``: executors take ingress only from their app's pods), by
    server-side apply; upstream's image ships Spark 4.0.4, and chart v2.5.2 grants no
    ``networkpolicies``. Without this every submission fails with 403 (SUBMISSION_FAILED).
    A purely computational function."""
    name = f"{RELEASE_NAME}-controller-networkpolicies"
    subject = {
        "kind": "ServiceAccount",
        "name": f"{RELEASE_NAME}-controller",
        "namespace": OPERATOR_NAMESPACE,
    }
    objects: list[JsonObj] = []
    for namespace in job_namespaces:
        meta = {"name": name, "namespace": namespace}
        objects.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": meta,
                "rules": [
                    {
                        "apiGroups": ["networking.k8s.io"],
                        "resources": ["networkpolicies"],
                        # patch: server-side apply creates it; delete: spark-submit removes
                        # what it made when the driver pod's creation fails
                        "verbs": ["create", "get", "patch", "delete"],
                    }
                ],
            }
        )
        objects.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": meta,
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                "subjects": [subject],
            }
        )
    return objects


def with_flags(args: Sequence[str], overrides: Mapping[str, str]) -> list[str]:
    """``args`` with each ``--name=value`` named in ``overrides`` set to the new value (in
    place), and the other overrides appended. A purely computational function."""
    out: list[str] = []
    left = dict(overrides)
    for arg in args:
        name = arg.split("=", 1)[0]
        if arg.startswith("--") and name in left:
            out.append(f"{name}={left.pop(name)}")
        else:
            out.append(arg)
    out.extend(f"{name}={value}" for name, value in left.items())
    return out


def container_args(objects: Sequence[JsonObj], deployment: str) -> list[str]:
    """The first container's ``args`` of the rendered Deployment named ``deployment``."""
    for obj in objects:
        if obj.get("kind") == "Deployment" and obj["metadata"]["name"] == deployment:
            return [str(a) for a in obj["spec"]["template"]["spec"]["containers"][0]["args"]]
    raise KubeBenchError(f"upstream's chart rendered no Deployment {deployment!r}")


def webhook_by_url(config: JsonObj, base_url: str) -> JsonObj:
    """A rendered webhook configuration with each ``clientConfig.service`` replaced by
    ``url: <base_url><service.path>``. A purely computational function."""
    out: JsonObj = {**config, "webhooks": []}
    for hook in config.get("webhooks") or []:
        service = hook["clientConfig"]["service"]
        client_config = {"url": base_url + str(service.get("path", "/"))}
        out["webhooks"].append({**hook, "clientConfig": client_config})
    return out


#: sh run by ``unshare --mount``: /tmp becomes an empty tmpfs, except the entries named in
#: $KUBECLUSTER_TMP_KEEP, bind-mounted back from the real /tmp (still reachable through the
#: working directory once the tmpfs covers it; --no-canonicalize, or mount would resolve
#: "./name" to the new /tmp/name)
_PRIVATE_TMP_SCRIPT = """set -eu
cd /tmp
mount -t tmpfs -o mode=1777,size=512m kubecluster-tmp /tmp
for name in $KUBECLUSTER_TMP_KEEP; do
  mkdir "/tmp/$name"
  mount --no-canonicalize --bind "./$name" "/tmp/$name"
done
cd /
unset KUBECLUSTER_TMP_KEEP
exec "$@"
"""


def with_private_tmp(argv: Sequence[str], keep: Sequence[Path]) -> tuple[list[str], JsonObj]:
    """``argv`` wrapped to run in a mount namespace of its own where ``/tmp`` is a tmpfs that
    holds only the entries of ``/tmp`` that ``keep``'s paths lie in; and the environment that
    names them. Upstream's controller writes each submission's pod templates into
    ``/tmp/spark/<submissionID>/`` and removes them only for apps with templates of their own
    (``cleanUpPodTemplateFiles``); the chart gives it an emptyDir at ``/tmp``, and so does
    this: the files go when the controller does. A purely computational function."""
    tmp = Path("/tmp")
    under = [p.resolve().relative_to(tmp).parts for p in keep if p.resolve().is_relative_to(tmp)]
    names = sorted({parts[0] for parts in under if parts})
    wrapped = ["unshare", "--mount", "--propagation", "private", "--"]
    wrapped += ["sh", "-c", _PRIVATE_TMP_SCRIPT, "sh", *argv]
    return wrapped, {"KUBECLUSTER_TMP_KEEP": " ".join(names)}


class KubeCluster(KubeBench):
    """A :class:`KubeBench` plus kube-controller-manager, kube-scheduler and upstream's
    spark-operator (controller and webhook) watching ``job_namespaces``; see the module's
    docstring. :meth:`start` builds what is missing; :meth:`stop` ends every process."""

    def __init__(
        self,
        *,
        job_namespaces: Sequence[str] = ("default",),
        controller_args: Mapping[str, str] | None = None,
        node: bool = False,
        **bench_args: Any,
    ) -> None:
        super().__init__(crd_files=(), service_account_admission=node, **bench_args)
        self.job_namespaces = list(job_namespaces)
        #: a node (the real kubelet and kubebench-cri, ``node.py``) when started with ``node=True``
        self.node: KubeNode | None = None
        self._with_node = node
        #: the controller's flags over the chart's, e.g. ``{"--zap-log-level": "debug"}``
        self._controller_overrides = dict(controller_args or {})
        self.release: SparkOperatorRelease | None = None
        self._components: list[kubebench._Process] = []
        # /healthz of the control plane: served with a cert of the bench CA, checked as such.
        self._health_opener: urllib.request.OpenerDirector | None = None

    def start(self) -> Self:
        """Build (if needed) and start the bench with upstream's CRDs, then
        kube-controller-manager, kube-scheduler, the spark-operator's webhook (registered and
        called once) and its controller (its caches synced). Idempotent."""
        if self.started:
            return self
        # The build first: the bench applies the release's CRDs when it starts. Refused
        # outside the guard like the bench itself (no registry is reached from here).
        try:
            netguard.require_guard("the kube cluster (spark-operator, control plane)")
        except netguard.NetGuardError as exc:
            raise KubeBenchError(str(exc)) from None
        self.release = ensure_spark_operator(timeout=self._build_timeout)
        self._crd_files = self.release.crd_files
        super().start()
        try:
            deadline = time.monotonic() + self._startup_timeout
            self._start_control_plane(deadline)
            self._start_node(deadline)
            objects = render_spark_operator_chart(self.release, job_namespaces=self.job_namespaces)
            for namespace in (OPERATOR_NAMESPACE, *self.job_namespaces):
                self.ensure_namespace(namespace)
            self.apply_manifest([o for o in objects if o["kind"] not in _NOT_APPLIED])
            self.apply_manifest(network_policy_grant(self.job_namespaces))
            self._start_webhook(objects, deadline)
            self._start_controller(objects, deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """End the spark-operator and the control plane (each with its process group: the
        controller's spark-submit too), then the bench."""
        components, self._components = self._components, []
        operator = [p for p in components if p.name.startswith("spark-operator")]
        for proc in reversed(operator):
            proc.stop()
        if self.node is not None:
            self.node.stop()
        for proc in reversed([p for p in components if p not in operator]):
            proc.stop()
        super().stop()

    # -- components ---------------------------------------------------------------------------

    def _start(
        self, name: str, argv: list[str], env: Mapping[str, str] | None = None
    ) -> kubebench._Process:
        assert self._workdir is not None
        proc = kubebench._Process(name, argv, self._workdir / f"{name}.log", env=env)
        self._components.append(proc)
        return proc

    def _start_control_plane(self, deadline: float) -> None:
        """kube-controller-manager and kube-scheduler as the admin, serving /healthz on
        127.0.0.1 only; waits until both answer ok."""
        assert self.bin_dir is not None
        for name in ("kube-controller-manager", "kube-scheduler"):
            binary = self.bin_dir / name
            if not binary.exists():
                raise KubeBenchError(
                    f"{binary} is missing: build.sh builds it (or ${kubebench.BIN_DIR_ENV} "
                    "lacks it)"
                )
            port = kubebench._free_port()
            serving = self.issue_certificate(name)
            argv = [
                str(binary),
                f"--kubeconfig={self.kubeconfig_path}",
                f"--authentication-kubeconfig={self.kubeconfig_path}",
                f"--authorization-kubeconfig={self.kubeconfig_path}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--tls-cert-file={serving.cert_file}",
                f"--tls-private-key-file={serving.key_file}",
                "--leader-elect=false",
                "--profiling=false",
            ]
            if name == "kube-controller-manager":
                # The kube-root-ca.crt ConfigMap of every namespace (projected SA tokens).
                argv.append(f"--root-ca-file={self.ca_file}")
            proc = self._start(name, argv)
            url = f"https://127.0.0.1:{port}/healthz"
            self._wait_for(self._answers_ok(proc, url), deadline, f"{name} /healthz", proc)

    def _start_node(self, deadline: float) -> None:
        """The node (the real kubelet and the bench's runtime) when started with ``node=True``;
        waits until it is Ready."""
        if self._with_node:
            assert self.bin_dir is not None
            self.node = KubeNode(self, self.bin_dir)
            self.node.start(deadline)

    def _answers_ok(self, proc: kubebench._Process, url: str) -> Callable[[], bool]:
        if self._health_opener is None:
            context = ssl.create_default_context(cafile=self.ca_file)
            self._health_opener = urllib.request.build_opener(
                urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
            )
        opener = self._health_opener

        def ok() -> bool:
            self._check_alive(proc)
            try:
                with opener.open(url, timeout=2) as resp:
                    return int(resp.status) == 200
            except (OSError, urllib.error.URLError):
                return False

        return ok

    def _start_webhook(self, objects: Sequence[JsonObj], deadline: float) -> None:
        """Upstream's webhook with the chart's arguments (its port free on this machine, no
        metrics, no health server, no leader election), then the chart's two webhook
        configurations by url; waits until the webhook wrote its CA into both and the API
        server called it (a dry-run SparkApplication)."""
        assert self.release is not None
        assert self._workdir is not None
        port = kubebench._free_port()
        kubeconfig = self.service_account_kubeconfig(OPERATOR_NAMESPACE, f"{RELEASE_NAME}-webhook")
        args = with_flags(
            container_args(objects, f"{RELEASE_NAME}-webhook"),
            {
                "--kubeconfig": kubeconfig,
                "--webhook-port": str(port),
                "--webhook-cert-dir": str(self._workdir / "spark-operator-webhook-certs"),
                "--leader-election": "false",
                "--enable-metrics": "false",
                "--metrics-bind-address": "0",
                "--health-probe-bind-address": "0",
            },
        )
        proc = self._start("spark-operator-webhook", [str(self.release.binary), *args])
        configs = [
            webhook_by_url(o, f"https://localhost:{port}")
            for o in objects
            if o["kind"] in _WEBHOOK_KINDS
        ]
        self.apply_manifest(configs)

        def ca_written() -> bool:
            self._check_alive(proc)
            for config in configs:
                path = (
                    "/apis/admissionregistration.k8s.io/v1/"
                    f"{config['kind'].lower()}s/{config['metadata']['name']}"
                )
                _, stored = self._raw("GET", path)
                if not all(h["clientConfig"].get("caBundle") for h in stored["webhooks"]):
                    return False
            return True

        self._wait_for(ca_written, deadline, "the spark-operator webhook's caBundle", proc)
        self._wait_for(
            self._webhook_answers(proc), deadline, "the spark-operator webhook to answer", proc
        )

    def _webhook_answers(self, proc: kubebench._Process) -> Callable[[], bool]:
        """A dry-run create of a SparkApplication: the API server calls upstream's mutating
        and validating webhooks for it (failurePolicy Fail: an error while it cannot)."""
        namespace = self.job_namespaces[0]
        probe = {
            "apiVersion": "sparkoperator.k8s.io/v1beta2",
            "kind": "SparkApplication",
            "metadata": {"name": "webhook-probe", "namespace": namespace},
            "spec": {
                "type": "Scala",
                "mode": "cluster",
                "sparkVersion": "4.0.0",
                "mainClass": "org.apache.spark.examples.SparkPi",
                "mainApplicationFile": "local:///opt/spark/examples/jars/examples.jar",
                "driver": {},
                "executor": {},
            },
        }
        path = f"/apis/sparkoperator.k8s.io/v1beta2/namespaces/{namespace}/sparkapplications"

        def answers() -> bool:
            self._check_alive(proc)
            try:
                self._raw("POST", f"{path}?dryRun=All", probe)
            except kubebench.KubeApiError as exc:
                if "failed calling webhook" in exc.body:
                    return False
                raise
            return True

        return answers

    def _start_controller(self, objects: Sequence[JsonObj], deadline: float) -> None:
        """Upstream's controller with the chart's arguments (no metrics, no health server, no
        leader election), as the chart's ServiceAccount; spark-submit is the PySpark wheel's,
        its master ``k8s://https://127.0.0.1:<port>`` (KUBERNETES_SERVICE_HOST/PORT), its
        credentials the same kubeconfig. Waits until its workers started (caches synced)."""
        assert self.release is not None
        kubeconfig = self.service_account_kubeconfig(
            OPERATOR_NAMESPACE, f"{RELEASE_NAME}-controller"
        )
        args = with_flags(
            container_args(objects, f"{RELEASE_NAME}-controller"),
            {
                "--kubeconfig": kubeconfig,
                "--leader-election": "false",
                "--enable-metrics": "false",
                "--metrics-bind-address": "0",
                "--health-probe-bind-address": "0",
                **self._controller_overrides,
            },
        )
        host_port = self.server.removeprefix("https://")
        host, _, port = host_port.rpartition(":")
        spark_home = pyspark_home()
        # spark-submit's JVM (one per submission, seconds of CPU each): C1 only, the serial
        # collector and the class-data archive, as every test JVM (tests/support/jvm_options.py)
        archive, _ = jvm_options.ensure_archive(cached_jars.cache_root())
        env = {
            "SPARK_HOME": str(spark_home),
            "SPARK_SUBMIT_OPTS": jvm_options.java_options(archive),
            "KUBERNETES_SERVICE_HOST": host,
            "KUBERNETES_SERVICE_PORT": port,
            "KUBECONFIG": kubeconfig,
        }
        # What the controller and its spark-submit read under /tmp: the bench's files (kubeconfig,
        # CA), the run's TMPDIR (java.io.tmpdir), and the rest where they lie.
        keep = [self.workdir, Path(tempfile.gettempdir()), spark_home, self.release.binary]
        argv, tmp_env = with_private_tmp([str(self.release.binary), *args], keep)
        proc = self._start("spark-operator-controller", argv, {**env, **tmp_env})

        def workers_started() -> bool:
            self._check_alive(proc)
            log = proc.log_path.read_text(encoding="utf-8", errors="replace")
            return any(
                "Starting workers" in line and '"controller": "sparkapplication"' in line
                for line in log.splitlines()
            )

        self._wait_for(workers_started, deadline, "the spark-operator controller's workers", proc)

    # -- what tests read ----------------------------------------------------------------------

    def component_log(self, name: str) -> str:
        """The log of a component: ``kube-controller-manager``, ``kube-scheduler``,
        ``spark-operator-webhook`` or ``spark-operator-controller``."""
        for proc in self._components:
            if proc.name == name:
                return proc.log_path.read_text(encoding="utf-8", errors="replace")
        raise KubeBenchError(f"no component {name!r} in this cluster")
