"""A stand-in for the Kubeflow spark-operator, for a bench with no kubelet.

It reads a SparkApplication's *mutated* spec from the real API server and runs, as local
processes, exactly what a driver pod would run: the driver's initContainers in order (the
library bundle, then sparkguard's rollback), the sidecars, then the driver (the demo job) with
the app's ``spec.sparkConf`` and driver env. Volumes become directories: every path under a
volumeMount is rewritten to that volume's directory, and secret volumes are filled from the
Secret. It reports status through the ``/status`` subresource the way spark-operator does
(SUBMITTED, RUNNING, then COMPLETED or FAILED), and reruns the app when its spec changes after
a terminal state. Only what the test needs is modelled; no pod scheduling, no executors pods
(Spark runs in local mode inside the "driver").

Two driver programs: ``job="demo"`` runs sparkguard's demo job (the Python writer), given the
injected settings as arguments; ``job="plain"`` runs a plain PySpark job that never imports
sparkguard (``tests/jvm/jobs/plain_write.py``, ``df.write.mode("append").parquet``) with the
app's *whole* ``spec.sparkConf`` passed as spark-submit's ``--conf`` options (what
spark-operator does), so the JVM layer the operator injected (commit protocol, ``spark.jars``
from the library volume) is what makes it exactly once.

The kubelet's part, as far as the pod's end goes: a native sidecar is stopped (SIGTERM) once the
driver container ended; regular containers are never stopped, so the pod is terminal only once
every one of them has exited by itself (``Succeeded`` when all exited 0, else ``Failed``), and
``Running`` until then. The app's state follows spark-operator's ``GetDriverState``: the driver
container's exit decides COMPLETED/FAILED even while the pod is still ``Running``. Process
namespaces are real (``unshare``/``nsenter``): every sidecar sees only its own processes, or,
with ``spec.driver.shareProcessNamespace: true``, sidecars and driver share one namespace with
a pause process as PID 1 (without that the sidecars would also see every other Spark process
on the host).
"""

from __future__ import annotations

import base64
import contextlib
import datetime
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
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kubernetes import client

from tests.support.process import kill_session

GROUP, VERSION, PLURAL = "sparkoperator.k8s.io", "v1beta2", "sparkapplications"
BIN = Path(sys.executable).parent
#: the unchanged job of ``job="plain"``: never imports sparkguard
PLAIN_JOB = Path(__file__).resolve().parents[1] / "jvm" / "jobs" / "plain_write.py"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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


class _PodProcesses:
    """The PID namespaces of one driver pod: shared (a pause process as PID 1) or per container.

    Containers are started through ``nsenter``/``unshare``; signals go to the container's own
    process, the wrapper relays its exit status.
    """

    def __init__(self, *, shared: bool, run_dir: Path) -> None:
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


