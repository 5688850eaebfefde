"""Spark's streaming file sink through ``SparkguardStreamingCommitProtocol`` on a remote store:
an unchanged streaming job (``tests/jvm/jobs/stream_write.py``, never imports sparkguard) with
its checkpoint, its parquet sink and its journal on ``s3a://`` (the test S3 server, an object
store) or on ``hdfs://`` (the HDFS minicluster, a rename store: a real NameNode and DataNode),
run with the conf ``sparkguard spark-conf`` prints plus the store's conf. It is SIGKILLed (the whole
driver: its Python process and its Spark JVM) twice, once with a batch's files written and its
``_spark_metadata/<batch>`` not, then at a seeded random moment; before each restart
``sparkguard rollback`` runs as the operator's rollback initContainer runs it. After every
rollback the sink holds exactly the files its manifest lists, with no incomplete upload or temp
file of a data file; at the end every input row is there once, through ``_spark_metadata`` and
by listing the directory, and every checkpoint and manifest file parses."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.spark import sparkconf
from sparkguard.spark_lib.storage import reader, sinklog
from tests.jvm import conftest, stores
from tests.jvm.test_checkpoint_manager import assert_every_file_parses

pytestmark = pytest.mark.spark

JOB = "stream-s3-job-1"
ROWS_PER_FILE = 1000
#: Input files, one micro-batch each: enough that the random kill lands before the last batch.
INPUTS = 6
#: The first attempt of the task holding this row (batch 4) fails in every execution of that
#: batch: on S3 Spark's close of the aborted writer completes its object under the final name,
#: abortTask deletes it, and the retry writes the name again (on HDFS the aborted writer's temp
#: file is deleted and the retry publishes the name).
FAIL_ROW = "4500"
NAME = re.compile(rf"^k=[01]/part-(\d{{5}})-{JOB}-b(\d{{10}})-c\d{{3}}\.snappy\.parquet$")


class Sink:
    """The store directory's sink, checkpoint and journal, and what a test reads of them."""

    def __init__(self, store: stores.Store) -> None:
        self.store = store
        self.url = store.url("sink")
        self.checkpoint = store.url("cp")
        self.journal = store.url("journal")
        self.options: dict[str, Any] = store.options

    def keys(self, prefix: str = "") -> list[str]:
        return self.store.listing(prefix)

    def data_files(self) -> set[str]:
        """Data files found by listing the sink (what Hive/Trino/a plain reader see)."""
        found = set()
        for key in self.keys("sink/"):
            relative = key[len("sink/") :]
            parts = relative.split("/")
            if relative.endswith(".parquet") and not any(p.startswith(("_", ".")) for p in parts):
                found.add(relative)
        return found

    def listed(self) -> set[str]:
        """Data files ``_spark_metadata`` lists."""
        manager, table = filemanager.resolve(self.url, storage_options=self.options)
        return set(sinklog.listed_files(manager, table))

    def manifest_batches(self) -> set[int]:
        names = [k.rsplit("/", 1)[-1] for k in self.keys("sink/_spark_metadata/")]
        return {int(n.split(".")[0]) for n in names if n.split(".")[0].isdigit()}

    def instants(self) -> int:
        return len([k for k in self.keys("sink/_sparkguard/timeline/") if k.endswith(".inflight")])

    def uploads(self) -> list[str]:
        """Keys of incomplete multipart uploads anywhere in the bucket (none on HDFS)."""
        return self.store.uploads()

    def temp_objects(self) -> list[str]:
        """Temp files of data files, Spark's ``_temporary``. Not the temp file a kill may leave
        of a checkpoint or manifest file on a rename store (``.<n>.sg-tmp-<hex>`` beside
        ``offsets/<n>``): Spark's metadata logs skip hidden names and the rerun writes the file
        again (Spark's own rename-based manager leaves ``.<n>.<uuid>.tmp`` the same way)."""
        logs = ("cp/", "sink/_spark_metadata/")
        return [
            k
            for k in self.keys()
            if (".sg-tmp-" in k and not k.startswith(logs)) or "_temporary" in k
        ]

    def rows_by_listing(self) -> list[int]:
        """Every ``n`` of every data file found by listing the sink (no manifest, no Spark)."""
        fs, root = self.store.filesystem()
        rows: list[int] = []
        for relative in sorted(self.data_files()):
            with fs.open(f"{root}/sink/{relative}", "rb") as f:
                rows.extend(pq.read_table(f, columns=["n"]).column("n").to_pylist())
        return rows


