"""Stores every spark_lib test can run against: local disk, memory, and the S3 server."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sparkguard.spark_lib import filemanager


@dataclass(frozen=True)
class Store:
    """A file manager and a fresh base path inside its filesystem, plus how to reopen it."""

    name: str
    manager: filemanager.FileManager
    base: str
    url: str
    options: dict[str, Any]


def make_store(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Store:
    if kind == "local":
        url = str(tmp_path / "store")
        options: dict[str, Any] = {}
    elif kind == "memory":
        url = f"memory://sg-{uuid.uuid4().hex[:12]}"
        options = {}
    else:
        url = request.getfixturevalue("s3_bucket") + "/store"
        options = request.getfixturevalue("s3_options")
    manager, base = filemanager.resolve(url, storage_options=options)
    manager.mkdirs(base)
    return Store(name=kind, manager=manager, base=base, url=url, options=options)


@pytest.fixture(params=["local", "memory", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """Each test using it runs once per backend."""
    return make_store(request.param, tmp_path, request)


@pytest.fixture(params=["local", "s3"])
def durable_store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """Backends that survive a process: local disk and the S3 server."""
    return make_store(request.param, tmp_path, request)
