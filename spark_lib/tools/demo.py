"""A failing Spark job, recovered exactly once, on your machine.

By default the job is an **unchanged** PySpark job (``demo_plain_job.py``: a plain
``df.write.mode("append").parquet(table)``, no sparkguard import) launched by ``spark-submit``
with the conf ``sparkguard spark-conf`` prints, so its write goes through sparkguard's JVM commit
protocol with its markers batched by the marker sidecar: the zero-code path. Its first attempt
is killed (SIGKILL of the driver's process group: the Python driver and its Spark JVM) once half
of its data files are on storage. The demo shows what it left behind, rolls it back with
``sparkguard rollback``, reruns the job with the same job id, and checks that every row is in
the table exactly once and no uncommitted file and no temp file (``.<name>.sg-tmp-<hex>``, a
Hadoop checksum of a file that is gone, or an unfinished upload on an object store) remains.
Exits non-zero if any check fails. Needs Java 17 for Spark; takes about a minute on 2 cores.

``--writer fsspec`` runs sparkguard's Python writer instead (``demo_job.py``:
``df.write.format("sparkguard")`` after ``writer.register``); the demo picks it by itself, with
the reason printed, where the JVM path cannot write: a ``--storage`` URL that the Hadoop inside
PySpark has no FileSystem for (``s3://``, ``gs://``, ...) or a package without the JVM layer's jar.
Its first attempt pauses in a task through the writer's test-only fault hook and is then killed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import enum
import json
import os
import secrets
import shlex
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
from typing import Any, Final

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors, paths
from sparkguard.spark_lib.spark import faults, sparkconf
from sparkguard.spark_lib.storage import reader, rollback, timeline
from sparkguard.spark_lib.tools import commands

JOB_ID = "demo-orders"
#: the fsspec writer's first attempt pauses here (partition 5, after its file) and is killed
KILL_PARTITION = 5
#: the unchanged job of the JVM path (run by file name: it is not imported here)
PLAIN_JOB: Final = Path(__file__).resolve().with_name("demo_plain_job.py")
#: the Spark master of the demo's jobs: two task slots, like the 2-core machine it targets
MASTER: Final = "local[2]"
#: the line the plain job ends with (``demo_plain_job.py``)
PLAIN_JOB_DONE: Final = "demo job: written; sparkguard Python modules loaded: "
#: the URL schemes the Hadoop inside PySpark writes with no extra jar (a plain path is ``file``)
HADOOP_SCHEMES: Final = frozenset({"file"})
#: how often the demo looks at storage while a job runs (seconds): local disk, anything else
POLL_LOCAL_S: Final = 0.05
POLL_REMOTE_S: Final = 0.25


class Writer(enum.StrEnum):
    """Which sparkguard path writes the demo's table."""

    JVM = "jvm"  # an unchanged df.write.parquet under `sparkguard spark-conf`: zero code
    FSSPEC = "fsspec"  # sparkguard's Python writer: df.write.format("sparkguard")


@dataclasses.dataclass(frozen=True)
class Size:
    """How much the job writes: enough for a write that lasts seconds on its path."""

    rows: int
    partitions: int


