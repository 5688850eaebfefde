"""``format("sparkguard")`` is the JVM front when sparkguard's jar is on the classpath: the
commit protocol writes (no Python in the data path), for that write only; the fsspec writer
stays reachable for the locations Hadoop cannot open and for the streaming sink."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkguard.spark_lib.spark import sparkconf, writer
from sparkguard.spark_lib.storage import reader, rollback
from tests.jvm.conftest import run_job

pytestmark = pytest.mark.spark


def test_the_format_name_is_the_jvm_protocol_and_fsspec_keeps_what_only_it_reaches(
    tmp_path: Path,
) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.json").write_text("".join(f'{{"id": {i}}}\n' for i in range(30)))
    conf = {sparkconf.JARS_KEY: str(sparkconf.jar_path())}  # the jar only: no protocol conf
    result = run_job("front_write.py", str(tmp_path), conf=conf)

    # The Python writer took its own name: Spark refuses a Python source named like a JVM one.
    assert result == {"registered": writer.FSSPEC_NAME, "sessionProtocol": None}
    table = tmp_path / "table"
    names = [f"part-{p:05d}-front-py-w000-c000.snappy.parquet" for p in range(4)]
    assert reader.committed_paths(str(table)) == [str(table / n) for n in names]
    outcomes = sorted((table / "_sparkguard" / "timeline").glob("*.outcome"))
    assert len(outcomes) == 1  # the rerun (a new driver run) was skipped
    outcome = json.loads(outcomes[0].read_text())
    assert outcome["extra"]["protocol"] == "io.sparkguard.spark.SparkguardCommitProtocol"
    assert outcome["extra"]["rows"] == 1000
    # The journal option reached the protocol: a journal-based rollback finds the table.
    summary = rollback.rollback_job("front-py", str(tmp_path / "journal"))
    assert list(summary.tables) == [str(table)]

    # local:// has no Hadoop FileSystem: the fsspec writer wrote it, with its own names.
    fsspec_files = reader.committed_paths(f"local://{tmp_path}/fsspec")
    assert len(fsspec_files) == 4
    assert all("-front-py-w000-c000.parquet" in p for p in fsspec_files)
    (fsspec_outcome,) = (tmp_path / "fsspec" / "_sparkguard" / "timeline").glob("*.outcome")
    assert "protocol" not in json.loads(fsspec_outcome.read_text()).get("extra", {})

    # writeStream.format("sparkguard") is the Python streaming sink.
    assert (tmp_path / "stream" / "_sparkguard" / "streams" / "front-stream").is_dir()
    assert sum(1 for _ in reader.committed_paths(str(tmp_path / "stream"))) >= 1

    # A plain write after them still uses Spark's own protocol.
    assert (tmp_path / "plain" / "_SUCCESS").exists()
    assert not (tmp_path / "plain" / "_sparkguard").exists()
