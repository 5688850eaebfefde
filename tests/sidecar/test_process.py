"""The sidecar as a process: entry points, bad settings, graceful stop on SIGTERM."""

from __future__ import annotations

import argparse
import os
import resource
import signal
import subprocess
import sys
import threading

from sparkguard.sidecar import cli
from sparkguard.spark_lib import errors, filemanager, markers
from sparkguard.spark_lib.marker_http import HttpMarkerClient
from tests.sidecar.conftest import TOKEN, free_port, marker_dir_under, run_sidecar


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
