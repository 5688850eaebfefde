"""A real S3 API over HTTP on 127.0.0.1: moto in server mode, run as a subprocess.

Tests reach it through s3fs exactly as a user's S3 would be reached: endpoint URL + keys.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def storage_options_for(endpoint: str) -> dict[str, Any]:
    """s3fs storage options that reach an S3 API at ``endpoint`` with the tests' keys.

    ``verify: False``: the endpoint is plain HTTP on loopback, so there is no certificate to
    verify; otherwise every new client loads the CA bundle into an SSL context it never uses
    (about 45 ms of CPU a client, and the S3 tests make thousands)."""
    return {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1", "verify": False},
    }


def env_for(endpoint: str) -> dict[str, str]:
    """Environment variables for a subprocess whose S3 clients should reach ``endpoint``."""
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ENDPOINT_URL_S3": endpoint,
    }


@dataclass(frozen=True)
class S3Server:
    """Where the server listens, and the options s3fs needs to reach it."""

    endpoint: str
    process: subprocess.Popen[bytes]

    @property
    def storage_options(self) -> dict[str, Any]:
        return storage_options_for(self.endpoint)

    def env(self) -> dict[str, str]:
        """Environment variables for a subprocess that should reach this server."""
        return env_for(self.endpoint)

    def client(self) -> Any:
        """A boto3 S3 client of this server (the tests' keys and region)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )

    @functools.cached_property
    def _bucket_maker(self) -> Any:
        """The client create_bucket reuses: a new boto3 client costs about 11 ms of CPU, reusing
        one makes a bucket about 4 times cheaper (a bucket per S3 test)."""
        return self.client()

    def create_bucket(self, name: str | None = None, *, ignores_if_none_match: bool = False) -> str:
        """Create a fresh bucket; returns its name. ``ignores_if_none_match``: a bucket where
        the server ignores ``If-None-Match: *``, as some S3-compatible stores do."""
        prefix = "ignores-inm-" if ignores_if_none_match else "sg-"  # moto_conditional.py
        bucket = name or f"{prefix}{uuid.uuid4().hex[:12]}"
        self._bucket_maker.create_bucket(Bucket=bucket)
        return bucket


@contextlib.contextmanager
def run_s3_server(
    port: int | None = None,
    *,
    conditional_deletes: bool = False,
    ignore_if_none_match: bool = False,
    server_flags: tuple[str, ...] = (),
) -> Iterator[S3Server]:
    """Start moto's server on 127.0.0.1 and stop it afterwards. Its conditional writes are
    atomic, as AWS S3's are (moto alone can let two racing creates both succeed);
    ``conditional_deletes``: it also honours ``ETag`` per key of ``DeleteObjects`` as AWS S3
    does (moto alone reports every key deleted); ``ignore_if_none_match``: every bucket
    ignores ``If-None-Match: *`` as some S3-compatible stores do (a create replaces the key;
    without it, only buckets made by ``create_bucket(ignores_if_none_match=True)``). All
    three: ``tests/support/moto_conditional.py``;
    ``server_flags``: more of its flags (its own tests' switches)."""
    port = port or free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    # moto logs every request: to a file, never to a pipe nobody drains (a full pipe blocks
    # the server after a few hundred requests).
    log = tempfile.NamedTemporaryFile(prefix="moto-", suffix=".log", delete=False)  # noqa: SIM115
    server = [str(Path(__file__).with_name("moto_conditional.py"))]
    if conditional_deletes:
        server.append("--conditional-deletes")
    if ignore_if_none_match:
        server.append("--ignore-if-none-match")
    server.extend(server_flags)
    process = subprocess.Popen(
        [sys.executable, *server, "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=log,
        env=env,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1):  # noqa: S310
                    break
            except OSError:
                if process.poll() is not None:
                    err = Path(log.name).read_text(errors="replace")
                    raise RuntimeError(f"moto server exited: {err[-2000:]}") from None
                if time.monotonic() > deadline:
                    raise RuntimeError("moto server did not answer within 30 s") from None
                time.sleep(0.1)
        yield S3Server(endpoint=endpoint, process=process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()
        Path(log.name).unlink(missing_ok=True)
