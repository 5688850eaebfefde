"""Timeline snapshots and the archive (docs/storage-contract.md, "Snapshots and the archive").

Real storage (local disk and the S3 server) for every step; the history is written through
the timeline API directly (fast), the Spark end-to-end tests are in test_snapshots_spark.py.
"""

from __future__ import annotations

import datetime
import io
import json
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors, paths
from sparkguard.spark_lib.spark import config, writer
from sparkguard.spark_lib.storage import reader, rollback, snapshots, timeline
from sparkguard.spark_lib.tools import commands
from tests.spark_lib.conftest import Store

JOB = "job-a"


class History:
    """Writes instants straight to a table's timeline (no Spark, no data files)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.manager = store.manager
        self.table = store.base
        self.tl = timeline.Timeline(store.manager, store.base)
        self.writes: dict[str, int] = {}

    def commit(
        self,
        job: str = JOB,
        *,
        operation: str = "append",
        files: Sequence[str] | None = None,
        write: int | None = None,
        partitions: Sequence[str] = (),
        rows: int = 5,
    ) -> str:
        if write is None:
            write = self.writes.get(job, 0)
            self.writes[job] = write + 1
        names = files or [f"k={write % 3}/part-00000-{job}-w{write:03d}-c000.parquet"]
        instant = self.tl.start(
            job, attempt=0, marker_type="DIRECT", operation=operation, write=write
        )
        extra: dict[str, Any] = {
            "operation": operation,
            "format": "parquet",
            "schema": '{"type":"struct","fields":[]}',
            "committedAt": reader.now_key(),
        }
        if partitions:
            extra["partitions"] = list(partitions)
        self.tl.commit(
            instant,
            [timeline.DataFile(n, 100 + len(n), rows) for n in names],
            extra=extra,
            write=write,
        )
        return instant

    def rolled_back(self, job: str = JOB, *, marked: Sequence[str] = ()) -> str:
        instant = self.tl.start(job, attempt=0, marker_type="DIRECT", write=99)
        assert self.tl.claim_rollback(instant)
        self.tl.record_rolled_back(
            instant, {"marked": list(marked), "complete": True, "owner": f"job:{job}"}
        )
        return instant

    def inflight(self, job: str = "job-live") -> str:
        return self.tl.start(job, attempt=0, marker_type="DIRECT")

    def visible(self) -> dict[str, timeline.DataFile]:
        return reader.committed_files(self.store.url, storage_options=self.store.options)

    def replay(self) -> dict[str, timeline.DataFile]:
        """The reference: every instant replayed from the hot timeline (before compaction)."""
        return reader.visible_files(reader.load_commits_full(self.manager, self.table))

    def hot(self) -> list[str]:
        return sorted(self.tl.files_by_instant())

    def compact(self, **kwargs: Any) -> snapshots.CompactResult:
        return snapshots.compact(self.manager, self.table, **kwargs)


#: commits of build()'s job-a by default: each kind of operation once, appends around them
#: (every step on S3 is requests: the history is as short as that allows)
BUILT_COMMITS = 7
#: instants build() leaves by default: those commits, a rolled-back one and job-b's commit
BUILT_INSTANTS = BUILT_COMMITS + 2


def build(store: Store, n: int = BUILT_COMMITS) -> History:
    """Appends, an overwrite, an overwrite-partitions, a rewrite of a write the overwrite hid,
    more appends; then a rolled-back instant and another job's commit."""
    h = History(store)
    for i in range(n):
        if i == 2:
            h.commit(operation="overwrite")
        elif i == 4:
            h.commit(operation="overwrite-partitions", partitions=["k=1"])
        elif i == 5:
            h.commit(operation="rewrite", write=1, files=[f"part-00000-{JOB}-w001-c000.parquet"])
        else:
            h.commit()
    h.rolled_back(marked=[f"part-00000-{JOB}-w099-c000.parquet"])
    h.commit("job-b")
    return h


