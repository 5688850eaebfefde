"""Processes racing create-if-absent and metadata-log adds: exactly one wins, every time."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors, paths
from sparkguard.spark_lib.storage import metadatalog


def _race_create(url: str, options_json: str, name: str, who: int, start: Any) -> bool:
    manager, base = filemanager.resolve(url, storage_options=json.loads(options_json))
    stream = manager.create_atomic(paths.join(base, name))
    stream.write(f"writer {who}".encode())
    start.wait()
    try:
        stream.close()
    except errors.AlreadyExistsError:
        return False
    return True


def _race_add(url: str, options_json: str, batch: int, who: int, start: Any) -> bool:
    manager, base = filemanager.resolve(url, storage_options=json.loads(options_json))
    log = metadatalog.MetadataLog(manager, paths.join(base, "log"))
    start.wait()
    return log.add(batch, {"who": who})


def _run_race(target: Any, url: str, options: dict[str, Any], key: Any, n: int) -> list[bool]:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as mgr:
        start = mgr.Barrier(n)
        with ctx.Pool(n) as pool:
            results = [
                pool.apply_async(target, (url, json.dumps(options), key, who, start))
                for who in range(n)
            ]
            return [r.get(timeout=120) for r in results]


@pytest.fixture(params=["local", "s3"])
def race_target(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    if request.param == "local":
        return str(tmp_path / "race"), {}
    return f"{request.getfixturevalue('s3_bucket')}/race", request.getfixturevalue("s3_options")


def test_processes_racing_create_exactly_one_wins(race_target: tuple[str, dict[str, Any]]) -> None:
    url, options = race_target
    for round_ in range(3):
        outcomes = _run_race(_race_create, url, options, f"file-{round_}", 4)
        assert outcomes.count(True) == 1, outcomes


def test_processes_racing_log_add_exactly_one_wins(race_target: tuple[str, dict[str, Any]]) -> None:
    url, options = race_target
    for batch in range(3):
        outcomes = _run_race(_race_add, url, options, batch, 4)
        assert outcomes.count(True) == 1, outcomes
    manager, base = filemanager.resolve(url, storage_options=options)
    log = metadatalog.MetadataLog(manager, paths.join(base, "log"))
    assert log.list() == [0, 1, 2]
