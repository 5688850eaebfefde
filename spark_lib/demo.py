"""Show sparkguard's storage guarantees on a local directory, step by step.

A writer killed mid-write leaves no partial file; two writers racing for one checkpoint: exactly
one wins; a metadata log records a batch once; a rollback fences a zombie driver's commit.
Exits non-zero if any check fails.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from sparkguard.spark_lib import errors, filemanager, metadatalog, paths, timeline

_SLOW_WRITER = """
import sys, time
from sparkguard.spark_lib import filemanager
manager, path = filemanager.resolve(sys.argv[1])
with manager.create_atomic(path, overwrite=True) as stream:
    for _ in range(1000):
        stream.write(b"x" * 65536)
        print("wrote", flush=True)
        time.sleep(0.01)
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the demo's flags."""
    parser.add_argument(
        "--dir",
        default=None,
        help="directory for the demo's files (default: a new temp directory, removed after)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the demo directory")


class _Checks:
    def __init__(self) -> None:
        self.failed: list[str] = []

    def step(self, number: int, title: str) -> None:
        print(f"\n[{number}] {title}")

    def check(self, ok: bool, what: str) -> None:
        print(f"    {'ok  ' if ok else 'FAIL'} {what}")
        if not ok:
            self.failed.append(what)


def _killed_writer(checks: _Checks, base: str) -> None:
    checks.step(1, "A writer is killed with SIGKILL in the middle of a checkpoint file")
    target = paths.join(base, "checkpoint", "state-00001.bin")
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    child = subprocess.Popen(
        [sys.executable, "-c", _SLOW_WRITER, target], stdout=subprocess.PIPE, env=env
    )
    assert child.stdout is not None
    for _ in range(5):
        child.stdout.readline()
    child.send_signal(signal.SIGKILL)
    child.wait()
    manager, directory = filemanager.resolve(paths.parent(target))
    print(f"    killed pid {child.pid} after it wrote 320 KiB")
    checks.check(not manager.exists(target), f"no file visible at {target}")
    leftovers = manager.find_temp_files(directory)
    checks.check(len(leftovers) == 1, f"its temp file is recognisable: {leftovers}")
    manager.delete_many(leftovers)
    checks.check(manager.find_temp_files(directory) == [], "cleanup removed exactly the temp file")


def _racing_writers(checks: _Checks, base: str) -> None:
    checks.step(2, "Eight writers race to create the same checkpoint (create-if-absent)")
    manager, directory = filemanager.resolve(paths.join(base, "checkpoint"))
    target = paths.join(directory, "state-00002.bin")
    barrier = threading.Barrier(8)
    winners: list[int] = []

    def write(who: int) -> None:
        stream = manager.create_atomic(target)
        stream.write(f"writer {who}".encode())
        barrier.wait()
        try:
            stream.close()
            winners.append(who)
        except errors.AlreadyExistsError:
            pass

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    checks.check(len(winners) == 1, f"exactly one winner (writer {winners})")
    checks.check(manager.find_temp_files(directory) == [], "the seven losers left no temp file")


def _metadata_log(checks: _Checks, base: str) -> None:
    checks.step(3, "A metadata log records batch 0 once, however often it is retried")
    manager, directory = filemanager.resolve(paths.join(base, "offsets"))
    log = metadatalog.MetadataLog(manager, directory)
    first = log.add(0, {"offset": 100})
    second = log.add(0, {"offset": 999})
    checks.check(first and not second, "first add wins, the retry is refused")
    checks.check(log.get(0) == {"offset": 100}, "the recorded payload is the first one")


def _zombie_driver(checks: _Checks, base: str) -> None:
    checks.step(4, "A rollback decides an instant's fate first; the zombie driver's commit fails")
    tl = timeline.timeline_for(paths.join(base, "table"))
    instant = tl.start("demo-job", attempt=0, marker_type="DIRECT")
    print(f"    driver opened instant {instant}, then stalled")
    checks.check(tl.claim_rollback(instant), "rollback claimed the instant")
    try:
        tl.commit(instant, [])
        refused = False
    except errors.InstantDecidedError as exc:
        refused = True
        print(f"    zombie commit: {exc}")
    checks.check(refused, "the zombie's late commit was refused")
    checks.check(tl.status(instant).state is timeline.State.ROLLING_BACK, "state: rolling back")


def run(args: argparse.Namespace) -> int:
    """Run every step; returns 0 when every check passed."""
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="sparkguard-demo-"))
    base.mkdir(parents=True, exist_ok=True)
    print(f"sparkguard demo in {base}")
    started = time.monotonic()
    checks = _Checks()
    try:
        _killed_writer(checks, str(base))
        _racing_writers(checks, str(base))
        _metadata_log(checks, str(base))
        _zombie_driver(checks, str(base))
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    elapsed = time.monotonic() - started
    if checks.failed:
        print(f"\natomic-storage: FAILED ({len(checks.failed)} checks) in {elapsed:.1f}s")
        return 1
    print(f"\natomic-storage: OK (4 steps, all checks passed in {elapsed:.1f}s)")
    return 0
