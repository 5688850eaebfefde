"""The rollback side of the storage contract (docs/storage-contract.md), against real storage.

Late files of zombie tasks, a sidecar-format append racing rollback's delete, torn and garbage
marker files, temp leftovers of a killed writer, and counts that are true. Writes go through
the writer's own driver and task code in-process (see test_rollback.py), or a real process.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sparkguard import cli
from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors, paths
from sparkguard.spark_lib.spark import writer
from sparkguard.spark_lib.storage import journal, markers, reader, rollback, timeline
from sparkguard.spark_lib.tools import commands
from tests.spark_lib.spark_conftest import assert_exactly_once, assert_no_strays, undecided
from tests.spark_lib.test_rollback import PARTS, _batch, _start, _task, existing_location


@pytest.fixture(params=["local", "s3"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str, dict[str, Any]]:
    """(table URL, journal URL, storage options) on local disk or the S3 server."""
    if request.param == "local":
        return str(tmp_path / "t"), str(tmp_path / "journal"), {}
    bucket = request.getfixturevalue("s3_bucket")
    return f"{bucket}/t", f"{bucket}/journal", request.getfixturevalue("s3_options")


def _exists(url: str, options: dict[str, Any], relative: str) -> bool:
    manager, table = filemanager.resolve(url, storage_options=options)
    return manager.exists(paths.join(table, relative))


# --------------------------------------------------------------------------------------------
# Late files of zombie tasks.
# --------------------------------------------------------------------------------------------


def _zombie_task(
    w: writer.BatchWriter,
    partition: int,
    ids: range,
    during: Callable[[], object],
    monkeypatch: pytest.MonkeyPatch,
) -> writer.WriteMessage:
    """A task that stalls right after its marker is created: ``during()`` runs then (the
    rollback), and the task opens and publishes its file afterwards (a zombie)."""
    real_create = markers.DirectMarkerClient.create

    def create_then_stall(self: markers.DirectMarkerClient, *args: Any, **kwargs: Any) -> None:
        monkeypatch.setattr(markers.DirectMarkerClient, "create", real_create)
        real_create(self, *args, **kwargs)
        during()

    monkeypatch.setattr(markers.DirectMarkerClient, "create", create_then_stall)
    # Published at task end (see test_rollback._task): a zombie's late file, as a rollback
    # meets it from the streaming writer or a store that cannot hold a file.
    spec = dataclasses.replace(w.spec, publish_after_outcome=False)
    files = writer.write_partition(
        spec, [_batch(ids)], partition=partition, attempt=0, token=w.spec.settings.job_id
    )
    return writer.WriteMessage(partition=partition, attempt=0, task_attempt_id=0, files=files)


def test_file_published_after_rollback_is_removed_by_the_next_pass(
    where: tuple[str, str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, journal, options = where
    w = _start(url, journal, options, "late-1", markerType="DIRECT")
    _task(w, 0, PARTS[0])
    passes: list[rollback.RollbackSummary] = []
    late = _zombie_task(
        w,
        1,
        PARTS[1],
        lambda: passes.append(rollback.rollback_job("late-1", journal, storage_options=options)),
        monkeypatch,
    )
    (late_file,) = [f.path for f in late.files]
    assert _exists(url, options, late_file)  # published after the pass, with no marker left
    assert late_file not in reader.committed_files(url, storage_options=options)
    second = rollback.rollback_job("late-1", journal, storage_options=options)
    assert not _exists(url, options, late_file)
    assert second.files_deleted == 1
    assert passes[0].files_deleted == 1  # partition 0's file; the zombie's was not there yet
    assert_no_strays(url, options)


def test_file_published_after_rollback_is_removed_before_the_next_commit(
    where: tuple[str, str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, journal, options = where
    existing_location(url, options)
    w = _start(url, journal, options, "late-2", markerType="DIRECT")
    late = _zombie_task(
        w,
        3,
        range(300, 310),
        lambda: rollback.rollback_job("late-2", journal, storage_options=options),
        monkeypatch,
    )
    (late_file,) = [f.path for f in late.files]
    assert _exists(url, options, late_file)
    # The rerun (same job) writes partitions 0-2 only; its commit removes the late file.
    rerun = _start(url, journal, options, "late-2")
    rerun.commit([_task(rerun, p, ids) for p, ids in PARTS.items()])
    assert not _exists(url, options, late_file)
    assert_exactly_once(url, range(300), options)
    assert_no_strays(url, options)


# --------------------------------------------------------------------------------------------
# A sidecar-format append racing rollback's delete.
# --------------------------------------------------------------------------------------------


def _batched_instant(
    url: str, options: dict[str, Any], job: str, count: int
) -> tuple[timeline.Timeline, str, str, list[str]]:
    """An inflight instant with batched markers (sidecar format) for ``count`` existing files."""
    manager, table = filemanager.resolve(url, storage_options=options)
    tl = timeline.Timeline(manager, table)
    instant = tl.start(job, attempt=0, marker_type="TIMELINE_SERVER_BASED")
    mdir = markers.marker_dir(table, instant)
    manager.mkdirs(mdir)
    names = [f"part-{i:05d}-{job}-c000.parquet" for i in range(count)]
    for name in names:
        manager.write_bytes(paths.join(table, name), b"x")
    manager.write_bytes(
        paths.join(mdir, markers.TYPE_FILE), markers.MarkerType.TIMELINE_SERVER_BASED.value.encode()
    )
    return tl, instant, mdir, names


def test_sidecar_append_after_rollback_read_the_batch_file_is_not_lost(
    where: tuple[str, str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _, options = where
    tl, instant, mdir, names = _batched_instant(url, options, "race-1", 3)
    manager = tl.manager
    batch_file = paths.join(mdir, "MARKERS3")
    first = markers.render_batch_file(markers.marker_name(n) for n in names[:2])
    manager.write_bytes(batch_file, first, overwrite=True)
    late_name = "part-00009-race-1-c000.parquet"
    real_delete = rollback._delete

    def delete_then_sidecar_appends(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(rollback, "_delete", real_delete)
        result = real_delete(*args, **kwargs)
        # After rollback read MARKERS3: the sidecar appends (rewrites the file with one more
        # line) and acknowledges; the executor then writes the file.
        manager.write_bytes(
            batch_file,
            first + markers.render_batch_file([markers.marker_name(late_name)]),
            overwrite=True,
        )
        manager.write_bytes(paths.join(tl.table, late_name), b"late")
        return result

    monkeypatch.setattr(rollback, "_delete", delete_then_sidecar_appends)
    rollback.rollback_table(url, storage_options=options)
    # Either this pass dealt with the appended marker, or it left it for the next pass.
    late_marker_kept = manager.exists(batch_file)
    assert late_marker_kept or not _exists(url, options, late_name)
    rollback.rollback_table(url, storage_options=options)
    assert not _exists(url, options, late_name)
    assert not manager.list_files(mdir)
    assert late_name in tl.status(instant).rolled_back_names


# --------------------------------------------------------------------------------------------
# Damaged marker files.
# --------------------------------------------------------------------------------------------


def test_torn_last_line_is_tolerated_and_its_file_found_by_prefix(
    where: tuple[str, str, dict[str, Any]],
) -> None:
    url, _, options = where
    tl, instant, mdir, names = _batched_instant(url, options, "torn-1", 3)
    content = markers.render_batch_file(markers.marker_name(n) for n in names[:2])
    torn = markers.marker_name(names[2])[:18].encode()  # "part-00002-torn-1-": no newline
    tl.manager.write_bytes(paths.join(mdir, "MARKERS0"), content + torn)
    out = io.StringIO()
    assert commands.run_inspect(url, as_json=True, options=options, out=out) == 0
    (row,) = json.loads(out.getvalue())["instants"]
    assert row["marked"] == 2
    assert "torn last line" in row["warnings"][0]
    dry = rollback.rollback_table(url, storage_options=options, dry_run=True)
    assert dry.files_deleted == 3
    summary = rollback.rollback_table(url, storage_options=options)
    assert summary.files_deleted == 3
    assert any("torn last line" in w and "MARKERS0" in w for w in summary.warnings)
    assert not any(_exists(url, options, n) for n in names)
    assert tl.status(instant).state is timeline.State.ROLLED_BACK


def test_garbage_marker_line_names_file_instant_and_fix_and_other_instants_proceed(
    where: tuple[str, str, dict[str, Any]],
) -> None:
    url, _, options = where
    tl, bad, mdir, names = _batched_instant(url, options, "garbage-1", 2)
    garbage = (
        markers.render_batch_file([markers.marker_name(names[0])])
        + b"\x00garbage\xff line\n"
        + markers.render_batch_file([markers.marker_name(names[1])])
    )
    bad_file = paths.join(mdir, "MARKERS1")
    tl.manager.write_bytes(bad_file, garbage)
    _, good, _, good_names = _batched_instant(url, options, "garbage-2", 1)
    good_dir = markers.marker_dir(tl.table, good)
    tl.manager.write_bytes(
        paths.join(good_dir, "MARKERS0"),
        markers.render_batch_file([markers.marker_name(good_names[0])]),
    )
    # inspect shows every instant, the damaged one with its error.
    out = io.StringIO()
    assert commands.run_inspect(url, as_json=True, options=options, out=out) == 0
    rows = {r["instant"]: r for r in json.loads(out.getvalue())["instants"]}
    assert rows[good]["marked"] == 1
    assert rows[good]["error"] is None
    assert rows[bad]["marked"] is None
    assert "line 2" in rows[bad]["error"]
    with pytest.raises(errors.CorruptFileError) as failure:
        rollback.rollback_table(url, storage_options=options)
    message = str(failure.value)
    assert bad in message
    assert "MARKERS1" in message
    assert "line 2" in message
    assert "run the rollback again" in message
    # The other instant was rolled back all the same; the damaged one is claimed, resumable.
    assert tl.status(good).state is timeline.State.ROLLED_BACK
    assert not _exists(url, options, good_names[0])
    assert tl.status(bad).state is timeline.State.ROLLING_BACK
    tl.manager.write_bytes(
        bad_file, markers.render_batch_file(markers.marker_name(n) for n in names), overwrite=True
    )
    resumed = rollback.rollback_table(url, storage_options=options)
    assert resumed.files_deleted == 2
    assert undecided(url, options) == []


def test_damaged_markers_through_the_cli_torn_is_a_warning_garbage_one_line_exit_1(
    where: tuple[str, str, dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """What a user sees from ``sparkguard rollback``: a torn last line is tolerated (exit 0, the
    warning names the file); a garbage line is one line on stderr naming the file, the
    instant and the fix (exit 1, no traceback), and the rerun after the fix completes."""
    url, journal_url, options = where
    monkeypatch.setenv("SPARKGUARD_STORAGE_OPTIONS", json.dumps(options))
    jmanager, jroot = filemanager.resolve(journal_url, storage_options=options)
    tl, torn_instant, torn_dir, torn_names = _batched_instant(url, options, "cli-1", 2)
    tl.manager.write_bytes(
        paths.join(torn_dir, "MARKERS0"),
        markers.render_batch_file([markers.marker_name(torn_names[0])])
        + markers.marker_name(torn_names[1])[:16].encode(),
    )
    journal.Journal(jmanager, jroot, "cli-1").record(table=url, instant=torn_instant, attempt=0)
    capsys.readouterr()
    argv = ["rollback", "--job-id", "cli-1", "--journal", journal_url, "--json", "--quiet"]
    assert cli.main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["filesDeleted"] == 2
    assert any("torn last line" in w and "MARKERS0" in w for w in summary["warnings"])

    _, bad, bad_dir, bad_names = _batched_instant(url, options, "cli-2", 1)
    bad_file = paths.join(bad_dir, "MARKERS1")
    tl.manager.write_bytes(bad_file, b"\x00garbage\xff line\n")
    journal.Journal(jmanager, jroot, "cli-2").record(table=url, instant=bad, attempt=0)
    argv = ["rollback", "--job-id", "cli-2", "--journal", journal_url, "--quiet"]
    assert cli.main(argv) == 1
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert bad in line
    assert "MARKERS1" in line
    assert "run the rollback again" in line
    assert "Traceback" not in captured.err
    tl.manager.write_bytes(
        bad_file, markers.render_batch_file([markers.marker_name(bad_names[0])]), overwrite=True
    )
    assert cli.main(argv) == 0
    assert not _exists(url, options, bad_names[0])
    assert undecided(url, options) == []


@pytest.mark.parametrize(
    ("content", "expected"),
    [(b"BOGUS\xff", "not DIRECT or TIMELINE_SERVER_BASED"), (b"DIRECT", "says DIRECT")],
)
def test_marker_type_garbage_or_disagreement_is_a_warning(
    tmp_path: Path, content: bytes, expected: str
) -> None:
    url = str(tmp_path / "t")
    tl, _, mdir, names = _batched_instant(url, {}, "type-1", 2)
    tl.manager.write_bytes(paths.join(mdir, markers.TYPE_FILE), content, overwrite=True)
    tl.manager.write_bytes(
        paths.join(mdir, "MARKERS0"),
        markers.render_batch_file(markers.marker_name(n) for n in names),
    )
    summary = rollback.rollback_table(url)
    assert summary.files_deleted == 2
    assert any(expected in w for w in summary.warnings), summary.warnings


# --------------------------------------------------------------------------------------------
# Temp leftovers of a killed writer.
# --------------------------------------------------------------------------------------------

_CHILD = """
import json, sys, time
import pyarrow as pa
from pyspark.sql.types import LongType, StringType, StructField, StructType
from sparkguard.spark_lib.spark import writer

