"""The test run's own temporary directory: one per run, removed when the run ends.

A Spark JVM unpacks lz4-java's and snappy-java's native libraries into its temp directory and
makes Spark's ``spark-*`` and ``blockmgr-*`` directories there; all of it is deleted at a clean
exit only, and the tests SIGKILL drivers on purpose. Python's ``tempfile`` users (the shared
driver's logs, moto's, the kube bench, pytest's ``tmp_path``) leave theirs when a run is
interrupted. So every temp directory of a run points into one directory:

* the process that starts the run (pytest's controller, or the only process without xdist)
  makes it under the temp directory it was given and exports its path as :data:`ENV`; xdist
  workers and any pytest a test starts inherit it and join it;
* ``TMPDIR`` (and ``tempfile.tempdir``): Python's ``tempfile``, so pytest's ``tmp_path`` base,
  and every subprocess that inherits the environment (Go's ``os.TempDir`` too);
* ``java.io.tmpdir`` of every test JVM (:func:`java_options`, in ``SPARK_SUBMIT_OPTS`` and the
  HDFS minicluster's command line): Spark's local directories default to it, and so do
  lz4-java's and snappy-java's (``org.xerial.snappy.tempdir``) unpacked libraries;
* its owner removes it when it exits (an exit handler: after failures and Ctrl-C too; not
  after a SIGKILL of pytest itself).

:class:`LitterCheck` then names what still appeared directly in the temp directory during the
run (tests/conftest.py fails the run on it, see its docstring for when it only warns).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import shutil
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path

#: the environment variable that hands the run's directory to xdist workers and subprocesses
ENV = "SPARKGUARD_TEST_TMP"

#: what the tests and the processes they start put into a temp directory, by name prefix
LITTER_PREFIXES = (
    "liblz4-java",  # lz4-java's native library (Spark's shuffle and broadcast codec)
    "snappy-",  # snappy-java's (Parquet's default codec)
    "spark-",  # Spark's scratch, userFiles and SparkFiles directories
    "blockmgr-",  # Spark's block manager (shuffle files)
    "sg-",  # ours: shared driver logs, the HDFS minicluster, the CDS dump
    "moto-",  # the S3 server's log
    "kubebench-",  # the kube bench's etcd and certificates
    "sparkguard-",  # the operator's webhook certificates
    "pytest-of-",  # pytest's tmp_path base
)


@dataclasses.dataclass(frozen=True)
class RunTmp:
    """The run's directory, and whether this process made it (and so removes it)."""

    path: Path
    owned: bool
    #: the temp directory the run was given, where what ignores the run's directory lands
    root: Path


def enter() -> RunTmp:
    """Join the run's directory (:data:`ENV`), or make it when this process starts the run;
    point ``TMPDIR`` and ``tempfile`` at it."""
    joined = os.environ.get(ENV)
    if joined and Path(joined).is_dir():
        run = RunTmp(path=Path(joined), owned=False, root=Path(joined).parent)
    else:
        root = Path(tempfile.gettempdir())
        made = Path(tempfile.mkdtemp(prefix="sg-test-run-", dir=root))
        run = RunTmp(path=made, owned=True, root=root)
        os.environ[ENV] = str(run.path)
        # At the interpreter's exit: after pytest is done and after the exit handlers
        # registered since (the shared driver's, the kube bench's), which stop what writes here
        atexit.register(remove, run)
    os.environ["TMPDIR"] = str(run.path)
    tempfile.tempdir = str(run.path)
    return run


def java_options(path: Path) -> str:
    """The JVM options that put a JVM's temp files under ``path``."""
    return f"-Djava.io.tmpdir={path}"


def remove(run: RunTmp) -> None:
    """Remove the run's directory if this process made it."""
    if run.owned:
        shutil.rmtree(run.path, ignore_errors=True)


def litter(names: Iterable[str], *, before: Iterable[str]) -> list[str]:
    """The names not in ``before`` that the tests would have made (:data:`LITTER_PREFIXES`).

    A purely computational function with no side-effects."""
    seen = set(before)
    return sorted(n for n in names if n not in seen and n.startswith(LITTER_PREFIXES))


#: what a process's command line shows when it may make such litter: a JVM, a test run, a
#: benchmark or a Spark job of someone else on this machine
_MAKERS = ("java", "pytest", "pyspark", "benchmarks/", "sparkguard")


def _processes() -> dict[int, tuple[int, str]]:
    """Every process: pid -> (parent pid, command line)."""
    found: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            parent = int(stat[stat.rindex(")") + 2 :].split()[1])
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            found[int(entry.name)] = (parent, command.strip())
    return found


def foreign_makers(processes: dict[int, tuple[int, str]], *, ours: int) -> dict[int, str]:
    """The processes outside ``ours``'s tree (itself, its descendants and its ancestors)
    whose command line may make litter (:data:`_MAKERS`).

    A purely computational function with no side-effects."""
    ancestors = set()
    pid = ours
    while pid in processes and pid not in ancestors:
        ancestors.add(pid)
        pid = processes[pid][0]

    def descends(pid: int) -> bool:
        path = set()
        while pid in processes and pid not in path:
            if pid == ours:
                return True
            path.add(pid)
            pid = processes[pid][0]
        return False

    return {
        pid: command
        for pid, (_, command) in processes.items()
        if pid not in ancestors and not descends(pid) and any(maker in command for maker in _MAKERS)
    }


class LitterCheck:
    """What appears directly in the run's root during the run, and whether another process
    on the machine could have made it: processes are sampled every ``interval`` seconds."""

    def __init__(self, run: RunTmp, *, interval: float = 2.0) -> None:
        self.run = run
        self.before = frozenset(os.listdir(run.root))
        self.foreign: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._sample, args=(interval,), name="sg-litter-check", daemon=True
        )
        self._thread.start()

    def _sample(self, interval: float) -> None:
        while True:
            self.foreign.update(foreign_makers(_processes(), ours=os.getpid()))
            if self._stop.wait(interval):
                return

    def finish(self) -> list[str]:
        """Stop sampling; the new litter in the root (its names)."""
        self._stop.set()
        self._thread.join()
        self.foreign.update(foreign_makers(_processes(), ours=os.getpid()))
        names = [n for n in os.listdir(self.run.root) if Path(self.run.root, n) != self.run.path]
        return litter(names, before=self.before)
