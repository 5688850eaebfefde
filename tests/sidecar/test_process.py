"""The sidecar as a process: entry points, bad settings, graceful stop on SIGTERM."""

from __future__ import annotations

import argparse
import errno
import http.client
import json
import logging
import os
import resource
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from sparkguard.sidecar import cli, outcomes
from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors
from sparkguard.spark_lib.spark.marker_http import HttpMarkerClient
from sparkguard.spark_lib.storage import markers
from tests.sidecar.conftest import INSTANT, TOKEN, free_port, marker_dir_under, run_sidecar


def test_cli_registers_every_flag() -> None:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(
        ["--allowed-roots", "/data", "--flush-mode", "group-commit", "--auth-disabled"]
    )
    assert (args.allowed_roots, args.flush_mode, args.auth_disabled) == (
        "/data",
        "group-commit",
        "true",
    )
    assert args.port is None  # unset flags leave the environment in charge


def test_bad_settings_exit_2_naming_the_setting() -> None:
    env = {**os.environ, "PYTHONSAFEPATH": "1", "SPARKGUARD_SIDECAR_TOKEN": "t"}
    env.pop("SPARKGUARD_SIDECAR_ALLOWED_ROOTS", None)
    result = subprocess.run(
        [sys.executable, "-m", "sparkguard.sidecar", "--batch-threads", "zero"],
        env={**env, "SPARKGUARD_SIDECAR_ALLOWED_ROOTS": "/data"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert (
        "SPARKGUARD_SIDECAR_BATCH_THREADS / --batch-threads='zero' is not an integer"
        in result.stderr
    )


def test_open_files_limit_without_room_for_connections_exits_2(root: str) -> None:
    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    env = {
        **os.environ,
        "PYTHONSAFEPATH": "1",
        "SPARKGUARD_SIDECAR_TOKEN": "t",
        "SPARKGUARD_SIDECAR_ALLOWED_ROOTS": root,
        "SPARKGUARD_SIDECAR_PORT": str(free_port()),
    }
    result = subprocess.run(
        [sys.executable, "-m", "sparkguard.sidecar"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        preexec_fn=low_limit,
    )
    assert result.returncode == 2, result.stderr
    assert "the open-files limit (64) leaves no room for connections" in result.stderr
    assert "Traceback" not in result.stderr


def test_sigterm_drains_and_exits_cleanly(root: str) -> None:
    directory = marker_dir_under(root)
    port = free_port()
    acked: list[str] = []
    env = {"SPARKGUARD_SIDECAR_BATCH_INTERVAL_MS": "200"}
    with run_sidecar(port=port, roots=root, extra_env=env) as process:
        stop = threading.Event()

        def writer(w: int) -> None:
            client = HttpMarkerClient(f"http://127.0.0.1:{port}", token=TOKEN, deadline_s=0.5)
            for i in range(100_000):
                if stop.is_set():
                    break
                try:
                    client.create(directory, f"w{w}/f{i}.parquet")
                except errors.MarkerError:
                    break
                acked.append(f"w{w}/f{i}.parquet")
            client.close()

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
        for thread in threads:
            thread.start()
        stop.wait(1.0)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    manager, path = filemanager.resolve(directory)
    assert acked
    assert set(acked) <= markers.read_marked_files(manager, path)


def test_the_injected_command_exits_0_on_sigterm(root: str) -> None:
    """``sparkguard sidecar`` (the command admission injects) exits 0 on SIGTERM, after a marker
    and without any: as a native sidecar of an Apache Spark operator app, a non-zero exit at
    the end of the pod would make that operator mark the app Failed (apache-model.md §3)."""
    directory = marker_dir_under(root)
    for traffic in (True, False):
        port = free_port()
        with run_sidecar(port=port, roots=root, entry=("sparkguard", "sidecar")) as process:
            if traffic:
                client = HttpMarkerClient(f"http://127.0.0.1:{port}", token=TOKEN, deadline_s=5)
                client.create(directory, "one.parquet")
                client.close()
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=30) == 0


class _Records(logging.Handler):
    """Keeps the messages of a logger (here the client's retries) for the test to read."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def wait_for(self, fragment: str) -> None:
        deadline = time.monotonic() + 60  # a hang guard, not a measurement
        while not any(fragment in message for message in list(self.messages)):
            assert time.monotonic() < deadline, f"no {fragment!r} in {self.messages}"
            time.sleep(0.05)


def _readyz(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refusal:
        return refusal.code, json.loads(refusal.read())


def _release_fifo(path: Path) -> None:
    """Open the writing end of the FIFO at ``path`` once its reader waits, then close it."""
    deadline = time.monotonic() + 60  # a hang guard, not a measurement
    while True:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            return
        except OSError as exc:  # ENXIO: nobody has opened it for reading yet
            if exc.errno != errno.ENXIO or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_sigterm_answers_503_while_draining_and_the_client_rides_through(
    root: str, tmp_path: Path
) -> None:
    """Kubernetes sends SIGTERM while the pod's endpoints are still being removed. While queued
    markers are written, the sidecar keeps listening: /readyz and new markers get 503 +
    Retry-After, not a refused connection. Then it stops listening and exits 0; the client
    retries the 503 and the refused connections, and succeeds against the next sidecar."""
    directory = marker_dir_under(root)
    port = free_port()
    log_path = tmp_path / "sidecar.log"
    env = {"SPARKGUARD_SIDECAR_LOG_LEVEL": "INFO", "SPARKGUARD_SIDECAR_SHUTDOWN_TIMEOUT_S": "600"}
    retries = _Records()
    client_log = logging.getLogger("sparkguard.spark_lib.spark.marker_http")
    client_log.addHandler(retries)
    client_log.setLevel(logging.DEBUG)
    results: dict[str, BaseException | None] = {}

    def create(name: str) -> None:
        client = HttpMarkerClient(f"http://127.0.0.1:{port}", token=TOKEN, deadline_s=120)
        try:
            client.create(directory, name)
            results[name] = None
        except BaseException as exc:  # reported by the assertion on results below
            results[name] = exc
        finally:
            client.close()

    # "before" again: a re-sent marker, already durable, is queued for the next flush, which
    # reads the instant's outcome before it answers (a new name would be appended to MARKERS0
    # by a conditional rewrite, which reads nothing).
    threads = [threading.Thread(target=create, args=(name,)) for name in ("before", "racing")]
    try:
        with run_sidecar(port=port, roots=root, extra_env=env, log_path=log_path) as process:
            HttpMarkerClient(f"http://127.0.0.1:{port}", token=TOKEN).create(directory, "before")
            # Hold the drain: the re-sent marker's flush reads the instant's outcome, here a
            # FIFO whose open() waits until the test opens its other end.
            fifo = Path(outcomes.outcome_path(directory, INSTANT))
            fifo.parent.mkdir(parents=True, exist_ok=True)
            os.mkfifo(fifo)
            threads[0].start()
            while _readyz(port)[1].get("pending") != 1:
                time.sleep(0.05)
            process.send_signal(signal.SIGTERM)
            try:
                while _readyz(port)[0] == 200:
                    time.sleep(0.05)
            except OSError as exc:  # refused, reset, or no answer within the hang guard
                raise AssertionError(f"/readyz after SIGTERM: {exc!r}, not 503") from None
            assert _readyz(port)[0] == 503
            probe = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            probe.request(
                "POST",
                "/v1/markers/create",
                json.dumps({"markerdir": directory, "markername": "racing"}),
                {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
            )
            answer = probe.getresponse()
            assert (answer.status, answer.headers["Retry-After"]) == (503, "1")
            assert "the sidecar is stopping" in json.loads(answer.read())["error"]
            probe.close()
            threads[1].start()
            retries.wait_for("HTTP 503: the sidecar is stopping")
            _release_fifo(fifo)  # the held flush fails (a FIFO is no outcome): 503, not acked
            assert process.wait(timeout=60) == 0
        fifo.unlink()
        retries.wait_for("ConnectionRefusedError")
        with run_sidecar(port=port, roots=root, extra_env=env):
            for thread in threads:
                thread.join(timeout=120)
    finally:
        client_log.removeHandler(retries)
        client_log.setLevel(logging.NOTSET)
    assert results == {"before": None, "racing": None}
    assert "Traceback" not in log_path.read_text(errors="replace")
    manager, path = filemanager.resolve(directory)
    assert markers.read_marked_files(manager, path) == {"before", "racing"}


def _wait_for_log(log_path: Path, text: str, process: subprocess.Popen[bytes]) -> None:
    """Block until the sidecar logged ``text`` (the signal that it reached a state)."""
    deadline = time.monotonic() + 60  # a hang guard, not a measurement
    while text not in log_path.read_text(errors="replace"):
        assert process.poll() is None, log_path.read_text(errors="replace")
        assert time.monotonic() < deadline, f"no {text!r} in the sidecar log"
        time.sleep(0.05)


def test_drains_and_exits_0_once_the_watched_process_is_gone(root: str, tmp_path: Path) -> None:
    """The regular-sidecar fallback: the driver's process ends, the sidecar follows cleanly."""
    directory = marker_dir_under(root)
    port = free_port()
    tag = f"sparkguard-test-driver-{uuid.uuid4().hex}"
    log_path = tmp_path / "sidecar.log"
    driver = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()", tag], stdin=subprocess.PIPE
    )
    env = {"SPARKGUARD_SIDECAR_BATCH_INTERVAL_MS": "200", "SPARKGUARD_SIDECAR_LOG_LEVEL": "INFO"}
    acked: list[str] = []
    try:
        with run_sidecar(
            port=port,
            roots=root,
            extra_env=env,
            args=("--exit-with-process", tag),
            log_path=log_path,
        ) as process:
            _wait_for_log(log_path, "driver process seen", process)
            client = HttpMarkerClient(f"http://127.0.0.1:{port}", token=TOKEN, deadline_s=0.5)
            for i in range(5):
                client.create(directory, f"before/f{i}.parquet")
                acked.append(f"before/f{i}.parquet")
            client.close()
            first_batch = threading.Event()

            def writer(w: int) -> None:
                client = HttpMarkerClient(f"http://127.0.0.1:{port}", token=TOKEN, deadline_s=0.5)
                for i in range(100_000):
                    try:
                        client.create(directory, f"w{w}/f{i}.parquet")
                    except errors.MarkerError:
                        break  # refused or unreachable once the sidecar drains: never acked
                    acked.append(f"w{w}/f{i}.parquet")
                    first_batch.set()
                client.close()

            threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
            for thread in threads:
                thread.start()
            first_batch.wait(timeout=60)
            assert driver.stdin is not None
            driver.stdin.close()  # the driver ends while markers are in flight
            assert driver.wait(timeout=30) == 0
            assert process.wait(timeout=60) == 0
            for thread in threads:
                thread.join(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    log = log_path.read_text(errors="replace")
    assert "driver process gone" in log
    assert "Traceback" not in log
    manager, path = filemanager.resolve(directory)
    assert len(acked) > 5
    assert set(acked) <= markers.read_marked_files(manager, path)


def test_exits_0_when_the_watched_process_never_appears(root: str) -> None:
    """A driver container that never started Spark must not keep the pod alive for ever."""
    env = {
        **os.environ,
        "PYTHONSAFEPATH": "1",
        "SPARKGUARD_SIDECAR_TOKEN": "t",
        "SPARKGUARD_SIDECAR_ALLOWED_ROOTS": root,
        "SPARKGUARD_SIDECAR_PORT": str(free_port()),
        "SPARKGUARD_SIDECAR_EXIT_WITH_PROCESS": f"never-{uuid.uuid4().hex}",
        "SPARKGUARD_SIDECAR_EXIT_WITH_PROCESS_WAIT_S": "1",
    }
    result = subprocess.run(
        [sys.executable, "-m", "sparkguard.sidecar", "--log-level", "INFO"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "appeared within 1 s" in result.stderr
    assert "Traceback" not in result.stderr