#: Default sizes. The JVM path writes about a million rows a second per task slot once warm
#: (its first wave of tasks is slower: cold JIT), so it gets 4M rows in 16 tasks of 250k rows:
#: when half of the files are on storage, four waves of two tasks are still to run (0.2-0.5 s
#: each on a 2-core machine, longer under load; the demo looks every 50 ms). The Python writer
#: is slower per row and is stopped by its fault hook, not by timing.
DEFAULT_SIZES: Final[Mapping[Writer, Size]] = {
    Writer.JVM: Size(rows=4_000_000, partitions=16),
    Writer.FSSPEC: Size(rows=400_000, partitions=8),
}
#: fewest tasks per path: the JVM path kills at half the files, which must leave a wave of
#: ``local[2]``'s tasks to run; the fsspec path pauses one partition
MIN_PARTITIONS: Final[Mapping[Writer, int]] = {Writer.JVM: 4, Writer.FSSPEC: 2}


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
    parser.add_argument(
        "--writer",
        choices=[w.value for w in Writer],
        default=None,
        help="jvm: an unchanged df.write.parquet under the conf of 'sparkguard spark-conf' "
        "(sparkguard's JVM commit protocol; the default where it can write: a local table); "
        "fsspec: sparkguard's Python writer, df.write.format('sparkguard') (the default for "
        "--storage URLs the JVM path cannot open here, e.g. s3://)",
    )
    parser.add_argument(
        "--rows",
        type=int,
        default=None,
        help=f"rows to write (default {DEFAULT_SIZES[Writer.JVM].rows} with the jvm writer, "
        f"{DEFAULT_SIZES[Writer.FSSPEC].rows} with fsspec)",
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=None,
        help=f"Spark partitions (default {DEFAULT_SIZES[Writer.JVM].partitions} with the jvm "
        f"writer, {DEFAULT_SIZES[Writer.FSSPEC].partitions} with fsspec)",
    )
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


def jvm_unavailable(table_url: str) -> str | None:
    """Why the JVM path cannot write ``table_url`` here (``None``: it can).

    A purely computational function besides looking for the packaged jar: the JVM path needs
    sparkguard's jar and a location the Hadoop inside PySpark has a FileSystem for without
    extra jars (a local path or ``file://``).
    """
    protocol = filemanager.protocol_of(table_url)
    if protocol == "s3a":
        return (
            "the Hadoop inside PySpark has no FileSystem for s3a:// without the hadoop-aws "
            "jars, and the demo adds none to its job"
        )
    if protocol not in HADOOP_SCHEMES:
        return (
            f"the Hadoop inside PySpark has no FileSystem for {protocol}:// here (Spark writes "
            "S3 through s3a:// with the hadoop-aws jars)"
        )
    try:
        sparkconf.jar_path()
    except sparkconf.JarNotBuiltError:
        return (
            "this installation has no JVM layer jar (scripts/build-jvm.sh builds it; "
            "scripts/demo.sh runs it)"
        )
    return None


def choose_writer(asked: str | None, table_url: str) -> tuple[Writer, str | None]:
    """The writer for the demo and, when the demo chose fsspec by itself, why.

    A purely computational function besides looking for the packaged jar. Raises
    :class:`~sparkguard.spark_lib.base.errors.ConfigError` for ``--writer jvm`` where the JVM path
    cannot write.
    """
    if asked == Writer.FSSPEC:
        return Writer.FSSPEC, None
    reason = jvm_unavailable(table_url)
    if reason is None:
        return Writer.JVM, None
    if asked == Writer.JVM:
        raise errors.ConfigError(
            f"--writer jvm cannot write {table_url!r}: {reason}; drop --writer (the demo then "
            "uses sparkguard's Python writer) or give a local --storage path"
        )
    return Writer.FSSPEC, reason


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _child_env(*, fault_hook: bool = False) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONSAFEPATH"] = "1"  # a cwd holding an operator/ folder must not shadow the stdlib
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if fault_hook:
        # The fsspec path crashes its job through the test-only fault hook, which needs this.
        env[faults.ENV_VAR] = "1"
    else:
        env.pop(faults.ENV_VAR, None)
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


def _spark_submit() -> str:
    """The ``spark-submit`` of the PySpark this Python runs."""
    import pyspark

    return str(Path(pyspark.__file__).resolve().parent / "bin" / "spark-submit")


def _is_hidden(name: str) -> bool:
    # Spark's file listing skips these (temp files, Hadoop checksums, _SUCCESS, _sparkguard).
    return name.startswith((".", "_"))


