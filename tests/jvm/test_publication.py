"""A plain directory reader never sees a write that did not commit (docs/storage-contract.md,
"Publication after the outcome"): the JVM commit protocol leaves each data file under its
hidden temp name (rename stores) or as a multipart upload left open (S3) until the outcome is
written, then renames it or completes the upload.

A reader of the directory that knows nothing of sparkguard (pyarrow's dataset discovery, which
skips names starting with ``.`` or ``_`` as Spark's, Hive's and Trino's listings do) polls the
table while an unchanged PySpark job appends, overwrites or overwrites partitions dynamically,
and the job is SIGKILLed at a seeded random moment. Every poll taken wholly before the outcome
reads the table as it was, every poll taken wholly after the publication reads it as written;
right after the kill, before any rollback, it reads exactly the committed rows; after the
rollback no temp file, marker or upload is left: every kind of write on local disk, one kind
each on a real HDFS (the minicluster) and on the S3 server. A driver killed inside the
publication window (deterministically: a test-only pause between publications) is rolled
*forward* by the rollback: every row once, on local disk, HDFS and S3.
"""

from __future__ import annotations

import dataclasses
import random
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from sparkguard.spark_lib.spark import sparkconf
from sparkguard.spark_lib.storage import reader
from tests.jvm import conftest, stores
from tests.jvm.conftest import job_command, job_env, rollback_as_init_container, run_job
from tests.support.process import kill_session

pytestmark = pytest.mark.spark

JOB = "jvm-publish-1"
#: rows the table holds before the write (plain files, as before opting in), and the write's
OLD_ROWS = 1_000
ROWS = 400_000
PARTITIONS = 8
#: the write killed inside its publication window: the test's pause between renames makes the
#: window, not the rows (ROWS makes the random kill's write last)
WINDOW_ROWS = 8_000
#: the Hadoop setting that pauses the driver's publication after each rename (tests only)
PUBLISH_PAUSE = "spark.hadoop.sparkguard.test.publishPauseMs"

#: (rows, sum of n): what a reader of the directory counts
Reading = tuple[int, int]


@dataclasses.dataclass(frozen=True)
class Write:
    """One kind of write: its mode, partition expression and extra conf, and the readings
    before and after it."""

    mode: str
    partition_expr: str | None
    conf: dict[str, str]
    before: Reading
    after: Reading


def _reading(ns: list[int] | range) -> Reading:
    return len(ns), sum(ns)


def _old() -> range:
    return range(OLD_ROWS)


def _new() -> range:
    return range(OLD_ROWS, OLD_ROWS + ROWS)


WRITES = {
    "append": Write("append", None, {}, _reading(_old()), _reading(range(OLD_ROWS + ROWS))),
    "overwrite": Write("overwrite", None, {}, _reading(_old()), _reading(_new())),
    # The old table is partitioned by n % 4; the write's partitions are n % 2 (0 and 1): it
    # replaces k=0 and k=1 and keeps the old rows of k=2 and k=3.
    "dynamic": Write(
        "overwrite",
        "n % 2",
        {"spark.sql.sources.partitionOverwriteMode": "dynamic"},
        _reading(_old()),
        _reading([n for n in _old() if n % 4 >= 2] + list(_new())),
    ),
}


@dataclasses.dataclass(frozen=True)
class TableOn:
    """A table on one store: its URL, the Spark conf and fsspec options that reach it, a listing
    of its directory and of the files its writes left unpublished (rename stores: temp names;
    object stores: multipart uploads in progress)."""

    url: str
    conf: dict[str, str]
    options: dict[str, Any]
    fs: Any
    root: str
    uploads: Any = None
    #: how often a poller reads it (a store's server is not listed every 10 ms)
    poll_s: float = 0.01

    @classmethod
    def local(cls, table: Path) -> TableOn:
        return cls(str(table), {}, {}, fsspec.filesystem("file"), str(table))

    def reading(self) -> Reading | None:
        """What a plain directory reader reads of it now (:func:`plain_reading`)."""
        self.fs.invalidate_cache()
        return plain_reading(self.root, self.fs)

    def leftovers(self) -> list[str]:
        """Temp files, markers and uploads in progress: none once a write is decided and
        cleaned."""
        self.fs.invalidate_cache()
        temps = self.fs.glob(f"{self.root}/**/.*.sg-tmp-*")
        markers = list(self.fs.find(f"{self.root}/_sparkguard/markers"))
        return sorted(temps + markers + (self.uploads() if self.uploads else []))

    def names(self, pattern: str) -> list[str]:
        """Last path segments matching ``<table>/<pattern>``, listed now."""
        self.fs.invalidate_cache()
        return sorted(p.rsplit("/", 1)[-1] for p in self.fs.glob(f"{self.root}/{pattern}"))

    def exists(self, pattern: str) -> bool:
        """Whether anything matches ``<table>/<pattern>`` now."""
        self.fs.invalidate_cache()
        return bool(self.fs.glob(f"{self.root}/{pattern}"))

    def unpublished(self) -> list[str]:
        """The write's files not published yet: temp files, or pending uploads (by key)."""
        if self.uploads is not None:
            return sorted(k.rsplit("/", 1)[-1] for k in self.uploads())
        return self.names(".*.sg-tmp-*")