def test_compaction_keeps_the_committed_set_and_empties_the_timeline(durable_store: Store) -> None:
    h = build(durable_store)
    live = h.inflight()
    before = h.replay()
    assert h.visible() == before
    result = h.compact()
    assert result.snapshot == 1
    assert result.covered == BUILT_INSTANTS
    assert result.archived == BUILT_INSTANTS
    assert h.visible() == before
    assert h.hot() == [live]  # only the undecided instant stays hot
    # A second compaction has nothing to do; the reader still agrees.
    assert h.compact().snapshot is None
    assert h.visible() == before
    # More history after the snapshot: snapshot + the rest equals the whole replay.
    h.commit()
    h.commit(operation="overwrite-partitions", partitions=["k=0"])
    expected = reader.visible_files(
        [*snapshots.load_view(h.manager, h.table).commits()]  # what the reader applies
    )
    assert h.visible() == expected
    assert h.compact().snapshot == 2
    assert h.visible() == expected
    # inspect reads the same, and --archived lists the history.
    report = commands.inspect_table(durable_store.url, options=durable_store.options, archived=True)
    assert report["visible"]["files"] == len(expected)
    assert len(report["archived"]) == BUILT_INSTANTS + 2
    assert report["snapshot"]["snapshot"] == 2
    assert report["snapshot"]["latestPointer"] == 2


STEPS = ["C3", "C4", "C5", "C6", "C6.1", "C6.2", "C6.3", "C7"]


class CrashError(Exception):
    pass


def crash_at(step: str) -> Callable[[str], None]:
    def hook(at: str) -> None:
        if at == step:
            raise CrashError(step)

    return hook


@pytest.mark.parametrize("step", STEPS)
def test_a_crash_at_every_step_is_repaired_by_the_next_compaction(
    durable_store: Store, step: str
) -> None:
    h = build(durable_store)
    h.compact()  # snapshot 1
    for _ in range(4):
        h.commit()
    h.rolled_back(marked=["part-00000-job-a-w098-c000.parquet"])
    live = h.inflight()
    expected = h.visible()
    with pytest.raises(CrashError):
        h.compact(hook=crash_at(step))
    assert h.visible() == expected  # a reader right after the crash
    result = h.compact()  # the next compaction repairs whatever was left
    assert h.visible() == expected
    assert h.hot() == [live]
    # After C6 finished there is nothing left to cover; before, the rest is carried.
    assert (result.snapshot is None) == (step in ("C6.3", "C7"))
    # And once more: nothing changes.
    h.compact()
    assert h.visible() == expected
    assert h.hot() == [live]


def test_two_compactors_racing_in_threads(durable_store: Store) -> None:
    h = build(durable_store, n=20)
    expected = h.visible()
    results: list[snapshots.CompactResult] = []
    failures: list[BaseException] = []
    barrier = threading.Barrier(3)

    def run() -> None:
        try:
            barrier.wait()
            results.append(h.compact())
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    assert h.visible() == expected
    assert h.hot() == []
    assert sum(1 for r in results if r.snapshot is not None) >= 1


def test_two_compactors_interleaved_deterministically(durable_store: Store) -> None:
    """B runs whole while A is (1) about to put its snapshot: A loses; (2) about to delete:
    both finish and the reader agrees throughout."""
    h = build(durable_store)
    expected = h.visible()

    def b_runs_at(step: str) -> Callable[[str], None]:
        def hook(at: str) -> None:
            if at == step:
                assert h.visible() == expected
                h.compact()
                assert h.visible() == expected

        return hook

    lost = h.compact(hook=b_runs_at("C3"))
    assert lost.snapshot is None
    assert "first" in lost.reason
    assert h.visible() == expected
    for _ in range(3):
        h.commit()
    expected = h.visible()
    done = h.compact(hook=b_runs_at("C6.1"))
    assert done.snapshot is not None
    assert h.visible() == expected
    assert h.hot() == []