def _data_files(manager: filemanager.FileManager, table: str) -> list[str]:
    """Data files under the table (relative paths), as Spark lists them: no hidden name."""
    found = []
    pending = [table]
    while pending:
        current = pending.pop()
        if not manager.exists(current):
            continue
        for info in manager.list(current):
            if _is_hidden(info.name):
                continue
            if info.is_dir:
                pending.append(info.path)
            else:
                found.append(info.path[len(table.rstrip("/")) + 1 :])
    return sorted(found)


def _written_files(manager: filemanager.FileManager, table: str) -> int:
    """Data files a write has put on storage, published or not: those a directory reader lists,
    and the temp files of data names (the JVM protocol on a rename store publishes those only
    after its outcome)."""
    temps = [
        relative
        for relative in _temp_files(manager, table)
        if (filemanager.temp_target(relative) or "").startswith("part-")
    ]
    return len(_data_files(manager, table)) + len(temps)


def _temp_files(manager: filemanager.FileManager, table: str) -> list[str]:
    """What a killed writer may leave that no reader sees (relative paths or keys): temp files
    (``.<name>.sg-tmp-<hex>``), Hadoop checksums (``.<name>.crc``) of files that are gone, and
    unfinished multipart uploads on an object store."""
    root = table.rstrip("/")
    if not manager.exists(root):
        return []
    files = [info.path[len(root) + 1 :] for info in manager.list_files(root)]
    present = set(files)
    found = []
    for relative in files:
        name = paths.basename(relative)
        owner = filemanager.checksum_owner(name)
        if filemanager.is_temp_name(name):
            found.append(relative)
        elif owner and not relative.startswith(timeline.SPARKGUARD_DIR):
            target = relative[: -len(name)] + owner
            if target not in present:
                found.append(relative)
    if isinstance(manager, filemanager.DirectPutFileManager):
        found += [f"{u['Key']} (unfinished upload)" for u in manager.list_pending_uploads(root)]
    return sorted(found)


def _progress(done: int, total: int) -> str:
    width = 30
    filled = min(width, width * done // max(total, 1))
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} data files"


