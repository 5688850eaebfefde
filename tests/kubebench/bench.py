"""KubeBench: a real kube-apiserver backed by a real etcd, for sparkguard's tests.

The binaries are built from Go modules by ``build.sh`` (see README.md) into a cache outside the
repository. :class:`KubeBench` starts etcd and kube-apiserver on free 127.0.0.1 ports with a
throw-away PKI, static admin token, service-account signing keys (so TokenRequest works without a
controller-manager) and RBAC authorization, installs the SparkApplication CRD, and tears it all
down again::

    with KubeBench() as bench:
        api = kubernetes.client.CoreV1Api(bench.api_client())
        sa_kubeconfig = bench.service_account_kubeconfig("sparkguard", "operator")

There is no controller-manager, scheduler or kubelet: Deployments never get Pods, namespaces stay
``Terminating`` after deletion, ownerReferences are not garbage-collected, and ServiceAccounts are
not auto-created in new namespaces (hence the ``ServiceAccount`` admission plugin is off).
Admission webhooks are called for real; register them with ``clientConfig.url`` pointing at
``https://127.0.0.1:<port>`` (``service`` references need kube-proxy, which is absent).

Internals talk to the apiserver with the standard library only; :meth:`KubeBench.api_client`
hands out ``kubernetes.client.ApiClient`` objects for tests.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import functools
import http.client
import ipaddress
import json
import os
import secrets
import select
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from tests.support import netguard

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, Configuration

__all__ = [
    "APACHE_SPARK_OPERATOR_CRD",
    "BUILD_SCRIPT",
    "CRD_DIR",
    "KUBE_BINARIES",
    "SPARK_OPERATOR_CRDS",
    "KubeApiError",
    "KubeBench",
    "KubeBenchError",
    "ensure_binaries",
    "run_build_script",
]

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"
CRD_DIR = HERE / "crds"
#: the SparkApplication CRD of each spark-operator major version (tests/kubebench/crds/generate.py)
SPARK_OPERATOR_CRDS = {
    version: CRD_DIR / "sparkapplications" / f"spark-operator-{version}.yaml"
    for version in ("1.x", "2.x")
}
#: The Apache Spark Kubernetes Operator's SparkApplication CRD (spark.apache.org/v1), written by
#: tests/kubebench/crds/generate_apache.py. Not installed by default: apply it where needed.
APACHE_SPARK_OPERATOR_CRD = CRD_DIR / "apache" / "sparkapplications.spark.apache.org.yaml"
#: Set to ``1.x`` to start the bench with spark-operator 1.x's SparkApplication CRD (default 2.x).
SPARK_OPERATOR_ENV = "SPARKGUARD_KUBEBENCH_SPARK_OPERATOR"

#: Set to a directory holding ``kube-apiserver`` and ``etcd`` to use those instead of building.
BIN_DIR_ENV = "SPARKGUARD_KUBE_BIN_DIR"
#: Set to ``1`` to keep the bench's temp dir (logs, certs, etcd data) after ``stop()``.
KEEP_ENV = "SPARKGUARD_KUBEBENCH_KEEP"

ADMIN_USER = "kubebench-admin"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
SERVICE_CIDR = "10.0.0.0/24"
FIELD_MANAGER = "kubebench"
_LOOPBACK_NO_PROXY = "127.0.0.1,localhost,::1"

JsonObj = dict[str, Any]


def spark_operator_version(given: str | None = None) -> str:
    """``given``, else $SPARKGUARD_KUBEBENCH_SPARK_OPERATOR, else ``2.x``; checked."""
    version = given or os.environ.get(SPARK_OPERATOR_ENV) or "2.x"
    if version not in SPARK_OPERATOR_CRDS:
        raise KubeBenchError(
            f"{SPARK_OPERATOR_ENV}={version!r} is not a spark-operator version of the bench; "
            f"use one of {', '.join(sorted(SPARK_OPERATOR_CRDS))}"
        )
    return version


class KubeBenchError(RuntimeError):
    """The bench could not be built, started or driven. The message says why."""


class KubeApiError(KubeBenchError):
    """The apiserver answered a bench request with an HTTP error."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        self.method = method
        self.path = path
        self.status = status
        self.body = body
        reason = body
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            parsed = json.loads(body)
            reason = f"{parsed.get('reason', '')}: {parsed.get('message', body)}"
        super().__init__(f"{method} {path} -> HTTP {status}: {reason[:2000]}")


# --------------------------------------------------------------------------------------------
# building


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _file_tail(path: Path, lines: int = 60) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return _tail(data, lines) or f"<{path} is empty>"


#: what build.sh makes (ensure_binaries checks the first two; the cluster components the rest)
KUBE_BINARIES = ("kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler")


def ensure_binaries(*, timeout: float = 3 * 3600.0) -> Path:
    """Return the directory holding ``kube-apiserver`` and ``etcd`` (and build.sh's other
    binaries, ``KUBE_BINARIES``), building them if needed.

    Runs ``build.sh`` (a no-op when its stamp matches). Any failure raises
    :class:`KubeBenchError` carrying the tail of the build output; nothing is ever skipped.
    ``$SPARKGUARD_KUBE_BIN_DIR`` overrides the build with prebuilt binaries.
    """
    override = os.environ.get(BIN_DIR_ENV)
    if override:
        bin_dir = Path(override)
        missing = [b for b in ("kube-apiserver", "etcd") if not os.access(bin_dir / b, os.X_OK)]
        if missing:
            raise KubeBenchError(f"${BIN_DIR_ENV}={override} lacks executable {', '.join(missing)}")
        return bin_dir
    return run_build_script(
        BUILD_SCRIPT, what="kube-apiserver/etcd", binaries=KUBE_BINARIES, timeout=timeout
    )