@pytest.mark.parametrize("step", ["C3", "C5", "C6.1"])
def test_a_writer_commits_while_a_snapshot_is_written(durable_store: Store, step: str) -> None:
    h = build(durable_store)
    late: list[str] = []

    def commit_now(at: str) -> None:
        if at == step:
            late.append(h.commit(files=["late/part-00000-job-a-w500-c000.parquet"], write=500))

    h.compact(hook=commit_now)
    visible = h.visible()
    assert "late/part-00000-job-a-w500-c000.parquet" in visible
    assert late[0] in h.hot()  # not covered: it was not in the compactor's listing
    h.compact()
    assert h.visible() == visible
    assert h.hot() == []


def test_an_undecided_instant_stays_hot_and_commits_after_the_snapshot(
    durable_store: Store,
) -> None:
    h = build(durable_store)
    live = h.tl.start(JOB, attempt=0, marker_type="DIRECT", operation="overwrite", write=50)
    h.commit()
    h.compact()
    assert h.hot() == [live]
    h.tl.commit(
        live,
        [timeline.DataFile("part-00000-job-a-w050-c000.parquet", 1, 1)],
        extra={"operation": "overwrite", "committedAt": reader.now_key()},
        write=50,
    )
    assert sorted(h.visible()) == ["part-00000-job-a-w050-c000.parquet"]


def test_an_unsettled_commit_blocks_later_commits_from_the_snapshot(durable_store: Store) -> None:
    """A commit whose markers survive (W10 not done) stays hot, and every commit after it too:
    a snapshot is a prefix of the commit order."""
    h = History(durable_store)
    first = h.commit()
    stuck = h.commit(operation="overwrite")
    h.manager.mkdirs(paths.join(h.table, "_sparkguard", "markers", stuck))
    h.manager.write_bytes(
        paths.join(h.table, "_sparkguard", "markers", stuck, "MARKERS.type"), b"DIRECT"
    )
    after = h.commit()
    expected = h.visible()
    h.compact()
    assert h.hot() == sorted([stuck, after])
    assert first not in h.hot()
    assert h.visible() == expected


def test_a_zombie_commit_after_archiving_is_refused_and_void(durable_store: Store) -> None:
    h = build(durable_store)
    zombie = h.tl.start(JOB, attempt=0, marker_type="DIRECT", write=7)
    assert h.tl.claim_rollback(zombie)
    h.tl.record_rolled_back(zombie, {"marked": [], "complete": True})
    expected = h.visible()
    h.compact()
    assert zombie not in h.hot()
    with pytest.raises(errors.InstantDecidedError, match="archived") as err:
        h.tl.commit(zombie, [timeline.DataFile("part-00000-job-a-w007-c000.parquet", 1, 1)])
    assert err.value.outcome == "archived"
    assert zombie not in h.hot()  # its outcome was withdrawn
    assert h.visible() == expected
    # A zombie killed between its put and its withdrawal leaves a void outcome: ignored by
    # readers, rollback and writers, deleted by the next compaction.
    body = {
        "instant": zombie,
        "outcome": "committed",
        "decided": "2026-01-01T00:00:00+00:00",
        "files": [{"path": "part-00000-job-a-w007-c000.parquet", "size": 1, "rows": 1}],
        "extra": {"operation": "overwrite", "committedAt": reader.now_key()},
    }
    void_path = paths.join(h.tl.directory, f"{zombie}.outcome")
    h.manager.write_bytes(
        void_path, json.dumps({"kind": timeline.OUTCOME_KIND, "version": 1, **body}).encode()
    )
    assert h.visible() == expected
    assert zombie not in h.tl.instant_ids()
    assert (
        rollback.rollback_table(
            durable_store.url, job_id=JOB, storage_options=durable_store.options
        ).instants_rolled_back
        == ()
    )
    h.commit()
    expected = h.visible()
    h.compact()
    assert not h.manager.exists(void_path)
    assert h.visible() == expected