def _id_stats(url: str, options: Mapping[str, Any], rows: int) -> tuple[int, int, int]:
    """Rows read from the committed files, duplicated ids, missing ids of ``0..rows-1``."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    manager, _ = filemanager.resolve(url, storage_options=options)
    chunks = []
    for path in reader.committed_paths(url, storage_options=options):
        with manager.fs.open(manager.fs._strip_protocol(path), "rb") as handle:
            chunks.extend(pq.read_table(handle, columns=["id"]).column("id").chunks)
    ids = pa.chunked_array(chunks, type=pa.int64())
    distinct = pc.unique(ids)
    expected = pc.and_(pc.greater_equal(distinct, 0), pc.less(distinct, rows))
    found = pc.sum(pc.cast(expected, pa.int64())).as_py() or 0
    return len(ids), len(ids) - len(distinct), rows - found


@dataclasses.dataclass(frozen=True)
class _Setup:
    """Where the demo writes, how it reaches storage, and which writer writes."""

    work: Path
    table_url: str
    journal_url: str
    options: Mapping[str, Any]
    manager: filemanager.FileManager
    table: str
    token_file: Path
    log: Path
    writer: Writer
    size: Size

    @property
    def poll_s(self) -> float:
        """How often to look at the table while a job runs."""
        local = isinstance(self.manager, filemanager.RenameFileManager)
        return POLL_LOCAL_S if local else POLL_REMOTE_S

    def attempt_log(self, attempt: int) -> Path:
        """The output of one attempt of the job."""
        return self.work / f"attempt-{attempt}.log"


def _prepare(args: argparse.Namespace) -> tuple[_Setup, str | None]:
    """Check the flags (ConfigError: bad input), then create the working directory; returns the
    setup and why the demo chose the fsspec writer by itself (``None``: it did not)."""
    options = commands.storage_options_from_env(os.environ)
    if args.storage:  # the checks every command makes (memory:// is refused: one process)
        commands.open_location(args.storage, what="--storage", options=options)
    writer, reason = choose_writer(args.writer, args.storage or "table")
    default = DEFAULT_SIZES[writer]
    size = Size(
        rows=default.rows if args.rows is None else args.rows,
        partitions=default.partitions if args.partitions is None else args.partitions,
    )
    if size.rows < 1:
        raise errors.ConfigError(f"--rows must be >= 1, got {size.rows}")
    least = MIN_PARTITIONS[writer]
    if size.partitions < least:
        why = (
            "half the files are written when it is killed"
            if writer is Writer.JVM
            else "one is killed"
        )
        raise errors.ConfigError(
            f"--partitions must be >= {least} with the {writer} writer ({why}), got "
            f"{size.partitions}"
        )
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="sparkguard-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    storage = args.storage
    if storage and "://" not in storage:
        # The job, the sidecar and the rollback each open it: one absolute path for all.
        storage = str(Path(storage).resolve())
    table_url = storage or str(work.resolve() / "table")
    journal_url = (storage.rstrip("/") + "-journal") if storage else str(work.resolve() / "journal")
    manager, table = filemanager.resolve(table_url, storage_options=options)
    token_file = work / "marker-token"
    token_file.write_text(secrets.token_hex(16))
    token_file.chmod(0o600)
    setup = _Setup(work=work, table_url=table_url, journal_url=journal_url, options=options,
                   manager=manager, table=table, token_file=token_file.resolve(),
                   log=work / "demo.log", writer=writer, size=size)  # fmt: skip
    return setup, reason


class _Job:
    """How one writer's job is launched and killed mid-write."""

    def __init__(self, setup: _Setup, endpoint: str, report: _Report) -> None:
        self.setup = setup
        self.endpoint = endpoint
        self.report = report

    def argv(self, attempt: int, *, kill: bool) -> list[str]:
        """The command line of one attempt."""
        raise NotImplementedError

    def env(self, *, kill: bool) -> dict[str, str]:
        """The environment of one attempt."""
        return _child_env()

    def due(self, done: int) -> bool:
        """Whether the attempt to kill has reached the middle of its write (``done``: its data
        files on storage)."""
        raise NotImplementedError

    def run(self, attempt: int, *, kill: bool) -> int:
        """Run one attempt as its own session; with ``kill``, SIGKILL its process group once
        :meth:`due`. Returns its exit code (``-SIGKILL`` when killed)."""
        setup = self.setup
        log = setup.attempt_log(attempt)
        with log.open("ab") as out:
            process = subprocess.Popen(
                self.argv(attempt, kill=kill), stdout=out, stderr=out, env=self.env(kill=kill),
                start_new_session=True,
            )  # fmt: skip
        last = ""
        deadline = time.monotonic() + 600
        while process.poll() is None:
            done = _written_files(setup.manager, setup.table)
            line = _progress(done, setup.size.partitions)
            if line != last:
                print(f"    {line}", flush=True)
                last = line
            if kill and self.due(done):
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                self.report.say(
                    f"driver pid {process.pid} and its Spark JVM (its process group) killed "
                    "with SIGKILL"
                )
                return -signal.SIGKILL
            if time.monotonic() > deadline:
                os.killpg(process.pid, signal.SIGKILL)
                raise SystemExit(f"demo: the Spark job did not finish in 10 minutes; see {log}")
            time.sleep(setup.poll_s)
        final = _progress(_written_files(setup.manager, setup.table), setup.size.partitions)
        if final != last:
            print(f"    {final}", flush=True)
        if process.returncode != 0:
            self.report.say(f"the job exited {process.returncode}; its output: {log}")
        return process.returncode


