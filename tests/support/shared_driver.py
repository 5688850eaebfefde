"""One Spark driver process per pytest worker for the test jobs that are not killed.

A test job (``tests/jvm/jobs/*.py``: plain PySpark, never importing sparkguard) is a script
that builds its SparkSession from a conf, runs, prints one JSON line and stops its session.
Run as its own process, most of its time on this 2-core machine is the JVM's start, class
loading and Spark's first query. A job nobody kills does not need a process of its own: the
:class:`SharedDriver` runs such jobs one after another inside one long-lived Python process,
each with a *new* SparkContext built from that job's conf (``spark.stop()`` in between, as the
scripts do), in a JVM that stays warm. Kill tests never use it: a job that is SIGKILLed runs as
its own process (``tests/jvm/conftest.py``'s ``kill_when``), as a driver pod dies whole.

What a job cannot change inside a running JVM is handled, not ignored:

* the driver's classpath is fixed at the JVM's start: the server starts with the jars of the
  job that started it (``spark.jars``, put on the classpath by ``--jars``); a job that needs a
  jar the JVM lacks gets a new server started with the union;
* the keys of :data:`LAUNCH_KEYS` (JVM options, driver memory, extra classpath) only take
  effect at a launch: a job that sets one runs as its own process;
* Hadoop's FileSystem cache is JVM-wide: after every job :func:`_clean_up` closes every cached
  FileSystem (an S3A client keeps no endpoint or credentials of one job for the next), and
  stops a SparkContext a failed job left behind.

``SPARKGUARD_TEST_SHARED_DRIVER=0`` runs every job as its own process. Protocol: one JSON
request per line on the server's stdin (``{"script", "argv"}``), one JSON answer per line on
the server's original stdout (``{"code", "stdout"}``); everything else either writes (Spark's
logs, the JVM) goes to the server's stderr, a log file the client reads for failures.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import IO, Any

#: Spark settings read only when a driver JVM starts: a job setting one gets its own process
LAUNCH_KEYS = frozenset(
    {
        "spark.driver.extraJavaOptions",
        "spark.driver.extraClassPath",
        "spark.driver.extraLibraryPath",
        "spark.driver.memory",
        "spark.driver.userClassPathFirst",
        "spark.jars.packages",
        "spark.jars.repositories",
        "spark.jars.ivy",
        "spark.master",
        "spark.submit.deployMode",
    }
)


def enabled() -> bool:
    """Whether jobs may share a driver (``SPARKGUARD_TEST_SHARED_DRIVER``, default on)."""
    return os.environ.get("SPARKGUARD_TEST_SHARED_DRIVER", "1") != "0"


def jars_of(conf: dict[str, str]) -> frozenset[str]:
    """The jars a job's conf puts on the driver's classpath."""
    return frozenset(j for j in conf.get("spark.jars", "").split(",") if j)


def shareable(conf: dict[str, str]) -> bool:
    """Whether a job with ``conf`` can run in a shared driver."""
    return enabled() and not (LAUNCH_KEYS & conf.keys())


class JobResult:
    """What a job left: its exit code, its stdout, and its part of the driver's log."""

    def __init__(self, code: int, stdout: str, stderr: str) -> None:
        self.returncode = code
        self.stdout = stdout
        self.stderr = stderr


