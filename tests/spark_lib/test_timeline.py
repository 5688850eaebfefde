"""Timeline and journal: instants decided exactly once; the journal indexes a job's instants."""

from __future__ import annotations

import threading

import pytest

from sparkguard.spark_lib.base import errors, paths
from sparkguard.spark_lib.storage import journal, timeline
from tests.spark_lib.conftest import Store

FILES = [timeline.DataFile(path="part-00000-job-a-c000.parquet", size=10, rows=2)]


def test_instant_lifecycle_commit(store: Store) -> None:
    tl = timeline.Timeline(store.manager, store.base)
    instant = tl.start("job-a", attempt=0, marker_type="DIRECT")
    assert timeline.job_of_instant(instant) == "job-a"
    assert tl.status(instant).state is timeline.State.INFLIGHT
    tl.commit(instant, FILES, extra={"rows": 2})
    status = tl.status(instant)
    assert status.state is timeline.State.COMMITTED
    assert status.files == tuple(FILES)
    assert status.info is not None
    assert status.info.job_id == "job-a"
    assert tl.committed_files() == {"part-00000-job-a-c000.parquet": instant}
    # A rollback after the commit leaves it alone.
    assert tl.claim_rollback(instant) is False


def test_instant_lifecycle_rollback_fences_zombie_commit(store: Store) -> None:
    tl = timeline.Timeline(store.manager, store.base)
    instant = tl.start("job-a", attempt=0, marker_type="DIRECT")
    assert tl.claim_rollback(instant) is True
    assert tl.status(instant).state is timeline.State.ROLLING_BACK
    assert tl.claim_rollback(instant) is True  # resumable: a second pass still owns it
    with pytest.raises(errors.InstantDecidedError, match="already decided as rolled_back") as err:
        tl.commit(instant, FILES)
    assert err.value.outcome == "rolled_back"
    tl.record_rolled_back(instant, {"deleted": ["x"]})
    assert tl.status(instant).state is timeline.State.ROLLED_BACK
    assert tl.committed_files() == {}


def test_commit_and_rollback_race_exactly_one_wins(store: Store) -> None:
    tl = timeline.Timeline(store.manager, store.base)
    for _ in range(5):
        instant = tl.start("job-race", attempt=0, marker_type="DIRECT")
        results: dict[str, bool] = {}
        barrier = threading.Barrier(2)

        def commit(
            instant: str = instant,
            results: dict[str, bool] = results,
            barrier: threading.Barrier = barrier,
        ) -> None:
            barrier.wait()
            try:
                tl.commit(instant, FILES)
                results["commit"] = True
            except errors.InstantDecidedError:
                results["commit"] = False

        def rollback(
            instant: str = instant,
            results: dict[str, bool] = results,
            barrier: threading.Barrier = barrier,
        ) -> None:
            barrier.wait()
            results["rollback"] = tl.claim_rollback(instant)

        threads = [threading.Thread(target=commit), threading.Thread(target=rollback)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results["commit"] != results["rollback"], results
        expected = timeline.State.COMMITTED if results["commit"] else timeline.State.ROLLING_BACK
        assert tl.status(instant).state is expected


def test_instants_sorted_and_filtered_by_job(store: Store) -> None:
    tl = timeline.Timeline(store.manager, store.base)
    a1 = tl.start("job-a", attempt=0, marker_type="DIRECT")
    b1 = tl.start("job-b", attempt=0, marker_type="DIRECT")
    a2 = tl.start("job-a", attempt=1, marker_type="DIRECT")
    assert tl.instant_ids() == sorted([a1, b1, a2])
    assert tl.instant_ids(job_id="job-a") == sorted([a1, a2])
    assert [s.instant for s in tl.statuses(job_id="job-b")] == [b1]


@pytest.mark.parametrize(
    "bad", ["", "Job", "job_a", "-job", "job-", "a" * 101, "../x", "a/b", "sales\n"]
)
def test_bad_job_ids_are_rejected(store: Store, bad: str) -> None:
    tl = timeline.Timeline(store.manager, store.base)
    with pytest.raises(errors.ConfigError, match=r"job id .* is not valid"):
        tl.start(bad, attempt=0, marker_type="DIRECT")
    assert store.manager.list(store.base) == []


def test_corrupt_and_foreign_timeline_files_are_loud(store: Store) -> None:
    tl = timeline.Timeline(store.manager, store.base)
    instant = tl.start("job-a", attempt=0, marker_type="DIRECT")
    store.manager.write_bytes(paths.join(tl.directory, f"{instant}.outcome"), b"[]")
    with pytest.raises(errors.CorruptFileError, match="holds list"):
        tl.status(instant)
    store.manager.write_bytes(paths.join(tl.directory, "README"), b"hi")
    with pytest.raises(errors.CorruptFileError, match="unexpected file"):
        tl.instant_ids()


def test_journal_lists_a_jobs_tables_and_instants(store: Store) -> None:
    root = paths.join(store.base, "journal")
    j = journal.Journal(store.manager, root, "job-a")
    t1 = timeline.Timeline(store.manager, paths.join(store.base, "t1"))
    t2 = timeline.Timeline(store.manager, paths.join(store.base, "t2"))
    i1 = t1.start("job-a", attempt=0, marker_type="DIRECT")
    i2 = t2.start("job-a", attempt=0, marker_type="DIRECT")
    j.record(table="s3://bucket/t1", instant=i1, attempt=0)
    j.record(table="s3://bucket/t1", instant=i1, attempt=0)  # idempotent
    j.record(table="s3://bucket/t2", instant=i2, attempt=0)
    entries = j.entries()
    assert [(e.table, e.instant) for e in entries] == sorted(
        [("s3://bucket/t1", i1), ("s3://bucket/t2", i2)], key=lambda x: (x[1], x[0])
    )
    assert j.tables() == ["s3://bucket/t1", "s3://bucket/t2"]
    assert journal.Journal(store.manager, root, "job-b").entries() == []
    with pytest.raises(errors.ConfigError, match="belongs to job 'job-a'"):
        journal.Journal(store.manager, root, "job-b").record(table="x", instant=i1, attempt=0)


def test_inflight_records_owner_and_write_identity(store: Store) -> None:
    tl = timeline.Timeline(store.manager, store.base)
    instant = tl.start("job-w", attempt=0, marker_type="DIRECT", owner="k8s:ns/app/1", write=2)
    info = tl.read_info(instant)
    assert info is not None
    assert (info.owner, info.write) == ("k8s:ns/app/1", 2)
    assert tl.status(instant).owner == "k8s:ns/app/1"
    plain = tl.start("job-w", attempt=0, marker_type="DIRECT")
    assert (tl.status(plain).owner, tl.status(plain).info.write) == ("job:job-w", None)  # type: ignore[union-attr]
    with pytest.raises(errors.ConfigError, match="owner"):
        tl.start("job-w", attempt=0, marker_type="DIRECT", owner="")
