"""The life of a table (docs/storage-contract.md): a rollback of the write that created the
table's location removes it again, and nothing else; a crash at any step of the removal is
finished by the next rollback. The writer runs in-process (tasks and commit called directly),
on local disk and on the S3 server.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StructField, StructType

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors
from sparkguard.spark_lib.spark import writer
from sparkguard.spark_lib.storage import journal, lifecycle, markers, rollback, timeline
from tests.spark_lib.spark_conftest import (
    assert_exactly_once,
    assert_no_strays,
    data_files_on_storage,
    unpublished_leftovers,
)

SCHEMA = StructType([StructField("id", LongType())])
PARTS = {0: range(100), 1: range(100, 250), 2: range(250, 300)}
Where = tuple[str, str, dict[str, Any]]


def _location(request: pytest.FixtureRequest, tmp_path: Path, store: str) -> Where:
    """(table URL, journal URL, storage options) on ``store``: local disk, the S3 server or
    the HDFS minicluster."""
    if store == "local":
        return str(tmp_path / "t"), str(tmp_path / "journal"), {}
    if store == "s3":
        bucket = request.getfixturevalue("s3_bucket")
        return f"{bucket}/t", f"{bucket}/journal", request.getfixturevalue("s3_options")
    cluster = request.getfixturevalue("hdfs_cluster")
    base = cluster.fresh_dir()
    return f"{base}/t", f"{base}/journal", cluster.storage_options


@pytest.fixture(params=["local", "s3"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Where:
    """(table URL, journal URL, storage options) on local disk or the S3 server."""
    return _location(request, tmp_path, request.param)


@pytest.fixture(params=["local", "s3", pytest.param("hdfs", marks=pytest.mark.hdfs)])
def on_every_store(request: pytest.FixtureRequest, tmp_path: Path) -> Where:
    """:func:`where`, and the HDFS minicluster: for the tests of how the writer holds and
    publishes its files, which each store does its own way (a rename on local disk, a delete
    then a rename on HDFS, an upload completion on S3)."""
    return _location(request, tmp_path, request.param)


def _start(url: str, journal_url: str, options: dict[str, Any], job: str) -> writer.BatchWriter:
    cls = writer.source_class(
        {
            "spark.sparkguard.jobId": job,
            "spark.sparkguard.journal": journal_url,
            "spark.sparkguard.storageOptions": json.dumps(options),
        }
    )
    built = cls(options={"path": url}).writer(SCHEMA, False)
    assert isinstance(built, writer.BatchWriter)
    return built


def _task(w: writer.BatchWriter, partition: int) -> writer.WriteMessage:
    ids = PARTS[partition]
    batch = pa.record_batch({"id": pa.array(list(ids), pa.int64())})
    files = writer.write_partition(
        w.spec, [batch], partition=partition, attempt=0, token=w.spec.settings.job_id
    )
    return writer.WriteMessage(partition=partition, attempt=0, task_attempt_id=0, files=files)


def _keys(url: str, options: dict[str, Any]) -> list[str]:
    """Every file and directory (local) or key (S3) under the table's location."""
    manager, path = filemanager.resolve(url, storage_options=options)
    return [info.path for info in manager.list_tree(path)] + (
        [path] if manager.exists(path) else []
    )


def _crashed_first_write(where: Where, job: str = "orders-1") -> writer.BatchWriter:
    """The first write to a new table: two tasks wrote their files (left unpublished: temp
    files, pending uploads, for the driver to publish after the outcome), then the driver
    died."""
    url, journal_url, options = where
    w = _start(url, journal_url, options, job)
    _task(w, 0)
    _task(w, 1)
    return w


def _rerun_commits_everything(where: Where, job: str = "orders-1") -> None:
    url, journal_url, options = where
    rerun = _start(url, journal_url, options, job)
    rerun.commit([_task(rerun, p) for p in PARTS])
    assert_exactly_once(url, range(300), options)
    assert_no_strays(url, options)


