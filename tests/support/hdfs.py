"""A real HDFS on 127.0.0.1: Hadoop's MiniDFSCluster (a NameNode and DataNodes) in a JVM of its
own, for the ``hdfs`` test tier and benchmarks/commit_protocol.py.

* The jars: ``scripts/fetch-jars.sh hdfs-minicluster`` (``tests/support/cached_jars.py``, the
  helper the S3A jars use too): the shaded ``hadoop-client-minicluster`` of the Hadoop version
  PySpark bundles, fetched with Maven into ``~/.cache/sparkguard/hdfs-minicluster/`` the first
  time, nothing afterwards.
* The JVM: ``java -cp <those jars>:<its class> MiniHdfs`` (``tests/support/minicluster/
  MiniHdfs.java``, compiled with ``javac`` once into the cache beside the jars, keyed by its
  source: Java's single-file source launcher would compile it at every start, 20 s on a loaded
  machine), which writes a ready file once the NameNode is out of safe mode and every DataNode
  registered, and shuts the cluster down when its standard input closes: the pipe is held by
  the process that started it, so a test process that dies, however it dies, takes its cluster
  with it.
* Spark reaches it as ``hdfs://127.0.0.1:<port>`` (HDFS's RPC, Spark's own client); the tests'
  Python side (``sparkguard rollback``, the reader, listings) over WebHDFS on the NameNode's HTTP
  port, through :class:`HdfsOverWebHdfs`, which :func:`python_access` registers for ``hdfs://``
  in the calling process only: pyarrow's HDFS client, fsspec's default for ``hdfs://``, needs a
  native libhdfs that no package registry here serves.
"""

from __future__ import annotations

import contextlib
import dataclasses
import getpass
import hashlib
import importlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import fsspec
from fsspec.implementations.webhdfs import WebHDFS
from fsspec.utils import infer_storage_options

