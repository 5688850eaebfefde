"""SIGKILL a writer at random points: no partial file is ever visible at a target path."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sparkguard.spark_lib import filemanager
from tests.support import atomic_child

CHILD = Path(atomic_child.__file__)


def _kill_at_random(
    url: str, options: dict[str, Any], *, mode: str, seed: int, extra: list[str], max_size: int
) -> int:
    rng = random.Random(seed)
    env = {
        **os.environ,
        # Never put the repo root on PYTHONPATH: its operator/ folder would shadow the stdlib.
        "PYTHONSAFEPATH": "1",
        "SPARKGUARD_TEST_STORAGE_OPTIONS": json.dumps(options),
        "SPARKGUARD_TEST_MAX_SIZE": str(max_size),
    }
    child = subprocess.Popen(
        [sys.executable, str(CHILD), url, mode, *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout is not None
    first = child.stdout.readline()  # started writing for real before the kill window opens
    assert first, child.stderr.read().decode() if child.stderr else "no output"
    time.sleep(rng.uniform(0.0, 0.6))
    child.send_signal(signal.SIGKILL)
    child.wait()
    return 1


def _assert_only_whole_files(manager: filemanager.FileManager, base: str) -> tuple[int, int]:
    whole = temps = 0
    for info in manager.list(base):
        if filemanager.is_temp_name(info.name):
            temps += 1
            continue
        data = manager.read_bytes(info.path)
        assert atomic_child.is_whole(data), f"partial file visible: {info.path} ({len(data)} B)"
        whole += 1
    return whole, temps


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["overwrite", "create"])
def test_sigkill_never_exposes_partial_local_file(tmp_path: Path, mode: str) -> None:
    url = str(tmp_path / "t")
    manager, base = filemanager.resolve(url)
    manager.mkdirs(base)
    for seed in range(12):
        _kill_at_random(url, {}, mode=mode, seed=seed, extra=[], max_size=4 * 1024 * 1024)
        whole, _ = _assert_only_whole_files(manager, base)
        assert whole > 0
    # Leftover temp files are recognisable, so a cleanup can remove exactly them.
    for temp in manager.find_temp_files(base):
        manager.delete(temp)
    assert manager.find_temp_files(base) == []


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["overwrite", "create"])
def test_sigkill_never_exposes_partial_s3_object(
    s3_bucket: str, s3_options: dict[str, Any], mode: str
) -> None:
    url = f"{s3_bucket}/t"
    manager, base = filemanager.resolve(url, storage_options=s3_options)
    assert isinstance(manager, filemanager.DirectPutFileManager)
    for seed in range(6):
        # 5 MiB parts and files up to 11 MiB: kills land inside multipart uploads too.
        _kill_at_random(
            url,
            s3_options,
            mode=mode,
            seed=seed,
            extra=[str(5 * 1024 * 1024)],
            max_size=11 * 1024 * 1024,
        )
        whole, temps = _assert_only_whole_files(manager, base)
        assert whole > 0
        assert temps == 0  # object stores never show temp objects
    # A killed multipart writer leaves an invisible pending upload; the cleanup aborts it.
    manager.abort_pending_uploads(base)
    assert manager.list_pending_uploads(base) == []
