"""Fixtures for the sidecar tests: configs, an in-process app, and a real sidecar subprocess."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from sparkguard.sidecar import app, config
from sparkguard.spark_lib import filemanager
from tests.support import s3server

TOKEN = "s3cr3t-token"
INSTANT = "20261122120000000-job-1"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def table(request: pytest.FixtureRequest, tmp_path: Any) -> tuple[str, dict[str, Any], str]:
    """(table URL, storage options, allowed root) on local disk or the S3 test server."""
    if request.param == "local":
        root = str(tmp_path / "warehouse")
        options: dict[str, Any] = {}
    else:
        server: s3server.S3Server = request.getfixturevalue("s3_server")
        root = f"s3://{server.create_bucket()}"
        options = dict(server.storage_options)
    return f"{root}/orders", options, root


def marker_dir_under(
    root: str,
    table: str = "table",
    instant: str = INSTANT,
    *,
    storage_options: Mapping[str, Any] | None = None,
    opened: bool = True,
) -> str:
    """The marker directory of ``instant`` in table ``root/table``, with the instant opened: its
    ``.inflight`` written, as a writer's W2 does before any marker (the sidecar refuses markers
    of an instant whose ``.inflight`` is gone). Object-store roots need ``storage_options``;
    without them, or with ``opened=False`` (a path the sidecar must refuse), only the path is
    returned."""
    table_url = f"{root.rstrip('/')}/{table}"
    if opened and ("://" not in root or storage_options is not None):
        open_instant(table_url, instant, storage_options=storage_options)
    return f"{table_url}/_sparkguard/markers/{instant}"


def open_instant(
    table_url: str, instant: str, *, storage_options: Mapping[str, Any] | None = None
) -> None:
    """Write ``<table>/_sparkguard/timeline/<instant>.inflight`` (its content is not read)."""
    manager, table = filemanager.resolve(table_url, storage_options=storage_options)
    inflight = f"{table}/_sparkguard/timeline/{instant}.inflight"
    manager.write_bytes(inflight, b"{}", overwrite=True)


@pytest.fixture
def root(tmp_path: Path) -> str:
    """An allowed root on the local filesystem."""
    path = tmp_path / "warehouse"
    path.mkdir()
    return str(path)


@pytest.fixture
def make_config(root: str) -> Callable[..., config.SidecarConfig]:
    """Build a config allowing ``root``; keyword arguments override fields."""

    def build(**overrides: Any) -> config.SidecarConfig:
        fields: dict[str, Any] = {"allowed_roots": (root,), "token": TOKEN, "batch_interval_ms": 10}
        fields.update(overrides)
        return config.SidecarConfig(**fields)

    return build


@pytest.fixture
async def client(
    aiohttp_client: Callable[..., Any], make_config: Callable[..., config.SidecarConfig]
) -> TestClient[Any, Any]:
    """A test client of an app with default settings over ``root``."""
    result: TestClient[Any, Any] = await aiohttp_client(app.create_app(make_config()))
    return result


@contextlib.contextmanager
def run_sidecar(
    *,
    port: int,
    roots: str,
    extra_env: Mapping[str, str] | None = None,
    args: tuple[str, ...] = (),
    ready_timeout_s: float = 30.0,
    log_path: Path | None = None,
    preexec_fn: Callable[[], None] | None = None,
    entry: tuple[str, ...] = ("sparkguard.sidecar",),
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``python -m sparkguard.sidecar`` (or ``python -m <entry...>``, e.g. ``sparkguard
    sidecar`` as admission injects it) as a real process; kill -9 it on exit if alive.

    ``log_path`` receives its stderr (the log); ``preexec_fn`` runs in the child before exec
    (e.g. to lower its open-files limit).
    """
    env = {
        **os.environ,
        "PYTHONSAFEPATH": "1",
        "SPARKGUARD_SIDECAR_ALLOWED_ROOTS": roots,
        "SPARKGUARD_SIDECAR_TOKEN": TOKEN,
        "SPARKGUARD_SIDECAR_PORT": str(port),
        "SPARKGUARD_SIDECAR_LOG_LEVEL": os.environ.get("SG_TEST_SIDECAR_LOG", "WARNING"),
        **(extra_env or {}),
    }
    log = log_path.open("wb") if log_path is not None else None
    process = subprocess.Popen(
        [sys.executable, "-m", *entry, *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log or (None if os.environ.get("SG_TEST_SIDECAR_LOG") else subprocess.PIPE),
        preexec_fn=preexec_fn,  # noqa: PLW1509 - only resource limits, no threads involved
    )
    try:
        wait_ready(process, port, timeout_s=ready_timeout_s, log_path=log_path)
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        if process.stderr:
            process.stderr.close()
        if log is not None:
            log.close()


def wait_ready(
    process: subprocess.Popen[bytes], port: int, *, timeout_s: float, log_path: Path | None = None
) -> None:
    """Poll /readyz until 200; fail with the process's stderr (or log file) if it exits."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        if process.poll() is not None:
            err = process.stderr.read().decode() if process.stderr else ""
            if log_path is not None:
                err = log_path.read_text(errors="replace")
            raise RuntimeError(f"sidecar exited with {process.returncode}: {err[-3000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"sidecar not ready within {timeout_s} s")
        time.sleep(0.05)


def rss_kib(pid: int) -> int:
    """Resident set size of a process, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def open_fds(pid: int) -> int:
    """How many file descriptors a process has open, from /proc."""
    return len(os.listdir(f"/proc/{pid}/fd"))


free_port = s3server.free_port
