"""What the tests on upstream operators share (no kubelet on their benches): polling, and the
pod statuses a kubelet would write for a driver that runs and then exits."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tests.kubebench.bench import JsonObj

#: when the patched container "ran" (fixed: the operators read only the states)
_STARTED_AT = "2026-01-01T00:00:00Z"
_FINISHED_AT = "2026-01-01T00:00:01Z"


def wait_for(what: str, probe: Callable[[], Any], *, timeout: float = 90.0) -> Any:
    """Poll ``probe`` every 100 ms until it returns something truthy; return it."""
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.1)


def run_then_exit(pod: JsonObj, *, exit_code: int) -> list[JsonObj]:
    """The two statuses a kubelet writes for ``pod`` whose first container runs and is ready
    (phase Running), then exits with ``exit_code`` (phase Failed), each a ``status`` for a
    merge patch of the pod's status subresource. A purely computational function."""
    container = pod["spec"]["containers"][0]
    running = {"running": {"startedAt": _STARTED_AT}}
    ended = {
        "terminated": {
            "exitCode": exit_code,
            "reason": "Error",
            "startedAt": _STARTED_AT,
            "finishedAt": _FINISHED_AT,
        }
    }
    statuses: list[JsonObj] = []
    for phase, state in (("Running", running), ("Failed", ended)):
        ready = phase == "Running"
        statuses.append(
            {
                "phase": phase,
                "conditions": [{"type": "Ready", "status": str(ready)}],
                "containerStatuses": [
                    {
                        "name": container["name"],
                        "image": container["image"],
                        "imageID": "",
                        "ready": ready,
                        "restartCount": 0,
                        "state": state,
                    }
                ],
            }
        )
    return statuses
