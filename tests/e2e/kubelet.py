"""The kubelet of the stand-ins' driver pods: a pod's containers run as local processes.

Shared by the Kubeflow stand-in (``standin.py``) and the Apache one (``apache_standin.py``):
each turns its app's spec into a :class:`PodSpec` (Kubeflow: ``spec.driver`` and
``spec.volumes``; Apache: ``spec.driverSpec.podTemplateSpec.spec``) and calls
:meth:`Kubelet._start_pod`; the operator's side reads :class:`DriverPod` (phase, exits).

What a driver pod would run: the initContainers in order (the library bundle, then
sparkguard's rollback), the sidecars, then the driver with the app's ``sparkConf`` and driver
env. Volumes become directories: every path under a volumeMount is rewritten to that volume's
directory, secret volumes are filled from the Secret and downward API volumes from the pod's
annotations. A native sidecar (an initContainer
with ``restartPolicy: Always``) is stopped (SIGTERM) once the driver container ended; regular
containers are never stopped, so the pod is terminal only once every one of them has exited by
itself (``Succeeded`` when all exited 0, else ``Failed``), and ``Running`` until then. Deleting
the pod sends SIGTERM to its containers and SIGKILL after ``termination_grace_s``; the pod is
gone (its name free again) only then. Pods share the host's network, so a port is one pod's at
a time (:class:`HostPorts`). Process namespaces are real (``unshare``/``nsenter``):
every sidecar sees only its own processes, or, with ``shareProcessNamespace: true``, sidecars
and driver share one namespace with a pause process as PID 1.

Four driver programs: ``job="demo"`` runs sparkguard's demo job (the Python writer, a Spark
session), given the injected settings as arguments; ``job="plain"`` runs a plain PySpark job
that never imports sparkguard (``tests/jvm/jobs/plain_write.py``) with the app's *whole*
``sparkConf`` passed as spark-submit's ``--conf`` options; ``job="plain-table"`` is the same for
``df.write.saveAsTable("orders")`` (``tests/jvm/jobs/create_table.py``; the table argument is
the warehouse directory); ``job="light"`` runs
``light_driver.py``: sparkguard's Python writer without a JVM (driver step, task files,
commit), with one task in a separate *executor* process that outlives its driver (lingering
executors: stopped ``executor_linger_s`` after the driver pod ended, as Kubernetes' garbage
collection of executor pods owned by the driver pod does).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from kubernetes import client

from tests.support.process import kill_session

BIN = Path(sys.executable).parent
#: the unchanged job of ``job="plain"``: never imports sparkguard
PLAIN_JOB = Path(__file__).resolve().parents[1] / "jvm" / "jobs" / "plain_write.py"
#: the driver of ``job="light"``: sparkguard's Python writer without a Spark JVM
LIGHT_JOB = Path(__file__).resolve().parent / "light_driver.py"
#: the unchanged job of ``job="plain-table"``: ``saveAsTable("orders")`` in the warehouse
PLAIN_TABLE_JOB = Path(__file__).resolve().parents[1] / "jvm" / "jobs" / "create_table.py"
JOBS: Final = ("demo", "plain", "plain-table", "light")


class DriverPodStillRunningError(RuntimeError):
    """The driver container ended but a sidecar keeps the pod running."""


class PidNamespacesUnavailableError(RuntimeError):
    """This machine cannot create PID namespaces (no root, no user namespaces)."""


def pid_namespaces_available() -> bool:
    """Whether ``unshare --pid`` works here (root, or unprivileged user namespaces)."""
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"],
        capture_output=True,
        timeout=30,
        check=False,
    )
    return probe.returncode == 0


def _main_pid(wrapper: subprocess.Popen[bytes]) -> int | None:
    """The container's own process behind ``unshare --fork``/``nsenter``: the wrapper's child."""
    deadline = time.monotonic() + 10
    while wrapper.poll() is None:
        try:
            children = Path(f"/proc/{wrapper.pid}/task/{wrapper.pid}/children").read_text()
        except OSError:
            return None
        if children.split():
            return int(children.split()[0])
        if time.monotonic() > deadline:
            return None
        time.sleep(0.01)
    return None


class _DeletedWhilePendingError(Exception):
    """The pod was deleted while a container of it waited to start."""


class HostPorts:
    """The ports the bench's pods listen on: one pod at a time per port.

    In a cluster each pod has its own network; on the bench every pod shares the host's
    loopback. Two pods' marker sidecars at once (a scheduled app's next run while the previous
    one's rerun writes) would both want the chart's one port: the second could not listen, its
    startup probe would be answered by the first pod's sidecar, and its driver would send its
    markers to another app's sidecar, which refuses them: the rerun fails, a failure no
    cluster has. So a pod whose container needs a port another pod holds waits for it, Pending
    (as a pod with a hostPort waits for a node where that port is free); the port is free
    again once that pod ended.
    """

    def __init__(self) -> None:
        self._held: dict[int, object] = {}
        self._changed = threading.Condition()

    def hold(
        self,
        port: int,
        holder: object,
        *,
        timeout: float,
        cancelled: threading.Event | None = None,
    ) -> bool:
        """Wait until no other holder has ``port``, then hold it (again, for its holder) and
        return True; False, holding nothing, once ``cancelled`` is set (the pod was deleted)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._held.get(port, holder) is not holder:
                if cancelled is not None and cancelled.is_set():
                    return False
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"port {port} still held by another pod after {timeout:g} s")
                self._changed.wait(min(left, 0.1))
            self._held[port] = holder
        return True

    def release(self, holder: object) -> None:
        """Free every port ``holder`` holds."""
        with self._changed:
            for port in [p for p, h in self._held.items() if h is holder]:
                del self._held[port]
            self._changed.notify_all()


