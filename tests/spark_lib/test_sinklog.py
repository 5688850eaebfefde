"""Spark's file-sink manifest (``_spark_metadata``) as sparkguard reads it, and the rollback
rules that make it the commit of a streaming file sink (docs/storage-contract.md, "The
streaming file sink"): an instant whose batch the manifest committed is recorded as committed,
never rolled back, and no file the manifest lists is ever deleted."""

from __future__ import annotations

import json
from pathlib import Path

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.storage import rollback, sinklog, timeline

JOB = "sink-job"


def _manifest(sink: Path, name: str, entries: list[tuple[str, str]]) -> None:
    """``_spark_metadata/<name>``: ``v1`` then one SinkFileStatus per (relative path, action)."""
    directory = sink / "_spark_metadata"
    directory.mkdir(parents=True, exist_ok=True)
    lines = ["v1"]
    for relative, action in entries:
        uri = (sink / relative).as_uri().replace("file:///", "file:/")  # how Spark records it
        lines.append(json.dumps({"path": uri, "size": 3, "isDir": False, "action": action}))
    (directory / name).write_text("\n".join(lines))


def _file(sink: Path, relative: str) -> None:
    path = sink / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"abc")


def _batch_instant(sink: Path, batch: int, marked: list[str]) -> str:
    manager, table = filemanager.resolve(str(sink))
    tl = timeline.Timeline(manager, table)
    instant = tl.start(
        JOB, attempt=0, marker_type="DIRECT", operation="stream-batch", extra={"batchId": batch}
    )
    for relative in marked:
        marker = sink / "_sparkguard" / "markers" / instant / f"{relative}.marker.CREATE"
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    return instant


def _name(batch: int, partition: int = 0) -> str:
    return f"k=1 x/part-{partition:05d}-{JOB}-b{batch:010d}-c000.snappy.parquet"


def test_manifest_paths_are_read_relative_to_the_sink_on_every_store() -> None:
    """As Spark records them: local disk (``file:/``), an object store (the bucket is the
    path's first segment), HDFS (the NameNode is the URI's authority, never part of the
    filesystem's path: a rooted ``/...`` table). Elsewhere: None."""
    name = "k=1/part-00000-j-b0000000000-c000.snappy.parquet"
    relative = sinklog._relative
    assert relative(f"file:/data/sink/{name}", "/data/sink") == name
    assert relative(f"s3a://bucket/sink/{name}", "bucket/sink") == name
    assert relative(f"hdfs://127.0.0.1:8020/t/sink/{name}", "/t/sink") == name
    assert relative("hdfs://nn/t/sink/k%3D1/a%20b.parquet", "/t/sink") == "k=1/a b.parquet"
    assert relative(f"hdfs://127.0.0.1:8020/t/other/{name}", "/t/sink") is None
    assert relative(f"s3a://other/bucket/sink/{name}", "bucket/sink") is None
    assert relative(f"s3a://other/sink/{name}", "bucket/sink") is None


def test_listed_files_follow_the_newest_compact_file_and_later_batches(tmp_path: Path) -> None:
    sink = tmp_path / "sink"
    _manifest(sink, "0", [(_name(0), "add")])
    _manifest(sink, "1.compact", [(_name(0), "add"), (_name(1), "add")])
    _manifest(sink, "2", [(_name(2), "add"), (_name(0), "delete")])
    (sink / "_spark_metadata" / ".3.1234.tmp").write_text("v1\n{partial")  # a writer's temp
    manager, table = filemanager.resolve(str(sink))
    assert sinklog.latest_batch(manager, table) == 2
    assert sinklog.listed_files(manager, table) == {_name(1): 3, _name(2): 3}
    assert sinklog.latest_batch(manager, str(tmp_path / "no-sink")) is None


def test_rollback_records_a_batch_the_manifest_committed_and_deletes_nothing_listed(
    tmp_path: Path,
) -> None:
    sink = tmp_path / "sink"
    for batch in (0, 1):
        _file(sink, _name(batch))
    _manifest(sink, "0", [(_name(0), "add")])
    committed = _batch_instant(sink, 0, [_name(0)])  # died between manifest and outcome
    dead = _batch_instant(sink, 1, [_name(1), _name(0)])  # died mid-write
    summary = rollback.rollback_table(str(sink), job_id=JOB)

    manager, table = filemanager.resolve(str(sink))
    tl = timeline.Timeline(manager, table)
    assert tl.status(committed).state is timeline.State.COMMITTED
    assert [f.path for f in tl.status(committed).files] == [_name(0)]
    assert tl.status(dead).state is timeline.State.ROLLED_BACK
    assert summary.instants_rolled_back == (dead,)
    assert summary.files_deleted == 1
    assert (sink / _name(0)).exists()  # listed by the manifest: never deleted
    assert not (sink / _name(1)).exists()
