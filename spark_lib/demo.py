"""A failing Spark job, recovered exactly once, on your machine.

A PySpark job writes a table through sparkguard with its markers batched by the marker sidecar.
Its first attempt is killed (SIGKILL of the whole driver) in the middle of the write. The demo
shows what it left behind, rolls it back, reruns the job with the same job id, and checks that
every row is in the table exactly once and no uncommitted file and no temp file
(``.<name>.sg-tmp-<hex>``, or an unfinished upload on an object store) remains. Exits non-zero
if any check fails. Needs Java 17 for Spark; takes about a minute on 2 cores.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from sparkguard.spark_lib import (
    commands,
    errors,
    faults,
    filemanager,
    paths,
    reader,
    rollback,
    timeline,
)

JOB_ID = "demo-orders"
#: the first attempt pauses here (partition 5, after its file is written) and is then killed
KILL_PARTITION = 5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the demo's flags."""
    parser.add_argument(
        "--dir",
        default=None,
        help="working directory (default: a new temp directory, removed afterwards)",
    )
    parser.add_argument(
        "--storage",
        default=None,
        help="table location as any fsspec URL, e.g. s3://bucket/demo (credentials from the "
        "AWS_* environment or SPARKGUARD_STORAGE_OPTIONS); default: <dir>/table",
    )
    parser.add_argument("--rows", type=int, default=400_000, help="rows to write (default 400000)")
    parser.add_argument("--partitions", type=int, default=8, help="Spark partitions (default 8)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory")


class _Report:
    """Step headings and checks, printed as they happen."""

    def __init__(self) -> None:
        self.failed: list[str] = []
        self.number = 0

    def step(self, title: str) -> None:
        self.number += 1
        print(f"\n[{self.number}] {title}", flush=True)

    def say(self, text: str) -> None:
        print(f"    {text}", flush=True)

    def check(self, ok: bool, what: str) -> None:
        print(f"    {'ok  ' if ok else 'FAIL'} {what}", flush=True)
        if not ok:
            self.failed.append(what)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONSAFEPATH"] = "1"  # a cwd holding an operator/ folder must not shadow the stdlib
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # The demo crashes its job through the test-only fault hook, which needs this switch.
    env[faults.ENV_VAR] = "1"
    return env


@contextlib.contextmanager
def _sidecar(*, root: str, token_file: Path, log: Path) -> Iterator[str]:
    """Run the marker sidecar as a subprocess; yields its URL."""
    port = _free_port()
    argv = [
        sys.executable,
        "-m",
        "sparkguard.sidecar",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--token-file",
        str(token_file),
        "--allowed-roots",
        root,
    ]
    with log.open("ab") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=out, env=_child_env())
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/readyz", timeout=1) as answer:  # noqa: S310
                    if answer.status == 200:
                        break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"demo: the marker sidecar did not start; see {log}") from None
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()


def _job_argv(
    args: argparse.Namespace,
    *,
    table: str,
    journal: str,
    endpoint: str,
    token_file: Path,
    attempt: int,
    faults: str,
) -> list[str]:
    return [
        sys.executable, "-m", "sparkguard.spark_lib.demo_job",
        "--table", table, "--job-id", JOB_ID, "--attempt", str(attempt),
        "--journal", journal, "--rows", str(args.rows), "--partitions", str(args.partitions),
        "--endpoint", endpoint, "--token-file", str(token_file), "--faults", faults,
    ]  # fmt: skip


def _data_files(manager: filemanager.FileManager, table: str) -> list[str]:
    """Data files under the table (relative paths), skipping sparkguard's own folder."""
    found = []
    pending = [table]
    while pending:
        current = pending.pop()
        for info in manager.list(current):
            relative = info.path[len(table.rstrip("/")) + 1 :]
            if relative.startswith(timeline.SPARKGUARD_DIR):
                continue
            if info.is_dir:
                pending.append(info.path)
            elif not filemanager.is_temp_name(info.name):
                found.append(relative)
    return sorted(found)


def _temp_files(manager: filemanager.FileManager, table: str) -> list[str]:
    """Temp files a killed writer left anywhere under the table (``.<name>.sg-tmp-<hex>``),
    and unfinished multipart uploads on an object store (relative paths or keys)."""
    root = table.rstrip("/")
    found = [
        info.path[len(root) + 1 :]
        for info in manager.list_files(root)
        if filemanager.is_temp_name(info.name)
    ]
    if isinstance(manager, filemanager.DirectPutFileManager):
        found += [f"{u['Key']} (unfinished upload)" for u in manager.list_pending_uploads(root)]
    return sorted(found)


def _progress(manager: filemanager.FileManager, table: str, total: int) -> str:
    done = len(_data_files(manager, table))
    width = 30
    filled = min(width, width * done // max(total, 1))
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} data files"