class StandInSparkOperator:
    """Runs one SparkApplication's driver pod locally, as often as spark-operator would."""

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
        self.api = api
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.namespace = namespace
        self.name = name
        self.workdir = workdir
        self.table = table
        self.rows = rows
        self.partitions = partitions
        if job not in ("demo", "plain"):
            raise ValueError(f"job {job!r}: use 'demo' or 'plain'")
        self.job = job
        self.runs: list[dict[str, Any]] = []
        #: per-run fault: run index -> kill the driver mid-write
        self.kill_runs: set[int] = set()
        #: ``job="plain"`` has no fault points: the driver of a run in ``kill_runs`` is
        #: SIGKILLed (whole process group) as soon as this says so (e.g. "a file is published")
        self.kill_when: Callable[[], bool] | None = None
        self.log = workdir / "standin.log"

    # -- the API side -----------------------------------------------------------------------
    def app(self) -> dict[str, Any]:
        found: dict[str, Any] = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, self.name
        )
        return found

    def report(self, state: str, **extra: Any) -> None:
        """Write status as spark-operator does (through the status subresource)."""
        status = {"applicationState": {"state": state}, **extra}
        self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, self.namespace, PLURAL, self.name, {"status": status}
        )

    def _secret(self, name: str) -> dict[str, str]:
        secret = self.core.read_namespaced_secret(name, self.namespace)
        return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}

    # -- volumes and containers -------------------------------------------------------------
    def _volumes(self, spec: Mapping[str, Any], run_dir: Path) -> dict[str, Path]:
        dirs = {}
        for volume in spec.get("volumes") or []:
            path = run_dir / "volumes" / volume["name"]
            path.mkdir(parents=True, exist_ok=True)
            if "secret" in volume:
                for key, value in self._secret(volume["secret"]["secretName"]).items():
                    (path / key).write_text(value)
            dirs[volume["name"]] = path
        return dirs

    @staticmethod
    def _mounts(container: Mapping[str, Any], volumes: Mapping[str, Path]) -> list[tuple[str, str]]:
        mounts = [
            (m["mountPath"].rstrip("/"), str(volumes[m["name"]]))
            for m in container.get("volumeMounts") or []
        ]
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

    # -- one driver pod ---------------------------------------------------------------------
    def run_driver_pod(self, *, failure_state: str = "FAILED") -> str:
        """Run the app's driver pod once; returns the state it reported at the end.

        ``failure_state`` is FAILING when spark-operator will restart the driver itself.
        """
        app = self.app()
        spec = app["spec"]
        index = len(self.runs)
        run_dir = self.workdir / f"run-{index}"
        run_dir.mkdir(parents=True)
        submission = uuid.uuid4().hex[:8]
        self.report(
            "SUBMITTED",
            submissionID=submission,
            sparkApplicationId=f"spark-{submission}",
            submissionAttempts=index + 1,
            lastSubmissionAttemptTime=_now(),
        )
        record: dict[str, Any] = {
            "generation": app["metadata"]["generation"], "init": [], "native_sidecars": [],
        }  # fmt: skip
        self.runs.append(record)
        volumes = self._volumes(spec, run_dir)
        driver = spec["driver"]
        pod = _PodProcesses(shared=driver.get("shareProcessNamespace") is True, run_dir=run_dir)
        record["shared_processes"] = pod.pause_pid is not None
        # As the kubelet: a native sidecar (an initContainer with restartPolicy Always) starts
        # in its place among the initContainers, the next one waits until it has started.
        native: list[subprocess.Popen[bytes]] = []
        sidecars: list[subprocess.Popen[bytes]] = []
        try:
            with self.log.open("ab") as log:
                for init in driver.get("initContainers") or []:
                    if init.get("restartPolicy") == "Always":
                        native.append(self._start_sidecar(init, volumes, run_dir, log, pod))
                        record["native_sidecars"].append(init["name"])
                        continue
                    mounts = self._mounts(init, volumes)
                    result = subprocess.run(
                        self._argv(init, mounts), env=self._env(init, mounts), stdout=log,
                        stderr=subprocess.STDOUT, cwd=run_dir, timeout=300, check=False,
                    )  # fmt: skip
                    record["init"].append((init["name"], result.returncode))
                    if result.returncode != 0:
                        self._stop(native, pod)
                        return self._terminate(
                            failure_state, f"initContainer {init['name']} failed"
                        )
                sidecars = [
                    self._start_sidecar(s, volumes, run_dir, log, pod)
                    for s in driver.get("sidecars") or []
                ]
                self.report("RUNNING", submissionID=submission, executionAttempts=index + 1)
                code = self._run_driver(
                    spec, volumes, run_dir, log, pod, kill=index in self.kill_runs
                )
                # The driver container ended. The kubelet stops native sidecars now; regular
                # sidecar containers keep the pod Running for as long as they run.
                self._stop(native, pod)
                record["pod_phase"] = self._pod_phase(code, sidecars)
                record["sidecar_exits"] = [p.returncode for p in sidecars]
        finally:
            self._stop(native + sidecars, pod)  # the stand-in cleans up either way
            pod.close()
        record["exit"] = code
        # spark-operator's GetDriverState: the driver container's exit decides the app's
        # state, even while a sidecar keeps the pod Running.
        if code == 0:
            state = self._terminate("COMPLETED", None)
        else:
            state = self._terminate(failure_state, f"driver exited with code {code}")
        if record["pod_phase"] == "Running":
            stuck = [s["name"] for s in driver.get("sidecars") or []]
            raise DriverPodStillRunningError(
                f"the driver container exited ({code}) but the pod stays Running: sidecar "
                f"container(s) {stuck} did not exit within {self.sidecar_grace_s:g} s"
            )
        return state

    #: how long regular sidecar containers get to exit by themselves after the driver ended
    #: before the stand-in calls the pod stuck (a hang guard: the kubelet would wait for ever)
    sidecar_grace_s = 60.0

    def _stop(self, processes: list[subprocess.Popen[bytes]], pod: _PodProcesses) -> None:
        for process in reversed(processes):  # native sidecars stop in reverse order
            pod.terminate(process)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=15)

    def _pod_phase(self, code: int, sidecars: list[subprocess.Popen[bytes]]) -> str:
        """The driver pod's phase once its driver container ended, as the kubelet reports it."""
        deadline = time.monotonic() + self.sidecar_grace_s
        while any(p.poll() is None for p in sidecars) and time.monotonic() < deadline:
            time.sleep(0.1)
        if any(p.poll() is None for p in sidecars):
            return "Running"
        return "Succeeded" if code == 0 and all(p.returncode == 0 for p in sidecars) else "Failed"

    def _terminate(self, state: str, message: str | None) -> str:
        status: dict[str, Any] = {"terminationTime": _now()}
        self.report(state, **status)
        if message:
            self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, self.namespace, PLURAL, self.name,
                {"status": {"applicationState": {"state": state, "errorMessage": message}}},
            )  # fmt: skip
        return state

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
        # The pod network is the host here: listen on loopback only.
        argv = pod.wrap(["127.0.0.1" if a == "0.0.0.0" else a for a in argv], sidecar=True)
        process = subprocess.Popen(
            argv, env=self._env(container, mounts), stdout=log, stderr=log, cwd=run_dir
        )
        pod.started(process, argv)
        probe = (container.get("startupProbe") or container["readinessProbe"])["httpGet"]
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

    def _run_driver(
        self,
        spec: Mapping[str, Any],
        volumes: Mapping[str, Path],
        run_dir: Path,
        log: Any,
        pod: _PodProcesses,
        *,
        kill: bool,
    ) -> int:
        driver = spec["driver"]
        mounts = self._mounts(driver, volumes)
        env = self._env(driver, mounts)
        conf = {k: self._remap(str(v), mounts) for k, v in (spec.get("sparkConf") or {}).items()}
        signal_file = run_dir / "paused"
        if self.job == "plain":
            argv = [
                sys.executable, str(PLAIN_JOB), "{}", self.table, str(self.rows),
                str(self.partitions),
            ]  # fmt: skip
            env["PYSPARK_SUBMIT_ARGS"] = _submit_args(conf)
            env["SPARK_LOCAL_IP"] = "127.0.0.1"
            return self._watch(argv, env, run_dir, log, pod, kill=kill, signal_file=signal_file)
        faults = (
            json.dumps([{"point": "task:after-file", "action": "pause", "partition": 2,
                         "signal": str(signal_file)}])
            if kill else ""
        )  # fmt: skip
        argv = [
            sys.executable, "-m", "sparkguard.spark_lib.demo_job",
            "--table", self.table, "--rows", str(self.rows), "--partitions", str(self.partitions),
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
        return self._watch(argv, env, run_dir, log, pod, kill=kill, signal_file=signal_file)

    def _watch(
        self,
        argv: list[str],
        env: Mapping[str, str],
        run_dir: Path,
        log: Any,
        pod: _PodProcesses,
        *,
        kill: bool,
        signal_file: Path,
    ) -> int:
        """Run the driver program in the pod's process namespace; SIGKILL it (its whole session:
        Python, its Spark JVM and PySpark's workers) when a run to kill reaches its moment."""
        argv = pod.wrap(argv, sidecar=False)
        process = subprocess.Popen(
            argv, env=env, stdout=log, stderr=log, cwd=run_dir, start_new_session=True
        )
        pod.started(process, argv)
        deadline = time.monotonic() + 600
        while process.poll() is None:
            due = signal_file.exists() or (self.kill_when is not None and self.kill_when())
            if kill and due:
                kill_session(process.pid)  # with PySpark's workers, in their own group
                process.wait()
                return -signal.SIGKILL
            if time.monotonic() > deadline:
                kill_session(process.pid)
                raise RuntimeError("driver did not finish within 600 s")
            time.sleep(0.01 if kill else 0.2)
        return process.returncode

    # -- the control loop -------------------------------------------------------------------
    def serve(self, stop: threading.Event, *, restart_on_failure: int = 0) -> None:
        """Run the app now, then again whenever its spec changes after a terminal state.

        ``restart_on_failure`` models spark-operator's ``restartPolicy: OnFailure``: that many
        driver restarts happen inside spark-operator (state FAILING, PENDING_RERUN) before a
        FAILED is final.
        """
        restarts_left = restart_on_failure

        def failure_state() -> str:
            return "FAILING" if restarts_left > 0 else "FAILED"

        state = self.run_driver_pod(failure_state=failure_state())
        while not stop.is_set():
            if state == "FAILING":
                restarts_left -= 1
                self.report("PENDING_RERUN")
                state = self.run_driver_pod(failure_state=failure_state())
                continue
            app = self.app()
            if app["metadata"]["generation"] != self.runs[-1]["generation"]:
                state = self.run_driver_pod()
                continue
            stop.wait(0.2)

    def cleanup(self) -> None:
        shutil.rmtree(self.workdir / "volumes", ignore_errors=True)


def _submit_args(conf: Mapping[str, str]) -> str:
    """``conf`` as spark-submit options (``--conf k=v`` each), as spark-operator passes
    ``spec.sparkConf``; PySpark hands them to the spark-submit that starts its JVM."""
    options = " ".join(f"--conf {shlex.quote(f'{key}={value}')}" for key, value in conf.items())
    return f"{options} pyspark-shell"
