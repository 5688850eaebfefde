"""KubeNode: the real kubelet on the bench, with the bench's own container runtime.

The kubelet (``k8s.io/kubernetes/cmd/kubelet``) and ``kubebench-cri`` (``go/cmd/kubebench-cri``,
a CRI v1 server that runs containers as local processes) are built by ``build.sh`` from the
module graph of the API server. :class:`KubeNode` runs both, inside the network guard, in a
process tree that is contained so that nothing of it outlives :meth:`KubeNode.stop` and the
machine is never changed:

* **one PID and mount namespace** for the kubelet, the runtime and every container
  (``unshare --pid --fork --kill-child --mount --propagation private``): when the node's first
  process ends, the kernel ends every process of the node, and every mount the kubelet made
  (volumes, its root dir) goes with the namespace;
* **kernel settings are never written.** The kubelet runs with ``protectKernelDefaults: true``:
  it only checks ``vm.overcommit_memory``, ``vm.panic_on_oom``, ``kernel.panic``,
  ``kernel.panic_on_oops`` and ``kernel.keys.root_max*``, and refuses to start when they
  differ. In the node's mount namespace, files holding the values it expects are bound over
  those ``/proc/sys`` entries; the host's values stay as they are;
* **fixed host paths on tmpfs:** the kubelet writes under ``/var/lib/kubelet`` (device
  plugins) and ``/var/log`` (container log links) whatever its ``--root-dir``; both are tmpfs
  in the node's namespace;
* **no cgroups:** ``cgroupsPerQOS: false`` and ``enforceNodeAllocatable: []``;
* **the pod network** (``POD_NETWORK``, a documentation range, RFC 5737): a bridge in the
  guard's namespace with the node's address, a network namespace per pod with one veth into
  it, and no default route in the pods. The runtime answers DNS for Services on the bridge
  address (``kubernetes.default.svc`` is 127.0.0.1 in a pod) and relays the pod's
  127.0.0.1:443 and 127.0.0.1:<API server port> to the API server;
* the API server's loopback address is the only one the kubelet dials.

Usage (``KubeCluster(node=True)`` does this after its control plane)::

    node = KubeNode(bench, bin_dir)
    node.start(deadline)
    ...
    node.stop()
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Final

from tests.kubebench import bench as kubebench
from tests.kubebench.bench import HERE, JsonObj, KubeBench, KubeBenchError
from tests.support import cached_jars, jvm_options

__all__ = [
    "HOST_SYSCTLS",
    "NODE_NAME",
    "POD_NETWORK",
    "KubeNode",
    "host_sysctls",
    "image_rules",
    "kubelet_configuration",
    "node_roots",
]

#: the Node's name (``--hostname-override``): the API server reaches the kubelet on loopback
NODE_NAME: Final = "localhost"
#: the pod network: TEST-NET-1 (RFC 5737), never routed anywhere; .1 is the node's bridge
POD_NETWORK: Final = "192.0.2."
POD_PREFIX_LEN: Final = 24
NODE_IP: Final = POD_NETWORK + "1"
BRIDGE: Final = "kbnode0"
CLUSTER_DOMAIN: Final = "cluster.local"
#: what the kubelet's container manager expects of the kernel (protectKernelDefaults checks
#: them; without it, it would write them into the host kernel)
HOST_SYSCTLS: Final = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}
#: the Spark image's entrypoint on this node (Spark's ``driver``/``executor`` arguments)
SPARK_ENTRYPOINT: Final = HERE / "node" / "spark-entrypoint.sh"
REPO: Final = HERE.parents[1]

#: sh run as the node's first process (PID 1 of its PID namespace, in its mount namespace):
#: the tmpfs and the kernel-setting files, then the runtime, then the kubelet ("$@")
_NODE_SCRIPT = """set -eu
mount -t tmpfs -o mode=0755 kubenode-var-lib /var/lib
mount -t tmpfs -o mode=0755 kubenode-var-log /var/log
for entry in $KUBENODE_SYSCTLS; do
  mount --bind "${entry#*=}" "/proc/sys/${entry%%=*}"