def test_a_write_to_a_new_location_records_it_and_one_to_an_existing_table_does_not(
    where: Where,
) -> None:
    url, journal_url, options = where
    first = _start(url, journal_url, options, "orders-1")
    first.commit([_task(first, 0)])
    second = _start(url, journal_url, options, "orders-2")
    tl = timeline.timeline_for(url, storage_options=options)
    first_info, second_info = tl.read_info(first.instant), tl.read_info(second.instant)
    assert first_info is not None
    assert second_info is not None
    assert first_info.extra.get(lifecycle.CREATED_LOCATION) is True
    assert lifecycle.CREATED_LOCATION not in second_info.extra


def test_rollback_of_the_write_that_created_the_table_removes_it_and_the_rerun_creates_it(
    on_every_store: Where,
) -> None:
    url, journal_url, options = where = on_every_store
    w = _crashed_first_write(where)
    summary = rollback.rollback_job("orders-1", journal_url, storage_options=options)
    assert summary.instants_rolled_back == (w.instant,)
    assert (summary.files_deleted, summary.temp_files_removed) == (0, 2)  # never published
    assert summary.tables_removed == (summary.tables[0],)
    assert summary.to_json()["tablesRemoved"] == list(summary.tables)
    assert _keys(url, options) == [], "no file, key or directory is left at the location"
    jmanager, jpath = filemanager.resolve(journal_url, storage_options=options)
    entries = journal.Journal(jmanager, jpath, "orders-1").entries()
    assert [e.instant for e in entries] == [w.instant], "the journal keeps the record"
    again = rollback.rollback_job("orders-1", journal_url, storage_options=options)
    assert again.tables_removed == ()
    assert again.tables_missing == summary.tables  # a later rollback: the table is gone
    _rerun_commits_everything(where)


def test_dry_run_reports_the_removal_and_changes_nothing(tmp_path: Path) -> None:
    where = (str(tmp_path / "t"), str(tmp_path / "journal"), {})
    w = _crashed_first_write(where)
    before = _keys(where[0], {})
    summary = rollback.rollback_job("orders-1", where[1], dry_run=True)
    assert summary.tables_removed == (where[0],)
    assert summary.instants_rolled_back == (w.instant,)
    assert _keys(where[0], {}) == before
    tl = timeline.timeline_for(where[0])
    assert tl.status(w.instant).state is timeline.State.INFLIGHT


def test_rollback_by_table_url_removes_it_too(tmp_path: Path) -> None:
    where = (str(tmp_path / "t"), str(tmp_path / "journal"), {})
    _crashed_first_write(where)
    summary = rollback.rollback_table(where[0], job_id="orders-1")
    assert summary.tables_removed == (where[0],)
    assert not (tmp_path / "t").exists()


def test_spark_leftovers_without_data_are_removed_with_the_location(tmp_path: Path) -> None:
    where = (str(tmp_path / "t"), str(tmp_path / "journal"), {})
    _crashed_first_write(where)
    (tmp_path / "t" / "_SUCCESS").write_bytes(b"")
    (tmp_path / "t" / "._SUCCESS.crc").write_bytes(b"crc")
    (tmp_path / "t" / "k=1").mkdir()
    (tmp_path / "t" / "k=1" / ".part-gone.parquet.crc").write_bytes(b"crc")  # its file is gone
    summary = rollback.rollback_job("orders-1", where[1])
    assert summary.tables_removed == (where[0],)
    assert not (tmp_path / "t").exists()


def test_a_table_that_had_committed_data_is_never_removed(where: Where) -> None:
    url, journal_url, options = where
    first = _start(url, journal_url, options, "orders-0")
    first.commit([_task(first, 0)])
    _crashed_first_write(where, job="orders-1")
    summary = rollback.rollback_job("orders-1", journal_url, storage_options=options)
    assert summary.tables_removed == ()
    assert (summary.files_deleted, summary.temp_files_removed) == (0, 2)  # never published
    assert_exactly_once(url, PARTS[0], options)