#: the bench's one host network, shared by every stand-in's pods in this process
HOST_PORTS: Final = HostPorts()


class _PodProcesses:
    """The PID namespaces of one driver pod: shared (a pause process as PID 1) or per container.

    Containers are started through ``nsenter``/``unshare``; signals go to the container's own
    process, the wrapper relays its exit status.
    """

    def __init__(
        self, *, shared: bool, run_dir: Path, deleting: threading.Event | None = None
    ) -> None:
        #: set when the pod is deleted (a container waiting to start gives up)
        self.deleting = deleting if deleting is not None else threading.Event()
        self.available = pid_namespaces_available()
        if shared and not self.available:
            raise PidNamespacesUnavailableError(
                "the driver pod shares its process namespace, and this machine cannot create "
                "PID namespaces to model it (run as root or enable user namespaces)"
            )
        self.run_dir = run_dir
        self.wrapped: set[int] = set()
        self.pause: subprocess.Popen[bytes] | None = None
        self.pause_pid: int | None = None
        if shared:
            self.pause = subprocess.Popen(
                ["unshare", "--pid", "--fork", "--mount-proc", "sleep", "infinity"],
                start_new_session=True,
            )
            self.pause_pid = _main_pid(self.pause)
            if self.pause_pid is None:
                raise PidNamespacesUnavailableError("the pod's pause process did not start")

    def wrap(self, argv: list[str], *, sidecar: bool) -> list[str]:
        """``argv`` as started in the pod: in the shared namespace, or a sidecar's own."""
        if self.pause_pid is not None:
            return [
                "nsenter", f"--target={self.pause_pid}", "--pid", "--mount",
                f"--wd={self.run_dir}", "--", *argv,
            ]  # fmt: skip
        if sidecar and self.available:
            return ["unshare", "--pid", "--fork", "--mount-proc", "--", *argv]
        return argv  # the driver: what it sees of the host does not matter here

    def started(self, process: subprocess.Popen[bytes], argv: list[str]) -> None:
        if argv and argv[0] in ("nsenter", "unshare"):
            self.wrapped.add(process.pid)

    def terminate(self, process: subprocess.Popen[bytes]) -> None:
        """SIGTERM to the container's process, as the kubelet sends it."""
        if process.poll() is not None:
            return
        pid = _main_pid(process) if process.pid in self.wrapped else process.pid
        if pid is None:
            process.kill()
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)

    def close(self) -> None:
        if self.pause is not None and self.pause.poll() is None:
            os.killpg(self.pause.pid, signal.SIGKILL)  # PID 1 gone: the namespace ends
        if self.pause is not None:
            self.pause.wait(timeout=30)
        HOST_PORTS.release(self)  # the pod ended: its ports are free


