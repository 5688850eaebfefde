"""A stateful ``foreachBatch`` query (``tests/jvm/jobs/stream_foreach_batch.py``, unchanged:
it never imports sparkguard) writing each micro-batch with a plain ``df.write`` through the JVM
commit protocol, checkpoint and output on the same store. SIGKILLed (the whole driver) at chosen
moments, rolled back as the operator's initContainer does, restarted from its checkpoint, all on
one query (one test per store: each kill's restart carries on from the previous one's state):

* killed after a batch's write committed and before Spark recorded the batch (``commits/<n>``):
  the restart re-executes the batch, and the write is skipped (its identity is (query, batch,
  n-th write of the batch), docs/storage-contract.md "Writes inside a micro-batch") instead of
  being appended a second time;
* killed in the middle of a batch's write: the rollback removes the dead attempt's files, the
  re-executed batch writes them again under the same names;
* killed at a seeded random moment, one per store (each kill costs a JVM start): on local disk
  an early one (0.11 s after the batch it waits for is recorded), on S3 a late one (1.42 s).

After every rollback the table holds exactly its committed files (no orphan for a reader that
lists it); at the end each batch's aggregate is in the output exactly once, with the counts the
state store must give (it was restored, not recomputed or applied twice), and the state store
can be read as of every batch (every state file parses)."""

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
from tests.jvm import s3a
from tests.jvm.conftest import job_command, kill_when, rollback_as_init_container, run_job
from tests.jvm.test_checkpoint_manager import assert_every_file_parses, checkpoint_files
from tests.support import s3server

pytestmark = pytest.mark.spark

JOB = "foreach-batch-1"
KEYS = 5  # k = value % 5
ROWS_PER_BATCH = 10


@dataclasses.dataclass(frozen=True)
class Query:
    """The query's checkpoint and output on one store, its conf, and how to look at them."""

    checkpoint: str
    output: str
    journal: str
    conf: dict[str, str]
    options: dict[str, Any]
    #: the seed of the random kill's moment
    seed: int
    #: how often a kill's condition lists the store (S3: a listing every 20 ms would load the
    #: server, which serves the job too, more than the job)
    poll_s: float = 0.02
    server: s3server.S3Server | None = None

    def glob(self, pattern: str) -> list[str]:
        fs, _, _ = fsspec.get_fs_token_paths(self.output, storage_options=self.options)
        fs.invalidate_cache()
        return [p.rsplit("/", 1)[-1] for p in fs.glob(f"{self.output}/{pattern}")]

    def checkpoint_names(self, log: str) -> list[int]:
        fs, _, _ = fsspec.get_fs_token_paths(self.checkpoint, storage_options=self.options)
        fs.invalidate_cache()
        names = [p.rsplit("/", 1)[-1] for p in fs.glob(f"{self.checkpoint}/{log}/*")]
        return sorted(int(n) for n in names if n.isdigit())

    def undecided_with_markers(self) -> list[str]:
        """Instants with an ``.inflight``, no ``.outcome`` and markers: a write in progress."""
        names = set(self.glob("_sparkguard/timeline/*"))
        marked = set(self.glob("_sparkguard/markers/*"))
        return [
            n.removesuffix(".inflight")
            for n in names
            if n.endswith(".inflight")
            and n.replace(".inflight", ".outcome") not in names
            and n.removesuffix(".inflight") in marked
        ]


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def query(request: pytest.FixtureRequest, tmp_path: Path) -> Query:
    journal = str(tmp_path / "journal")
    conf = sparkconf.build_spark_conf(JOB, journal=journal)
    if request.param == "local":
        return Query(str(tmp_path / "cp"), str(tmp_path / "out"), journal, conf, {}, seed=29)
    server = request.getfixturevalue("s3_server")
    storage = s3a.spark_conf(server, request.getfixturevalue("s3a_jars"))
    both = {**conf, **storage, "spark.jars": f"{conf['spark.jars']},{storage['spark.jars']}"}
    bucket = server.create_bucket()
    return Query(
        f"s3a://{bucket}/cp",
        f"s3a://{bucket}/out",
        journal,
        both,
        dict(server.storage_options),
        seed=7,
        poll_s=0.1,
        server=server,
    )


def _run_until_killed(
    query: Query, ready: Callable[[], bool], *, delay: float, stall: tuple[Path, int] | None
) -> None:
    """Start the query, wait until ``ready()``, then ``delay`` s, then SIGKILL the whole driver."""
    args = [query.checkpoint, query.output, "1000000"]
    if stall is not None:
        args += [str(stall[0]), str(stall[1])]
    command = job_command("stream_foreach_batch.py", *args, conf=query.conf)
    kill_when(command, ready, delay=delay, poll_s=query.poll_s)