def test_a_location_that_held_plain_files_before_the_write_is_never_removed(
    tmp_path: Path,
) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "legacy.parquet").write_bytes(b"not sparkguard's")
    where = (str(tmp_path / "t"), str(tmp_path / "journal"), {})
    _crashed_first_write(where)
    summary = rollback.rollback_job("orders-1", where[1])
    assert summary.tables_removed == ()
    assert summary.warnings == ()  # the write did not create the location: nothing to say
    assert (tmp_path / "t" / "legacy.parquet").read_bytes() == b"not sparkguard's"


def test_an_empty_directory_that_existed_before_the_write_is_kept(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    where = (str(tmp_path / "t"), str(tmp_path / "journal"), {})
    _crashed_first_write(where)
    assert rollback.rollback_job("orders-1", where[1]).tables_removed == ()
    assert (tmp_path / "t" / "_sparkguard" / "timeline").is_dir()


def test_files_put_there_during_the_write_keep_the_location_with_a_warning(
    tmp_path: Path,
) -> None:
    where = (str(tmp_path / "t"), str(tmp_path / "journal"), {})
    _crashed_first_write(where)
    (tmp_path / "t" / "notes.csv").write_text("someone else's")
    summary = rollback.rollback_job("orders-1", where[1])
    assert summary.tables_removed == ()
    assert any("notes.csv" in w and "left in place" in w for w in summary.warnings)
    assert (tmp_path / "t" / "notes.csv").exists()


def test_an_undecided_write_of_another_job_keeps_the_location(where: Where) -> None:
    url, journal_url, options = where
    _crashed_first_write(where, job="orders-1")
    other = _start(url, journal_url, options, "orders-2")
    summary = rollback.rollback_job("orders-1", journal_url, storage_options=options)
    assert summary.tables_removed == ()
    tl = timeline.timeline_for(url, storage_options=options)
    assert tl.status(other.instant).state is timeline.State.INFLIGHT


def test_snapshots_directory_means_history_and_keeps_the_location(tmp_path: Path) -> None:
    where = (str(tmp_path / "t"), str(tmp_path / "journal"), {})
    _crashed_first_write(where)
    (tmp_path / "t" / "_sparkguard" / "snapshots").mkdir()
    assert rollback.rollback_job("orders-1", where[1]).tables_removed == ()
    assert (tmp_path / "t" / "_sparkguard" / "snapshots").is_dir()


class _CrashError(Exception):
    """The injected crash of a rollback (the process would die here)."""


@contextlib.contextmanager
def _crash_at(
    monkeypatch: pytest.MonkeyPatch, manager_class: type[filemanager.FileManager], step: int
) -> Iterator[list[int]]:
    """Make the ``step``-th delete or ``rmdir`` (1-based) of a rollback raise :class:`_CrashError`
    before it runs; yields the count of steps reached."""
    reached = [0]

    def crashing(original: Callable[..., Any]) -> Callable[..., Any]:
        def step_once(self: filemanager.FileManager, path: str) -> Any:
            reached[0] += 1
            if reached[0] == step:
                raise _CrashError(f"crash before step {step}: {original.__name__}({path})")
            return original(self, path)

        return step_once

    with monkeypatch.context() as patch:
        patch.setattr(filemanager.FileManager, "delete", crashing(filemanager.FileManager.delete))
        patch.setattr(
            manager_class,
            "remove_empty_directory",
            crashing(manager_class.remove_empty_directory),
        )
        yield reached


def test_a_crash_at_every_step_of_the_removal_is_finished_by_the_next_rollback(
    where: Where, monkeypatch: pytest.MonkeyPatch
) -> None:
    base_url, base_journal, options = where
    manager_class = type(filemanager.resolve(base_url, storage_options=options)[0])
    step = 0
    while True:
        step += 1
        assert step < 60, "the removal never completed"
        case = (f"{base_url}-{step}", f"{base_journal}-{step}", options)
        _crashed_first_write(case)
        with _crash_at(monkeypatch, manager_class, step) as reached:
            try:
                rollback.rollback_job("orders-1", case[1], storage_options=options)
            except _CrashError:
                crashed = True
            else:
                crashed = False
        if not crashed:
            assert _keys(case[0], options) == []
            break
        summary = rollback.rollback_job("orders-1", case[1], storage_options=options)
        assert _keys(case[0], options) == [], f"crash at step {step} of {reached[0]}: {summary}"
        assert summary.tables_removed == summary.tables or summary.tables_missing
        if manager_class is filemanager.RenameFileManager:  # the S3 tier: the removal only
            _rerun_commits_everything(case)
    print(f"the rollback completed at {step} injected steps")
    assert step > 5, "the removal has more steps than that: the crash was not injected"


@pytest.mark.parametrize(
    ("temp_of", "removed"),
    [(".rolledback", True), (".outcome", True), (".inflight", False)],
)
def test_a_temp_file_of_the_rolled_back_instants_bookkeeping_goes_with_the_location(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, temp_of: str, removed: bool
) -> None:
    """A rollback killed while it replaced ``.rolledback`` (the operator's leader SIGKILLed
    mid-recovery) leaves a temp file of it in ``timeline/``: the next rollback removes the
    location all the same. A temp file of an ``.inflight`` is a writer publishing a new
    instant: the location stays."""
    url, journal_url = str(tmp_path / "t"), str(tmp_path / "journal")
    w = _crashed_first_write((url, journal_url, {}))
    with monkeypatch.context() as patch:  # the pass that was killed before its removal
        patch.setattr(lifecycle, "remove_created_location", lambda *a, **k: None)
        rollback.rollback_job("orders-1", journal_url)
    instant = w.instant if temp_of != ".inflight" else "20991231000000000-orders-2"
    left = tmp_path / "t" / "_sparkguard" / "timeline" / f".{instant}{temp_of}.sg-tmp-0123456789ab"
    left.write_text('{"kind": "sparkguard.instant.rolledback", "complete": fal')
    summary = rollback.rollback_job("orders-1", journal_url)
    if removed:
        assert summary.tables_removed == summary.tables
        assert _keys(url, {}) == [], "the temp file went with the location"
        _rerun_commits_everything((url, journal_url, {}))
    else:
        assert summary.tables_removed == ()
        assert left.exists()


def test_a_writer_that_starts_after_the_listing_is_not_harmed(
    where: Where, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, journal_url, options = where
    _crashed_first_write(where, job="orders-1")
    racing: list[writer.BatchWriter] = []
    plan = lifecycle._deletion_order

    def race_then_plan(*args: Any, **kwargs: Any) -> list[str]:
        racing.append(_start(url, journal_url, options, "orders-2"))  # after the listing
        return plan(*args, **kwargs)

    monkeypatch.setattr(lifecycle, "_deletion_order", race_then_plan)
    summary = rollback.rollback_job("orders-1", journal_url, storage_options=options)
    assert racing, "the removal never listed the table"
    assert summary.tables_removed == ()
    assert any("a writer started on the location" in w for w in summary.warnings)
    tl = timeline.timeline_for(url, storage_options=options)
    assert tl.status(racing[0].instant).state is timeline.State.INFLIGHT
    racing[0].commit([_task(racing[0], p) for p in PARTS])
    assert_exactly_once(url, range(300), options)
    assert_no_strays(url, options)


def test_a_zombie_driver_cannot_commit_after_the_removal(where: Where) -> None:
    _, journal_url, options = where
    w = _crashed_first_write(where)
    messages = [_task(w, 2)]
    rollback.rollback_job("orders-1", journal_url, storage_options=options)
    # The removal deleted the rolled-back outcome (the fence), and the files: W7 refuses.
    with pytest.raises(errors.SparkguardError, match="missing where its task wrote"):
        w.commit([*messages, _task_result_of_removed(w)])
    _rerun_commits_everything(where)


def _task_result_of_removed(w: writer.BatchWriter) -> writer.WriteMessage:
    """What partition 0's task reported before the rollback deleted its file."""
    name = writer.data_file_name(partition=0, token=w.spec.settings.job_id, seq=0, ext="parquet")
    files = (timeline.DataFile(path=name, size=100, rows=100),)
    return writer.WriteMessage(partition=0, attempt=0, task_attempt_id=0, files=files)


def test_a_late_file_published_during_the_pass_goes_with_the_location(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    where = (str(tmp_path / "t"), str(tmp_path / "journal"), {})
    _crashed_first_write(where)
    late = (
        tmp_path / "t" / writer.data_file_name(partition=0, token="orders-1", seq=0, ext="parquet")
    )
    listing = filemanager.RenameFileManager.list_tree

    def zombie_publishes_then_list(self: filemanager.FileManager, path: str) -> Any:
        late.write_bytes(b"a zombie task's file, published after R5")  # a marked name
        return listing(self, path)

    monkeypatch.setattr(filemanager.RenameFileManager, "list_tree", zombie_publishes_then_list)
    summary = rollback.rollback_job("orders-1", where[1])
    assert summary.tables_removed == (where[0],)
    # the late one; the two files the tasks left unpublished are R6's temp files
    assert (summary.files_deleted, summary.temp_files_removed) == (1, 2)
    assert not (tmp_path / "t").exists()


def test_a_late_file_whose_direct_marker_came_after_the_markers_were_read_goes_too(
    where: Where, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A zombie task (direct markers: nothing fences a put) puts its marker after the rollback
    read the marker directory (R7 leaves it), then publishes its file before the removal lists
    the location: the marker names the file as the rolled-back instant's, so it is a late
    file, not a stranger's: the location goes."""
    url, journal_url, options = where
    w = _crashed_first_write(where)
    _, path = filemanager.resolve(url, storage_options=options)
    name = writer.data_file_name(partition=2, token="orders-1", seq=0, ext="parquet")
    read_markers = markers.snapshot_marker_dir

    def then_the_zombie_marks_and_publishes(
        m: filemanager.FileManager, directory: str
    ) -> markers.MarkerDirSnapshot:
        snapshot = read_markers(m, directory)
        markers.DirectMarkerClient(m).create(markers.marker_dir(path, w.instant), name)
        m.write_bytes(f"{path}/{name}", b"a zombie task's file, marked after R4")
        return snapshot

    monkeypatch.setattr(markers, "snapshot_marker_dir", then_the_zombie_marks_and_publishes)
    summary = rollback.rollback_job("orders-1", journal_url, storage_options=options)
    assert summary.tables_removed == summary.tables
    assert summary.warnings == ()
    assert _keys(url, options) == []
    monkeypatch.undo()
    _rerun_commits_everything(where)


def test_conditional_create_probes_are_skipped_by_every_reader_and_go_with_the_location(
    where: Where,
) -> None:
    """A process killed between its conditional-create probe's puts and its delete leaves
    ``.sg-create-probe-<hex>`` beside its first create-if-absent: in the timeline, a marker
    directory, the journal (and a concurrent listing sees one there for a moment, as CI's
    ownership case met in a marker directory). Every reader skips it, and the rollback removes
    the location with it."""
    url, journal_url, options = where
    w = _crashed_first_write(where)
    manager, path = filemanager.resolve(url, storage_options=options)
    journal_manager, journal_path = filemanager.resolve(journal_url, storage_options=options)
    probe = f"{filemanager.CREATE_PROBE_PREFIX}{'0' * 32}"
    for directory in (f"{path}/_sparkguard/timeline", markers.marker_dir(path, w.instant)):
        manager.write_bytes(f"{directory}/{probe}", b"")
    journal_manager.write_bytes(f"{journal_path}/orders-1/{probe}", b"")
    summary = rollback.rollback_job("orders-1", journal_url, storage_options=options)
    assert summary.instants_rolled_back == (w.instant,)
    assert summary.tables_removed == summary.tables
    assert _keys(url, options) == []
    _rerun_commits_everything(where)


def test_a_late_file_published_after_the_removal_goes_with_the_next_rollback(
    where: Where,
) -> None:
    url, journal_url, options = where
    _crashed_first_write(where)
    rollback.rollback_job("orders-1", journal_url, storage_options=options)
    manager, path = filemanager.resolve(url, storage_options=options)
    name = writer.data_file_name(partition=1, token="orders-1", seq=0, ext="parquet")
    manager.write_bytes(f"{path}/{name}", b"a zombie task's file, published late")
    summary = rollback.rollback_job("orders-1", journal_url, storage_options=options)
    assert summary.tables_removed == summary.tables
    assert summary.files_deleted == 1
    assert _keys(url, options) == []
    _rerun_commits_everything(where)


def test_a_location_without_timeline_holding_other_files_is_reported_missing(
    tmp_path: Path,
) -> None:
    where = (str(tmp_path / "t"), str(tmp_path / "journal"), {})
    _crashed_first_write(where)
    rollback.rollback_job("orders-1", where[1])
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "report.parquet").write_bytes(b"someone else's, not named by the job")
    summary = rollback.rollback_job("orders-1", where[1])
    assert summary.tables_removed == ()
    assert summary.tables_missing == (where[0],)
    assert (tmp_path / "t" / "report.parquet").exists()


def test_the_cli_says_which_tables_it_removed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from sparkguard import cli

    where = (str(tmp_path / "t"), str(tmp_path / "journal"), {})
    _crashed_first_write(where)
    argv = ["rollback", "--job-id", "orders-1", "--journal", where[1]]
    assert cli.main([*argv, "--dry-run"]) == 0
    assert f"table would be removed: {where[0]}" in capsys.readouterr().out
    assert cli.main(argv) == 0
    assert f"table removed: {where[0]} (the rolled-back write created" in capsys.readouterr().out
    assert not (tmp_path / "t").exists()


def test_a_driver_dead_inside_the_publication_window_is_rolled_forward_by_the_next_write(
    on_every_store: Where, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outcome written, nothing published, the driver gone, no rollback run: the job's next
    write (a rerun by hand) publishes the committed files at W1 (R8a) before it skips."""
    url, journal_url, options = on_every_store
    w = _start(url, journal_url, options, "orders-1")
    messages = [_task(w, p) for p in PARTS]

    def dies(*_: Any) -> int:
        raise RuntimeError("the driver died after the outcome")

    monkeypatch.setattr(writer, "publish_committed", dies)
    with pytest.raises(RuntimeError, match="after the outcome"):
        w.commit(messages)
    monkeypatch.undo()
    assert data_files_on_storage(url, options) == set()  # committed, not published
    conf = {"spark.sparkguard.jobId": "orders-1", "spark.sparkguard.journal": journal_url}
    conf["spark.sparkguard.storageOptions"] = json.dumps(options)
    rerun = writer.source_class(conf)(options={"path": url}).writer(SCHEMA, False)
    assert isinstance(rerun, writer.SkipWriter)  # W1 rolled forward, then skipped the write
    assert_exactly_once(url, range(300), options)
    assert len(data_files_on_storage(url, options)) == len(PARTS)


def test_only_the_accepted_attempt_is_published_and_no_other_upload_or_temp_file_stays(
    on_every_store: Where,
) -> None:
    """Two attempts of each task write the same names (a retry, a speculative copy); the commit
    gets the second attempt's message: only its files are ever published, the first attempt's
    temp files and pending uploads are removed."""
    url, journal_url, options = on_every_store
    w = _start(url, journal_url, options, "orders-1")
    losers = [_task(w, p) for p in PARTS]
    winners = [_task(w, p) for p in PARTS]
    assert {f.temp or f.upload for m in losers for f in m.files}.isdisjoint(
        {f.temp or f.upload for m in winners for f in m.files}
    )
    assert len(unpublished_leftovers(url, options)) == 2 * len(PARTS)
    w.commit(winners)
    assert_exactly_once(url, range(300), options)
    assert_no_strays(url, options)
    assert unpublished_leftovers(url, options) == []