def test_a_stray_rolledback_of_an_archived_instant_is_void(durable_store: Store) -> None:
    """A rollback pass that rewrote ``.rolledback`` after C6 deleted the instant leaves a
    stray file: no writer's O4, no rollback and no reader takes it for an instant."""
    h = History(durable_store)
    gone = h.rolled_back(marked=["part-00000-job-a-w099-c000.parquet"])
    h.commit()
    h.compact()
    assert h.hot() == []
    h.tl.record_rolled_back(gone, {"marked": [], "complete": True})
    assert h.hot() == [gone]
    assert h.tl.instant_ids() == []
    summary = rollback.rollback_table(
        durable_store.url, job_id=JOB, owner="k8s:a/b/c", storage_options=durable_store.options
    )
    assert summary.instants_other_owner == ()
    assert rollback.rollback_instant(h.tl, gone).action is rollback.Action.MISSING
    h.commit()
    h.compact()
    assert h.hot() == []


def _damage(h: History, path: str, data: bytes = b'{"kind": "sparkguard.timeline.snap') -> None:
    h.manager.write_bytes(path, data, overwrite=True)


def test_a_damaged_newest_snapshot_falls_back_to_the_older_one_and_its_archive(
    durable_store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    h = build(durable_store)
    h.compact()
    for _ in range(5):
        h.commit()
    h.commit(operation="overwrite")
    h.commit()
    expected = h.visible()
    h.compact()
    _damage(h, snapshots.snapshot_path(h.table, 2))
    assert h.visible() == expected
    assert "damaged snapshot" in caplog.text
    # The next compaction writes snapshot 3 over 1 + archive 2; the damaged one is skipped.
    h.commit()
    expected = h.visible()
    assert h.compact().snapshot == 3
    assert h.visible() == expected
    # Every snapshot damaged: the archives are replayed.
    for n in (1, 3):
        _damage(h, snapshots.snapshot_path(h.table, n), b"garbage")
    assert h.visible() == expected


def test_a_damaged_snapshot_whose_history_is_gone_is_an_error_naming_the_fix(
    durable_store: Store,
) -> None:
    h = build(durable_store)
    for _ in range(5):
        h.commit()
        h.compact(archive_retention_days=0)
    numbers = sorted(snapshots.list_snapshots(h.manager, h.table))
    assert numbers == [3, 4, 5]  # C7 keeps the newest 3
    for n in numbers:
        _damage(h, snapshots.snapshot_path(h.table, n))
    with pytest.raises(errors.CorruptFileError, match="restore the snapshot file"):
        h.visible()


@pytest.mark.parametrize("latest", [None, b"1\n", b"garbage", b"999\n"])
def test_the_latest_pointer_is_only_a_hint(durable_store: Store, latest: bytes | None) -> None:
    h = build(durable_store)
    h.compact()
    h.commit()
    h.commit(operation="overwrite")
    h.compact()
    expected = h.visible()
    pointer = paths.join(snapshots.snapshots_dir(h.table), snapshots.LATEST_NAME)
    if latest is None:
        h.manager.delete(pointer)
    else:
        h.manager.write_bytes(pointer, latest, overwrite=True)
    assert h.visible() == expected
    h.commit()
    expected = h.visible()
    assert h.compact().snapshot == 3
    assert h.visible() == expected
    assert snapshots.read_latest(h.manager, h.table) == 3


def test_pruning_keeps_three_snapshots_and_archives_unless_retention(
    durable_store: Store,
) -> None:
    h = History(durable_store)
    for _ in range(5):
        h.commit()
        h.compact()
    assert sorted(snapshots.list_snapshots(h.manager, h.table)) == [3, 4, 5]
    archives = [i.name for i in h.manager.list(snapshots.archive_dir(h.table))]
    assert len(archives) == 5
    h.commit()
    h.compact(archive_retention_days=0)
    archives = [i.name for i in h.manager.list(snapshots.archive_dir(h.table))]
    assert sorted(archives) == [f"{n:012d}.archive" for n in (4, 5, 6)]
    assert len(h.visible()) == 6


def _write_data(store: Store, relative: str) -> None:
    store.manager.write_bytes(paths.join(store.base, relative), b"late", overwrite=True)


def test_late_file_of_an_archived_rolled_back_instant_is_swept(durable_store: Store) -> None:
    """R9 and W8 for an instant the snapshot archived: its marked names are in the snapshot."""
    h = History(durable_store)
    name = f"part-00000-{JOB}-w000-c000.parquet"
    h.rolled_back(marked=[name])
    kept = f"part-00000-{JOB}-w001-c000.parquet"
    h.rolled_back(marked=[kept])
    h.commit(files=[kept], write=1)  # the rerun committed this name: never deleted
    h.compact()
    assert h.hot() == []
    _write_data(durable_store, name)  # a zombie task publishes after everything
    _write_data(durable_store, kept)
    summary = rollback.rollback_table(
        durable_store.url, job_id=JOB, storage_options=durable_store.options
    )
    assert summary.files_deleted == 1
    assert not h.manager.exists(paths.join(h.table, name))
    assert h.manager.exists(paths.join(h.table, kept))
    # W8: the writer's pre-commit sweep finds the archived names too.
    _write_data(durable_store, name)
    live = h.tl.start(JOB, attempt=0, marker_type="DIRECT", write=5)
    assert rollback.sweep_late_files(h.tl, job_id=JOB, instant=live, keep=[]) == 1
    assert not h.manager.exists(paths.join(h.table, name))
    assert h.manager.exists(paths.join(h.table, kept))


def test_rerun_skip_finds_an_archived_committed_write(durable_store: Store) -> None:
    h = History(durable_store)
    first = h.commit(write=0)
    h.commit(write=1)
    h.commit("job-b", write=0)
    settings_ = config.WriteSettings(job_id=JOB, storage_options=durable_store.options)
    target = writer.open_target(durable_store.url, settings_)
    assert writer.committed_write(target, JOB, 0) == first
    h.compact()
    assert h.hot() == []
    assert writer.committed_write(target, JOB, 0) == first
    assert writer.committed_write(target, JOB, 2) is None
    # The commit's keep set: names the job's archived commits list are never deleted.
    history = snapshots.job_history(h.manager, h.table, JOB)
    assert f"k=0/part-00000-{JOB}-w000-c000.parquet" in history.names
    assert all(f"-{JOB}-" in n for n in history.names)
    assert rollback.committed_names(
        h.tl, job_id=JOB, marked=[f"k=0/part-00000-{JOB}-w000-c000.parquet"]
    ) == {f"k=0/part-00000-{JOB}-w000-c000.parquet"}


def test_automatic_compaction_after_a_commit_is_best_effort(
    durable_store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    h = History(durable_store)
    settings_ = config.parse_settings(
        conf={"spark.sparkguard.jobId": JOB, "spark.sparkguard.timeline.snapshotEvery": "3"}
    )
    h.commit()
    h.commit()
    assert writer.maybe_compact(h.manager, h.table, settings_) is None
    h.commit()
    result = writer.maybe_compact(h.manager, h.table, settings_)
    assert result is not None
    assert result.snapshot == 1
    off = config.parse_settings(
        conf={"spark.sparkguard.jobId": JOB, "spark.sparkguard.timeline.snapshotEvery": "0"}
    )
    for _ in range(3):
        h.commit()
    assert writer.maybe_compact(h.manager, h.table, off) is None

    def broken(*_: Any, **__: Any) -> snapshots.CompactResult:
        raise OSError("storage down")

    monkeypatch.setattr(snapshots, "compact", broken)
    assert writer.maybe_compact(h.manager, h.table, settings_) is None
    assert "compaction of" in caplog.text
    assert "storage down" in caplog.text


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("spark.sparkguard.timeline.snapshotEvery", "-1", "snapshotEvery='-1' is not valid"),
        ("spark.sparkguard.timeline.snapshotEvery", "ten", "integer >= 0"),
        ("spark.sparkguard.timeline.archiveRetentionDays", "-2", "archiveRetentionDays"),
        ("spark.sparkguard.timeline.archiveRetentionDays", "nan", "number of days"),
    ],
)
def test_bad_compaction_settings_are_refused(key: str, value: str, match: str) -> None:
    with pytest.raises(errors.ConfigError, match=match):
        config.parse_settings(conf={"spark.sparkguard.jobId": JOB, key: value})
    good = config.parse_settings(
        conf={
            "spark.sparkguard.jobId": JOB,
            "spark.sparkguard.timeline.archiveRetentionDays": "1.5",
        }
    )
    assert good.archive_retention_days == 1.5
    assert good.snapshot_every == 10