def _rollback(
    query: Query, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    """``sparkguard rollback`` as the rollback initContainer runs it before the restart; then
    the output holds exactly its committed files."""
    summary = rollback_as_init_container(JOB, query.journal, query.options, capsys, monkeypatch)
    committed = sorted(
        p.rsplit("/", 1)[-1]
        for p in reader.committed_paths(query.output, storage_options=query.options)
    )
    assert committed == sorted(query.glob("part-*")), "an orphan data file after the rollback"
    assert query.glob("**/.*.sg-tmp-*") == []
    # Hadoop's local filesystem keeps .<name>.crc beside each file: none outlives its file.
    names = set(query.glob("*"))
    assert [c for c in query.glob(".*.crc") if c[1 : -len(".crc")] not in names] == []
    return summary


def _expected_row(batch: int, k: int) -> list[int]:
    """The update-mode row of key ``k`` after ``batch``: running count and sum of ``value``."""
    values = [v for v in range(ROWS_PER_BATCH * (batch + 1)) if v % KEYS == k]
    return [batch, k, len(values), sum(values)]


def _assert_exactly_once(query: Query) -> int:
    """Restart to a few batches past the last kill; returns the last batch."""
    last = max(query.checkpoint_names("commits"), default=0) + 2
    result = run_job(
        "stream_foreach_batch.py", query.checkpoint, query.output, str(last), conf=query.conf,
        timeout=600,
    )  # fmt: skip
    done = result["lastBatch"]
    expected = [_expected_row(b, k) for b in range(done + 1) for k in range(KEYS)]
    assert result["output"] == expected  # by listing: each batch's rows once, counts exact
    assert result["state"] == {str(b): [KEYS, ROWS_PER_BATCH * (b + 1)] for b in range(done + 1)}, (
        "the state store as of every batch"
    )
    committed = sorted(
        p.rsplit("/", 1)[-1]
        for p in reader.committed_paths(query.output, storage_options=query.options)
    )
    assert committed == sorted(query.glob("part-*"))  # what sparkguard's reader reads, too
    return int(done)


@pytest.mark.slow
def test_foreach_batch_killed_after_its_write_mid_write_and_at_random_is_exactly_once(
    query: Query, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    # After its write: batch 2 stalls once its write committed, and is killed there.
    flag = tmp_path / "stall"
    flag.write_text("batch 2 waits after its write while this file exists\n")
    _run_until_killed(query, writes_committed(query, 3), delay=0.0, stall=(flag, 2))
    assert max(query.checkpoint_names("commits")) == 1, "batch 2 is not recorded by Spark"
    before = sorted(query.glob("part-*"))
    _rollback(query, capsys, monkeypatch)
    assert sorted(query.glob("part-*")) == before, "the committed write of batch 2 is kept"
    flag.unlink()

    # Mid-write: killed while a batch's write has markers and no outcome (the restart first
    # re-executes batch 2, whose write it skips). A kill that came too late (the write had
    # committed) is retried: the case must be covered, not hoped for.
    dead: list[str] = []
    for _ in range(5):
        _run_until_killed(query, lambda: bool(query.undecided_with_markers()), delay=0, stall=None)
        dead = query.undecided_with_markers()
        if dead:
            break
        _rollback(query, capsys, monkeypatch)
    assert dead, "no kill landed inside a write in 5 tries"
    summary = _rollback(query, capsys, monkeypatch)
    assert set(dead) <= set(summary["instantsRolledBack"]), summary

    # At random: the seed picks the moment, not the coverage (local disk, seed 29: 0.11 s
    # after the third batch past the last recorded one; S3, seed 7: 1.42 s after the second).
    rng = random.Random(query.seed)
    target = max(query.checkpoint_names("commits"), default=-1) + rng.randint(1, 3)
    _run_until_killed(
        query,
        lambda: max(query.checkpoint_names("commits"), default=-1) >= target,
        delay=rng.uniform(0.0, 1.5),
        stall=None,
    )
    _rollback(query, capsys, monkeypatch)
    _assert_exactly_once(query)
    # The re-executed batch 2 wrote nothing: its committed files are the first run's.
    batch2 = [n for n in query.glob("part-*") if "-b0000000002-w000-" in n]
    assert batch2
    assert sorted(n for n in before if "-b0000000002-w000-" in n) == sorted(batch2)
    if query.server is not None:  # every offsets/commits file parses (state: read by the job)
        bucket = query.checkpoint.split("/")[2]
        files = checkpoint_files(query.server, bucket, "cp/")
        logs = assert_every_file_parses(
            {k: v for k, v in files.items() if "/state/" not in k}, "cp/"
        )
        assert logs["offsets"]
        assert logs["commits"]


def writes_committed(query: Query, count: int) -> Callable[[], bool]:
    """True once ``count`` writes committed, their files published, and none is in progress.
    (An outcome comes before its publication: a kill between the two is rolled forward, a case
    of its own; here the write must be whole when the driver dies.)"""

    def reached() -> bool:
        outcomes = query.glob("_sparkguard/timeline/*.outcome")
        publishing = query.glob(".*.sg-tmp-*")
        return len(outcomes) >= count and not publishing and not query.undecided_with_markers()

    return reached
