"""Fixtures of the JVM layer's tests: the S3A jars, the stores a test runs on (the HDFS
minicluster's fixture, ``hdfs_cluster``, is tests/conftest.py's: the compatibility tier shares
it), and plain PySpark jobs run as processes."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.jvm import s3a, stores
from tests.sidecar import conftest as sidecar_support
from tests.support import s3server, shared_driver
from tests.support.process import kill_session

JOBS = Path(__file__).resolve().parent / "jobs"


@pytest.fixture(scope="session")
def s3a_jars() -> Path:
    """The S3A jars, fetched once into ~/.cache/sparkguard/s3a (Maven Central the first time)."""
    return s3a.fetch_jars()


@pytest.fixture
def store(request: pytest.FixtureRequest) -> stores.Store:
    """A fresh directory of the store the test's parameter names (``stores.params``)."""
    return open_store(request, request.param)


def open_store(request: pytest.FixtureRequest, name: str) -> stores.Store:
    """A fresh directory of the store ``name`` (``s3`` or ``hdfs``), its server or cluster
    from the session's fixtures."""
    if name == "s3":
        server = request.getfixturevalue("s3_server")
        return stores.on_s3(server, request.getfixturevalue("s3a_jars"))
    if name == "hdfs":
        return stores.on_hdfs(request.getfixturevalue("hdfs_cluster"))
    raise ValueError(f"no store {name!r}: use one of {sorted(stores.MARKS)}")


def job_env() -> dict[str, str]:
    """The environment of a job process: this one's, without AWS/Spark settings that could
    point it elsewhere; only ever 127.0.0.1, never the instance-metadata address."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PYSPARK_", "SPARK_"))}
    env.update(
        {"PYTHONSAFEPATH": "1", "AWS_EC2_METADATA_DISABLED": "true", "SPARK_LOCAL_IP": "127.0.0.1"}
    )
    # The test JVM options (tests/conftest.py) are the one Spark setting a job keeps.
    env["SPARK_SUBMIT_OPTS"] = os.environ.get("SPARK_SUBMIT_OPTS", "")
    return env


def job_command(script: str, *args: str, conf: dict[str, str]) -> list[str]:
    """The command line that runs ``tests/jvm/jobs/<script>`` with Spark ``conf``."""
    return [sys.executable, str(JOBS / script), json.dumps(conf), *args]


def run_job(
    script: str, *args: str, conf: dict[str, str], timeout: float = 300, expect_exit: int = 0
) -> Any:
    """Run ``tests/jvm/jobs/<script>`` with Spark ``conf``; returns the JSON of its last stdout
    line, or fails with the job's stderr when it exits otherwise than ``expect_exit``.

    Nobody kills it, so it runs in this worker's shared driver (``tests/support/
    shared_driver.py``: a new SparkContext of its own conf in a JVM that stays warm), or as its
    own process when its conf sets what only a JVM's start reads, or with
    ``SPARKGUARD_TEST_SHARED_DRIVER=0``."""
    result = job_result(script, *args, conf=conf, timeout=timeout)
    assert result.returncode == expect_exit, (
        f"{script} exited {result.returncode}, expected {expect_exit}:\n{result.stderr}"
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def job_result(script: str, *args: str, conf: dict[str, str], timeout: float = 300) -> Any:
    """Run ``tests/jvm/jobs/<script>`` as :func:`run_job` does; returns what it left (its
    ``returncode``, ``stdout`` and ``stderr``: the driver's log), whatever its exit."""
    if shared_driver.shareable(conf):
        return _shared().run(JOBS / script, [json.dumps(conf), *args], conf, timeout=timeout)
    return subprocess.run(
        job_command(script, *args, conf=conf),
        capture_output=True,
        text=True,
        env=job_env(),
        timeout=timeout,
        check=False,
    )


_SHARED: list[shared_driver.SharedDriver] = []


def _shared() -> shared_driver.SharedDriver:
    """This worker's shared driver, started on first use, stopped when the worker exits."""
    if not _SHARED:
        driver = shared_driver.SharedDriver(
            env=job_env(), log_dir=Path(tempfile.mkdtemp(prefix="sg-shared-driver-"))
        )
        atexit.register(driver.stop)
        _SHARED.append(driver)
    return _SHARED[0]


def kill_when(
    command: list[str],
    ready: Callable[[], bool],
    *,
    delay: float = 0.0,
    poll_s: float = 0.02,
    timeout: float = 600,
    log: Path | None = None,
) -> None:
    """Start the job ``command`` in its own process group, wait until ``ready()``, then
    ``delay`` seconds, then SIGKILL the whole driver (its Python process and its Spark JVM).
    Fails the test when the job exits before the kill. ``log`` keeps the job's stderr."""
    with contextlib.ExitStack() as stack:
        err = stack.enter_context(log.open("wb")) if log else subprocess.PIPE
        proc = subprocess.Popen(
            command, env=job_env(), stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
        )

    def early() -> str:
        if log is not None:
            return log.read_text(errors="replace")[-3000:]
        return proc.stderr.read().decode()[-3000:] if proc.stderr else ""

    try:
        deadline = time.monotonic() + timeout
        while not ready():
            if proc.poll() is not None:
                pytest.fail(f"the job exited {proc.returncode} too early:\n{early()}")
            assert time.monotonic() < deadline, "the job never reached the point of the kill"
            time.sleep(poll_s)
        time.sleep(delay)
        if proc.poll() is not None:
            pytest.fail(f"the job exited {proc.returncode} before the kill:\n{early()}")
    finally:
        kill_session(proc.pid)  # the driver, its JVM and PySpark's workers
        proc.wait(timeout=60)
        if proc.stderr:
            proc.stderr.close()


def rollback_as_init_container(
    job_id: str,
    journal: str,
    storage_options: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> dict[str, Any]:
    """``sparkguard rollback`` as the operator's rollback initContainer runs it before a
    restart (``--allow-missing-journal``: a kill before the first journal entry leaves none);
    returns its ``--json`` summary, failing the test unless it exits 0."""
    from sparkguard import cli
    from sparkguard.spark_lib.tools import commands

    monkeypatch.setenv(commands.STORAGE_ENV, json.dumps(storage_options))
    capsys.readouterr()
    argv = ["rollback", "--job-id", job_id, "--journal", journal, "--allow-missing-journal"]
    code = cli.main([*argv, "--json", "--quiet"])
    out = capsys.readouterr().out
    assert code == 0, out
    summary: dict[str, Any] = json.loads(out)
    return summary


@contextlib.contextmanager
def marker_sidecar(*, roots: Path, token_file: Path, log_path: Path | None = None) -> Iterator[str]:
    """The marker sidecar as a process on 127.0.0.1 (the sidecar tier's launcher), with the
    token of ``token_file``; yields its URL. Killed (SIGKILL) on exit. With ``log_path``, its
    log (at INFO) goes there."""
    port = s3server.free_port()
    token = token_file.read_text().strip()
    env = {"SPARKGUARD_SIDECAR_TOKEN": token}
    if log_path is not None:
        env["SPARKGUARD_SIDECAR_LOG_LEVEL"] = "INFO"
    with sidecar_support.run_sidecar(port=port, roots=str(roots), extra_env=env, log_path=log_path):
        yield f"http://127.0.0.1:{port}"
