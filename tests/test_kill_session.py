"""The tests' driver kill (``tests/support/process.py``) kills what a pod's death kills: also a
child that left the driver's process group, as PySpark's worker daemon does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.process import _session_members, kill_session

# A driver whose child moves to a group of its own (pyspark/daemon.py: os.setpgid(0, 0)) and
# would write a file later: a zombie task if the kill misses it.
DRIVER = """
import os, sys, time
ready, late = sys.argv[1:3]
if os.fork() == 0:
    os.setpgid(0, 0)
    open(ready, "w").close()
    time.sleep(2)
    open(late, "w").close()
    os._exit(0)
time.sleep(60)
"""


def _start(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    ready, late = tmp_path / "ready", tmp_path / "late"
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(ready), str(late)], start_new_session=True
    )
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return proc, late


def test_killpg_alone_misses_a_child_in_its_own_group(tmp_path: Path) -> None:
    proc, _late = _start(tmp_path)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    try:
        assert _session_members(proc.pid) != []  # why kill_session exists
    finally:
        kill_session(proc.pid)


def test_kill_session_leaves_nothing_running_that_could_write_later(tmp_path: Path) -> None:
    proc, late = _start(tmp_path)
    kill_session(proc.pid)
    proc.wait()
    assert _session_members(proc.pid) == []  # nothing left that could write ``late``
    assert not late.exists()
