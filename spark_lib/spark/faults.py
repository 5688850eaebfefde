"""Test-only fault injection: the one registry of the writer's and the sink's fault points.

The write option ``sparkguard.faults`` (a JSON list of :class:`Fault`) makes a write raise,
exit its process (``os._exit(17)``) or pause for an hour at a named point, and creates files at
caller-given paths (``signal``, ``once``). That belongs in tests and the demo only, so the
option is refused unless the environment variable ``SPARKGUARD_ENABLE_FAULTS=1`` is set in
every process that parses or fires it: the process that plans the write (in PySpark, a Python
worker of the driver: it inherits the driver JVM's environment) and the executors' Python
workers (in local mode the same JVM's children; on a cluster, ``spark.executorEnv.*``).

Every point the code fires is a member of :class:`Point`; ``tests/spark_lib/
test_fault_points.py`` fails when a point has no test that fires it.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import Final

from sparkguard.spark_lib.base import errors

logger = logging.getLogger(__name__)

#: the write option that carries the fault list
OPTION: Final = "sparkguard.faults"
#: the environment switch that allows the option (``1``); unset or anything else refuses it
ENV_VAR: Final = "SPARKGUARD_ENABLE_FAULTS"
#: the exit status of the ``exit`` action
EXIT_STATUS: Final = 17


class Point(enum.StrEnum):
    """Every place the writer and the streaming sink can inject a fault, in write order."""

    DRIVER_AFTER_INFLIGHT = "driver:after-inflight"  # inflight + journal written, no task yet
    TASK_BEFORE_MARKER = "task:before-marker"  # a task is about to create a file's marker
    TASK_AFTER_MARKER = "task:after-marker"  # marker created, data file not yet opened
    TASK_MID_FILE = "task:mid-file"  # a batch was added to an open (unpublished) data file
    # a data file was closed: left unpublished for the driver (batch), published (streaming)
    TASK_AFTER_FILE = "task:after-file"
    TASK_END = "task:end"  # every file of the task is closed, no commit message yet
    COMMIT_START = "commit:start"  # the driver's commit began, nothing decided
    COMMIT_BEFORE_OUTCOME = "commit:before-outcome"  # files verified, leftovers deleted
    COMMIT_AFTER_OUTCOME = "commit:after-outcome"  # committed, nothing published yet
    ABORT_START = "abort:start"  # the driver's abort began, nothing rolled back
    STREAM_COMMIT_START = "stream:commit-start"  # a micro-batch's commit began
    STREAM_AFTER_COMMIT = "stream:after-commit"  # batch decided, leftovers not yet cleaned


class Action(enum.StrEnum):
    """What a fault does when it fires."""

    RAISE = "raise"  # raise InjectedFaultError (the task attempt, or the driver step, fails)
    EXIT = "exit"  # os._exit(17): the process dies at once (an executor crash)
    PAUSE = "pause"  # sleep an hour (a test kills the process meanwhile)


class InjectedFaultError(RuntimeError):
    """Raised by a fault whose action is ``raise``. Its message names the point."""


@dataclasses.dataclass(frozen=True)
class Fault:
    """At ``point`` (for a matching partition/attempt), do ``action``."""

    point: Point
    action: Action = Action.RAISE
    partition: int | None = None
    attempt: int | None = None
    signal: str | None = None  # a line "<point> <partition> <attempt> <pid>" is appended on firing
    once: str | None = None  # fire only if this file is absent, creating it


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether fault injection is switched on in this process's environment."""
    return (os.environ if environ is None else environ).get(ENV_VAR) == "1"


def _require_enabled(environ: Mapping[str, str] | None) -> None:
    if not enabled(environ):
        raise errors.ConfigError(
            f"option {OPTION!r} is a test-only fault hook and is disabled in this process; set "
            f"the environment variable {ENV_VAR}=1 for the driver and the executors (tests and "
            "the demo do) or remove the option"
        )


def parse(raw: str | None, *, environ: Mapping[str, str] | None = None) -> tuple[Fault, ...]:
    """Parse the option's JSON fault list; refused unless :data:`ENV_VAR` is ``1``.

    An absent or empty option is no faults (and needs no switch).
    """
    if not raw:
        return ()
    _require_enabled(environ)
    try:
        items = json.loads(raw)
        if not isinstance(items, list):
            raise TypeError("expected a JSON list of objects")
        parsed = []
        for item in items:
            fault = Fault(**item)
            parsed.append(
                dataclasses.replace(fault, point=Point(fault.point), action=Action(fault.action))
            )
        return tuple(parsed)
    except (json.JSONDecodeError, TypeError, ValueError) as exc:
        points = ", ".join(p.value for p in Point)
        raise errors.ConfigError(
            f"option {OPTION!r} is not a fault list: {exc}; each item needs a 'point' (one of "
            f"{points}) and may set 'action' (raise, exit, pause), 'partition', 'attempt', "
            "'signal', 'once'"
        ) from None


def fire(
    faults: Sequence[Fault],
    point: Point,
    *,
    partition: int | None = None,
    attempt: int | None = None,
) -> None:
    """Run the faults registered at ``point`` (a no-op when none are)."""
    for fault in faults:
        if fault.point != point:
            continue
        if fault.partition is not None and fault.partition != partition:
            continue
        if fault.attempt is not None and fault.attempt != attempt:
            continue
        _require_enabled(None)  # an executor without the switch refuses too
        if fault.once is not None:
            try:
                with open(fault.once, "x"):
                    pass
            except FileExistsError:
                continue
        if fault.signal is not None:
            with open(fault.signal, "a") as handle:
                handle.write(f"{point.value} {partition} {attempt} {os.getpid()}\n")
        logger.warning("injected fault %s at %s (partition %s)", fault.action, point, partition)
        if fault.action is Action.EXIT:
            os._exit(EXIT_STATUS)
        if fault.action is Action.PAUSE:
            time.sleep(3600)
        raise InjectedFaultError(
            f"sparkguard injected fault at {point.value} (partition {partition})"
        )