from tests.support import cached_jars, run_tmp

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = ROOT / "tests" / "support" / "minicluster" / "MiniHdfs.java"
#: the cluster's JVM: a small heap, the C1 compiler and the serial collector (as the test
#: Spark JVMs: a server that lives minutes gains nothing from C2 and G1's threads on 2 cores)
JAVA_OPTIONS: Final = ("-Xmx768m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
#: start budget: the first start of a machine fetches the jars (Maven) before this counts
START_TIMEOUT_S: Final = 180.0


class MiniHdfsError(RuntimeError):
    """The minicluster did not start (the message holds the end of its log)."""


@dataclasses.dataclass(frozen=True)
class MiniHdfs:
    """A running minicluster: its ``hdfs://`` URI, its NameNode's HTTP (WebHDFS) port."""

    uri: str
    http_port: int
    datanodes: int
    log: Path

    def url(self, *parts: str) -> str:
        """``hdfs://127.0.0.1:<port>/<parts...>``."""
        return "/".join([self.uri, *(p.strip("/") for p in parts)])

    def fresh_dir(self, prefix: str = "t") -> str:
        """The URL of a directory no test used yet (nothing is created)."""
        return self.url(f"{prefix}-{uuid.uuid4().hex[:12]}")

    def spark_conf(self) -> dict[str, str]:
        """Spark conf for ``hdfs://`` on this cluster: one copy of each block when it has one
        DataNode (the default, 3, would leave every block under-replicated)."""
        return {"spark.hadoop.dfs.replication": str(min(self.datanodes, 3))}

    @property
    def storage_options(self) -> dict[str, Any]:
        """fsspec options of :class:`HdfsOverWebHdfs` for this cluster (the tests' Python side,
        with :func:`python_access`)."""
        return {"host": "127.0.0.1", "port": self.http_port, "user": getpass.getuser()}


def fetch_jars() -> Path:
    """The minicluster's jars (Maven Central the first time; cached afterwards)."""
    return cached_jars.fetch("hdfs-minicluster")


def compile_launcher(jars: Path) -> Path:
    """The directory of ``MiniHdfs.class``, compiled against ``jars`` once (a directory beside
    them named by a hash of the source; filled under a temporary name and renamed, so it is
    complete or absent, and a concurrent compile's copy is as good)."""
    source = LAUNCHER.read_bytes()
    stamp = hashlib.sha256(source + str(jars).encode()).hexdigest()[:16]
    classes = jars.parent / f"{jars.name}-launcher-{stamp}"
    if (classes / "MiniHdfs.class").is_file():
        return classes
    partial = Path(tempfile.mkdtemp(prefix=".launcher-", dir=jars.parent))
    try:
        result = subprocess.run(
            ["javac", "-nowarn", "-cp", str(jars / "*"), "-d", str(partial), str(LAUNCHER)],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise MiniHdfsError(f"javac {LAUNCHER.name} failed:\n{result.stderr[-4000:]}")
        with contextlib.suppress(OSError):  # a concurrent compile published it first
            partial.rename(classes)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return classes


@contextlib.contextmanager
def run_mini_hdfs(*, datanodes: int = 1, timeout: float = START_TIMEOUT_S) -> Iterator[MiniHdfs]:
    """Start a minicluster with ``datanodes`` DataNodes on 127.0.0.1, wait until it is up,
    yield it, and stop it (its data directory is removed). Raises :class:`MiniHdfsError` with
    the cluster's log when it exits or is not up within ``timeout`` seconds."""
    jars = fetch_jars()
    launcher = compile_launcher(jars)
    base = Path(tempfile.mkdtemp(prefix="sg-minihdfs-"))
    ready = base / "ready.json"
    log = base / "minihdfs.log"
    command = [
        "java",
        *JAVA_OPTIONS,
        run_tmp.java_options(base),  # removed with the cluster, like its data
        "-cp",
        f"{jars / '*'}{os.pathsep}{launcher}",
        "MiniHdfs",
        str(base / "dfs"),
        str(ready),
        str(datanodes),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HADOOP_", "JAVA_TOOL"))}
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=out, stderr=out, cwd=base, env=env
        )
    try:
        info = _wait_ready(process, ready, log, timeout)
        yield MiniHdfs(
            uri=str(info["uri"]), http_port=int(info["http"]), datanodes=datanodes, log=log
        )
    finally:
        _stop(process)
        shutil.rmtree(base, ignore_errors=True)


def _wait_ready(
    process: subprocess.Popen[bytes], ready: Path, log: Path, timeout: float
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if process.poll() is not None:
            raise MiniHdfsError(
                f"the HDFS minicluster exited {process.returncode} before it was up:\n" + _tail(log)
            )
        if time.monotonic() > deadline:
            raise MiniHdfsError(
                f"the HDFS minicluster was not up within {timeout:g} s:\n{_tail(log)}"
            )
        time.sleep(0.2)
    info: dict[str, Any] = json.loads(ready.read_text())
    return info


def _stop(process: subprocess.Popen[bytes]) -> None:
    """EOF on its standard input (a clean shutdown), then SIGKILL if it lingers."""
    if process.stdin is not None:
        with contextlib.suppress(OSError):
            process.stdin.close()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=30)


def _tail(log: Path, chars: int = 4000) -> str:
    try:
        return log.read_text(errors="replace")[-chars:]
    except OSError as exc:
        return f"(no log: {exc})"


class HdfsOverWebHdfs(WebHDFS):  # type: ignore[misc]
    """``hdfs://host:rpc-port/path`` URLs served over WebHDFS (the NameNode's REST API on its
    HTTP port, given by the storage options ``host`` and ``port``): the tests' Python client of
    the minicluster. The RPC address in a URL is ignored (the storage options name the
    NameNode's HTTP address instead). WebHDFS answers a refused RENAME or DELETE with
    ``{"boolean": false}``, which fsspec's WebHDFS ignores: here a rename onto an existing file
    raises :class:`FileExistsError` (a refused publication would look like a success) and a
    delete of a missing file :class:`FileNotFoundError` (as every fsspec filesystem does; the
    rollback counts what it deleted by it); ``rmdir`` removes an empty directory only."""

    protocol = ("hdfs",)

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        stripped: str = infer_storage_options(path)["path"]
        return stripped.rstrip("/") or "/"

    @staticmethod
    def _get_kwargs_from_urls(urlpath: str) -> dict[str, Any]:
        return {}  # the URL's host:port is the NameNode's RPC, not its WebHDFS address

    def mv(self, path1: str, path2: str, **kwargs: Any) -> None:
        answer = self._call("RENAME", method="put", path=path1, destination=path2)
        if not answer.json().get("boolean", False):
            if not self.exists(path1):
                raise FileNotFoundError(path1)
            raise FileExistsError(f"rename {path1} -> {path2} refused: {path2} exists")

    def rm(self, path: str, recursive: bool = False, **kwargs: Any) -> None:
        flag = "true" if recursive else "false"
        answer = self._call("DELETE", method="delete", path=path, recursive=flag)
        if not answer.json().get("boolean", False):
            raise FileNotFoundError(path)

    def rmdir(self, path: str) -> None:
        """Remove an empty directory: a DELETE without ``recursive``, which the NameNode
        refuses for a directory with anything in it (an :class:`OSError` here). fsspec's
        WebHDFS has no ``rmdir``: its base class's does nothing."""
        self.rm(path, recursive=False)


@contextlib.contextmanager
def python_access() -> Iterator[None]:
    """In this process, serve ``hdfs://`` with :class:`HdfsOverWebHdfs` (fsspec's registry)
    until exit, then put back what served it before."""
    # the module (``fsspec.registry`` is also the name of its read-only view of the registry)
    module = importlib.import_module("fsspec.registry")
    before = module.registry.get("hdfs")
    fsspec.register_implementation("hdfs", HdfsOverWebHdfs, clobber=True)
    try:
        yield
    finally:
        if before is not None:
            fsspec.register_implementation("hdfs", before, clobber=True)
        else:  # fsspec has no public way to unregister: drop the instantiated entry
            module._registry.pop("hdfs", None)