def test_compact_cli(durable_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    h = build(durable_store)
    out = io.StringIO()
    assert (
        commands.run_compact(
            durable_store.url, as_json=True, options=durable_store.options, out=out
        )
        == 0
    )
    report = json.loads(out.getvalue())
    assert report["snapshot"] == 1
    assert report["instantsCovered"] == BUILT_INSTANTS
    assert report["instantsDeleted"] == BUILT_INSTANTS
    out = io.StringIO()
    commands.run_compact(durable_store.url, as_json=False, options=durable_store.options, out=out)
    assert "no snapshot written (nothing to compact)" in out.getvalue()
    out = io.StringIO()
    commands.run_inspect(
        durable_store.url, as_json=False, options=durable_store.options, out=out, archived=True
    )
    assert "archived instants" in out.getvalue()
    assert "snapshot 1" in out.getvalue()
    assert h.hot() == []


def test_compact_cli_bad_input(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from sparkguard import cli

    assert cli.main(["compact", str(tmp_path / "missing")]) == 2
    assert "table" in capsys.readouterr().err
    (tmp_path / "plain").mkdir()
    assert cli.main(["compact", str(tmp_path / "plain")]) == 2
    assert "no sparkguard timeline" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["compact", str(tmp_path / "plain"), "--archive-retention-days", "-1"])
    assert "--archive-retention-days" in capsys.readouterr().err


# -- the property: snapshot + the rest == the whole history ------------------------------------

OPS = st.sampled_from(["append", "append", "overwrite", "overwrite-partitions", "rewrite"])


def _commits(ops: list[tuple[str, int, int]]) -> list[reader.Commit]:
    commits = []
    for i, (op, write, part) in enumerate(ops):
        job = "job-a" if write % 2 == 0 else "job-b"
        files = (
            timeline.DataFile(f"k={part}/part-00000-{job}-w{write:03d}-c000.parquet", 1, 1),
            timeline.DataFile(
                f"k={(part + 1) % 3}/part-00001-{job}-w{write:03d}-c000.parquet", 1, 1
            ),
        )
        commits.append(
            reader.Commit(
                order=f"{i:020d}",
                source=f"{i:017d}-{job}",
                job_id=job,
                operation=reader.Operation(op),
                files=files,
                write=write,
                partitions=(f"k={part}",) if op == "overwrite-partitions" else (),
            )
        )
    return commits


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(st.tuples(OPS, st.integers(0, 4), st.integers(0, 2)), max_size=14),
    cuts=st.lists(st.integers(0, 14), max_size=3),
)
def test_property_snapshot_then_rest_equals_the_whole_history(
    ops: list[tuple[str, int, int]], cuts: list[int]
) -> None:
    commits = _commits(ops)
    whole = reader.visible_files(commits)
    superseded = reader.superseded_files(commits)
    kept: list[reader.Commit] = []
    gone: list[str] = []
    done = 0
    for cut in sorted(min(c, len(commits)) for c in cuts):
        kept, gone = snapshots.fold_commits([*kept, *commits[done:cut]], gone)
        done = cut
        # Round trip through the document too.
        snap = snapshots.Snapshot(1, None, "t", (), "", tuple(kept), tuple(gone), {}, {})
        again = snapshots.Snapshot.decode(snap.encode(), source="s", number=1)
        assert list(again.commits) == kept
    assert reader.visible_files([*kept, *commits[done:]]) == whole
    assert set(gone) | reader.superseded_files([*kept, *commits[done:]]) >= superseded - set(whole)


