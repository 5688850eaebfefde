"""One operator replica as its own process, for the HA tests and the operator benchmark.

    python tests/operator/replica.py --kubeconfig K --calls FILE [--gate FILE] [--decisions FILE]

Settings come from ``SPARKGUARD_*`` variables, as for ``sparkguard operator``. The rollback is
a stand-in that appends one JSON line per call to ``--calls`` (job id, owner, replica), takes
``--rollback-seconds``, and, with ``--gate``, does not return before that file exists (a
rollback that is still running when the test kills this process); with ``--fail-jobs REGEX``
it raises for the job ids that match (storage unreachable); with ``--real-rollback``, after
recording the call (and waiting as above) it runs the product's rollback on the real storage
and returns its summary. Everything else is the product: kopf, leader election, claims,
patches, Events. SIGTERM stops it like a pod
termination; SIGKILL is a crash.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import re
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparkguard.operator import rollbacks

sys.path.append(str(Path(__file__).resolve().parents[2]))  # after the stdlib: no shadowing


@dataclasses.dataclass
class Summary:
    instants_rolled_back: tuple[str, ...] = ("20261122100000000-job",)
    instants_committed: tuple[str, ...] = ()
    files_deleted: int = 1
    files_kept: int = 0
    #: per instant, as the library's summary has them: the instant rolled back, a late file
    #: of an earlier rolled-back instant removed, a committed instant's markers cleaned
    details: tuple[dict[str, Any], ...] = (
        {"action": "rolled_back", "filesDeleted": 1, "markersDeleted": 1},
        {"action": "nothing", "filesDeleted": 1, "markersDeleted": 0},
        {"action": "committed", "filesDeleted": 0, "markersDeleted": 1},
    )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class FileRollback:
    calls: Path
    replica: str
    gate: Path | None
    seconds: float
    fail: re.Pattern[str] | None = None
    #: the product's rollback, run after the record and the wait (``--real-rollback``)
    real: rollbacks.RollbackFn | None = None

    def __call__(
        self,
        job_id: str,
        journal: str,
        *,
        owner: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        dry_run: bool = False,
    ) -> Summary | rollbacks.RollbackSummary:
        line = json.dumps(
            {"job": job_id, "owner": owner, "replica": self.replica, "at": time.time()}
        )
        with self.calls.open("a") as out:
            out.write(line + "\n")
            out.flush()
            os.fsync(out.fileno())
        deadline = time.monotonic() + self.seconds
        while time.monotonic() < deadline or (self.gate is not None and not self.gate.exists()):
            time.sleep(0.02)
        if self.fail is not None and self.fail.search(job_id):
            raise OSError(f"storage unreachable (the stand-in fails job {job_id})")
        if self.real is not None:
            return self.real(
                job_id, journal, owner=owner, storage_options=storage_options, dry_run=dry_run
            )
        return Summary()


def main() -> int:
    from sparkguard.operator import config, kube
    from sparkguard.operator import main as operator_main
    from sparkguard.operator import runtime as runtime_

    parser = argparse.ArgumentParser()
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--calls", required=True, type=Path)
    parser.add_argument("--gate", type=Path)
    parser.add_argument("--rollback-seconds", type=float, default=0.0)
    parser.add_argument("--decisions", type=Path, help="append every decision here (JSONL)")
    parser.add_argument("--fail-jobs", type=re.compile, help="rollbacks of these job ids fail")
    parser.add_argument("--real-rollback", action="store_true", help="then the product's rollback")
    args = parser.parse_args()
    # Warnings and the leadership's changes, with the time: the tests read when it led.
    logging.basicConfig(format="[%(asctime)s] %(name)s %(levelname)s %(message)s")
    logging.getLogger("sparkguard.operator.leadership").setLevel(logging.INFO)
    settings = config.load_config(os.environ)
    api = kube.load_api_client(kubeconfig=args.kubeconfig)
    runtime = runtime_.Runtime(config=settings, kube=kube.KubeClient(api))
    real = runtime.rollback if args.real_rollback else None
    runtime.rollback = FileRollback(
        args.calls, runtime.identity, args.gate, args.rollback_seconds, args.fail_jobs, real
    )
    if args.decisions is not None:
        decisions = args.decisions.open("a", buffering=1)

        def record(key: Any, decision: Any) -> None:
            entry = {"replica": runtime.identity, "app": key.name, "uid": key.uid}
            entry.update(action=str(decision.action), reason=decision.reason)
            decisions.write(json.dumps(entry) + "\n")

        runtime.on_decision = record
    print(f"replica {runtime.identity} starting", flush=True)
    asyncio.run(operator_main.run(runtime))
    return 0


if __name__ == "__main__":
    sys.exit(main())