class DriverPod:
    """One driver pod: its containers as local processes, its phase as the kubelet reports it."""

    def __init__(self, *, name: str, submission: str, index: int, record: dict[str, Any]) -> None:
        self.name = name
        self.submission = submission
        self.index = index
        self.record = record
        self.phase = "Pending"
        self.driver_exit: int | None = None
        self.driver_reason = ""
        self.deleting = threading.Event()
        self.gone = threading.Event()
        self.driver: subprocess.Popen[bytes] | None = None
        self.run_dir: Path | None = None
        self.thread: threading.Thread | None = None


@dataclasses.dataclass(frozen=True)
class PodSpec:
    """What the kubelet runs of one driver pod, whichever operator built it."""

    #: in order; one with ``restartPolicy: Always`` is a native sidecar
    init_containers: Sequence[Mapping[str, Any]]
    #: regular containers besides the driver's (they keep the pod Running while they run)
    sidecars: Sequence[Mapping[str, Any]]
    #: the driver container (its ``env``, ``envFrom``, ``volumeMounts``)
    driver: Mapping[str, Any]
    volumes: Sequence[Mapping[str, Any]]
    share_process_namespace: bool
    #: the driver's Spark conf (``spec.sparkConf``)
    conf: Mapping[str, str]
    #: the driver pod's annotations (a downward API volume reads them)
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)


