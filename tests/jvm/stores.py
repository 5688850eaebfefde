"""The remote stores the JVM tier's kill tests run on, behind one face: a directory of the test
S3 server (``s3a://``, moto) or of the HDFS minicluster (``hdfs://``, a real NameNode and
DataNode: tests/support/hdfs.py), the Spark conf that writes it, the storage options with which
the Python side (``sparkguard rollback``, the reader) reaches it, and listings taken afresh.

A test runs on several stores by taking the ``store`` fixture (tests/jvm/conftest.py) with
``indirect`` parameters from :func:`params`: each case carries its store's marker (``s3``,
``hdfs``), and the ``hdfs`` cases share the run's one cluster (the xdist group ``hdfs-cluster``,
tests/conftest.py)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import pytest

from tests.jvm import s3a
from tests.support import hdfs, s3server

#: the stores, and the marker of each one's tests
MARKS = {"s3": pytest.mark.s3, "hdfs": pytest.mark.hdfs}


def _no_uploads() -> list[str]:
    return []


@dataclasses.dataclass(frozen=True)
class Store:
    """One directory of a store, and how Spark and the Python side reach it."""

    name: str
    #: the directory's URL (``s3a://<bucket>``, ``hdfs://127.0.0.1:<port>/t-<hex>``)
    base: str
    #: Spark conf that reaches the store (S3A's jars in ``spark.jars``, endpoint, keys, ...)
    conf: dict[str, str]
    #: fsspec storage options of the Python side
    options: dict[str, Any]
    #: keys of incomplete multipart uploads (object stores; a rename store has none)
    uploads: Callable[[], list[str]] = _no_uploads

    def url(self, relative: str) -> str:
        """The URL of ``relative`` inside the directory."""
        return f"{self.base}/{relative.strip('/')}"

    def filesystem(self) -> tuple[Any, str]:
        """This store's fsspec filesystem (its own instance, its listing cache emptied: what
        it lists is the store now) and the directory's path."""
        fs, root = self._filesystem
        fs.invalidate_cache()
        return fs, root

    @functools.cached_property
    def _filesystem(self) -> tuple[Any, str]:
        fs, root = fsspec.core.url_to_fs(self.base, skip_instance_cache=True, **self.options)
        return fs, str(root).rstrip("/")

    def listing(self, prefix: str = "") -> list[str]:
        """Files whose path relative to the directory starts with ``prefix`` (as S3's listing
        by prefix), sorted; listed now."""
        fs, root = self.filesystem()
        under = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = f"{root}/{under}" if under else root
        found = [str(p)[len(root) + 1 :] for p in fs.find(start)]
        return sorted(k for k in found if k.startswith(prefix))

    def files(self, prefix: str) -> dict[str, bytes]:
        """``listing(prefix)`` with their bytes."""
        fs, root = self.filesystem()
        return {k: fs.cat_file(f"{root}/{k}") for k in self.listing(prefix)}


def params(*names: str) -> list[Any]:
    """``pytest.param`` of each store in ``names``, with its marker and id."""
    return [pytest.param(n, marks=[MARKS[n]], id=n) for n in names]


def on_s3(server: s3server.S3Server, jars: Path) -> Store:
    """A fresh bucket of the test S3 server, through S3A."""
    bucket = server.create_bucket()
    client = server.client()

    def uploads() -> list[str]:
        answer = client.list_multipart_uploads(Bucket=bucket)
        return [u["Key"] for u in answer.get("Uploads", [])]

    return Store(
        "s3", f"s3a://{bucket}", s3a.spark_conf(server, jars), dict(server.storage_options), uploads
    )


def on_hdfs(cluster: hdfs.MiniHdfs) -> Store:
    """A fresh directory of the minicluster (the caller has :func:`hdfs.python_access`)."""
    return Store("hdfs", cluster.fresh_dir(), cluster.spark_conf(), cluster.storage_options)


def with_jars(conf: dict[str, str], more: dict[str, str]) -> dict[str, str]:
    """``conf`` updated with ``more``, the ``spark.jars`` of both kept."""
    jars = [j for j in (conf.get("spark.jars"), more.get("spark.jars")) if j]
    merged = {**conf, **more}
    if jars:
        merged["spark.jars"] = ",".join(jars)
    return merged
