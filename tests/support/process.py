"""Killing a whole driver at once, as a pod's death does; finding a process by its command line.

A job started with ``start_new_session=True`` leads its own session. ``os.killpg`` on it
is not enough: PySpark's worker daemon moves itself into a process group of its own
(``os.setpgid(0, 0)`` in ``pyspark/daemon.py``), so its Python workers outlive a kill of
the driver's group and go on writing (a zombie task) until they notice the JVM is gone.
When a driver pod dies, every process in it dies; :func:`kill_session` does the same here
by killing every process of the session (the daemon keeps the session id), and returns
only when none is left running.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path


def _session_members(sid: int) -> list[int]:
    """Live (not zombie) processes whose session id is ``sid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited while we looked
            continue
        # pid (comm) state ppid pgrp session ...: comm may hold spaces and parentheses
        fields = stat[stat.rindex(")") + 2 :].split()
        state, session = fields[0], int(fields[3])
        if session == sid and state not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def kill_session(sid: int, *, timeout: float = 30.0) -> None:
    """SIGKILL every process of session ``sid`` (the leader's pid), repeating until none is
    left: a process forked meanwhile is caught by the next round."""
    deadline = time.monotonic() + timeout
    while members := _session_members(sid):
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise AssertionError(f"session {sid} still runs {members} after SIGKILL")
        time.sleep(0.02)


def find_process(matches: Callable[[list[str]], bool]) -> int | None:
    """The PID of a process whose command line (its words) ``matches``, or None: for a test
    that kills or stops one JVM among many (a pod's, a controller's child)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # exited while we looked
            continue
        if matches([w.decode(errors="replace") for w in argv]):
            return int(entry.name)
    return None
