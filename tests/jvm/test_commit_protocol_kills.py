"""An unchanged PySpark job writing through the JVM commit protocol is SIGKILLed (the whole
driver: its Python process and its Spark JVM) at each stage of a write, rolled back with
``sparkguard rollback`` as a user would, and rerun: every row exactly once, no uncommitted or
temp file left; on local disk, on the S3 server through ``s3a://`` and on a real HDFS; and with
the write made by ``df.write.format("sparkguard")`` (the Python API's name, the JVM front) on
local disk.

The stages are chosen explicitly (coverage is never left to chance): the inflight written, the
first marker, half the files written (rename stores: under their hidden temp names; S3: as
multipart uploads left open), half the files published (after the outcome, inside the publication
window, which the rollback rolls forward), and the committed outcome (killed after it: the rerun
must skip the write, spark-operator#1854). Right after a kill before the outcome, and before any
rollback, the directory holds no data file of the write, on every store. A seeded draw adds kills
at random delays inside the write; the seed chooses only the delay. On S3 (a slower tier: S3A's
start costs) a subset runs: the middle of the write (half the files written as pending uploads:
published after the outcome there too) and one random moment. On a real HDFS (the minicluster:
``HadoopRenameAtomicStore``, temp file + hsync + ``FileContext.rename`` on a NameNode) the middle
of the write. Through the front, after the outcome (the rerun through the
format name skips the write); a front kill before the outcome is no other path than
``local-half-temps`` (once the front chose it, the protocol's own steps run), so it is not run.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import pytest

from sparkguard.spark_lib.spark import sparkconf
from sparkguard.spark_lib.storage import reader
from tests.jvm import conftest, stores
from tests.jvm.conftest import job_command, kill_when, rollback_as_init_container, run_job

pytestmark = pytest.mark.spark

JOB = "jvm-kill-1"
#: Enough rows that a write spans many polls of its stages; no more (each case writes them
#: twice: the killed run and the rerun).
ROWS = 1_000_000
PARTITIONS = 8


@dataclasses.dataclass(frozen=True)
class Where:
    """A table and its journal on one store, the job's conf for it, and a way to list it."""

    table: str
    journal: str
    conf: dict[str, str]
    options: dict[str, Any]
    poll_s: float
    #: keys of the multipart uploads in progress (S3; a rename store has none)
    uploads: Callable[[], list[str]] = stores._no_uploads

    def glob(self, pattern: str) -> list[str]:
        """Names (last path segment) matching ``<table>/<pattern>``, listed afresh."""
        fs, _, _ = fsspec.get_fs_token_paths(self.table, storage_options=self.options)
        fs.invalidate_cache()
        return [p.rsplit("/", 1)[-1] for p in fs.glob(f"{self.table}/{pattern}")]

    def committed(self) -> bool:
        """Whether the write's outcome says committed (listed and read now)."""
        fs, _, _ = fsspec.get_fs_token_paths(self.table, storage_options=self.options)
        fs.invalidate_cache()
        outcomes = fs.glob(f"{self.table}/_sparkguard/timeline/*.outcome")
        return any(b'"committed"' in fs.cat_file(p) for p in outcomes)