url, journal = sys.argv[1], sys.argv[2]
schema = StructType([StructField("id", LongType()), StructField("s", StringType())])
conf = {"spark.sparkguard.jobId": "killed-1", "spark.sparkguard.journal": journal}
cls = writer.source_class(conf)
w = cls(options={"path": url, "format": "json"}).writer(schema, False)

def batches():
    yield pa.record_batch({"id": pa.array(range(50), pa.int64()), "s": pa.array(["v"] * 50)})
    print(w.instant, flush=True)  # the file is marked and open: its temp file exists
    time.sleep(3600)

writer.write_partition(w.spec, batches(), partition=0, attempt=0, token="killed-1")
"""


def test_rollback_removes_temp_files_of_a_killed_writer_and_only_those(tmp_path: Path) -> None:
    url, journal = str(tmp_path / "t"), str(tmp_path / "journal")
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, url, journal],
        env={**os.environ, "PYTHONSAFEPATH": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert line, child.stderr.read().decode() if child.stderr else ""
    temps = [p for p in Path(url).iterdir() if filemanager.is_temp_name(p.name)]
    assert len(temps) == 1, temps
    # Hadoop's local filesystem (the JVM protocol's writers) keeps a checksum beside each file,
    # the temp file's included: it goes with its file, and a stale one of the marked name too.
    target = filemanager.temp_target(temps[0].name)
    assert target is not None
    temp_checksum = Path(url, f".{temps[0].name}.crc")
    stale_checksum = Path(url, f".{target}.crc")
    temp_checksum.write_bytes(b"crc")
    stale_checksum.write_bytes(b"crc")
    # A live writer of another job has a temp file (and its checksum) in the same directory:
    # never touched.
    other = Path(url, ".part-00000-other-job-c000.json.sg-tmp-0123456789ab")
    other.write_bytes(b"in progress")
    other_checksum = Path(url, f".{other.name}.crc")
    other_checksum.write_bytes(b"crc")
    summary = rollback.rollback_job("killed-1", journal)
    assert not temps[0].exists()
    assert not temp_checksum.exists()
    assert not stale_checksum.exists()
    assert other.exists()
    assert summary.temp_files_removed == 1  # checksums are not counted
    assert summary.files_deleted == 0  # the file itself was never published
    left = sorted(p.name for p in Path(url).iterdir() if not p.name.startswith("_"))
    assert left == sorted([other.name, other_checksum.name])


def test_rollback_aborts_incomplete_upload_of_a_marked_name(
    s3_bucket: str, s3_options: dict[str, Any]
) -> None:
    url, journal = f"{s3_bucket}/t", f"{s3_bucket}/journal"
    w = _start(url, journal, s3_options, "upload-1")
    manager, table = filemanager.resolve(url, storage_options=s3_options)
    assert isinstance(manager, filemanager.DirectPutFileManager)
    name = "part-00000-upload-1-c000.parquet"
    markers.DirectMarkerClient(manager).create(markers.marker_dir(table, w.instant), name)
    stream = manager.create_atomic(paths.join(table, name), overwrite=True)
    stream._block_size = 5 * 1024 * 1024  # type: ignore[attr-defined]
    stream.write(b"x" * (6 * 1024 * 1024))  # a part is uploaded; the writer then "dies"
    assert len(manager.list_pending_uploads(table + "/")) == 1
    summary = rollback.rollback_job("upload-1", journal, storage_options=s3_options)
    assert summary.temp_files_removed == 1
    assert manager.list_pending_uploads(table + "/") == []


# --------------------------------------------------------------------------------------------
# Counts that are true; a deleted table stays deleted.
# --------------------------------------------------------------------------------------------


def test_files_deleted_counts_files_removed_not_names_marked(
    where: tuple[str, str, dict[str, Any]],
) -> None:
    url, journal, options = where
    existing_location(url, options)
    w = _start(url, journal, options, "count-1")
    for p, ids in PARTS.items():
        _task(w, p, ids)
    manager, table = filemanager.resolve(url, storage_options=options)
    # A fourth file was marked, but its task died before writing it.
    markers.DirectMarkerClient(manager).create(
        markers.marker_dir(table, w.instant), "part-00007-count-1-c000.parquet"
    )
    dry = rollback.rollback_job("count-1", journal, storage_options=options, dry_run=True)
    assert dry.files_deleted == 3
    summary = rollback.rollback_job("count-1", journal, storage_options=options)
    assert summary.files_deleted == 3
    assert summary.to_json()["details"][0]["filesDeleted"] == 3
    assert tl_rolledback(url, options, w.instant)["filesDeleted"] == 3


def test_rolledback_deleted_lists_only_files_removed(
    where: tuple[str, str, dict[str, Any]],
) -> None:
    url, journal, options = where
    existing_location(url, options)
    w = _start(url, journal, options, "count-2")
    written = sorted(f.path for p, ids in PARTS.items() for f in _task(w, p, ids).files)
    manager, table = filemanager.resolve(url, storage_options=options)
    never = "part-00007-count-2-c000.parquet"  # marked, but its task died before writing it
    markers.DirectMarkerClient(manager).create(markers.marker_dir(table, w.instant), never)
    rollback.rollback_job("count-2", journal, storage_options=options)
    record = tl_rolledback(url, options, w.instant)
    assert record["marked"] == sorted([*written, never])
    assert record["deleted"] == written
    assert record["absent"] == [never]
    assert record["filesDeleted"] == len(record["deleted"]) == 3


def tl_rolledback(url: str, options: dict[str, Any], instant: str) -> dict[str, Any]:
    tl = timeline.timeline_for(url, storage_options=options)
    record = tl.read_rolledback(instant)
    assert record is not None
    return record


def test_rollback_of_a_deleted_table_reports_it_and_creates_nothing(
    where: tuple[str, str, dict[str, Any]],
) -> None:
    url, journal, options = where
    w = _start(url, journal, options, "gone-1")
    _task(w, 0, PARTS[0])
    manager, table = filemanager.resolve(url, storage_options=options)
    if manager.kind is filemanager.Kind.RENAME:
        shutil.rmtree(table)
    else:
        manager.fs.rm(table, recursive=True)
    assert not manager.list_files(table)
    summary = rollback.rollback_job("gone-1", journal, storage_options=options)
    assert not manager.list_files(table)
    assert not manager.exists(paths.join(table, timeline.SPARKGUARD_DIR))
    assert summary.tables_missing == (reader.table_url(url),)
    assert summary.to_json()["tablesMissing"] == [reader.table_url(url)]
    assert summary.files_deleted == 0


def test_an_undecided_instant_is_claimed_before_any_cleanup_deletes_a_name_it_marked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rerun marks the names a rolled-back instant marked: the rerun's instant must be
    claimed (it can then never commit) before the older instant's late-file check deletes
    one of its files; else a zombie driver could commit a file that is being deleted."""
    url = str(tmp_path / "t")
    manager, table = filemanager.resolve(url)
    tl = timeline.Timeline(manager, table)
    client = markers.DirectMarkerClient(manager)
    name = "part-00000-order-1-c000.parquet"
    old = tl.start("order-1", attempt=0, marker_type="DIRECT")
    client.create(markers.marker_dir(table, old), name)
    rollback.rollback_table(url, job_id="order-1")  # the file was never written
    assert name in tl.status(old).rolled_back_names
    rerun = tl.start("order-1", attempt=1, marker_type="DIRECT")
    client.create(markers.marker_dir(table, rerun), name)
    manager.write_bytes(paths.join(table, name), b"rerun's data")
    real_delete = rollback._delete

    def delete_only_after_the_claim(
        mgr: filemanager.FileManager, tbl: str, relative: list[str], *args: Any, **kwargs: Any
    ) -> Any:
        if name in relative:
            assert tl.read_outcome(rerun) is not None, "deleted before the rerun was claimed"
        return real_delete(mgr, tbl, relative, *args, **kwargs)

    monkeypatch.setattr(rollback, "_delete", delete_only_after_the_claim)
    summary = rollback.rollback_table(url, job_id="order-1")
    assert summary.files_deleted == 1
    assert not manager.exists(paths.join(table, name))