def _run_job(
    argv: list[str], *, log: Path, manager: filemanager.FileManager, table: str, total: int,
    kill_when: Path | None, report: _Report,
) -> int:  # fmt: skip
    """Run the driver; with ``kill_when``, SIGKILL its process group once that file appears."""
    with log.open("ab") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=out, env=_child_env(), start_new_session=True
        )
    last = ""
    deadline = time.monotonic() + 600
    while process.poll() is None:
        line = _progress(manager, table, total)
        if line != last:
            print(f"    {line}", flush=True)
            last = line
        if kill_when is not None and kill_when.exists():
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            report.say(f"driver pid {process.pid} and its Spark workers killed with SIGKILL")
            return -signal.SIGKILL
        if time.monotonic() > deadline:
            os.killpg(process.pid, signal.SIGKILL)
            raise SystemExit(f"demo: the Spark job did not finish in 10 minutes; see {log}")
        time.sleep(0.25)
    final = _progress(manager, table, total)
    if final != last:
        print(f"    {final}", flush=True)
    return process.returncode


def _read_ids(url: str, options: Mapping[str, Any]) -> list[int]:
    import pyarrow.parquet as pq

    manager, _ = filemanager.resolve(url, storage_options=options)
    ids: list[int] = []
    for path in reader.committed_paths(url, storage_options=options):
        with manager.fs.open(manager.fs._strip_protocol(path), "rb") as handle:
            ids.extend(pq.read_table(handle, columns=["id"]).column("id").to_pylist())
    return ids


@dataclasses.dataclass(frozen=True)
class _Setup:
    """Where the demo writes and how it reaches storage."""

    args: argparse.Namespace
    work: Path
    table_url: str
    journal_url: str
    options: Mapping[str, Any]
    manager: filemanager.FileManager
    table: str
    token_file: Path
    log: Path

    def job(self, *, endpoint: str, attempt: int, faults: str) -> list[str]:
        return _job_argv(self.args, table=self.table_url, journal=self.journal_url,
                         endpoint=endpoint, token_file=self.token_file, attempt=attempt,
                         faults=faults)  # fmt: skip

    def run_job(self, argv: list[str], *, kill_when: Path | None, report: _Report) -> int:
        return _run_job(argv, log=self.log, manager=self.manager, table=self.table,
                        total=self.args.partitions, kill_when=kill_when, report=report)  # fmt: skip


def _prepare(args: argparse.Namespace) -> _Setup:
    """Check the storage flags (ConfigError: bad input), then create the working directory."""
    options = commands.storage_options_from_env(os.environ)
    if args.storage:
        if filemanager.protocol_of(args.storage) == "memory":
            raise errors.ConfigError(
                f"--storage {args.storage!r}: memory:// lives inside one process and the demo's "
                "Spark job runs in others; give a local path or an object store URL"
            )
        commands.open_location(args.storage, what="--storage", options=options)
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="sparkguard-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    table_url = args.storage or str(work / "table")
    journal_url = (args.storage.rstrip("/") + "-journal") if args.storage else str(work / "journal")
    manager, table = filemanager.resolve(table_url, storage_options=options)
    token_file = work / "marker-token"
    token_file.write_text(secrets.token_hex(16))
    token_file.chmod(0o600)
    return _Setup(args=args, work=work, table_url=table_url, journal_url=journal_url,
                  options=options, manager=manager, table=table, token_file=token_file,
                  log=work / "demo.log")  # fmt: skip


def _kill_first_attempt(setup: _Setup, endpoint: str, report: _Report) -> None:
    report.step(f"Attempt 0 writes {setup.args.rows} rows in {setup.args.partitions} partitions")
    signal_file = setup.work / "paused"
    faults = json.dumps([{
        "point": "task:after-file", "action": "pause", "partition": KILL_PARTITION,
        "signal": str(signal_file),
    }])  # fmt: skip
    code = setup.run_job(
        setup.job(endpoint=endpoint, attempt=0, faults=faults),
        kill_when=signal_file,
        report=report,
    )
    report.check(code != 0, "attempt 0 died in the middle of its write")


def _show_leftovers(setup: _Setup, report: _Report) -> None:
    report.step("What the dead attempt left behind")
    tl = timeline.Timeline(setup.manager, setup.table)
    leftovers = _data_files(setup.manager, setup.table)
    statuses = tl.statuses(job_id=JOB_ID)
    inflight = [s.instant for s in statuses if s.state is timeline.State.INFLIGHT]
    report.say(f"instant(s) still inflight: {', '.join(inflight) or 'none'}")
    report.say(f"data files on storage, none committed: {len(leftovers)}")
    for name in leftovers[:4]:
        report.say(f"  {name}")
    if len(leftovers) > 4:
        report.say(f"  ... and {len(leftovers) - 4} more")
    temps = _temp_files(setup.manager, setup.table)
    report.say(f"temp files of writes cut short (never visible): {len(temps)}")
    plan = rollback.rollback_job(
        JOB_ID, setup.journal_url, storage_options=setup.options, dry_run=True
    )
    report.say(
        f"marked for rollback: {plan.files_deleted} file(s) in "
        f"{len(plan.instants_rolled_back)} instant(s) (dry run; a marker is made before "
        "its file, so a file whose write never started is marked too)"
    )
    report.check(len(inflight) == 1, "one undecided instant")
    report.check(bool(leftovers), "partial output is on storage (not yet visible to readers)")
    committed = reader.committed_paths(setup.table_url, storage_options=setup.options)
    report.check(committed == [], "readers of committed data see nothing of it")