@pytest.fixture(params=["local", "s3", "hdfs", "front"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Where:
    journal = str(tmp_path / "journal")
    conf = sparkconf.build_spark_conf(JOB, journal=journal)
    if request.param == "local":
        return Where(str(tmp_path / "table"), journal, conf, {}, 0.002)
    if request.param == "front":
        # df.write.format("sparkguard"): the jar and the job's settings, no protocol conf; the
        # JVM front chooses the protocol for the write (docs/writer.md, "Which path writes").
        front = {
            sparkconf.JARS_KEY: conf[sparkconf.JARS_KEY],
            "spark.sparkguard.jobId": JOB,
            "spark.sparkguard.journal": journal,
            "sparkguard.test.writeFormat": "sparkguard",
        }
        return Where(str(tmp_path / "table"), journal, front, {}, 0.002)
    store = conftest.open_store(request, request.param)
    both = stores.with_jars(conf, store.conf)
    # Listing a store every 2 ms would load its server more than the job: poll every 50 ms.
    return Where(store.url("table"), journal, both, store.options, 0.05, store.uploads)


#: Each stage: is the write (at least) there yet?
STAGES: dict[str, Callable[[Where], bool]] = {
    "inflight": lambda w: bool(w.glob("_sparkguard/timeline/*.inflight")),
    "first-marker": lambda w: bool(w.glob("_sparkguard/markers/*/*.marker.*")),
    "half-temps": lambda w: len(w.glob(".part-*.sg-tmp-*")) >= PARTITIONS // 2,
    "half-files": lambda w: len(w.glob("part-*")) >= PARTITIONS // 2,
    # S3: half the files written, left as multipart uploads for the driver to complete
    "half-uploads": lambda w: len(w.uploads()) >= PARTITIONS // 2,
    "outcome": lambda w: bool(w.glob("_sparkguard/timeline/*.outcome")),
}
#: What the S3 tier runs (each case costs two S3A Spark starts).
S3_STAGES = ("half-uploads",)
#: Stages only an object store has (a rename store leaves temp files, not uploads).
S3_ONLY = frozenset({"half-uploads"})
S3_SEEDS = (11,)
#: What the HDFS tier runs: the rollback deleting temp files on a NameNode, then the rerun.
HDFS_STAGES = ("half-temps",)
#: What the format("sparkguard") tier runs: the same protocol, reached through the format name,
#: killed after the outcome (the rerun through the format name must skip the write); before the
#: outcome it would be ``local-half-temps`` again (the module's docstring).
FRONT_STAGES = ("outcome",)


def _kill_when(where: Where, ready: Callable[[Where], bool], delay: float) -> None:
    """Start the job, wait until ``ready(where)``, then ``delay`` seconds, then SIGKILL the whole
    driver (process group). Fails when the job ended before the stage was reached."""
    command = job_command(
        "plain_write.py", where.table, str(ROWS), str(PARTITIONS), conf=where.conf
    )
    kill_when(command, lambda: ready(where), delay=delay, poll_s=where.poll_s)


def _rollback(
    where: Where, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> dict[str, object]:
    """``sparkguard rollback`` as the rollback initContainer runs it after the crash. A kill
    between the inflight (W2) and the journal entry (W3) leaves no journal yet: that instant has
    no markers and no files, and the rerun's W1 claims it (docs/storage-contract.md)."""
    return rollback_as_init_container(JOB, where.journal, where.options, capsys, monkeypatch)


def _assert_exactly_once(where: Where) -> None:
    """Rerun the unchanged job; then every row once, every data file committed, nothing else."""
    result = run_job(
        "plain_write.py", where.table, str(ROWS), str(PARTITIONS), conf=where.conf, timeout=900
    )
    assert result == {"rows": ROWS, "ids": ROWS}, "plain Spark's read of the directory"
    committed = sorted(
        p.rsplit("/", 1)[-1]
        for p in reader.committed_paths(where.table, storage_options=where.options)
    )
    assert committed == sorted(where.glob("part-*")), "every data file in the table is committed"
    assert where.glob("**/.*.sg-tmp-*") == []
    assert where.glob("_temporary") == []
    assert where.glob("_sparkguard/markers/*/*") == []
    assert where.uploads() == [], "no multipart upload left in progress"


def _cases(kind: str, names: tuple[Any, ...] | list[Any]) -> list[Any]:
    marks = [stores.MARKS[kind]] if kind in stores.MARKS else []
    return [pytest.param(kind, n, marks=marks, id=f"{kind}-{n}") for n in names]


@pytest.mark.parametrize(
    ("where", "stage"),
    _cases("local", [stage for stage in STAGES if stage not in S3_ONLY])
    + _cases("s3", S3_STAGES)
    + _cases("hdfs", HDFS_STAGES)
    + _cases("front", FRONT_STAGES),
    indirect=["where"],
)
def test_killed_at_each_stage_then_rolled_back_and_rerun_is_exactly_once(
    where: Where,
    stage: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _kill_when(where, STAGES[stage], delay=0.0)
    assert where.glob("_sparkguard/timeline/*.inflight"), "the kill came after the write started"
    committed = where.committed()
    if not committed:
        # Before any rollback: a directory reader finds no file of the uncommitted write.
        assert where.glob("part-*") == [], "a data file published before the outcome"
    summary = _rollback(where, capsys, monkeypatch)
    if committed:  # rolled forward: every file of the write published, none deleted
        assert len(where.glob("part-*")) == PARTITIONS, summary
        assert summary["filesDeleted"] == 0, summary
    else:  # before the commit: the rollback removes every file of the write
        assert where.glob("part-*") == [], summary
    _assert_exactly_once(where)


@pytest.mark.parametrize(
    ("where", "seed"), _cases("local", [23]) + _cases("s3", S3_SEEDS), indirect=["where"]
)
def test_killed_at_a_random_moment_of_the_write_then_rerun_is_exactly_once(
    where: Where,
    seed: int,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The seed picks the moment, not the coverage: within the first second after the inflight
    # (seed 23: 0.92 s, seed 11: 0.45 s), while the job still runs (a kill after its exit fails).
    delay = random.Random(seed).uniform(0.0, 1.0)
    _kill_when(where, STAGES["inflight"], delay=delay)
    _rollback(where, capsys, monkeypatch)
    _assert_exactly_once(where)
