"""An unchanged PySpark job, run with the conf ``sparkguard spark-conf`` prints, writes through
the JVM commit protocol; the Python side (reader, inspect, rollback) reads and repairs its
output unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkguard import cli
from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.spark import sparkconf
from sparkguard.spark_lib.storage import reader, rollback, timeline
from tests.jvm.conftest import marker_sidecar, run_job

pytestmark = pytest.mark.spark

JOB = "jvm-job-1"
NAMES = [f"part-{p:05d}-{JOB}-w000-c000.snappy.parquet" for p in range(4)]


def _conf(journal: Path) -> dict[str, str]:
    return sparkconf.build_spark_conf(JOB, journal=str(journal))


def _inspect(table: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    capsys.readouterr()
    assert cli.main(["inspect", str(table), "--json"]) == 0
    doc: dict[str, object] = json.loads(capsys.readouterr().out)
    return doc


def test_python_tools_read_what_the_jvm_protocol_committed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table, journal = tmp_path / "table", tmp_path / "journal"
    # The job ran, committed, then (say) a later step failed and it ran again: the rerun's write
    # 0 already committed, so it is skipped (spark-operator#1854: plain Spark duplicates it all).
    for _ in range(2):
        result = run_job("plain_write.py", str(table), "1000", "4", conf=_conf(journal))
        assert result == {"rows": 1000, "ids": 1000}

    assert reader.committed_paths(str(table)) == [str(table / n) for n in NAMES]
    doc = _inspect(table, capsys)
    instants = doc["instants"]
    assert isinstance(instants, list)
    assert [i["state"] for i in instants] == ["committed"]
    assert {i["owner"] for i in instants} == {f"job:{JOB}"}
    assert {i["rows"] for i in instants} == {1000}
    assert doc["visible"] == {
        "files": 4,
        "bytes": sum((table / n).stat().st_size for n in NAMES),
        "rows": 1000,
        "rowsKnown": 1000,
        "filesRowsUnknown": 0,
    }
    # The journal names the table, so a journal-based rollback finds it: nothing to undo.
    summary = rollback.rollback_job(JOB, str(journal))
    assert list(summary.tables) == [str(table)]
    assert not summary.instants_rolled_back
    assert summary.files_deleted == 0


def test_a_failed_jvm_write_is_rolled_back_by_python_and_the_rerun_is_exactly_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table, journal = tmp_path / "table", tmp_path / "journal"
    # Row 600 is in the last of 4 tasks: the others commit their files, then the job aborts.
    failed = run_job(
        "plain_write.py", str(table), "1000", "4", "append", "600", conf=_conf(journal),
        expect_exit=3,
    )  # fmt: skip
    assert failed == {"failed": True}
    written = sorted(p.name for p in table.glob(".part-*.sg-tmp-*"))
    assert written, "the tasks before the failure wrote their files, under their temp names"
    assert sorted(table.glob("part-*")) == [], "published only after an outcome: none"
    assert reader.committed_paths(str(table)) == []  # none of them is visible to readers
    states = [i["state"] for i in _inspect(table, capsys)["instants"]]  # type: ignore[union-attr]
    assert states == [timeline.State.ROLLING_BACK.value]  # abortJob claimed it

    summary = rollback.rollback_job(JOB, str(journal))
    assert (summary.files_deleted, summary.temp_files_removed) == (0, len(written))
    assert sorted(p.name for p in table.glob("*part-*")) == []

    result = run_job("plain_write.py", str(table), "1000", "4", conf=_conf(journal))
    assert result == {"rows": 1000, "ids": 1000}
    assert reader.committed_paths(str(table)) == [str(table / n) for n in NAMES]


def test_markers_batched_by_the_sidecar_are_what_rollback_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table, journal = tmp_path / "table", tmp_path / "journal"
    token = tmp_path / "token"
    token.write_text("0123456789abcdef0123456789abcdef\n")
    log = tmp_path / "sidecar.log"
    with marker_sidecar(roots=tmp_path, token_file=token, log_path=log) as endpoint:
        conf = sparkconf.build_spark_conf(
            JOB, markers="sidecar", endpoint=endpoint, token_file=str(token), journal=str(journal)
        )
        failed = run_job(
            "plain_write.py", str(table), "1000", "4", "append", "600", conf=conf, expect_exit=3
        )
        assert failed == {"failed": True}
        (marker_dir,) = (table / "_sparkguard" / "markers").iterdir()
        assert (marker_dir / "MARKERS.type").read_text().strip() == "TIMELINE_SERVER_BASED"
        batched = {
            line
            for batch in marker_dir.glob("MARKERS[0-9]*")
            for line in batch.read_text().splitlines()
        }
        written = [filemanager.temp_target(p.name) for p in table.glob(".part-*.sg-tmp-*")]
        assert written
        assert list(table.glob("part-*")) == [], "published only after an outcome: none"
        assert {f"{name}.marker.CREATE" for name in written} <= batched

        summary = rollback.rollback_job(JOB, str(journal))
        assert (summary.files_deleted, summary.temp_files_removed) == (0, len(written))
        assert list(table.glob("*part-*")) == []

        result = run_job("plain_write.py", str(table), "1000", "4", conf=conf)
    assert result == {"rows": 1000, "ids": 1000}
    assert reader.committed_paths(str(table)) == [str(table / n) for n in NAMES]
    # The rollback deleted the failed write's markers; the commit its own, through the sidecar.
    markers_root = table / "_sparkguard" / "markers"
    assert not markers_root.exists() or list(markers_root.iterdir()) == []
    # The commit sealed its directory before reading the markers (W8): one seal, of the
    # committed write's directory (the failed write never reached its commit).
    sealed = [line for line in log.read_text().splitlines() if " sealed: " in line]
    assert len(sealed) == 1, sealed
    assert f"{table}/_sparkguard/markers/" in sealed[0]