@settings(max_examples=15, deadline=None)
@given(
    ops=st.lists(st.tuples(OPS, st.integers(0, 3), st.integers(0, 2)), min_size=1, max_size=8),
    every=st.integers(1, 4),
)
def test_property_on_storage_compacting_as_it_goes(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int, int]], every: int
) -> None:
    base = str(tmp_path_factory.mktemp("prop") / "t")
    manager, table = filemanager.resolve(base)
    store = Store("local", manager, table, base, {})
    h = History(store)
    plain_manager, plain_table = filemanager.resolve(base + "-plain")
    plain = History(Store("local", plain_manager, plain_table, base + "-plain", {}))
    for i, (op, write, part) in enumerate(ops):
        job = "job-a" if write % 2 == 0 else "job-b"
        kwargs: dict[str, Any] = {
            "operation": op,
            "write": write,
            "files": [f"k={part}/part-00000-{job}-w{write:03d}-c{i:03d}.parquet"],
            "partitions": [f"k={part}"] if op == "overwrite-partitions" else (),
        }
        h.commit(job, **kwargs)
        plain.commit(job, **kwargs)
        if i % every == 0:
            h.compact()
        assert sorted(h.visible()) == sorted(plain.replay())


def test_snapshot_document_is_checked_strictly() -> None:
    snap = snapshots.Snapshot(
        2,
        1,
        "2026-01-01T00:00:00+00:00",
        ("20260101000000000-job-a",),
        "1",
        (),
        (),
        {},
        {},
    )
    data = json.loads(snap.encode())
    for key, bad in [
        ("snapshot", "2"),
        ("instants", ["not-an-instant"]),
        ("maxOrder", "x"),
        ("commits", [{"order": "1"}]),
        ("jobs", {"a": {"writes": [{"write": "0"}], "rolledBack": []}}),
        ("version", 2),
    ]:
        broken = {**data, key: bad}
        with pytest.raises(errors.CorruptFileError):
            snapshots.Snapshot.decode(json.dumps(broken).encode(), source="s", number=2)
    with pytest.raises(errors.CorruptFileError, match="not 3"):
        snapshots.Snapshot.decode(snap.encode(), source="s", number=3)
    # Unknown fields are ignored.
    extended = json.dumps({**data, "future": 1}).encode()
    assert snapshots.Snapshot.decode(extended, source="s", number=2) == snap


