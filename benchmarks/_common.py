"""Helpers shared by the benchmarks: processes, ports, and the S3 server behind the proxy."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parents[1]))  # appended: never shadow the stdlib

from tests.support.s3server import S3Server, run_s3_server

REPO = Path(__file__).resolve().parent.parent


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


@contextlib.contextmanager
def process(
    args: list[str], env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """A child process (quiet), terminated (then killed) on exit."""
    proc = subprocess.Popen(
        args,
        env={**os.environ, "PYTHONSAFEPATH": "1", **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_http(url: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1):  # noqa: S310 - 127.0.0.1 only
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not answer within {timeout_s} s") from None
            time.sleep(0.1)


def proxy_call(proxy: str, path: str, method: str = "GET") -> dict[str, int]:
    request = urllib.request.Request(proxy + path, method=method)  # noqa: S310
    with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310
        result: dict[str, int] = json.loads(answer.read())
        return result


@dataclasses.dataclass(frozen=True)
class ProxiedS3:
    """moto's S3 server and the latency/throttling proxy in front of it."""

    s3: S3Server
    proxy: str

    @property
    def options(self) -> dict[str, Any]:
        """s3fs storage options that go through the proxy (what the benchmark measures)."""
        return {
            **self.s3.storage_options,
            "client_kwargs": {"endpoint_url": self.proxy, "region_name": "us-east-1"},
        }

    def env(self) -> dict[str, str]:
        """Environment for a child process (the sidecar) that should go through the proxy."""
        return {**self.s3.env(), "AWS_ENDPOINT_URL": self.proxy, "AWS_ENDPOINT_URL_S3": self.proxy}

    def stats(self) -> dict[str, int]:
        return proxy_call(self.proxy, "/_proxy/stats")

    def reset(self) -> None:
        proxy_call(self.proxy, "/_proxy/reset", "POST")


@contextlib.contextmanager
def proxied_s3(
    *, latency_ms: float, write_rate: float, conditional_deletes: bool = False
) -> Iterator[ProxiedS3]:
    """moto's S3 server behind ``_s3proxy.py`` (per-request latency, S3-like throttling);
    ``conditional_deletes``: one that honours ``ETag`` per key of ``DeleteObjects`` as AWS S3
    does (``tests/support/moto_conditional.py``)."""
    with run_s3_server(conditional_deletes=conditional_deletes) as s3:
        port = free_port()
        proxy = f"http://127.0.0.1:{port}"
        args = [
            sys.executable, str(REPO / "benchmarks" / "_s3proxy.py"), "--port", str(port),
            "--upstream", s3.endpoint, "--latency-ms", str(latency_ms),
            "--write-rate", str(write_rate),
        ]  # fmt: skip
        with process(args):
            wait_http(proxy + "/_proxy/stats")
            yield ProxiedS3(s3=s3, proxy=proxy)


def rss_kib(pid: int) -> int:
    """Resident set size of a process, from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def metric(endpoint: str, name: str) -> float:
    """One sample of a Prometheus metric from ``<endpoint>/metrics``."""
    with urllib.request.urlopen(f"{endpoint}/metrics", timeout=5) as answer:  # noqa: S310
        for line in answer.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise RuntimeError(f"metric {name} not exposed by {endpoint}")


def rotated(kinds: tuple[str, ...], round_: int) -> tuple[str, ...]:
    """``kinds`` rotated by ``round_``: each kind goes first once every len(kinds) rounds."""
    shift = round_ % len(kinds)
    return kinds[shift:] + kinds[:shift]