class Kubelet:
    """The kubelet of one app's driver pods, and Kubernetes' GC of their executors.

    Test hooks (faults the real system has): ``kill_runs`` (runs whose driver is SIGKILLed at
    ``kill_point`` or when ``kill_when`` says), ``stall_runs`` (the light driver stalls at
    ``kill_point`` until its pod is deleted). Subclasses (the operator's side) implement
    :meth:`enqueue` and may override :meth:`_pod_changed`.
    """

    #: how long regular sidecar containers get to exit by themselves after the driver ended
    #: before the stand-in calls the pod stuck (a hang guard: the kubelet would wait for ever)
    sidecar_grace_s = 60.0
    #: the pod's terminationGracePeriodSeconds: SIGTERM, then SIGKILL after this (Kubernetes'
    #: default is 30 s; short here, the bench's drivers do not use it)
    termination_grace_s = 1.0
    #: how long the light driver's executor keeps running after its driver pod ended, until
    #: the garbage collector's deletion of the executor pod (ownerReference to the driver pod)
    #: stops it: on a cluster GC latency plus the executor's grace period, 10 to 30 s; 4 s here,
    #: enough to overlap the next driver's rollback initContainer on the bench
    executor_linger_s = 4.0
    #: the light driver's executor waits this long before it writes its task's file
    executor_delay_s = 1.5

    def __init__(
        self,
        api: client.ApiClient,
        *,
        namespace: str,
        name: str,
        workdir: Path,
        table: str,
        rows: int,
        partitions: int = 4,
        job: str = "demo",
    ) -> None:
        if job not in JOBS:
            raise ValueError(f"job {job!r}: use one of {', '.join(JOBS)}")
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.namespace = namespace
        #: the app this operator stand-in serves
        self.name = name
        self.workdir = workdir
        self.table = table
        self.rows = rows
        self.partitions = partitions
        self.job = job
        #: one record per driver pod started (its containers, exit, how it ended)
        self.runs: list[dict[str, Any]] = []
        #: per-run fault: run index -> kill the driver
        self.kill_runs: set[int] = set()
        #: runs whose light driver stalls at ``kill_point`` until its pod is deleted
        self.stall_runs: set[int] = set()
        #: where the light driver stalls to be killed: before-files, mid-write, after-commit
        self.kill_point = "mid-write"
        #: ``job="light"`` as a streaming query of this many micro-batches (0: one batch write)
        self.stream_batches = 0
        #: ``job="plain"`` has no fault points: the driver of a run in ``kill_runs`` is
        #: SIGKILLed (whole process group) as soon as this says so (e.g. "a file is published")
        self.kill_when: Callable[[], bool] | None = None
        self.log = workdir / "standin.log"
        self.pods: dict[str, DriverPod] = {}
        self._lock = threading.Lock()
        self._executors: list[tuple[float, list[int]]] = []
        self._wake = threading.Event()
        #: the reconcile errors (each requeued with backoff), for a test's failure message
        self.errors: list[str] = []
        self._halt = threading.Event()
        self._requeue_at: float | None = None
        self._error_backoff = 0.05

    # -- the work queue ---------------------------------------------------------------------
    def enqueue(self, *, after: float | None = None) -> None:
        """Queue a reconcile now, or ``after`` seconds (``RequeueAfter``)."""
        with self._lock:
            if after is None:
                self._wake.set()
            else:
                due = time.monotonic() + after
                if self._requeue_at is None or due < self._requeue_at:
                    self._requeue_at = due

    def _next(self, stop: threading.Event) -> bool:
        while not stop.is_set():
            with self._lock:
                if self._wake.is_set() or (
                    self._requeue_at is not None and time.monotonic() >= self._requeue_at
                ):
                    self._wake.clear()
                    self._requeue_at = None
                    return True
            self._gc_executors()
            self._wake.wait(0.05)
        return False

    def _reconcile(self) -> None:
        """One reconcile of the app (the operator's side)."""
        raise NotImplementedError

    def _app_gone(self) -> None:
        """A reconcile found the app NotFound: nothing to reconcile."""

    def _serve(self, stop: threading.Event, informers: Sequence[Callable[[], None]]) -> None:
        """Run the informers and one worker until ``stop``: each queued reconcile runs
        :meth:`_reconcile`; an error requeues it with backoff (a NotFound app: nothing)."""
        self._halt = stop
        threads = [threading.Thread(target=informer, daemon=True) for informer in informers]
        for thread in threads:
            thread.start()
        try:
            while self._next(stop):
                try:
                    self._reconcile()
                    self._error_backoff = 0.05
                except client.ApiException as exc:
                    if exc.status == 404:  # the app is gone: nothing to reconcile
                        self._app_gone()
                        continue
                    self.errors.append(f"{exc.status} {exc.reason}")
                    self._requeue_with_backoff()
                except Exception as exc:  # the reconcile's error: requeued with backoff
                    self.errors.append(repr(exc))
                    self._requeue_with_backoff()
        finally:
            for thread in threads:
                thread.join(10)

    def _requeue_with_backoff(self) -> None:
        """A failed reconcile is requeued with exponential backoff (controller-runtime's rate
        limiter for ``ctrl.Result{}, err``; JOSDK's retry of a reconcile that threw)."""
        self.enqueue(after=self._error_backoff)
        self._error_backoff = min(self._error_backoff * 2, 5.0)

    def _pod_changed(self, pod: DriverPod) -> None:
        """The pod's phase changed or its driver exited: the pod event enqueues the app."""
        del pod
        self.enqueue()

    def _secret(self, name: str) -> dict[str, str]:
        secret = self.core.read_namespaced_secret(name, self.namespace)
        return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}

    def _start_pod(
        self, *, pod_name: str, submission: str, record: dict[str, Any], spec: PodSpec
    ) -> DriverPod:
        """The driver pod exists: the kubelet starts it (``record`` gets the run's trail)."""
        index = len(self.runs)
        run_dir = self.workdir / f"run-{index}"
        run_dir.mkdir(parents=True)
        record.update(pod=pod_name, init=[], native_sidecars=[], ended_by=None)
        self.runs.append(record)
        pod = DriverPod(name=pod_name, submission=submission, index=index, record=record)
        pod.run_dir = run_dir
        self.pods[pod_name] = pod
        pod.thread = threading.Thread(target=self._kubelet, args=(pod, spec), daemon=True)
        pod.thread.start()
        return pod

    def _kubelet(self, pod: DriverPod, spec: PodSpec) -> None:
        try:
            self._run_pod(pod, spec)
        except Exception as exc:  # the pod fails, the controller sees it
            pod.record["error"] = repr(exc)
            pod.phase = "Failed"
        finally:
            pod.record["pod_phase"] = pod.phase
            assert pod.run_dir is not None
            pids = [int(p.name) for p in (pod.run_dir / "executors").glob("*")]
            with self._lock:
                self._executors.append((time.monotonic() + self.executor_linger_s, pids))
            self._pod_ended(pod)

    def _pod_ended(self, pod: DriverPod) -> None:
        """The pod's containers all ended; a deleted pod is gone now (its name is free)."""
        with self._lock:
            if pod.deleting.is_set() and self.pods.get(pod.name) is pod:
                del self.pods[pod.name]
                pod.gone.set()
        self._pod_changed(pod)  # the pod's update or delete event

    def _delete_pod(self, pod: DriverPod) -> None:
        pod.deleting.set()
        if pod.thread is not None and not pod.thread.is_alive():
            self._pod_ended(pod)

    def _run_pod(self, pod: DriverPod, spec: PodSpec) -> None:
        record, run_dir = pod.record, pod.run_dir
        assert run_dir is not None
        volumes = self._volumes(spec.volumes, run_dir, annotations=spec.annotations)
        procs = _PodProcesses(
            shared=spec.share_process_namespace, run_dir=run_dir, deleting=pod.deleting
        )
        record["shared_processes"] = procs.pause_pid is not None
        # As the kubelet: a native sidecar (an initContainer with restartPolicy Always) starts
        # in its place among the initContainers, the next one waits until it has started.
        native: list[subprocess.Popen[bytes]] = []
        sidecars: list[subprocess.Popen[bytes]] = []
        code: int | None = None
        try:
            with self.log.open("ab") as log:
                for init in spec.init_containers:
                    if pod.deleting.is_set():
                        record["ended_by"] = "deleted"
                        return
                    if init.get("restartPolicy") == "Always":
                        native.append(self._start_sidecar(init, volumes, run_dir, log, procs))
                        record["native_sidecars"].append(init["name"])
                        continue
                    returncode = self._run_init(init, volumes, run_dir, log, pod)
                    record["init"].append((init["name"], returncode))
                    if returncode != 0:
                        record["ended_by"] = "deleted" if pod.deleting.is_set() else "init"
                        pod.phase = "Failed"  # the driver container never started
                        return
                sidecars = [
                    self._start_sidecar(s, volumes, run_dir, log, procs) for s in spec.sidecars
                ]
                pod.phase = "Running"
                self._pod_changed(pod)
                code = self._run_driver(spec, volumes, run_dir, log, procs, pod)
                pod.driver_exit = code
                pod.driver_reason = "Completed" if code == 0 else "Error"
                # Spark's driver ends its executors: their pods' events enqueue the app even
                # while a sidecar keeps the driver pod Running.
                self._pod_changed(pod)
                # The kubelet stops native sidecars now; regular sidecar containers keep the
                # pod Running for as long as they run.
                self._stop(native, procs)
                pod.phase = self._pod_phase(code, sidecars, pod)
                record["sidecar_exits"] = [p.returncode for p in sidecars]
        except _DeletedWhilePendingError:
            record["ended_by"] = "deleted"
        finally:
            self._stop(native + sidecars, procs)  # the stand-in cleans up either way
            procs.close()
            record["exit"] = code

    def _run_init(
        self,
        init: Mapping[str, Any],
        volumes: Mapping[str, Path],
        run_dir: Path,
        log: Any,
        pod: DriverPod,
    ) -> int:
        mounts = self._mounts(init, volumes)
        process = subprocess.Popen(
            self._argv(init, mounts), env=self._env(init, mounts), stdout=log,
            stderr=subprocess.STDOUT, cwd=run_dir, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 300
        while process.poll() is None:
            if pod.deleting.is_set() or time.monotonic() > deadline:
                self._terminate_session(process)
                break
            time.sleep(0.02)
        return int(process.wait())

    def _terminate_session(self, process: subprocess.Popen[bytes]) -> int:
        """The kubelet stopping a container: SIGTERM, SIGKILL after the grace period."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=self.termination_grace_s)
        except subprocess.TimeoutExpired:
            kill_session(process.pid)
            process.wait()
        else:
            kill_session(process.pid)  # what is left of the session
        return int(process.returncode)

    def _stop(self, processes: list[subprocess.Popen[bytes]], pod: _PodProcesses) -> None:
        for process in reversed(processes):  # native sidecars stop in reverse order
            pod.terminate(process)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=15)

    def _pod_phase(self, code: int, sidecars: list[subprocess.Popen[bytes]], pod: DriverPod) -> str:
        """The driver pod's phase once its driver container ended, as the kubelet reports it."""
        deadline = time.monotonic() + self.sidecar_grace_s
        while any(p.poll() is None for p in sidecars) and time.monotonic() < deadline:
            if pod.deleting.is_set():
                return "Failed"
            time.sleep(0.1)
        if any(p.poll() is None for p in sidecars):
            return "Running"
        return "Succeeded" if code == 0 and all(p.returncode == 0 for p in sidecars) else "Failed"

    # -- volumes and containers -------------------------------------------------------------
    def _volumes(
        self,
        volumes: Sequence[Mapping[str, Any]],
        run_dir: Path,
        *,
        annotations: Mapping[str, str],
    ) -> dict[str, Path]:
        dirs = {}
        for volume in volumes:
            path = run_dir / "volumes" / volume["name"]
            path.mkdir(parents=True, exist_ok=True)
            if "secret" in volume:
                for key, value in self._secret(volume["secret"]["secretName"]).items():
                    (path / key).write_text(value)
            for item in (volume.get("downwardAPI") or {}).get("items") or []:
                (path / item["path"]).write_text(
                    _field_of(item["fieldRef"]["fieldPath"], annotations)
                )
            dirs[volume["name"]] = path
        return dirs

    @staticmethod
    def _mounts(container: Mapping[str, Any], volumes: Mapping[str, Path]) -> list[tuple[str, str]]:
        """(mount path, local directory) of each mount, longest path first; a ``subPath`` is
        a directory in its volume, made as the kubelet makes it. A mount at ``/tmp`` is left
        out: these containers are processes of the host, whose temp directory stands in for
        that emptyDir (remapping ``/tmp`` would rewrite the host paths the tests pass)."""
        mounts = []
        for mount in container.get("volumeMounts") or []:
            if mount["mountPath"].rstrip("/") == "/tmp":
                continue
            local = volumes[mount["name"]] / mount.get("subPath", "")
            local.mkdir(parents=True, exist_ok=True)
            mounts.append((mount["mountPath"].rstrip("/"), str(local)))
        return sorted(mounts, key=lambda m: -len(m[0]))

    @staticmethod
    def _remap(value: str, mounts: list[tuple[str, str]]) -> str:
        for mount_path, local in mounts:
            value = value.replace(mount_path, local)
        return value

    def _env(self, container: Mapping[str, Any], mounts: list[tuple[str, str]]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKGUARD_")}
        env["PYTHONSAFEPATH"] = "1"
        env["PYSPARK_PYTHON"] = sys.executable
        env["PATH"] = f"{BIN}:{env.get('PATH', '')}"
        for source in container.get("envFrom") or []:
            if "secretRef" in source:
                env.update(self._secret(source["secretRef"]["name"]))
        for item in container.get("env") or []:
            if "value" in item:
                env[item["name"]] = self._remap(str(item["value"]), mounts)
            elif "secretKeyRef" in item.get("valueFrom", {}):
                ref = item["valueFrom"]["secretKeyRef"]
                env[item["name"]] = self._secret(ref["name"])[ref["key"]]
        return env

    def _argv(self, container: Mapping[str, Any], mounts: list[tuple[str, str]]) -> list[str]:
        argv = [
            self._remap(a, mounts)
            for a in [*(container.get("command") or []), *(container.get("args") or [])]
        ]
        if argv and argv[0] == "sparkguard":
            argv[0] = str(BIN / "sparkguard")
        return argv

    def _start_sidecar(
        self,
        container: Mapping[str, Any],
        volumes: Mapping[str, Path],
        run_dir: Path,
        log: Any,
        pod: _PodProcesses,
    ) -> subprocess.Popen[bytes]:
        mounts = self._mounts(container, volumes)
        argv = self._argv(container, mounts)
        # The pod network is the host here: listen on loopback only, one pod at a time.
        argv = pod.wrap(["127.0.0.1" if a == "0.0.0.0" else a for a in argv], sidecar=True)
        probe = (container.get("startupProbe") or container["readinessProbe"])["httpGet"]
        if not HOST_PORTS.hold(int(probe["port"]), pod, timeout=300, cancelled=pod.deleting):
            raise _DeletedWhilePendingError
        process = subprocess.Popen(
            argv, env=self._env(container, mounts), stdout=log, stderr=log, cwd=run_dir
        )
        pod.started(process, argv)
        url = f"http://127.0.0.1:{probe['port']}{probe['path']}"
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(url, timeout=1):
                    return process
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"sidecar {container['name']} did not become ready"
                    ) from None
                time.sleep(0.1)

    def _run_driver(  # noqa: PLR0917 - the pod's parts, as _watch_driver takes them
        self,
        spec: PodSpec,
        volumes: Mapping[str, Path],
        run_dir: Path,
        log: Any,
        procs: _PodProcesses,
        pod: DriverPod,
    ) -> int:
        mounts = self._mounts(spec.driver, volumes)
        env = self._env(spec.driver, mounts)
        conf = {k: self._remap(str(v), mounts) for k, v in spec.conf.items()}
        kill = pod.index in self.kill_runs
        signal_file = run_dir / "paused"
        if self.job in ("plain", "plain-table"):
            argv = [
                sys.executable, str(PLAIN_JOB), "{}", self.table, str(self.rows),
                str(self.partitions),
            ]  # fmt: skip
            if self.job == "plain-table":  # self.table is the warehouse directory
                argv = [
                    sys.executable, str(PLAIN_TABLE_JOB), "{}", "saveAsTable", self.table,
                    str(self.rows), str(self.partitions),
                ]  # fmt: skip
            env["PYSPARK_SUBMIT_ARGS"] = _submit_args(conf)
            env["SPARK_LOCAL_IP"] = "127.0.0.1"
        elif self.job == "light":
            settings = {**conf, "spark.driver.host": "127.0.0.1"}
            argv = [
                sys.executable, str(LIGHT_JOB), "stream" if self.stream_batches else "driver",
                json.dumps(settings), self.table, str(self.rows), str(self.partitions),
                str(run_dir), self.kill_point if kill or pod.index in self.stall_runs else "none",
                str(self.executor_delay_s),
            ]  # fmt: skip
            if self.stream_batches:  # micro-batches of ``rows`` rows each (light_driver.py)
                argv.append(str(self.stream_batches))
            signal_file = run_dir / f"at-{self.kill_point}"
        else:
            faults = (
                json.dumps([{"point": "task:after-file", "action": "pause", "partition": 2,
                             "signal": str(signal_file)}])
                if kill else ""
            )  # fmt: skip
            argv = [
                sys.executable, "-m", "sparkguard.spark_lib.tools.demo_job",
                "--table", self.table, "--rows", str(self.rows),
                "--partitions", str(self.partitions),
                "--job-id", conf["spark.sparkguard.jobId"],
                "--attempt", conf["spark.sparkguard.attempt"],
                "--journal", conf["spark.sparkguard.journal"],
                "--markers", conf["spark.sparkguard.markers.type"],
                "--endpoint", conf.get("spark.sparkguard.markers.endpoint", ""),
                "--token-file", conf.get("spark.sparkguard.markers.tokenFile", ""),
                "--faults", faults,
            ]  # fmt: skip
            if kill:  # fault injection is test-only: the library refuses it without this
                env["SPARKGUARD_ENABLE_FAULTS"] = "1"
            owner = conf.get("spark.sparkguard.owner")
            if owner:  # as spark-submit --conf (spark-operator passes sparkConf so)
                env["PYSPARK_SUBMIT_ARGS"] = (
                    f"--conf {shlex.quote('spark.sparkguard.owner=' + owner)} pyspark-shell"
                )
        return self._watch_driver(argv, env, run_dir, log, procs, pod, signal_file=signal_file)

    def _watch_driver(  # noqa: PLR0917 - the pod's parts
        self,
        argv: list[str],
        env: Mapping[str, str],
        run_dir: Path,
        log: Any,
        procs: _PodProcesses,
        pod: DriverPod,
        *,
        signal_file: Path,
    ) -> int:
        """Run the driver program in the pod's process namespace; SIGKILL it (its whole session:
        Python, its Spark JVM and PySpark's workers) when a run to kill reaches its moment, or
        stop it (SIGTERM, then SIGKILL) when the pod is deleted."""
        kill = pod.index in self.kill_runs
        argv = procs.wrap(argv, sidecar=False)
        process = subprocess.Popen(
            argv, env=env, stdout=log, stderr=log, cwd=run_dir, start_new_session=True
        )
        procs.started(process, argv)
        pod.driver = process
        deadline = time.monotonic() + 600
        while process.poll() is None:
            self._start_executors(run_dir, env, log)
            if pod.deleting.is_set():
                pod.record["ended_by"] = "deleted"
                code = self._terminate_session(process)
                return 128 - code if code < 0 else code
            due = signal_file.exists() or (self.kill_when is not None and self.kill_when())
            if kill and due:
                kill_session(process.pid)  # with PySpark's workers, in their own group
                process.wait()
                pod.record["ended_by"] = "killed"
                return 128 + signal.SIGKILL  # a container's exit code for SIGKILL
            if time.monotonic() > deadline:
                kill_session(process.pid)
                raise RuntimeError("driver did not finish within 600 s")
            time.sleep(0.01 if kill else 0.05)
        pod.record["ended_by"] = "exited"
        return int(process.returncode)

    # -- lingering executors ----------------------------------------------------------------
    def _start_executors(self, run_dir: Path, env: Mapping[str, str], log: Any) -> None:
        """Start the executor "pods" the driver asked for (``light_driver._request_executor``)
        as processes of their own session and namespaces, as Kubernetes runs executor pods
        apart from the driver's: the driver pod's end (its PID namespace included) does not end
        them; :meth:`_gc_executors` does, ``executor_linger_s`` later."""
        requests = run_dir / "executor-requests"
        if not requests.is_dir():
            return
        for request in sorted(requests.glob("*.json")):
            argv = json.loads(request.read_text())
            request.unlink()
            executor = subprocess.Popen(
                argv, env=dict(env), stdout=log, stderr=log, cwd=run_dir, start_new_session=True
            )
            (run_dir / "executors").mkdir(exist_ok=True)
            (run_dir / "executors" / str(executor.pid)).touch()

    def _gc_executors(self, *, everything: bool = False) -> None:
        """Stop the executors whose driver ended ``executor_linger_s`` ago (or all of them)."""
        now = time.monotonic()
        with self._lock:
            due = [e for e in self._executors if everything or e[0] <= now]
            self._executors = [e for e in self._executors if e not in due]
        for _, pids in due:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGTERM)
            time.sleep(min(self.termination_grace_s, 0.5) if pids else 0)
            for pid in pids:
                kill_session(pid)

    def executors_left(self) -> int:
        """Executor processes still running (lingering after their driver, or not yet GC'd)."""
        with self._lock:
            return sum(len(pids) for _, pids in self._executors)

    def cleanup(self) -> None:
        """Stop every pod and executor still running (the test is over)."""
        for pod in list(self.pods.values()):
            pod.deleting.set()
        for pod in list(self.pods.values()):
            if pod.thread is not None:
                pod.thread.join(30)
        self._gc_executors(everything=True)
        shutil.rmtree(self.workdir / "volumes", ignore_errors=True)


def _submit_args(conf: Mapping[str, str]) -> str:
    """``conf`` as spark-submit options (``--conf k=v`` each), as spark-operator passes
    ``spec.sparkConf``; PySpark hands them to the spark-submit that starts its JVM."""
    options = " ".join(f"--conf {shlex.quote(f'{key}={value}')}" for key, value in conf.items())
    return f"{options} pyspark-shell"


def _field_of(field_path: str, annotations: Mapping[str, str]) -> str:
    """A downward API ``metadata.annotations['<key>']`` of the pod (empty when it has none, as
    the kubelet writes it); the only field sparkguard projects."""
    prefix, suffix = "metadata.annotations['", "']"
    if not (field_path.startswith(prefix) and field_path.endswith(suffix)):
        raise NotImplementedError(f"the stand-in kubelet projects annotations only: {field_path}")
    return annotations.get(field_path[len(prefix) : -len(suffix)], "")