def _roll_back(setup: _Setup, report: _Report) -> None:
    report.step(f"Rollback of job {JOB_ID} (what the operator and initContainer run)")
    summary = rollback.rollback_job(JOB_ID, setup.journal_url, storage_options=setup.options)
    report.say(
        f"rolled back {len(summary.instants_rolled_back)} instant(s), deleted "
        f"{summary.files_deleted} file(s), kept {summary.files_kept} committed file(s)"
    )
    if summary.tables_removed:
        # The killed write created the table: the rollback returns it to not existing
        # (docs/storage-contract.md, "The life of a table"); the journal keeps the record.
        report.say(
            f"the dead attempt had created the table: its location was removed "
            f"({len(summary.tables_removed)} table(s)), as before the write; the journal "
            "keeps the record"
        )
    report.check(_data_files(setup.manager, setup.table) == [], "no data file left behind")
    report.check(_temp_files(setup.manager, setup.table) == [], "no temp file left behind")


def _verify(setup: _Setup, report: _Report) -> tuple[int, int, int, int, int]:
    """Rows read, duplicates, missing rows, uncommitted files, temp files."""
    report.step("Verify the table")
    committed_paths = reader.committed_paths(setup.table_url, storage_options=setup.options)
    committed = {paths.basename(p) for p in committed_paths}
    on_storage = {paths.basename(p) for p in _data_files(setup.manager, setup.table)}
    uncommitted = len(on_storage - committed)
    ids = _read_ids(setup.table_url, setup.options)
    counts = collections.Counter(ids)
    duplicates = sum(n - 1 for n in counts.values() if n > 1)
    missing = setup.args.rows - len(set(ids) & set(range(setup.args.rows)))
    report.check(duplicates == 0, f"{duplicates} duplicated row(s)")
    report.check(missing == 0, f"{missing} missing row(s)")
    report.check(uncommitted == 0, f"{uncommitted} uncommitted file(s) on storage")
    temps = len(_temp_files(setup.manager, setup.table))
    report.check(temps == 0, f"{temps} temp file(s) (.<name>.sg-tmp-<hex>, unfinished uploads)")
    print()
    commands.run_inspect(setup.table_url, as_json=False, options=setup.options, out=sys.stdout)
    return len(ids), duplicates, missing, uncommitted, temps


def run(args: argparse.Namespace) -> int:
    """Run the demo; returns 0 when every check passed."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        print("demo: Spark needs Java 17 on PATH (or JAVA_HOME)", file=sys.stderr)
        return 2
    if args.rows < 1:
        print(f"demo: --rows must be >= 1, got {args.rows}", file=sys.stderr)
        return 2
    if args.partitions < 2:
        print(f"demo: --partitions must be >= 2 (one is killed), got {args.partitions}",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        setup = _prepare(args)
    except errors.ConfigError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    report = _Report()
    started = time.monotonic()
    print(f"sparkguard demo: table {setup.table_url}, job id {JOB_ID}, logs in {setup.log}")
    try:
        root = setup.table_url
        if "://" not in root:
            root = str(Path(root).resolve())
        with _sidecar(root=root, token_file=setup.token_file, log=setup.log) as endpoint:
            report.step(f"Marker sidecar up at {endpoint} (batched markers, bearer token)")
            _kill_first_attempt(setup, endpoint, report)
            _show_leftovers(setup, report)
            _roll_back(setup, report)
            report.step("Attempt 1: the same job id, no fault")
            code = setup.run_job(
                setup.job(endpoint=endpoint, attempt=1, faults=""), kill_when=None, report=report
            )
            report.check(code == 0, f"attempt 1 committed (exit code {code})")
        rows, duplicates, missing, uncommitted, temps = _verify(setup, report)
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(setup.work, ignore_errors=True)
    elapsed = time.monotonic() - started
    if report.failed:
        print(f"\nexactly-once: FAILED ({'; '.join(report.failed)}) in {elapsed:.0f}s")
        return 1
    print(f"\nfinished in {elapsed:.0f}s")
    print(
        f"exactly-once: OK ({rows} rows, {duplicates} duplicates, {missing} missing, "
        f"{uncommitted} uncommitted files, {temps} temp files)"
    )
    return 0
