"""Rollback against real storage (local disk and the S3 server), driving the writer in-process.

Executors and the driver are simulated by calling the writer's own task and commit code, which
lets these tests place a crash, a duplicate attempt or a zombie exactly where they want.
"""

from __future__ import annotations

import contextlib
import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors, paths
from sparkguard.spark_lib.spark import writer
from sparkguard.spark_lib.storage import markers, reader, rollback, timeline
from tests.spark_lib.spark_conftest import assert_exactly_once, assert_no_strays, undecided

SCHEMA = StructType([StructField("id", LongType()), StructField("s", StringType())])
PARTS = {0: range(100), 1: range(100, 250), 2: range(250, 300)}


@pytest.fixture(params=["local", "s3"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str, dict[str, Any]]:
    """(table URL, journal URL, storage options) on local disk or the S3 server."""
    if request.param == "local":
        return str(tmp_path / "t"), str(tmp_path / "journal"), {}
    bucket = request.getfixturevalue("s3_bucket")
    return f"{bucket}/t", f"{bucket}/journal", request.getfixturevalue("s3_options")


def _batch(ids: range) -> pa.RecordBatch:
    return pa.record_batch(
        {"id": pa.array(list(ids), pa.int64()), "s": pa.array([f"v{i}" for i in ids])}
    )


def _start(
    url: str, journal: str, options: dict[str, Any], job: str, **write_options: str
) -> writer.BatchWriter:
    cls = writer.source_class(
        {
            "spark.sparkguard.jobId": job,
            "spark.sparkguard.journal": journal,
            "spark.sparkguard.storageOptions": json.dumps(options),
        }
    )
    built = cls(options={"path": url, **write_options}).writer(SCHEMA, False)
    assert isinstance(built, writer.BatchWriter)
    return built


def _task(
    w: writer.BatchWriter, partition: int, ids: range, *, attempt: int = 0, max_records: int = 0
) -> writer.WriteMessage:
    """A task attempt that publishes its files at its end (the streaming writer's rule, and
    what a store that cannot hold a file does): these tests are about rollback of published
    marked files and late files. The batch writer's own rule, files left unpublished for the
    driver, is test_writer_faults.py's and test_lifecycle.py's."""
    import dataclasses

    spec = dataclasses.replace(w.spec, max_records=max_records, publish_after_outcome=False)
    files = writer.write_partition(
        spec, [_batch(ids)], partition=partition, attempt=attempt, token=spec.settings.job_id
    )
    return writer.WriteMessage(partition=partition, attempt=attempt, task_attempt_id=0, files=files)


def _all_rows() -> range:
    return range(300)


def existing_location(url: str, options: dict[str, Any]) -> None:
    """Make the table's location exist before the first write (a file Spark's listing skips):
    its rollback then keeps the location and the timeline, where the rolled-back instant fences
    a zombie and remembers its names (a write that created the location is removed with it:
    tests/spark_lib/test_lifecycle.py)."""
    manager, path = filemanager.resolve(url, storage_options=options)
    manager.write_bytes(paths.join(path, "_existing"), b"", overwrite=True)


def test_duplicate_attempt_leftovers_removed_on_commit(
    where: tuple[str, str, dict[str, Any]],
) -> None:
    url, journal, options = where
    w = _start(url, journal, options, "dup-1")
    # A duplicate (speculative-like) attempt of partition 1 writes two files, then loses.
    _task(w, 1, PARTS[1], attempt=1, max_records=80)
    messages = [_task(w, p, ids) for p, ids in PARTS.items()]
    w.commit(list(messages))
    assert_exactly_once(url, _all_rows(), options)
    assert_no_strays(url, options)
    assert undecided(url, options) == []


def test_zombie_driver_cannot_commit_and_second_pass_removes_late_files(
    where: tuple[str, str, dict[str, Any]],
) -> None:
    url, journal, options = where
    existing_location(url, options)
    w = _start(url, journal, options, "zombie-1")
    messages = [_task(w, p, PARTS[p]) for p in (0, 1)]
    first = rollback.rollback_job("zombie-1", journal, storage_options=options)
    assert first.instants_rolled_back == (w.instant,)
    assert first.files_deleted == 2
    with pytest.raises(errors.InstantDecidedError):
        w.commit(list(messages))  # the zombie driver resumes: refused, publishes nothing
    _task(w, 2, PARTS[2])  # a zombie executor writes after the rollback
    second = rollback.rollback_job("zombie-1", journal, storage_options=options)
    assert second.files_deleted == 1
    assert_no_strays(url, options)
    third = rollback.rollback_job("zombie-1", journal, storage_options=options)
    assert third.files_deleted == 0
    # The re-run (same job id) then writes everything exactly once.
    rerun = _start(url, journal, options, "zombie-1")
    rerun.commit([_task(rerun, p, ids) for p, ids in PARTS.items()])
    assert_exactly_once(url, _all_rows(), options)
    assert_no_strays(url, options)


def test_marker_made_during_a_rollback_survives_it_and_the_next_pass_deletes_its_file(
    where: tuple[str, str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A zombie executor marks and writes a file while the rollback deletes: the rollback
    deletes only the markers it read, so the late marker keeps pointing at the late file. (The
    table existed before: on a location the write created, the removal's listing is the next
    pass, test_lifecycle.py.)"""
    url, journal, options = where
    existing_location(url, options)
    w = _start(url, journal, options, "zombie-2", markerType="DIRECT")
    _task(w, 0, PARTS[0])
    real_delete = rollback._delete

    def delete_with_a_zombie_in_between(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(rollback, "_delete", real_delete)  # once
        _task(w, 1, PARTS[1])  # after the markers were read, before they are deleted
        return real_delete(*args, **kwargs)

    monkeypatch.setattr(rollback, "_delete", delete_with_a_zombie_in_between)
    first = rollback.rollback_job("zombie-2", journal, storage_options=options)
    assert first.files_deleted == 1
    second = rollback.rollback_job("zombie-2", journal, storage_options=options)
    assert second.files_deleted == 1  # the late file, found through its surviving marker
    assert_no_strays(url, options)
    manager, table = filemanager.resolve(url, storage_options=options)
    assert not manager.list_files(markers.marker_dir(table, w.instant))


def test_rollback_keeps_names_a_commit_lists_after_a_failed_rewrite(
    where: tuple[str, str, dict[str, Any]],
) -> None:
    url, journal, options = where
    w = _start(url, journal, options, "keep-1")
    w.commit([_task(w, p, ids) for p, ids in PARTS.items()])
    committed = set(reader.committed_files(url, storage_options=options))
    again = _start(url, journal, options, "keep-1", rerun="rewrite")
    for p, ids in PARTS.items():
        _task(again, p, ids)  # overwrites the committed names with the same rows
    _task(again, 3, range(300, 310))  # and one new name; then the re-run dies
    summary = rollback.rollback_job("keep-1", journal, storage_options=options)
    assert summary.files_kept == 3
    assert summary.files_deleted == 1
    assert set(reader.committed_files(url, storage_options=options)) == committed
    assert_exactly_once(url, _all_rows(), options)
    assert_no_strays(url, options)


def test_commit_that_won_is_left_alone(where: tuple[str, str, dict[str, Any]]) -> None:
    url, _, options = where
    w = _start(url, "", options, "won-1")
    w.commit([_task(w, p, ids) for p, ids in PARTS.items()])
    tl = timeline.timeline_for(url, storage_options=options)
    result = rollback.rollback_instant(tl, w.instant)
    assert result.action is rollback.Action.COMMITTED
    assert result.files_deleted == 0
    assert_exactly_once(url, _all_rows(), options)


def test_dry_run_changes_nothing_and_reports_progress(tmp_path: Path) -> None:
    url, journal = str(tmp_path / "t"), str(tmp_path / "j")
    w = _start(url, journal, {}, "dry-1")
    for p, ids in PARTS.items():
        _task(w, p, ids)
    calls: list[tuple[str, int, int]] = []
    dry = rollback.rollback_job("dry-1", journal, dry_run=True, progress=lambda *a: calls.append(a))
    assert dry.dry_run
    assert dry.files_deleted == 3
    assert undecided(url) == [w.instant]
    real = rollback.rollback_job("dry-1", journal, progress=lambda *a: calls.append(a))
    assert real.files_deleted == 3
    assert ("delete", 3, 3) in calls
    assert ("instants", 1, 1) in calls
    assert json.loads(json.dumps(real.to_json()))["filesDeleted"] == 3


def test_a_killed_commit_s_outcome_temp_file_goes_with_the_rollback(tmp_path: Path) -> None:
    """A committer SIGKILLed while it published its ``.outcome`` (temp file, then the
    put-if-absent rename) left the temp file in timeline/; the table is kept (an earlier commit),
    so only the rollback can remove it. A ``.rolledback``'s temp file (a rollback pass may be
    writing it) stays."""
    url, journal = str(tmp_path / "t"), str(tmp_path / "j")
    done = _start(url, journal, {}, "kept-1")
    done.commit([_task(done, 0, PARTS[0])])
    w = _start(url, journal, {}, "kept-2")
    for p, ids in PARTS.items():
        _task(w, p, ids)
    directory = Path(url) / "_sparkguard" / "timeline"
    outcome_temp = directory / f".{w.instant}.outcome.sg-tmp-0123456789ab"
    outcome_temp.write_bytes(b'{"partial')
    rolledback_temp = directory / f".{w.instant}.rolledback.sg-tmp-ba9876543210"
    rolledback_temp.write_bytes(b"{")
    summary = rollback.rollback_job("kept-2", journal)
    assert summary.files_deleted == 3
    assert summary.temp_files_removed == 1
    names = sorted(p.name for p in directory.iterdir())
    assert not [n for n in names if n.startswith(f".{w.instant}.outcome")], names
    assert rolledback_temp.exists()
    assert (directory / f"{w.instant}.outcome").exists()
    assert timeline.timeline_for(url).status(w.instant).state is timeline.State.ROLLED_BACK


def test_nothing_to_roll_back(tmp_path: Path) -> None:
    summary = rollback.rollback_job("never-ran", str(tmp_path / "journal"))
    assert summary.instants_rolled_back == ()
    assert summary.files_deleted == 0


@pytest.mark.parametrize("type_content", [None, b"", b"TIMELINE_SERVER_BASED\n", b"DIRECT"])
def test_batched_markers_and_missing_or_empty_type_file(
    tmp_path: Path, type_content: bytes | None
) -> None:
    manager, table = filemanager.resolve(str(tmp_path / "t"))
    tl = timeline.Timeline(manager, table)
    instant = tl.start("batched-1", attempt=0, marker_type="TIMELINE_SERVER_BASED")
    mdir = markers.marker_dir(table, instant)
    manager.mkdirs(mdir)
    names = [f"part-{i:05d}-batched-1-c000.parquet" for i in range(5)]
    for name in names:
        manager.write_bytes(paths.join(table, name), b"x")
    manager.write_bytes(
        paths.join(mdir, "MARKERS0"),
        markers.render_batch_file(markers.marker_name(n) for n in names[:3]),
    )
    manager.write_bytes(
        paths.join(mdir, "MARKERS1"),
        markers.render_batch_file(markers.marker_name(n) for n in names[3:]),
    )
    if type_content is not None:
        manager.write_bytes(paths.join(mdir, markers.TYPE_FILE), type_content)
    summary = rollback.rollback_table(str(tmp_path / "t"))
    assert summary.files_deleted == 5
    assert not any(manager.exists(paths.join(table, n)) for n in names)
    assert tl.status(instant).state is timeline.State.ROLLED_BACK


class _CrashError(Exception):
    pass


@pytest.mark.parametrize("seed", range(3))
def test_rollback_resumes_after_a_crash_at_any_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """Crash the rollback at a random storage call (seeded), then run it again: same end."""
    rng = random.Random(seed)
    url, journal = str(tmp_path / "t"), str(tmp_path / "j")
    w = _start(url, journal, {}, "resume-1")
    w.commit([_task(w, p, ids) for p, ids in PARTS.items()])
    failed = _start(url, journal, {}, "resume-1", rerun="rewrite")
    _task(failed, 0, PARTS[0])  # a deterministic re-run: same rows under a committed name
    for p in range(3, 8):
        _task(failed, p, range(1000 + p * 10, 1010 + p * 10), max_records=3)
    for _ in range(4):
        budget = {"left": rng.randrange(1, 12)}
        for cls, name in [
            (filemanager.FileManager, "delete_many"),
            (filemanager.FileManager, "delete_existing"),
            (filemanager.FileManager, "remove_leftovers"),
            (filemanager.FileManager, "put_if_absent"),
            (filemanager.FileManager, "write_bytes"),
            (filemanager.FileManager, "read_bytes"),
        ]:
            original = getattr(cls, name)

            def wrapped(
                self: Any,
                *a: Any,
                __original: Any = original,
                __budget: dict[str, int] = budget,
                **k: Any,
            ) -> Any:
                __budget["left"] -= 1
                if __budget["left"] == 0:
                    raise _CrashError("crash")
                return __original(self, *a, **k)

            monkeypatch.setattr(cls, name, wrapped)
        with contextlib.suppress(_CrashError):
            rollback.rollback_job("resume-1", journal)
        monkeypatch.undo()
    rollback.rollback_job("resume-1", journal)
    assert undecided(url) == []
    assert_exactly_once(url, _all_rows())
    assert_no_strays(url)