def _inputs(directory: Path, count: int) -> None:
    """``count`` parquet files of ``n``, one micro-batch each, in modification-time order."""
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        path = directory / f"input-{i:03d}.parquet"
        values = pa.array(range(i * ROWS_PER_FILE, (i + 1) * ROWS_PER_FILE), pa.int64())
        pq.write_table(pa.table({"n": values}), path)
        os.utime(path, (1_700_000_000 + 10 * i, 1_700_000_000 + 10 * i))


def _conf(store: stores.Store, journal: str) -> dict[str, str]:
    """``sparkguard spark-conf`` + the store's conf, both jar lists in spark.jars."""
    return stores.with_jars(sparkconf.build_spark_conf(JOB, journal=journal), store.conf)


def _kill_when(
    args: list[str], conf: dict[str, str], log: Path, ready: Callable[[], bool], delay: float
) -> None:
    """Start the job, wait until ``ready()``, then ``delay`` seconds, then SIGKILL its process
    group (its Python and its JVM); its stderr goes to ``log``."""
    command = conftest.job_command("stream_write.py", *args, conf=conf)
    conftest.kill_when(command, ready, delay=delay, poll_s=0.3, log=log)


def _rollback(
    sink: Sink, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    """``sparkguard rollback`` as the rollback initContainer runs it before each restart."""
    return conftest.rollback_as_init_container(JOB, sink.journal, sink.options, capsys, monkeypatch)


def _assert_no_orphan(sink: Sink) -> None:
    on_store = sink.data_files()
    assert on_store == sink.listed(), "files a lister sees that _spark_metadata does not list"
    assert all(NAME.match(n) for n in on_store), on_store
    assert sink.uploads() == []
    assert sink.temp_objects() == []


@pytest.mark.slow
@pytest.mark.parametrize("store", stores.params("s3", "hdfs"), indirect=True)
def test_a_sink_killed_repeatedly_is_rolled_back_and_ends_exactly_once(
    store: stores.Store,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sink = Sink(store)
    conf = _conf(store, sink.journal)
    source = str(tmp_path / "input")
    _inputs(Path(source), INPUTS)
    args = [source, sink.url, sink.checkpoint]
    rng = random.Random(31)  # a fixed schedule of kill points
    seen_dead: dict[str, set[str]] = {}  # kill -> data files the manifest did not list then

    # Kill 1: batch 1's files written (the task holding row 1500 stalls, the other publishes),
    # its _spark_metadata/1 not.
    flag = tmp_path / "stall"
    flag.write_text("the task holding row 1500 waits while this file exists\n")

    def batch_one_half_written() -> bool:
        names = [NAME.match(n) for n in sink.data_files()]
        return any(m and m.group(2) == f"{1:010d}" for m in names)

    stalled = [*args, str(flag), "1500", FAIL_ROW]
    _kill_when(stalled, conf, tmp_path / "run0.err", batch_one_half_written, 0)
    assert 1 not in sink.manifest_batches()
    orphans = sink.data_files() - sink.listed()
    assert orphans, "the killed batch left no written file that _spark_metadata does not list"
    assert {NAME.match(n).group(2) for n in orphans} == {f"{1:010d}"}  # type: ignore[union-attr]
    seen_dead["stall"] = orphans
    summary = _rollback(sink, capsys, monkeypatch)
    assert summary["filesDeleted"] == len(orphans), summary
    assert len(summary["instantsRolledBack"]) == 1, summary  # batch 1's execution, not batch 0
    _assert_no_orphan(sink)
    flag.unlink()

    # Kill 2: a seeded moment inside a later batch execution (each is one instant; seed 31:
    # 2.14 s after the next instant).
    target = sink.instants() + rng.randint(1, 2)
    delay = rng.uniform(0.5, 4.0)  # a batch takes a few seconds here: early to late in one
    random_run = [*args, "-", "-1", FAIL_ROW]
    _kill_when(random_run, conf, tmp_path / "run1.err", lambda: sink.instants() >= target, delay)
    seen_dead["random"] = sink.data_files() - sink.listed()
    summary = _rollback(sink, capsys, monkeypatch)
    with capsys.disabled():  # with -s: where the kill landed, what the rollback did
        print(
            f"\nkill 2: instant {target} +{delay:.2f}s, manifest up to batch "
            f"{max(sink.manifest_batches(), default=-1)}, uncommitted "
            f"{sorted(seen_dead['random'])}, rollback deleted "
            f"{summary['filesDeleted']}, rolled back {summary['instantsRolledBack']}, "
            f"recorded committed {summary['instantsCommitted']}"
        )
    assert summary["filesDeleted"] == len(seen_dead["random"]), summary
    _assert_no_orphan(sink)

    # The last restart runs to the end (trigger availableNow), then reads back the sink.
    last = tmp_path / "run2.err"
    with last.open("wb") as err:
        done = subprocess.run(
            conftest.job_command("stream_write.py", *args, "-", "-1", FAIL_ROW, conf=conf),
            stdout=subprocess.PIPE,
            stderr=err,
            env=conftest.job_env(),
            timeout=900,
            check=False,
        )
    assert done.returncode == 0, last.read_text()[-3000:]
    result = json.loads(done.stdout.decode().strip().splitlines()[-1])
    logs = "".join(p.read_text(errors="replace") for p in sorted(tmp_path.glob("run*.err")))
    assert "injected failure of the first attempt" in logs, (
        f"no task attempt failed on {store.name}"
    )
    rows = INPUTS * ROWS_PER_FILE
    assert result == {"rows": rows, "ids": rows}  # through _spark_metadata
    listing = sink.rows_by_listing()  # ignoring _spark_metadata
    assert sorted(listing) == list(range(rows))
    final = sink.data_files()
    assert final == sink.listed()
    # Each batch's files carry its id, but an input may share a batch with the next one: Spark's
    # FileStreamSource logs a batch's input files (sources/0/<n>, in fetchMaxOffset) before the
    # offsets log has the batch, and a batch reads the source log's entries (start, end]
    # (getBatch). A kill between the two writes makes the restarted batch read two inputs, each
    # once (the rows above): at most one batch fewer per kill, the ids still 0, 1, 2, ...
    batches = {int(NAME.match(n).group(2)) for n in final}  # type: ignore[union-attr]
    assert batches == set(range(len(batches))), sorted(batches)
    assert INPUTS - len(seen_dead) <= len(batches) <= INPUTS, sorted(batches)
    # A re-executed batch wrote the same names as its dead execution (deterministic names).
    for kill, dead in seen_dead.items():
        assert dead <= final, (kill, dead - final)
    assert sink.uploads() == []
    assert sink.temp_objects() == []
    # sparkguard's timeline agrees with the manifest: every listed file is in a committed instant.
    committed = reader.committed_paths(sink.url, storage_options=sink.options)
    assert committed == [f"{sink.url}/{n}" for n in sorted(final)]
    assert _rollback(sink, capsys, monkeypatch)["filesDeleted"] == 0
    # Every checkpoint file and every manifest file is whole.
    logs = assert_every_file_parses(store.files("cp/"), "cp/")
    assert logs["offsets"] >= len(batches)
    assert logs["commits"] >= len(batches)
    manifest = store.files("sink/_spark_metadata/")
    assert assert_every_file_parses(manifest, "sink/")["_spark_metadata"] >= len(batches)