class SharedDriver:
    """The client side: starts the server on first use, restarts it when it must."""

    def __init__(self, *, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.log_dir = log_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.jars: frozenset[str] = frozenset()
        self.log: Path | None = None
        self.started = 0

    def run(
        self, script: Path, argv: list[str], conf: dict[str, str], *, timeout: float
    ) -> JobResult:
        """Run ``script`` with ``argv`` (its ``sys.argv[1:]``) in the shared driver."""
        needed = jars_of(conf)
        if self.proc is None or self.proc.poll() is not None or not needed <= self.jars:
            self._start(self.jars | needed)
        assert self.proc is not None
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        assert self.log is not None
        offset = self.log.stat().st_size
        request = {"script": str(script), "argv": argv}
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()
        line = _read_line(self.proc.stdout, timeout=timeout)
        log = self.log.read_bytes()[offset:].decode(errors="replace")
        if line is None:
            self.stop()
            raise AssertionError(
                f"{script.name} did not finish in {timeout:.0f}s in the shared driver "
                f"(stopped):\n{log[-5000:]}"
            )
        answer = json.loads(line)
        return JobResult(int(answer["code"]), str(answer["stdout"]), log)

    def _start(self, jars: frozenset[str]) -> None:
        self.stop()
        self.started += 1
        self.log = self.log_dir / f"shared-driver-{os.getpid()}-{self.started}.log"
        env = dict(self.env)
        # On the classpath, not in spark.jars: what spark-submit is given becomes JVM system
        # properties that every later SparkConf would read.
        classpath = f"--driver-class-path {':'.join(sorted(jars))} " if jars else ""
        env["PYSPARK_SUBMIT_ARGS"] = f"{classpath}pyspark-shell"
        with self.log.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve())],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
                start_new_session=True,
            )
        self.jars = jars

    def stop(self) -> None:
        """Stop the server (its JVM with it)."""
        if self.proc is None:
            return
        from tests.support.process import kill_session

        proc, self.proc = self.proc, None
        if proc.poll() is None and proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()  # the server's loop ends: it stops its session and exits
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=20)
        kill_session(proc.pid)
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


def _read_line(stream: IO[bytes], *, timeout: float) -> str | None:
    """One line of ``stream`` within ``timeout`` seconds, else ``None``."""
    import select

    deadline = time.monotonic() + timeout
    data = b""
    fd = stream.fileno()
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 65536)
        if not chunk:
            raise AssertionError("the shared driver exited; its log has why")
        data += chunk
    return data.decode()


# --- the server ---------------------------------------------------------------------------


def _spark_properties() -> dict[str, str]:
    """The JVM's ``spark.*`` system properties (every SparkConf starts from them)."""
    from pyspark import SparkContext

    props = SparkContext._jvm.java.lang.System.getProperties()  # type: ignore[union-attr]
    names = [str(k) for k in props.stringPropertyNames()]
    return {k: str(props.get(k)) for k in names if k.startswith("spark.")}


def _clean_up(baseline: dict[str, str]) -> None:
    """What one job must not leave to the next: a running SparkContext, cached FileSystems,
    ``spark.*`` system properties other than the JVM's own at its start."""
    from pyspark import SparkContext

    active = SparkContext._active_spark_context
    if active is not None:
        with contextlib.suppress(Exception):
            active.stop()
    jvm = SparkContext._jvm
    if jvm is not None:
        with contextlib.suppress(Exception):
            jvm.org.apache.hadoop.fs.FileSystem.closeAll()
        system = jvm.java.lang.System
        for key, value in _spark_properties().items():
            if key not in baseline:
                system.clearProperty(key)
            elif baseline[key] != value:
                system.setProperty(key, baseline[key])


def _run(script: str, argv: list[str], baseline: dict[str, str]) -> tuple[int, str]:
    out = io.StringIO()
    code = 0
    sys.argv = [script, *argv]
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as exc:
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:  # a job's failure is its exit code, as a process's would be
            traceback.print_exc()
            code = 1
    _clean_up(baseline)
    return code, out.getvalue()


def serve() -> None:
    """Answer requests from stdin until it closes."""
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # the JVM and anything else writing to fd 1: the log, not the answers
    from pyspark import SparkContext

    # The JVM starts now, with no job's conf: spark-submit turns the conf it launches with
    # into system properties, which every later SparkConf would inherit.
    SparkContext._ensure_initialized()
    baseline = _spark_properties()
    for line in sys.stdin:
        request: dict[str, Any] = json.loads(line)
        print(f"== shared driver: {request['script']} {request['argv'][1:]}", file=sys.stderr)
        sys.stderr.flush()
        code, stdout = _run(request["script"], list(request["argv"]), baseline)
        sys.stderr.flush()
        answers.write(json.dumps({"code": code, "stdout": stdout}) + "\n")
    _clean_up(baseline)


if __name__ == "__main__":
    serve()