done
"$KUBENODE_CRI" serve --config "$KUBENODE_CRI_CONFIG" 2>>"$KUBENODE_CRI_LOG" &
cri=$!
i=0
while [ ! -S "$KUBENODE_CRI_SOCKET" ]; do
  i=$((i + 1))
  if [ "$i" -gt 400 ] || ! kill -0 "$cri" 2>/dev/null; then
    echo "kubenode: the runtime did not start" >&2
    exit 1
  fi
  sleep 0.05
done
"$@" &
kubelet=$!
trap 'kill -TERM "$kubelet" "$cri" 2>/dev/null || true' TERM INT
wait "$kubelet" || true
kill -TERM "$kubelet" "$cri" 2>/dev/null || true
wait "$cri" || true
"""


def host_sysctls() -> dict[str, str]:
    """The host's values of the kernel settings the kubelet checks (read, never written)."""
    return {name: Path("/proc/sys", name).read_text().strip() for name in HOST_SYSCTLS}


def kubelet_configuration(
    *,
    port: int,
    healthz_port: int,
    client_ca: str,
    runtime_socket: Path,
    pod_logs: Path,
) -> JsonObj:
    """The KubeletConfiguration of the bench's node. A purely computational function."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        # this machine kind mounts cgroup v1 (the kubelet refuses it by default since 1.35)
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        # no cgroup is written: no QoS hierarchy, nothing enforced on it
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        # check the kernel settings, never write them (the node's files say what it expects)
        "protectKernelDefaults": True,
        "failSwapOn": False,
        "authentication": {
            "x509": {"clientCAFile": client_ca},
            "webhook": {"enabled": False},
            "anonymous": {"enabled": False},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": f"unix://{runtime_socket}",
        "podLogsDir": str(pod_logs),
        "clusterDNS": [NODE_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": "",
        # the machine's disks and memory are shared: evict nothing for the bench's pods
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "localStorageCapacityIsolation": False,
        "serializeImagePulls": False,
        "nodeStatusReportFrequency": "10s",
        "shutdownGracePeriod": "0s",
        "maxPods": 30,
    }


def image_rules(
    *, spark_home: Path, python: str, java_home: str, path: str, java_options: str = ""
) -> list[JsonObj]:
    """Image names to local commands (as an image's ENTRYPOINT, ENV and WORKDIR would):
    anything named ``*spark*`` but sparkguard's is the Spark image (the PySpark wheel's
    SPARK_HOME, Spark's own ``driver``/``executor`` entrypoint; ``java_options`` in
    ``JDK_JAVA_OPTIONS``, which every ``java`` it launches reads: the tests' JVM flags, as a
    test image would set them); ``*sparkguard*`` is the checkout's entry points (the venv);
    any other image runs the node's own commands (what a test's ``command`` names). A purely
    computational function."""
    venv_path = f"{Path(python).parent}:{path}"
    return [
        {
            "match": "*sparkguard*",
            "entrypoint": [],
            "env": [f"PATH={venv_path}", "PYTHONSAFEPATH=1", f"JAVA_HOME={java_home}"],
            "workingDir": str(REPO),
        },
        {
            "match": "*spark*",
            "entrypoint": [str(SPARK_ENTRYPOINT)],
            "env": [
                f"PATH={venv_path}",
                f"SPARK_HOME={spark_home}",
                f"JAVA_HOME={java_home}",
                f"PYSPARK_PYTHON={python}",
                "PYTHONSAFEPATH=1",
                *([f"JDK_JAVA_OPTIONS={java_options}"] if java_options else []),
            ],
            "workingDir": "/opt/spark/work-dir",
        },
        {"match": "*", "entrypoint": [], "env": [f"PATH={path}"], "workingDir": ""},
    ]


#: The node's system directories every container sees (read-only), as an image's base would.
SYSTEM_ROOTS: Final = ("/usr", "/bin", "/lib", "/lib64", "/sbin", "/etc")


def node_roots(*needed: Path) -> list[str]:
    """The node paths bound read-only into every container: the system directories, plus the
    real location of each ``needed`` path (the checkout, the venv, the interpreter it was made
    from, the JDK, Spark's home), wherever this machine keeps them (a CI checkout need not live
    where a developer's does), leaving out any path inside another one. A purely computational
    function of the paths and the links they resolve through."""
    roots: list[Path] = [Path(p) for p in SYSTEM_ROOTS if os.path.lexists(p)]
    for path in needed:
        real = path.resolve()
        if not any(real == r or r in real.parents for r in roots):
            roots = [r for r in roots if real not in r.parents] + [real]
    return [str(r) for r in roots]


def pyspark_home() -> Path:
    """The PySpark wheel's directory: a SPARK_HOME with ``bin/spark-submit`` and the Kubernetes
    resource manager's jars (spark-kubernetes, fabric8)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise KubeBenchError("pyspark is not installed: it is the bench's SPARK_HOME")
    home = Path(spec.origin).parent
    if not (home / "bin" / "spark-submit").exists():
        raise KubeBenchError(f"{home} has no bin/spark-submit")
    return home


def _java_home() -> str:
    java = shutil.which("java")
    if java is None:
        raise KubeBenchError("no java on PATH: the node's Spark image needs one")
    return str(Path(java).resolve().parents[1])


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise KubeBenchError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _links() -> list[str]:
    done = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True)
    return [line.split(":", 2)[1].strip().split("@")[0] for line in done.stdout.splitlines()]