def run_build_script(script: Path, *, what: str, binaries: Sequence[str], timeout: float) -> Path:
    """Run a bench build script (its stdout's last line: the bin dir) and check ``binaries``
    are executable there. Any failure raises :class:`KubeBenchError` with the script's output."""
    bash = shutil.which("bash")
    if bash is None:
        raise KubeBenchError("bash not found in PATH; it is needed to run " + str(script))
    try:
        proc = subprocess.run(
            [bash, str(script)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        raise KubeBenchError(
            f"{script} did not finish within {timeout:.0f}s:\n{_tail(err)}"
        ) from exc
    if proc.returncode != 0:
        raise KubeBenchError(
            f"building {what} failed ({script} exited {proc.returncode}):\n"
            f"{_tail(proc.stderr)}\n{_tail(proc.stdout, 5)}".rstrip()
        )
    lines = proc.stdout.strip().splitlines()
    bin_dir = Path(lines[-1]) if lines else Path()
    for b in binaries:
        if not os.access(bin_dir / b, os.X_OK):
            raise KubeBenchError(
                f"{script} succeeded but {bin_dir / b} is not executable:\n{_tail(proc.stderr)}"
            )
    return bin_dir


# --------------------------------------------------------------------------------------------
# PKI


@dataclass(frozen=True)
class CertPair:
    cert_file: Path
    key_file: Path


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class _Pki:
    """A throw-away CA that signs the apiserver's serving cert (and any others tests need)."""

    def __init__(self, directory: Path) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec, rsa
        from cryptography.x509.oid import NameOID

        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._ca_key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubebench-ca")])
        self._ca_name = name
        ski = x509.SubjectKeyIdentifier.from_public_key(self._ca_key.public_key())
        self._ca_cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - datetime.timedelta(hours=1))
            .not_valid_after(_now() + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(ski, critical=False)
            .sign(self._ca_key, hashes.SHA256())
        )
        self.ca_file = directory / "ca.crt"
        self.ca_pem = self._ca_cert.public_bytes(serialization.Encoding.PEM)
        self.ca_file.write_bytes(self.ca_pem)

        # Service-account token signing keys (RSA is what every verifier accepts).
        sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.sa_key_file = directory / "sa.key"
        self.sa_pub_file = directory / "sa.pub"
        _write_private(
            self.sa_key_file,
            sa_key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        )
        self.sa_pub_file.write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )

    def issue(
        self,
        name: str,
        *,
        dns_names: Sequence[str] = ("localhost",),
        ip_addresses: Sequence[str] = ("127.0.0.1",),
        server: bool = True,
        client: bool = False,
        organizations: Sequence[str] = (),
    ) -> CertPair:
        """Sign a leaf certificate for ``name`` with the bench CA; write ``<name>.crt/.key``."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, name)]
        attrs += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self._ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - datetime.timedelta(hours=1))
            .not_valid_after(_now() + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._ca_key.public_key()),
                critical=False,
            )
        )
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._ca_key, hashes.SHA256())
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        pair = CertPair(self.dir / f"{safe}.crt", self.dir / f"{safe}.key")
        pair.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_private(
            pair.key_file,
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        )
        return pair


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


# --------------------------------------------------------------------------------------------
# processes


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    for var in ("NO_PROXY", "no_proxy"):
        cur = env.get(var, "")
        env[var] = f"{cur},{_LOOPBACK_NO_PROXY}" if cur else _LOOPBACK_NO_PROXY
    return env


def _preexec_die_with_parent() -> None:  # pragma: no cover - runs in the child
    """Linux: SIGTERM the child when the process that started it dies (even on SIGKILL)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)
    except Exception:  # noqa: S110 - best effort only
        pass