@pytest.fixture(params=["local", *stores.params("hdfs", "s3")])
def table_on(request: pytest.FixtureRequest, tmp_path: Path) -> TableOn:
    """A fresh table on local disk, on a real HDFS (the minicluster) or on the S3 server."""
    if request.param == "local":
        return TableOn.local(tmp_path / "table")
    store = conftest.open_store(request, request.param)
    fs, root = store.filesystem()
    uploads = store.uploads if request.param == "s3" else None
    url, where = store.url("table"), f"{root}/table"
    return TableOn(url, store.conf, store.options, fs, where, uploads, poll_s=0.05)


def _seed_table(table: TableOn, write: Write) -> None:
    """The table before the write: plain Parquet files no sparkguard instant lists."""
    parts = [("", list(_old()))] if write.partition_expr is None else [
        (f"k={k}/", [n for n in _old() if n % 4 == k]) for k in range(4)
    ]  # fmt: skip
    for prefix, ns in parts:
        table.fs.makedirs(f"{table.root}/{prefix}", exist_ok=True)
        with table.fs.open(f"{table.root}/{prefix}old-0.parquet", "wb") as out:
            pq.write_table(pa.table({"n": pa.array(ns, pa.int64())}), out)


def plain_reading(table: str, filesystem: Any = None) -> Reading | None:
    """What a directory reader that knows nothing of sparkguard reads (pyarrow's discovery
    skips ``.``/``_`` names, like Spark's); None when a file went away mid-read (an overwrite
    deleting superseded files)."""
    try:
        dataset = ds.dataset(table, format="parquet", partitioning="hive", filesystem=filesystem)
        column = dataset.to_table(columns=["n"]).column("n")
    except (FileNotFoundError, OSError, pa.ArrowInvalid):
        return None
    total = pc.sum(column).as_py() if len(column) else 0
    return len(column), int(total or 0)


def _timeline_state(table: TableOn) -> tuple[bool, bool]:
    """(an outcome exists, a marker directory exists): before the outcome, the write is not
    visible; after the outcome with the markers gone, it is wholly published."""
    outcome = table.exists("_sparkguard/timeline/*.outcome")
    markers = table.exists("_sparkguard/markers/*")
    return outcome, markers


@dataclasses.dataclass
class Poller:
    """Reads the directory over and over in a thread, noting the timeline around each read."""

    table: TableOn
    seen: list[tuple[tuple[bool, bool], Reading | None, tuple[bool, bool]]] = dataclasses.field(
        default_factory=list
    )
    stop: threading.Event = dataclasses.field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            before = _timeline_state(self.table)
            got = self.table.reading()
            self.seen.append((before, got, _timeline_state(self.table)))
            time.sleep(self.table.poll_s)