def test_rolled_back_names_leave_the_snapshot_after_the_retention(durable_store: Store) -> None:
    h = History(durable_store)
    h.rolled_back(marked=["part-00000-job-a-w099-c000.parquet"])
    h.compact()
    assert snapshots.job_history(h.manager, h.table, JOB).rolled_back
    h.commit()
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=8)
    h.compact(now=later)
    assert not snapshots.job_history(h.manager, h.table, JOB).rolled_back


def test_a_reader_whose_snapshot_was_superseded_mid_read_reads_again(
    durable_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compaction that writes snapshot n+1 and deletes its instants between the reader's
    snapshot and its timeline listing: the reader sees n+1 exists and starts again (without
    that check it would lose the commits only n+1 covers)."""
    h = build(durable_store)
    h.compact()
    for _ in range(5):
        h.commit()
    expected = h.visible()
    original = snapshots._load_snapshot
    raced: list[int] = []

    def load_then_compact(manager: Any, table: str) -> Any:
        loaded = original(manager, table)
        if not raced:
            raced.append(1)
            h.compact()  # snapshot 2, the five hot instants archived and deleted
        return loaded

    monkeypatch.setattr(snapshots, "_load_snapshot", load_then_compact)
    assert h.visible() == expected
    assert raced == [1]
    assert h.hot() == []


def test_a_damaged_snapshot_with_a_damaged_archive_is_an_error(durable_store: Store) -> None:
    h = build(durable_store)
    h.compact()
    h.commit()
    h.compact()
    _damage(h, snapshots.snapshot_path(h.table, 2))
    h.manager.write_bytes(snapshots.archive_path(h.table, 2), b"{torn", overwrite=True)
    with pytest.raises(errors.CorruptFileError, match="restore either file"):
        h.visible()