class _Process:
    def __init__(
        self,
        name: str,
        argv: list[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        # PDEATHSIG fires when the *thread* that forked exits, so only use it from the main thread.
        preexec = (
            _preexec_die_with_parent
            if sys.platform == "linux" and threading.current_thread() is threading.main_thread()
            else None
        )
        with log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**_child_env(), **(env or {})},
                start_new_session=True,
                preexec_fn=preexec,  # noqa: PLW1509 - see the comment above
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def exited(self) -> int | None:
        return self.popen.poll()

    def log_tail(self, lines: int = 60) -> str:
        return _file_tail(self.log_path, lines)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM to its process group, then SIGKILL to the group after ``timeout`` or once the
        process ended: a child it started (the spark-operator's spark-submit) goes with it."""
        if self.popen.returncode is not None:
            return  # reaped already: its group id is no longer ours to signal
        # start_new_session: the group's id is the leader's pid, held until the leader is reaped.
        self._signal_group(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while not self._ended() and time.monotonic() < deadline:
            time.sleep(0.05)
        self._signal_group(signal.SIGKILL)
        self.popen.wait(10)

    def _ended(self) -> bool:
        """The process exited (not reaped: its pid, the group's id, stays ours)."""
        found = os.waitid(os.P_PID, self.popen.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
        return found is not None

    def _signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)


class _PortClashError(KubeBenchError):
    pass


_PORT_CLASH_MARKERS = ("address already in use", "bind: address", "failed to listen")


# --------------------------------------------------------------------------------------------
# the bench


@dataclass(frozen=True)
class _Resource:
    plural: str
    namespaced: bool


class KubeBench:
    """etcd + kube-apiserver on 127.0.0.1, started by :meth:`start`, removed by :meth:`stop`.

    Use it as a context manager, or call :meth:`start`/:meth:`stop` (``stop`` also runs at
    interpreter exit if forgotten). Every failure raises :class:`KubeBenchError`.
    """

    def __init__(
        self,
        *,
        crd_files: Iterable[Path] | None = None,
        spark_operator: str | None = None,
        extra_apiserver_args: Sequence[str] = (),
        service_account_admission: bool = False,
        startup_timeout: float = 120.0,
        build_timeout: float = 3 * 3600.0,
        temp_root: Path | None = None,
    ) -> None:
        #: whose SparkApplication CRD is installed: ``"1.x"`` or ``"2.x"`` (argument, else
        #: $SPARKGUARD_KUBEBENCH_SPARK_OPERATOR, else 2.x)
        self.spark_operator = spark_operator_version(spark_operator)
        self._crd_files = (
            [*sorted(CRD_DIR.glob("*.yaml")), SPARK_OPERATOR_CRDS[self.spark_operator]]
            if crd_files is None
            else [Path(p) for p in crd_files]
        )
        self._extra_args = list(extra_apiserver_args)
        #: the ServiceAccount admission plugin (a pod's token volume): only where a
        #: controller-manager makes each namespace's `default` ServiceAccount (a node needs it)
        self._service_account_admission = service_account_admission
        self._startup_timeout = startup_timeout
        self._build_timeout = build_timeout
        self._temp_root = temp_root
        self._workdir: Path | None = None
        self._etcd: _Process | None = None
        self._apiserver: _Process | None = None
        self._pki: _Pki | None = None
        self._server: str | None = None
        self._etcd_url: str | None = None
        self._admin_token = secrets.token_urlsafe(32)
        self._kubeconfig: Path | None = None
        self._ssl: ssl.SSLContext | None = None
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._connections = _KeepAlive()
        self._discovery: dict[str, dict[str, _Resource]] = {}
        self._atexit_registered = False
        self.bin_dir: Path | None = None

    # -- lifecycle -----------------------------------------------------------------------

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def started(self) -> bool:
        return self._apiserver is not None and self._kubeconfig is not None

    def start(self) -> Self:
        """Build (if needed) and start etcd + kube-apiserver; install the CRDs. Idempotent."""
        if self.started:
            return self
        try:
            netguard.require_guard("the kube bench (kube-apiserver and etcd)")
        except netguard.NetGuardError as exc:
            raise KubeBenchError(str(exc)) from None
        if not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True
        try:
            self.bin_dir = ensure_binaries(timeout=self._build_timeout)
            root = str(self._temp_root) if self._temp_root else None
            self._workdir = Path(tempfile.mkdtemp(prefix="kubebench-", dir=root))
            self._pki = _Pki(self._workdir / "pki")
            self._ssl = ssl.create_default_context(cafile=str(self._pki.ca_file))
            deadline = time.monotonic() + self._startup_timeout
            for attempt in range(3):
                try:
                    self._start_etcd(deadline)
                    self._start_apiserver(deadline)
                    break
                except _PortClashError:
                    self._stop_processes()
                    if attempt == 2:
                        raise
            self._write_admin_kubeconfig()
            self._wait_for(
                lambda: self._exists("/api/v1/namespaces/default"),
                deadline,
                "the 'default' namespace to be created",
            )
            for crd_file in self._crd_files:
                self.apply_manifest(crd_file.read_text(encoding="utf-8"))
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Terminate kube-apiserver and etcd and remove the temp dir. Safe to call repeatedly."""
        self._stop_processes()
        self._kubeconfig = None
        if self._atexit_registered:
            atexit.unregister(self.stop)
            self._atexit_registered = False
        workdir, self._workdir = self._workdir, None
        if workdir is not None:
            # The components' own word on what they dialled, beside the guard's packet record.
            for log in sorted(workdir.glob("*.log")):
                netguard.record_log_dials(
                    log.read_text(encoding="utf-8", errors="replace"), source=log.name
                )
            if os.environ.get(KEEP_ENV) == "1":
                print(f"kubebench: kept {workdir} (${KEEP_ENV}=1)", file=sys.stderr)
            else:
                shutil.rmtree(workdir, ignore_errors=True)

    def _stop_processes(self) -> None:
        apiserver, self._apiserver = self._apiserver, None
        etcd, self._etcd = self._etcd, None
        for proc in (apiserver, etcd):
            if proc is not None:
                proc.stop()

    def _start_etcd(self, deadline: float) -> None:
        assert self.bin_dir is not None
        assert self._workdir is not None
        client_port, peer_port = _free_port(), _free_port()
        client = f"http://127.0.0.1:{client_port}"
        peer = f"http://127.0.0.1:{peer_port}"
        data_dir = self._workdir / "etcd"
        shutil.rmtree(data_dir, ignore_errors=True)
        argv = [
            str(self.bin_dir / "etcd"),
            "--name=kubebench",
            f"--data-dir={data_dir}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=kubebench={peer}",
            "--initial-cluster-state=new",
            "--unsafe-no-fsync",  # a test bench: durability across crashes is not needed
            "--log-level=warn",
        ]
        self._etcd = proc = _Process("etcd", argv, self._workdir / "etcd.log")
        self._etcd_url = client

        def healthy() -> bool:
            self._check_alive(proc)
            try:
                with self._opener.open(f"{client}/health", timeout=2) as resp:
                    return bool(json.loads(resp.read()).get("health") == "true")
            except (OSError, ValueError):
                return False

        self._wait_for(healthy, deadline, "etcd to report healthy", proc)

    def _start_apiserver(self, deadline: float) -> None:
        assert self.bin_dir is not None
        assert self._workdir is not None
        assert self._pki is not None
        assert self._etcd_url is not None
        port = _free_port()
        serving = self._pki.issue(
            "kube-apiserver",
            dns_names=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            ip_addresses=("127.0.0.1", "10.0.0.1"),
        )
        # How the API server authenticates to a kubelet (pods/log, exec): a client certificate
        # of the bench CA, which a node's kubelet trusts (KubeCluster(node=True)).
        kubelet_client = self._pki.issue(
            "kube-apiserver-kubelet-client",
            server=False,
            client=True,
            dns_names=(),
            ip_addresses=(),
        )
        token_file = self._workdir / "tokens.csv"
        _write_private(
            token_file, f'{self._admin_token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n'.encode()
        )
        admission = ["NamespaceLifecycle", "LimitRanger", "DefaultStorageClass", "ResourceQuota"]
        admission += ["MutatingAdmissionWebhook", "ValidatingAdmissionWebhook"]
        # ServiceAccount admission needs the controller-manager's `default` SA in every
        # namespace; the bench alone has no controller-manager (envtest drops it for the same
        # reason). A cluster with a node has one, and its pods need their token volumes.
        if self._service_account_admission:
            admission.append("ServiceAccount")
        argv = [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers={self._etcd_url}",
            "--etcd-prefix=/registry",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self._workdir / 'apiserver-certs'}",
            f"--tls-cert-file={serving.cert_file}",
            f"--tls-private-key-file={serving.key_file}",
            f"--client-ca-file={self._pki.ca_file}",
            f"--token-auth-file={token_file}",
            f"--service-account-issuer={SA_ISSUER}",
            f"--service-account-key-file={self._pki.sa_pub_file}",
            f"--service-account-signing-key-file={self._pki.sa_key_file}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=RBAC",
            f"--enable-admission-plugins={','.join(admission)}",
            *(
                []
                if self._service_account_admission
                else ["--disable-admission-plugins=ServiceAccount"]
            ),
            "--allow-privileged=true",
            f"--kubelet-client-certificate={kubelet_client.cert_file}",
            f"--kubelet-client-key={kubelet_client.key_file}",
            # a node's kubelet listens on 127.0.0.1 and is named localhost (its InternalIP, on
            # the pod network, would do too): pods/log stays on loopback
            "--kubelet-preferred-address-types=Hostname,InternalIP",
            # Lighter: no API priority & fairness bookkeeping, no profiling endpoints.
            "--enable-priority-and-fairness=false",
            "--profiling=false",
            "--endpoint-reconciler-type=none",
            # A webhook (admission or CRD conversion) or APIService named by a Service is called
            # at the Service's endpoints (its EndpointSlices), never at its cluster IP: a Service
            # without endpoints fails before anything is dialled ("no endpoints available for
            # service"). Without this the API server dials the cluster IP, an address in
            # SERVICE_CIDR, which no route of this machine may carry (README: "Loopback only").
            "--enable-aggregator-routing=true",
            # Every request, at Metadata level: lets tests list which verbs an identity used
            # (the chart test compares them with what its RBAC grants).
            f"--audit-policy-file={self._write_audit_policy()}",
            f"--audit-log-path={self._workdir / 'audit.log'}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",
            *self._extra_args,
        ]
        self._apiserver = proc = _Process(
            "kube-apiserver", argv, self._workdir / "kube-apiserver.log"
        )
        self._server = f"https://127.0.0.1:{port}"
        self._wait_for_readyz(proc, deadline, "kube-apiserver /readyz")

    def _wait_for_readyz(self, proc: _Process, deadline: float, what: str) -> None:
        def ready() -> bool:
            self._check_alive(proc)
            try:
                status, _ = self._raw("GET", "/readyz", timeout=3)
            except (OSError, KubeApiError):
                return False
            return status == 200

        self._wait_for(ready, deadline, what, proc)

    def _write_audit_policy(self) -> Path:
        assert self._workdir is not None
        policy = self._workdir / "audit-policy.yaml"
        # Status writes of spark apps with their bodies: the application-state sequence an
        # operator wrote (tests/e2e/transitions.py), every write, in order, none missed. The
        # admin's reads are not recorded: they are the tests' polls (ten a second, a request
        # each) and the node components' reads, which no test asks the log about.
        policy.write_text(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\n"
            "omitStages: [RequestReceived]\nrules:\n"
            "  - level: Request\n    verbs: [update, patch]\n"
            "    resources:\n      - group: sparkoperator.k8s.io\n"
            "        resources: [sparkapplications/status, scheduledsparkapplications/status]\n"
            f"  - level: None\n    users: [{ADMIN_USER}]\n    verbs: [get]\n"
            "  - level: Metadata\n"
        )
        return policy

    def audit_events(self, *, user: str | None = None) -> list[dict[str, Any]]:
        """Audit events (``ResponseComplete``) recorded so far, optionally only ``user``'s.

        Service accounts appear as ``system:serviceaccount:<namespace>:<name>``.
        """
        self._need()
        assert self._workdir is not None
        events = []
        path = self._workdir / "audit.log"
        if not path.exists():
            return []
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            event = json.loads(line)
            if event.get("stage") != "ResponseComplete":
                continue
            if user is not None and event.get("user", {}).get("username") != user:
                continue
            events.append(event)
        return events

    def _check_alive(self, proc: _Process) -> None:
        rc = proc.exited()
        if rc is None:
            return
        tail = proc.log_tail()
        cls = (
            _PortClashError
            if any(m in tail.lower() for m in _PORT_CLASH_MARKERS)
            else KubeBenchError
        )
        raise cls(
            f"{proc.name} exited with status {rc}; last lines of {proc.log_path} "
            f"(set {KEEP_ENV}=1 to keep it):\n{tail}"
        )

    def _wait_for(
        self,
        predicate: Callable[[], bool],
        deadline: float,
        what: str,
        proc: _Process | None = None,
    ) -> None:
        delay = 0.05
        while True:
            if predicate():
                return
            if time.monotonic() > deadline:
                proc = proc or self._apiserver
                logs = f"\nlast lines of {proc.log_path}:\n{proc.log_tail()}" if proc else ""
                raise KubeBenchError(
                    f"timed out after {self._startup_timeout:.0f}s waiting for {what}{logs}"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def _write_admin_kubeconfig(self) -> None:
        assert self._workdir is not None
        self._kubeconfig = self._write_kubeconfig(
            self._workdir / "admin.kubeconfig", ADMIN_USER, self._admin_token, "default"
        )

    def _write_kubeconfig(self, path: Path, user: str, token: str, namespace: str) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "kubebench",
                    "cluster": {"server": self.server, "certificate-authority": self.ca_file},
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [
                {
                    "name": f"{user}@kubebench",
                    "context": {"cluster": "kubebench", "user": user, "namespace": namespace},
                }
            ],
            "current-context": f"{user}@kubebench",
            "preferences": {},
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        # JSON is YAML: kubectl, client-go, kopf and the Python client all read it.
        _write_private(path, json.dumps(config, indent=2).encode())
        return path

    # -- public accessors ------------------------------------------------------------------

    def _need(self) -> None:
        if not self.started:
            raise KubeBenchError("KubeBench is not started; call start() or use `with KubeBench()`")

    @property
    def server(self) -> str:
        """``https://127.0.0.1:<port>``."""
        if self._server is None:
            raise KubeBenchError("KubeBench is not started")
        return self._server

    @property
    def ca_file(self) -> str:
        """PEM file of the CA that signed the apiserver's serving cert."""
        if self._pki is None:
            raise KubeBenchError("KubeBench is not started")
        return str(self._pki.ca_file)

    @property
    def ca_pem(self) -> bytes:
        """The CA certificate as PEM bytes (e.g. for a webhook ``caBundle``: base64 it)."""
        if self._pki is None:
            raise KubeBenchError("KubeBench is not started")
        return self._pki.ca_pem

    @property
    def admin_token(self) -> str:
        """Bearer token of ``kubebench-admin`` (group ``system:masters``)."""
        return self._admin_token

    @property
    def kubeconfig_path(self) -> str:
        """Admin kubeconfig (default namespace ``default``)."""
        self._need()
        assert self._kubeconfig is not None
        return str(self._kubeconfig)

    @property
    def etcd_url(self) -> str:
        if self._etcd_url is None:
            raise KubeBenchError("KubeBench is not started")
        return self._etcd_url

    @property
    def workdir(self) -> Path:
        """The bench's temp dir: logs (``*.log``), PKI, kubeconfigs, etcd data."""
        if self._workdir is None:
            raise KubeBenchError("KubeBench is not started")
        return self._workdir

    def apiserver_log_tail(self, lines: int = 60) -> str:
        return self._apiserver.log_tail(lines) if self._apiserver else ""

    # -- faults: the control plane misbehaving (tests/operator/test_control_plane_faults.py) --

    def kill_apiserver(self) -> None:
        """SIGKILL kube-apiserver (a crash: no graceful shutdown, every watch and request cut).
        :meth:`restart_apiserver` brings it back; etcd and its data stay."""
        self._need()
        assert self._apiserver is not None
        self._apiserver._signal_group(signal.SIGKILL)
        self._apiserver.popen.wait(10)

    def restart_apiserver(self) -> None:
        """Start kube-apiserver again with its arguments of before: the same port, etcd,
        certificates and tokens, so every client's kubeconfig stays valid. SIGKILLs a running
        one first. Returns once ``/readyz`` answers 200."""
        self._need()
        old = self._apiserver
        assert old is not None
        if old.exited() is None:
            self.kill_apiserver()
        self._apiserver = proc = _Process(old.name, old.argv, old.log_path)
        deadline = time.monotonic() + self._startup_timeout
        self._wait_for_readyz(proc, deadline, "kube-apiserver /readyz after a restart")

    def compact_etcd(self) -> int:
        """Compact etcd's history up to its current revision (what kube-apiserver does every
        5 minutes): a watch resumed from an older resourceVersion then ends with 410 Gone.
        Returns the revision."""
        self._need()

        def call(path: str, body: dict[str, Any]) -> dict[str, Any]:
            request = urllib.request.Request(  # noqa: S310 - http://127.0.0.1 (etcd)
                f"{self.etcd_url}{path}", data=json.dumps(body).encode(), method="POST"
            )
            with self._opener.open(request, timeout=10) as resp:
                answer: dict[str, Any] = json.loads(resp.read())
                return answer

        # etcd's JSON gateway takes keys base64-encoded: "AA==" is the key "\0", any range.
        revision = int(call("/v3/kv/range", {"key": "AA==", "limit": 1})["header"]["revision"])
        call("/v3/kv/compaction", {"revision": revision, "physical": True})
        return revision

    @contextlib.contextmanager
    def etcd_paused(self) -> Iterator[None]:
        """etcd stopped (SIGSTOP) for the block, then continued (SIGCONT): a frozen etcd node.
        kube-apiserver stays up; its requests to etcd hang until their timeouts."""
        self._need()
        assert self._etcd is not None
        self._etcd._signal_group(signal.SIGSTOP)
        try:
            yield
        finally:
            self._etcd._signal_group(signal.SIGCONT)

    def issue_certificate(
        self,
        name: str,
        *,
        dns_names: Sequence[str] = ("localhost",),
        ip_addresses: Sequence[str] = ("127.0.0.1",),
    ) -> CertPair:
        """A serving cert signed by the bench CA, e.g. for a webhook on 127.0.0.1."""
        if self._pki is None:
            raise KubeBenchError("KubeBench is not started")
        return self._pki.issue(name, dns_names=dns_names, ip_addresses=ip_addresses)

    def configuration(self, token: str | None = None) -> Configuration:
        """A ``kubernetes.client.Configuration`` for the admin (or for ``token``)."""
        from kubernetes.client import Configuration

        self._need()
        return Configuration(
            host=self.server,
            ssl_ca_cert=self.ca_file,
            api_key={"BearerToken": token or self._admin_token},
            api_key_prefix={"BearerToken": "Bearer"},
            no_proxy=_LOOPBACK_NO_PROXY,
        )

    def api_client(self, token: str | None = None) -> ApiClient:
        """A new ``kubernetes.client.ApiClient`` (admin unless ``token`` is given). Close it."""
        from kubernetes.client import ApiClient

        return ApiClient(self.configuration(token))

    # -- service accounts ------------------------------------------------------------------

    def ensure_namespace(self, namespace: str) -> None:
        self._create_if_missing(
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        )

    def ensure_service_account(self, namespace: str, name: str) -> None:
        self.ensure_namespace(namespace)
        self._create_if_missing(
            f"/api/v1/namespaces/{namespace}/serviceaccounts",
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": name, "namespace": namespace},
            },
        )

    def service_account_token(
        self, namespace: str, name: str, *, expiration_seconds: int = 3600
    ) -> str:
        """A bound token for the ServiceAccount (created if missing) via TokenRequest."""
        self.ensure_service_account(namespace, name)
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": expiration_seconds},
        }
        _, resp = self._raw(
            "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", body
        )
        token = resp.get("status", {}).get("token") if isinstance(resp, dict) else None
        if not isinstance(token, str) or not token:
            raise KubeBenchError(f"TokenRequest for {namespace}/{name} returned no token: {resp}")
        return token

    def service_account_kubeconfig(
        self, namespace: str, name: str, *, expiration_seconds: int = 3600
    ) -> str:
        """Create the ServiceAccount if missing and write a kubeconfig that authenticates as it.

        The token comes from TokenRequest, so RBAC applies exactly as for an in-cluster pod
        running as ``system:serviceaccount:<namespace>:<name>``. Returns the file's path.
        """
        token = self.service_account_token(namespace, name, expiration_seconds=expiration_seconds)
        path = self.workdir / "kubeconfigs" / f"sa-{namespace}-{name}.kubeconfig"
        user = f"system:serviceaccount:{namespace}:{name}"
        return str(self._write_kubeconfig(path, user, token, namespace))

    # -- manifests ---------------------------------------------------------------------------

    def apply_manifest(
        self,
        manifest: str | Mapping[str, Any] | Iterable[Mapping[str, Any]],
        *,
        namespace: str | None = None,
        server_side: bool = False,
        wait: bool = True,
    ) -> list[JsonObj]:
        """Create-or-replace every object in ``manifest``; return the stored objects.

        ``manifest`` is YAML text (multi-document, ``kind: List`` allowed), one object, or an
        iterable of objects. Any kind the apiserver serves works (CRDs, custom resources, RBAC,
        Services, Deployments, webhook configurations, ...): the REST path comes from
        discovery. Namespaced objects without ``metadata.namespace`` go to ``namespace`` (else
        ``default``). An existing object is replaced (PUT with its resourceVersion; a Service
        keeps its clusterIP), or with ``server_side=True`` server-side applied with force.
        With ``wait``, CRDs are waited for until Established and served.
        """
        self._need()
        results: list[JsonObj] = []
        for obj in _load_objects(manifest):
            results.append(self._apply_one(obj, namespace, server_side))
            if wait and obj.get("kind") == "CustomResourceDefinition":
                self.wait_for_crd(str(obj["metadata"]["name"]))
        return results

    def _apply_one(self, obj: JsonObj, namespace: str | None, server_side: bool) -> JsonObj:
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        meta = obj.get("metadata") or {}
        name = meta.get("name")
        if not isinstance(api_version, str) or not isinstance(kind, str) or not name:
            raise KubeBenchError(f"manifest object lacks apiVersion, kind or metadata.name: {obj}")
        res = self._resolve(api_version, kind)
        obj = json.loads(json.dumps(obj))  # deep copy, and proves it is JSON-serialisable
        ns: str | None = None
        if res.namespaced:
            ns = meta.get("namespace") or namespace or "default"
            obj["metadata"]["namespace"] = ns
        collection = _collection_path(api_version, res, ns)
        item = f"{collection}/{urllib.parse.quote(str(name))}"

        if server_side:
            query = urllib.parse.urlencode({"fieldManager": FIELD_MANAGER, "force": "true"})
            _, out = self._raw(
                "PATCH", f"{item}?{query}", obj, content_type="application/apply-patch+yaml"
            )
            return _as_obj(out)

        try:
            _, out = self._raw("POST", collection, obj)
            return _as_obj(out)
        except KubeApiError as exc:
            if exc.status != 409:
                raise
        for _attempt in range(5):
            _, current = self._raw("GET", item)
            current = _as_obj(current)
            obj["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            if kind == "Service" and api_version == "v1":
                spec, cur_spec = obj.setdefault("spec", {}), current.get("spec", {})
                for field in ("clusterIP", "clusterIPs", "ipFamilies", "healthCheckNodePort"):
                    if field not in spec and field in cur_spec:
                        spec[field] = cur_spec[field]
            try:
                _, out = self._raw("PUT", item, obj)
                return _as_obj(out)
            except KubeApiError as exc:
                if exc.status != 409:
                    raise
        raise KubeBenchError(f"could not replace {kind} {ns}/{name}: resourceVersion kept changing")

    def install_spark_operator_crd(self, version: str) -> JsonObj:
        """Replace the SparkApplication CRD by spark-operator ``version``'s (``1.x``/``2.x``).

        Returns the stored CRD. The apiserver applies a new schema a moment after the CRD is
        Established; callers that depend on pruning wait for it (see the round-trip tests).
        """
        stored = self.apply_manifest(
            SPARK_OPERATOR_CRDS[spark_operator_version(version)].read_text(encoding="utf-8")
        )
        self.spark_operator = version
        return stored[0]

    def wait_for_crd(self, name: str, timeout: float = 60.0) -> None:
        """Wait until the CRD is Established (names accepted) and its versions are served."""
        deadline = time.monotonic() + timeout
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
        crd: JsonObj = {}

        def established() -> bool:
            nonlocal crd
            _, out = self._raw("GET", path)
            crd = _as_obj(out)
            status = crd.get("status") or {}
            conds = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
            return conds.get("Established") == "True" and conds.get("NamesAccepted") == "True"

        self._wait_for(established, deadline, f"CRD {name} to be Established")
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if not version.get("served", False):
                continue
            gv = f"{group}/{version['name']}"
            self._discovery.pop(gv, None)
            self._wait_for(
                functools.partial(self._serves, gv, str(kind)),
                deadline,
                f"{kind}.{gv} to appear in discovery",
            )

    def _serves(self, api_version: str, kind: str) -> bool:
        return kind in self._discover(api_version, refresh=True)

    def _resolve(self, api_version: str, kind: str) -> _Resource:
        found = self._discover(api_version).get(kind)
        if found is None:
            found = self._discover(api_version, refresh=True).get(kind)
        if found is None:
            raise KubeBenchError(
                f"the apiserver does not serve kind {kind!r} in {api_version!r} "
                "(install its CRD first?)"
            )
        return found

    def _discover(self, api_version: str, *, refresh: bool = False) -> dict[str, _Resource]:
        if refresh or api_version not in self._discovery:
            path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            try:
                _, out = self._raw("GET", path)
            except KubeApiError as exc:
                if exc.status == 404:
                    return {}
                raise
            kinds: dict[str, _Resource] = {}
            for r in _as_obj(out).get("resources") or []:
                if "/" in r["name"]:  # subresources such as pods/log
                    continue
                kinds[r["kind"]] = _Resource(plural=r["name"], namespaced=bool(r["namespaced"]))
            self._discovery[api_version] = kinds
        return self._discovery[api_version]

    # -- HTTP --------------------------------------------------------------------------------

    def _exists(self, path: str) -> bool:
        try:
            self._raw("GET", path)
        except KubeApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def _create_if_missing(self, collection: str, obj: JsonObj) -> None:
        try:
            self._raw("POST", collection, obj)
        except KubeApiError as exc:
            if exc.status != 409:
                raise

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: str | None = None,
        content_type: str = "application/json",
        timeout: float = 30.0,
    ) -> tuple[int, Any]:
        """Raw JSON request to the apiserver (admin unless ``token``); returns (status, body).

        HTTP errors raise :class:`KubeApiError` (``.status`` holds the code).
        """
        return self._raw(
            method, path, body, token=token, content_type=content_type, timeout=timeout
        )

    def _raw(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: str | None = None,
        content_type: str = "application/json",
        timeout: float = 30.0,
    ) -> tuple[int, Any]:
        if self._server is None or self._ssl is None:
            raise KubeBenchError("KubeBench is not started")
        data = None if body is None else json.dumps(body).encode()
        headers = {
            "Authorization": f"Bearer {token or self._admin_token}",
            "Accept": "application/json",
            **({"Content-Type": content_type} if data is not None else {}),
        }
        status, raw = self._connections.send(
            self._server, self._ssl, method, path, data=data, headers=headers, timeout=timeout
        )
        if status >= 400:
            text = raw.decode("utf-8", errors="replace")
            raise KubeApiError(method, path, status, text)
        if not raw:
            return status, None
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode("utf-8", errors="replace")


class _KeepAlive:
    """One kept-alive HTTPS connection to the apiserver per thread.

    Tests poll the apiserver every 100 ms or faster; a new connection per request cost a TLS
    handshake on both sides (2.4 ms of the test's CPU and more of the apiserver's, against
    0.3 ms a request on a kept connection: measured on the bench). A connection the server
    closed while idle (the apiserver restarted, its idle timeout) is seen before reuse and
    replaced; a GET that fails on a reused connection is sent once more on a new one, any
    other request's error is the caller's (it may have been carried out)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def send(
        self,
        server: str,
        context: ssl.SSLContext,
        method: str,
        path: str,
        *,
        data: bytes | None,
        headers: Mapping[str, str],
        timeout: float,
    ) -> tuple[int, bytes]:
        """Send the request; return (status, body), any status."""
        while True:
            conn, reused = self._connection(server, context, timeout)
            try:
                return self._exchange(conn, method, path, data, headers)
            except (OSError, http.client.HTTPException) as exc:
                self._drop()
                # once more only for a GET on a reused connection: the next one is new
                if not (reused and method == "GET"):
                    raise _as_os_error(exc) from exc

    @staticmethod
    def _exchange(
        conn: http.client.HTTPSConnection,
        method: str,
        path: str,
        data: bytes | None,
        headers: Mapping[str, str],
    ) -> tuple[int, bytes]:
        conn.request(method, path, body=data, headers=dict(headers))
        resp = conn.getresponse()
        raw = resp.read()
        if resp.will_close:
            conn.close()
        return int(resp.status), raw

    def _connection(
        self, server: str, context: ssl.SSLContext, timeout: float
    ) -> tuple[http.client.HTTPSConnection, bool]:
        conn: http.client.HTTPSConnection | None = getattr(self._local, "conn", None)
        if conn is not None and (
            getattr(self._local, "key", None) != (server, id(context)) or _dropped(conn)
        ):
            self._drop()
            conn = None
        reused = conn is not None
        if conn is None:
            parsed = urllib.parse.urlsplit(server)
            conn = http.client.HTTPSConnection(
                parsed.hostname or "127.0.0.1", parsed.port, context=context, timeout=timeout
            )
            self._local.conn, self._local.key = conn, (server, id(context))
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn, reused

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()


def _dropped(conn: http.client.HTTPSConnection) -> bool:
    """Whether an idle kept connection was closed by the server: its socket is readable (an
    end of file, or bytes nobody asked for) or gone."""
    sock = conn.sock
    if sock is None:
        return False  # closed by us after a ``Connection: close``: http.client reconnects
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _as_os_error(exc: BaseException) -> OSError:
    """http.client's protocol errors as OSError, what urllib raised for them (callers that
    wait out a restarting apiserver catch OSError)."""
    if isinstance(exc, OSError):
        return exc
    return ConnectionError(f"{type(exc).__name__}: {exc}")


# --------------------------------------------------------------------------------------------
# helpers


def _as_obj(value: Any) -> JsonObj:
    if not isinstance(value, dict):
        raise KubeBenchError(f"expected a JSON object from the apiserver, got {value!r:.500}")
    return value


def _collection_path(api_version: str, res: _Resource, namespace: str | None) -> str:
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    if namespace is not None:
        return f"{base}/namespaces/{namespace}/{res.plural}"
    return f"{base}/{res.plural}"


def _load_objects(manifest: str | Mapping[str, Any] | Iterable[Mapping[str, Any]]) -> list[JsonObj]:
    docs: list[Any]
    if isinstance(manifest, str):
        from tests.support import yamlfast

        docs = yamlfast.load_all(manifest)
    elif isinstance(manifest, Mapping):
        docs = [manifest]
    else:
        docs = list(manifest)
    out: list[JsonObj] = []
    for doc in docs:
        if doc is None:
            continue
        if not isinstance(doc, Mapping):
            raise KubeBenchError(f"manifest document is not an object: {doc!r:.200}")
        if doc.get("kind") == "List" or (
            str(doc.get("kind", "")).endswith("List") and "items" in doc
        ):
            out.extend(_load_objects(list(doc.get("items") or [])))
        else:
            out.append(dict(doc))
    return out