class KubeNode:
    """The kubelet and ``kubebench-cri`` of one bench (see the module's docstring)."""

    def __init__(self, bench: KubeBench, bin_dir: Path, *, spark_home: Path | None = None) -> None:
        self.bench = bench
        self.bin_dir = bin_dir
        self.spark_home = spark_home
        self.dir = bench.workdir / "node"
        self._proc: kubebench._Process | None = None
        self._bridge = False

    @property
    def log_path(self) -> Path:
        return self.bench.workdir / "kubelet.log"

    @property
    def runtime_log_path(self) -> Path:
        return self.bench.workdir / "kubebench-cri.log"

    @property
    def pod_logs(self) -> Path:
        return self.dir / "pod-logs"

    def start(self, deadline: float) -> None:
        """Make the bridge, start the node and wait until the Node is Ready."""
        for name in ("kubelet", "kubebench-cri"):
            if not (self.bin_dir / name).exists():
                raise KubeBenchError(f"{self.bin_dir / name} is missing: build.sh builds it")
        if BRIDGE in _links():
            raise KubeBenchError(f"the bridge {BRIDGE} exists already: one node per guard")
        self.dir.mkdir()
        _ip("link", "add", BRIDGE, "type", "bridge")
        self._bridge = True
        _ip("addr", "add", f"{NODE_IP}/{POD_PREFIX_LEN}", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
        argv, env = self._command()
        self._proc = kubebench._Process("kubelet", argv, self.log_path, env=env)
        self.bench._wait_for(self._ready, deadline, "the node to be Ready", self._proc)

    def _command(self) -> tuple[list[str], dict[str, str]]:
        sysctl_dir = self.dir / "sysctl"
        sysctls = []
        for name, value in HOST_SYSCTLS.items():
            file = sysctl_dir / name.replace("/", ".")
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_text(value + "\n")
            sysctls.append(f"{name}={file}")
        socket = self.dir / "cri.sock"
        host_port = self.bench.server.removeprefix("https://")
        python = str(Path(sys.executable))
        spark_home = self.spark_home or pyspark_home()
        # the archive of this interpreter's PySpark (dumped once per machine; a pytest run has
        # it already): another Spark home's JVMs run without one
        archive = None
        if self.spark_home is None:
            archive, _ = jvm_options.ensure_archive(cached_jars.cache_root())
        java_home = _java_home()
        cri_config = {
            "socket": str(socket),
            "stateDir": str(self.dir / "runtime"),
            "bridge": BRIDGE,
            "network": POD_NETWORK,
            "prefixLen": POD_PREFIX_LEN,
            "gateway": NODE_IP,
            # the API server inside each pod: at the node's address, and where the DNS
            # server sends kubernetes.default.svc (Spark's driver dials that name, port 443)
            "forward": [
                {"listen": host_port, "target": host_port},
                {"listen": "127.0.0.1:443", "target": host_port},
            ],
            "hosts": {f"kubernetes.default.svc.{CLUSTER_DOMAIN}": "127.0.0.1"},
            "apiServer": self.bench.server,
            "token": self.bench.admin_token,
            "caFile": self.bench.ca_file,
            "clusterDomain": CLUSTER_DOMAIN,
            "readOnly": node_roots(
                REPO,
                Path(sys.prefix),
                Path(sys.base_prefix),
                Path(java_home),
                spark_home,
                cached_jars.cache_root(),  # the project's caches (jars a test's conf may name)
            ),
            "writable": [],
            "images": image_rules(
                spark_home=spark_home,
                python=python,
                java_home=java_home,
                path=os.environ.get("PATH", "/usr/bin:/bin"),
                # the drivers' and executors' JVMs: C1 only, the serial collector and the
                # class-data archive, as every test JVM (tests/support/jvm_options.py)
                java_options=jvm_options.java_options(archive),
            ),
        }
        cri_config_file = self.dir / "cri.json"
        kubebench._write_private(cri_config_file, json.dumps(cri_config, indent=2).encode())
        config = kubelet_configuration(
            port=kubebench._free_port(),
            healthz_port=kubebench._free_port(),
            client_ca=self.bench.ca_file,
            runtime_socket=socket,
            pod_logs=self.pod_logs,
        )
        config_file = self.dir / "kubelet.json"
        config_file.write_text(json.dumps(config, indent=2))
        kubelet = [
            str(self.bin_dir / "kubelet"),
            f"--config={config_file}",
            f"--kubeconfig={self.bench.kubeconfig_path}",
            f"--root-dir={(self.dir / 'root').resolve()}",
            f"--cert-dir={(self.dir / 'pki').resolve()}",
            f"--hostname-override={NODE_NAME}",
            f"--node-ip={NODE_IP}",
        ]
        wrapper = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"]
        wrapper += ["--mount", "--propagation", "private", "--"]
        argv = [*wrapper, "sh", "-c", _NODE_SCRIPT, "kubenode", *kubelet]
        env = {
            "KUBENODE_SYSCTLS": " ".join(sysctls),
            "KUBENODE_CRI": str(self.bin_dir / "kubebench-cri"),
            "KUBENODE_CRI_CONFIG": str(cri_config_file),
            "KUBENODE_CRI_SOCKET": str(socket),
            "KUBENODE_CRI_LOG": str(self.runtime_log_path),
        }
        return argv, env

    def _ready(self) -> bool:
        assert self._proc is not None
        self.bench._check_alive(self._proc)
        try:
            _, node = self.bench.request("GET", f"/api/v1/nodes/{NODE_NAME}")
        except kubebench.KubeApiError as exc:
            if exc.status == 404:
                return False
            raise
        conditions = (node.get("status") or {}).get("conditions") or []
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
        taints = (node.get("spec") or {}).get("taints") or []
        return ready and not any(t["key"] == "node.kubernetes.io/not-ready" for t in taints)

    def stop(self) -> None:
        """End the node (every process of its PID namespace, every mount of its mount
        namespace, every pod network), then remove the bridge. Safe to call repeatedly."""
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.stop(timeout=20.0)
        if self._bridge:
            self._bridge = False
            # the pods' veths went with their namespaces; the bridge is the bench's
            subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True, check=False)

    def leftovers(self) -> dict[str, list[str]]:
        """What of the node is still there: mounts under its directory, processes that run its
        binaries, pod veths and the bridge (empty lists once :meth:`stop` is done)."""
        mounts = [
            line.split()[4]
            for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if str(self.dir) in line.split()[4]
        ]
        processes = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if str(self.dir) in cmdline or str(self.bin_dir / "kubebench-cri") in cmdline:
                processes.append(f"{entry.name}: {cmdline[:120]}")
        links = [name for name in _links() if name == BRIDGE or name.startswith("kbv")]
        return {"mounts": mounts, "processes": processes, "links": links}