class _PlainJob(_Job):
    """The zero-code path: ``spark-submit <the conf of sparkguard spark-conf> demo_plain_job.py``,
    killed once half of its data files are on storage."""

    def __init__(self, setup: _Setup, endpoint: str, report: _Report) -> None:
        super().__init__(setup, endpoint, report)
        self.conf_command = [
            "sparkguard", "spark-conf", "--job-id", JOB_ID, "--markers", "sidecar",
            "--endpoint", endpoint, "--token-file", str(setup.token_file),
            "--journal", setup.journal_url,
        ]  # fmt: skip
        self.conf_args: list[str] = []

    def make_conf(self) -> None:
        """Run ``sparkguard spark-conf`` as a user would and keep its ``--conf`` arguments."""
        self.report.step("The Spark conf that routes an unchanged job through sparkguard")
        self.report.say(f"$ {shlex.join(self.conf_command)}")
        result = subprocess.run(
            [sys.executable, "-m", "sparkguard", *self.conf_command[1:]],
            capture_output=True, text=True, env=_child_env(), check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise SystemExit(f"demo: sparkguard spark-conf failed: {result.stderr.strip()}")
        lines = result.stdout.strip().splitlines()
        for line in lines:
            self.report.say(f"  {line}")
        self.conf_args = [word for line in lines for word in shlex.split(line)]
        self.report.say(
            "plus spark.sparkguard.attempt=<n> (the operator bumps it on each resubmission)"
        )
        self.report.say(
            f"the job ({PLAIN_JOB.name}) imports no sparkguard; its write is Spark's own:"
        )
        self.report.say('  df.write.mode("append").parquet(table)')
        self.report.say(
            f"$ spark-submit --master {MASTER} <the conf above> --conf "
            f"spark.sparkguard.attempt=<n> {PLAIN_JOB.name} <table> {self.setup.size.rows} "
            f"{self.setup.size.partitions}"
        )

    def argv(self, attempt: int, *, kill: bool) -> list[str]:
        setup = self.setup
        return [
            # on the demo's own machine; in a cluster the driver's address is the pod's
            _spark_submit(), "--master", MASTER, "--conf", "spark.driver.host=127.0.0.1",
            *self.conf_args,
            "--conf", f"spark.sparkguard.attempt={attempt}",
            str(PLAIN_JOB), setup.table_url, str(setup.size.rows), str(setup.size.partitions),
        ]  # fmt: skip

    def due(self, done: int) -> bool:
        return done >= self.setup.size.partitions // 2

    def modules_loaded(self, attempt: int) -> str | None:
        """What the job's last line says of sparkguard's Python modules (None: no such line)."""
        for line in reversed(
            self.setup.attempt_log(attempt).read_text(errors="replace").splitlines()
        ):
            if line.startswith(PLAIN_JOB_DONE):
                return line[len(PLAIN_JOB_DONE) :]
        return None


class _FsspecJob(_Job):
    """sparkguard's Python writer (``demo_job.py``), paused in a task by the writer's test-only
    fault hook, then killed."""

    def __init__(self, setup: _Setup, endpoint: str, report: _Report) -> None:
        super().__init__(setup, endpoint, report)
        self.signal_file = setup.work / "paused"

    def argv(self, attempt: int, *, kill: bool) -> list[str]:
        setup = self.setup
        hook = json.dumps([{
            "point": "task:after-file", "action": "pause", "partition": KILL_PARTITION,
            "signal": str(self.signal_file),
        }]) if kill else ""  # fmt: skip
        return [
            sys.executable, "-m", "sparkguard.spark_lib.tools.demo_job",
            "--table", setup.table_url, "--job-id", JOB_ID, "--attempt", str(attempt),
            "--journal", setup.journal_url, "--rows", str(setup.size.rows),
            "--partitions", str(setup.size.partitions), "--endpoint", self.endpoint,
            "--token-file", str(setup.token_file), "--faults", hook,
        ]  # fmt: skip

    def env(self, *, kill: bool) -> dict[str, str]:
        return _child_env(fault_hook=kill)

    def due(self, done: int) -> bool:
        return self.signal_file.exists()


def _kill_first_attempt(setup: _Setup, job: _Job, report: _Report) -> None:
    size = setup.size
    when = (
        f"killed once {size.partitions // 2} of its data files are written"
        if setup.writer is Writer.JVM
        else f"killed while partition {KILL_PARTITION} is paused by the writer's fault hook"
    )
    report.step(f"Attempt 0 writes {size.rows} rows in {size.partitions} partitions; {when}")
    code = job.run(0, kill=True)
    report.check(code == -signal.SIGKILL, "attempt 0 died in the middle of its write")
    if code == 0:
        report.say(
            "the write finished before the demo could kill it: give more --rows (a write "
            "that takes seconds)"
        )


def _show_leftovers(setup: _Setup, report: _Report) -> None:
    report.step("What the dead attempt left behind")
    tl = timeline.Timeline(setup.manager, setup.table)
    leftovers = _data_files(setup.manager, setup.table)
    statuses = tl.statuses(job_id=JOB_ID)
    inflight = [s.instant for s in statuses if s.state is timeline.State.INFLIGHT]
    report.say(f"instant(s) still inflight: {', '.join(inflight) or 'none'}")
    # What spark.read.parquet(dir), Hive or Trino list now, before any rollback.
    report.say(f"data files a plain directory reader lists, none committed: {len(leftovers)}")
    for name in leftovers[:4]:
        report.say(f"  {name}")
    if len(leftovers) > 4:
        report.say(f"  ... and {len(leftovers) - 4} more")
    temps = _temp_files(setup.manager, setup.table)
    report.say(f"temp files of writes cut short (hidden from every reader): {len(temps)}")
    plan = rollback.rollback_job(
        JOB_ID, setup.journal_url, storage_options=setup.options, dry_run=True
    )
    report.say(
        f"marked for rollback: {plan.files_deleted} file(s) in "
        f"{len(plan.instants_rolled_back)} instant(s) (dry run; a marker is made before "
        "its file, so a file whose write never started is marked too)"
    )
    report.check(len(inflight) == 1, "one undecided instant")
    report.check(bool(leftovers or temps), "partial output is on storage")
    committed = reader.committed_paths(setup.table_url, storage_options=setup.options)
    report.check(committed == [], "readers of committed data see nothing of it")
    # Both writers publish only after the outcome, on every store of the demo (docs/
    # storage-contract.md, "Publication after the outcome"): the dead write's files are all
    # hidden temp files or unfinished uploads.
    report.check(
        leftovers == [],
        "a plain spark.read.parquet of the directory sees the committed rows only (none), "
        "before any rollback",
    )


def _roll_back(setup: _Setup, report: _Report) -> None:
    command = ["sparkguard", "rollback", "--job-id", JOB_ID, "--journal", setup.journal_url]
    report.step(f"Rollback of job {JOB_ID} (what the operator and initContainer run)")
    report.say(f"$ {shlex.join(command)}")
    result = subprocess.run(
        [sys.executable, "-m", "sparkguard", *command[1:], "--quiet"],
        capture_output=True, text=True, env=_child_env(), check=False,
    )  # fmt: skip
    for line in result.stdout.strip().splitlines():
        report.say(f"  {line}")
    report.check(result.returncode == 0, f"sparkguard rollback exited {result.returncode}")
    if result.returncode != 0:
        report.say(result.stderr.strip())
    if not setup.manager.exists(setup.table):
        # The killed write created the table: the rollback returns it to not existing
        # (docs/storage-contract.md, "The life of a table"); the journal keeps the record.
        report.say(
            "the dead attempt had created the table: its location was removed, as before "
            "the write; the journal keeps the record"
        )
    report.check(_data_files(setup.manager, setup.table) == [], "no data file left behind")
    report.check(_temp_files(setup.manager, setup.table) == [], "no temp file left behind")


def _rerun(setup: _Setup, job: _Job, report: _Report) -> None:
    report.step("Attempt 1: the same job id, no fault")
    code = job.run(1, kill=False)
    report.check(code == 0, f"attempt 1 committed (exit code {code})")
    if isinstance(job, _PlainJob):
        loaded = job.modules_loaded(1)
        report.check(
            loaded == "none",
            f"the job loaded no sparkguard Python module (it said: {loaded or 'nothing'})",
        )


def _verify(setup: _Setup, report: _Report) -> tuple[int, int, int, int, int]:
    """Rows read, duplicates, missing rows, uncommitted files, temp files."""
    report.step("Verify the table")
    committed_paths = reader.committed_paths(setup.table_url, storage_options=setup.options)
    committed = {paths.basename(p) for p in committed_paths}
    on_storage = {paths.basename(p) for p in _data_files(setup.manager, setup.table)}
    uncommitted = len(on_storage - committed)
    rows, duplicates, missing = _id_stats(setup.table_url, setup.options, setup.size.rows)
    report.check(duplicates == 0, f"{duplicates} duplicated row(s)")
    report.check(missing == 0, f"{missing} missing row(s)")
    report.check(uncommitted == 0, f"{uncommitted} uncommitted file(s) on storage")
    temps = len(_temp_files(setup.manager, setup.table))
    report.check(
        temps == 0,
        f"{temps} temp file(s) (.<name>.sg-tmp-<hex>, orphan checksums, unfinished uploads)",
    )
    tl = timeline.Timeline(setup.manager, setup.table)
    commits = [s for s in tl.statuses(job_id=JOB_ID) if s.state is timeline.State.COMMITTED]
    protocol = commits[-1].extra.get("protocol") if commits else None
    if setup.writer is Writer.JVM:
        report.check(
            protocol == rollback.JVM_PROTOCOL,
            f"committed by Spark's own writer through {protocol or 'no JVM protocol'}",
        )
    else:
        report.check(bool(commits) and protocol is None, "committed by sparkguard's Python writer")
    print()
    commands.run_inspect(setup.table_url, as_json=False, options=setup.options, out=sys.stdout)
    return rows, duplicates, missing, uncommitted, temps


def run(args: argparse.Namespace) -> int:
    """Run the demo; returns 0 when every check passed."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        print("demo: Spark needs Java 17 on PATH (or JAVA_HOME)", file=sys.stderr)
        return 2
    try:
        setup, reason = _prepare(args)
    except errors.ConfigError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    report = _Report()
    started = time.monotonic()
    print(f"sparkguard demo: table {setup.table_url}, job id {JOB_ID}, logs in {setup.work}")
    if setup.writer is Writer.JVM:
        print(
            "writer: jvm, the zero-code path: an unchanged df.write.parquet, routed through "
            "sparkguard's JVM commit protocol by its Spark conf (--writer fsspec: the Python "
            "writer)"
        )
    else:
        print(
            "writer: fsspec, sparkguard's Python writer (df.write.format('sparkguard'))"
            + (f", because {reason}" if reason else "")
        )
    try:
        root = setup.table_url
        if "://" not in root:
            root = str(Path(root).resolve())
        with _sidecar(root=root, token_file=setup.token_file, log=setup.log) as endpoint:
            report.step(f"Marker sidecar up at {endpoint} (batched markers, bearer token)")
            job: _Job
            if setup.writer is Writer.JVM:
                job = _PlainJob(setup, endpoint, report)
                job.make_conf()
            else:
                job = _FsspecJob(setup, endpoint, report)
            _kill_first_attempt(setup, job, report)
            _show_leftovers(setup, report)
            _roll_back(setup, report)
            _rerun(setup, job, report)
        rows, duplicates, missing, uncommitted, temps = _verify(setup, report)
    finally:
        if report.failed:
            print(f"\ndemo: kept the working directory for a look: {setup.work}")
        elif not args.keep and not args.dir:
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
