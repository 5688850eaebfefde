"""R8b without Spark: a JVM overwrite whose driver died between its outcome (W9) and the end of
its deferred deletes (W9b) is finished by ``rollback``, exactly within the contract's scope."""

from __future__ import annotations

from pathlib import Path

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.storage import markers, rollback, timeline

JVM = rollback.JVM_PROTOCOL


def _file(table: Path, relative: str) -> timeline.DataFile:
    target = table / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(b"data")
    return timeline.DataFile(path=relative, size=4, rows=1)


def _state_after_a_crash_in_w9b(table: Path, *, protocol: str) -> timeline.Timeline:
    """The old append, a later overwrite of k=1 committed with its markers, nothing deleted."""
    table.mkdir()
    manager, path = filemanager.resolve(str(table))
    tl = timeline.Timeline(manager, path)
    old = tl.start("old", attempt=0, marker_type="DIRECT")
    tl.commit(
        old,
        [_file(table, "k=0/part-00000-old-w000-c000.parquet"),
         _file(table, "k=1/part-00000-old-w000-c000.parquet")],
        extra={"operation": "append", "committedAt": "20260101000000000001", "protocol": JVM},
    )  # fmt: skip
    _file(table, "k=1/plain-from-before-sparkguard.parquet")
    (table / "k=1" / ".plain-from-before-sparkguard.parquet.crc").write_bytes(b"crc")
    # Another job's write in flight: it marked its name before publishing it.
    live = tl.start("live", attempt=0, marker_type="DIRECT")
    _file(table, "k=1/part-00000-live-w000-c000.parquet")
    live_markers = Path(markers.marker_dir(str(table), live))
    (live_markers / "k=1").mkdir(parents=True)
    (live_markers / "k=1" / "part-00000-live-w000-c000.parquet.marker.CREATE").touch()
    new = tl.start("new", attempt=0, marker_type="DIRECT", operation="overwrite-partitions")
    new_markers = Path(markers.marker_dir(str(table), new))
    (new_markers / "k=1").mkdir(parents=True)
    (new_markers / "MARKERS.type").write_text("DIRECT")
    (new_markers / "k=1" / "part-00000-new-w000-c000.parquet.marker.CREATE").touch()
    tl.commit(
        new,
        [_file(table, "k=1/part-00000-new-w000-c000.parquet")],
        extra={
            "operation": "overwrite-partitions",
            "partitions": ["k=1"],
            "committedAt": "20260101000000000002",
            "protocol": protocol,
        },
    )
    return tl


def _data(table: Path) -> list[str]:
    return sorted(
        str(p.relative_to(table))
        for p in table.rglob("*")
        if p.is_file() and "_sparkguard" not in p.parts
    )


def test_rollback_finishes_the_deletes_of_a_committed_jvm_overwrite(tmp_path: Path) -> None:
    table = tmp_path / "t"
    tl = _state_after_a_crash_in_w9b(table, protocol=JVM)
    (new,) = [i for i in tl.instant_ids() if i.endswith("-new")]
    assert rollback.superseded_on_storage(tl, new) == {
        "k=1/part-00000-old-w000-c000.parquet",
        "k=1/plain-from-before-sparkguard.parquet",
    }
    dry = rollback.rollback_table(str(table), job_id="new", dry_run=True)
    assert dry.files_deleted == 2
    assert len(_data(table)) == 6  # a dry run changes nothing

    summary = rollback.rollback_table(str(table), job_id="new")
    assert summary.files_deleted == 2
    assert _data(table) == [
        "k=0/part-00000-old-w000-c000.parquet",  # another partition: never in scope
        "k=1/part-00000-live-w000-c000.parquet",  # marked by a live instant: its own to decide
        "k=1/part-00000-new-w000-c000.parquet",
    ]
    assert not Path(markers.marker_dir(str(table), new)).exists()
    assert rollback.rollback_table(str(table), job_id="new").files_deleted == 0  # idempotent


def test_the_python_writers_overwrites_keep_their_superseded_files(tmp_path: Path) -> None:
    table = tmp_path / "t"
    tl = _state_after_a_crash_in_w9b(table, protocol="")
    (new,) = [i for i in tl.instant_ids() if i.endswith("-new")]
    assert rollback.superseded_on_storage(tl, new) == set()