def _run_and_kill(command: list[str], ready: Any, delay: float) -> bool:
    """Start the job, wait until ``ready()`` then ``delay`` s, SIGKILL the whole driver; True
    when the kill came before the job ended (else the write simply finished)."""
    proc = subprocess.Popen(
        command,
        env=job_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 600
        while not ready() and proc.poll() is None:
            assert time.monotonic() < deadline, "the write never started"
            time.sleep(0.005)
        time.sleep(delay)
        return proc.poll() is None
    finally:
        kill_session(proc.pid)
        proc.wait(timeout=60)


def _random_case(kind: str, seed: int, store: str) -> Any:
    marks = [stores.MARKS[store]] if store in stores.MARKS else []
    suffix = "" if store == "local" else f"-{store}"
    return pytest.param(kind, seed, store, marks=marks, id=f"{kind}{suffix}-{seed}")


#: every kind of write on every store (each store publishes its own way: renames on local
#: disk and HDFS, upload completions on S3)
RANDOM_CASES = [
    _random_case("append", 3, "local"),
    _random_case("overwrite", 5, "local"),
    _random_case("dynamic", 7, "local"),
    _random_case("append", 11, "s3"),
    _random_case("overwrite", 19, "s3"),
    _random_case("dynamic", 13, "s3"),
    _random_case("append", 23, "hdfs"),
    _random_case("overwrite", 17, "hdfs"),
    _random_case("dynamic", 29, "hdfs"),
]


@pytest.mark.parametrize(("kind", "seed", "table_on"), RANDOM_CASES, indirect=["table_on"])
def test_a_plain_reader_sees_the_table_before_or_after_a_write_killed_at_random(
    *,
    kind: str,
    seed: int,
    table_on: TableOn,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    write = WRITES[kind]
    table = table_on
    journal = str(tmp_path / "journal")
    _seed_table(table, write)
    assert table.reading() == write.before
    conf = stores.with_jars(sparkconf.build_spark_conf(JOB, journal=journal), table.conf)
    conf |= write.conf
    args = [table.url, str(ROWS), str(PARTITIONS), write.mode, "-", str(OLD_ROWS)]
    if write.partition_expr:
        args.append(write.partition_expr)
    poller = Poller(table)
    thread = threading.Thread(target=poller.run, daemon=True)
    thread.start()
    delay = random.Random(seed).uniform(0.0, 3.0)  # the seed picks the moment, not the coverage
    try:
        _run_and_kill(
            job_command("plain_write.py", *args, conf=conf),
            lambda: table.exists("_sparkguard/timeline/*.inflight"),
            delay,
        )
    finally:
        poller.stop.set()
        thread.join(timeout=30)
    # Outside the publication window every poll reads before or after, never a mix.
    checked = 0
    for before, got, after in poller.seen:
        if got is None:
            continue
        if not before[0] and not after[0]:
            assert got == write.before, "a poll before the outcome saw part of the write"
            checked += 1
        elif before[0] and not before[1]:
            assert got == write.after, "a poll after the publication saw a mix"
            checked += 1
    assert checked, "the poller read the table at least once outside the publication window"
    # After the kill, before any rollback: exactly the committed rows.
    committed, unpublished = _timeline_state(table)
    if not committed:
        assert table.reading() == write.before
    elif not unpublished:
        assert table.reading() == write.after
    rollback_as_init_container(JOB, journal, table.options, capsys, monkeypatch)
    assert table.reading() == (write.after if committed else write.before)
    assert table.leftovers() == []


def test_a_driver_killed_inside_the_publication_window_is_rolled_forward(
    table_on: TableOn,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rename stores: the files not renamed yet are renamed; S3: the uploads not completed yet
    are completed (the Python rollback lists their parts). Nothing is deleted."""
    where = table_on
    journal = str(tmp_path / "journal")
    conf = stores.with_jars(sparkconf.build_spark_conf(JOB, journal=journal), where.conf)
    conf[PUBLISH_PAUSE] = "2000"  # one file published every 2 s: the kill lands after the first
    args = [where.url, str(WINDOW_ROWS), str(PARTITIONS)]
    command = job_command("plain_write.py", *args, conf=conf)
    assert _run_and_kill(command, lambda: bool(where.names("part-*")), 0.2), "killed too late"
    published = where.names("part-*")
    assert 0 < len(published) < PARTITIONS, "killed inside the publication window"
    assert len(where.unpublished()) == PARTITIONS - len(published)
    summary = rollback_as_init_container(JOB, journal, where.options, capsys, monkeypatch)
    assert summary["filesPublished"] == PARTITIONS - len(published), summary
    assert summary["filesDeleted"] == 0, summary
    paths = reader.committed_paths(where.url, storage_options=where.options)
    committed = sorted(p.rsplit("/", 1)[-1] for p in paths)
    assert committed == where.names("part-*")
    assert len(committed) == PARTITIONS
    assert where.unpublished() == [], "no temp file, no upload in progress"
    assert where.names("_sparkguard/markers/*/*") == [], "no marker left"
    assert plain_reading(where.root, where.fs) == _reading(range(WINDOW_ROWS)), "every row once"


def test_a_rerun_before_any_rollback_first_publishes_a_write_killed_inside_the_window(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No rollback between the kill and the rerun (no operator, a user rerunning by hand): the
    rerun's setup rolls the committed write forward (R8a) before it skips it (every row once to
    a directory reader) or rewrites it; a rewrite that then fails leaves the committed rows,
    once, and so does the rollback after it."""
    rows, partitions = 4_000, 4
    table = tmp_path / "table"
    journal = str(tmp_path / "journal")
    conf = sparkconf.build_spark_conf(JOB, journal=journal)
    paused = {**conf, PUBLISH_PAUSE: "2000"}  # one rename every 2 s: killed after the first
    command = job_command("plain_write.py", str(table), str(rows), str(partitions), conf=paused)
    assert _run_and_kill(command, lambda: any(table.glob("part-*")), 0.2), "killed too late"
    assert 0 < len(list(table.glob("part-*"))) < partitions, "killed inside the publication window"
    rewritten = tmp_path / "rewritten"
    shutil.copytree(table, rewritten)  # the same killed state, for the failing rewrite
    everything = _reading(range(rows))

    skipped = run_job("plain_write.py", str(table), str(rows), str(partitions), conf=conf)
    assert skipped == {"rows": rows, "ids": rows}, "rerun=skip: the committed rows, published"
    assert plain_reading(str(table)) == everything
    assert list(table.rglob(".*.sg-tmp-*")) == []

    rewrite = {**conf, "spark.sparkguard.rerun": "rewrite"}
    args = [str(rewritten), str(rows), str(partitions), "append", str(rows - 1)]
    run_job("plain_write.py", *args, conf=rewrite, expect_exit=3)
    assert plain_reading(str(rewritten)) == everything, "the failed rewrite lost committed rows"

    rollback_as_init_container(JOB, journal, {}, capsys, monkeypatch)
    for done in (table, rewritten):
        assert plain_reading(str(done)) == everything
        assert TableOn.local(done).leftovers() == [], "the failed rewrite's temp files go"
