"""Watching for the driver's main process, so a regular sidecar container can end with it.

On Kubernetes < 1.29 (or with native sidecars turned off) the marker sidecar is a regular
container of the driver pod: it would keep the pod ``Running`` after the driver ended. With
``spec.driver.shareProcessNamespace: true`` every container of the pod sees the others'
processes in ``/proc``, so the sidecar can tell when the driver is gone: it scans
``/proc/<pid>/cmdline`` for a process matching a pattern (``pgrep -f`` style, a regular
expression searched in the arguments joined by spaces), waits until one has been seen, and
reports once none is left. The caller then drains and exits (see docs/operator.md).

:func:`matching_pids` is a purely computational function over a ``/proc``-like directory;
:func:`wait_for_exit` polls it.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Final

logger = logging.getLogger(__name__)

#: how often ``/proc`` is scanned; a pod has a few dozen processes, a scan costs ~1 ms
POLL_INTERVAL_S: Final = 0.5


class Outcome(enum.StrEnum):
    """Why :func:`wait_for_exit` returned."""

    #: a matching process was seen, and now none is left: the driver ended
    GONE = "gone"
    #: no matching process appeared within the bounded wait
    NEVER_SEEN = "never-seen"


def own_lineage(pid: int, *, proc_root: Path = Path("/proc")) -> frozenset[int]:
    """``pid`` and its ancestors: processes whose arguments may carry the pattern itself."""
    found = {pid}
    current = pid
    while current > 1:
        try:
            stat = (proc_root / str(current) / "stat").read_text()
        except OSError:
            break
        # the command name in parentheses may contain spaces and ')': split after the last one
        fields = stat.rsplit(")", 1)[-1].split()
        parent = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0
        if parent <= 0 or parent in found:
            break
        found.add(parent)
        current = parent
    return frozenset(found)


def matching_pids(
    pattern: re.Pattern[str], *, proc_root: Path = Path("/proc"), exclude: Iterable[int] = ()
) -> list[int]:
    """The pids under ``proc_root`` whose command line matches ``pattern``, except ``exclude``.

    A purely computational function over the directory it reads. Processes that vanish while
    they are read, or whose command line cannot be read, are skipped; a zombie's command line
    is empty, so a driver that has ended but is not reaped yet no longer counts.
    """
    skip = set(exclude)
    found = []
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit() or int(entry) in skip:
            continue
        try:
            raw = (proc_root / entry / "cmdline").read_bytes()
        except OSError:
            continue
        if not raw:
            continue
        command = raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")
        if pattern.search(command):
            found.append(int(entry))
    return sorted(found)


async def wait_for_exit(
    pattern: re.Pattern[str],
    *,
    appear_within_s: float,
    proc_root: Path = Path("/proc"),
    poll_interval_s: float = POLL_INTERVAL_S,
) -> Outcome:
    """Return once a process matching ``pattern`` was seen and none is left.

    Scans start at once, so a short driver is seen too. If no matching process appears within
    ``appear_within_s`` seconds (the driver container never got to start Spark), returns
    :attr:`Outcome.NEVER_SEEN` rather than keeping the pod alive forever. This process and its
    ancestors never count: their arguments may contain the pattern.
    """
    exclude = own_lineage(os.getpid(), proc_root=proc_root)
    started = time.monotonic()
    seen: list[int] = []
    while True:
        pids = await asyncio.to_thread(matching_pids, pattern, proc_root=proc_root, exclude=exclude)
        if pids and not seen:
            logger.info("driver process seen: pid(s) %s match %r", pids, pattern.pattern)
        if pids:
            seen = pids
        elif seen:
            logger.info("driver process gone (last pid(s) %s): stopping the sidecar", seen)
            return Outcome.GONE
        elif time.monotonic() - started > appear_within_s:
            logger.warning(
                "no process matching %r appeared within %g s (SPARKGUARD_SIDECAR_EXIT_WITH_"
                "PROCESS_WAIT_S): stopping the sidecar so the pod can end; if the driver does "
                "run, fix the pattern or enable shareProcessNamespace on the driver",
                pattern.pattern,
                appear_within_s,
            )
            return Outcome.NEVER_SEEN
        await asyncio.sleep(poll_interval_s)
