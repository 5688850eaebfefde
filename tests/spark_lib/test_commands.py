"""``sparkguard rollback`` and ``sparkguard inspect`` (run through argparse as the CLI does)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from sparkguard.spark_lib.tools import commands
from tests.spark_lib.test_rollback import PARTS, _start, _task


def _parser(name: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sparkguard")
    sub = parser.add_subparsers(dest="command")
    commands.add_arguments(sub.add_parser(name))
    return parser


def _run(name: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    args = _parser(name).parse_args([name, *argv])
    code = commands.run(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_rollback_json_and_table_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url, journal = str(tmp_path / "t"), str(tmp_path / "j")
    w = _start(url, journal, {}, "cli-1")
    for p, ids in PARTS.items():
        _task(w, p, ids)
    code, out, err = _run(
        "rollback", ["--job-id", "cli-1", "--journal", journal, "--dry-run", "--json"], capsys
    )
    assert code == 0
    assert json.loads(out)["dryRun"] is True
    code, out, err = _run("rollback", ["--job-id", "cli-1", "--journal", journal], capsys)
    assert code == 0
    assert "files deleted: 3" in out
    assert "rolled_back" in out
    assert "delete 3/3" in err  # progress on stderr
    code, out, _ = _run("rollback", ["--job-id", "cli-1", "--journal", journal, "--json"], capsys)
    assert code == 0
    assert json.loads(out)["filesDeleted"] == 0


def test_inspect_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "t")
    w = _start(url, "", {}, "cli-2")
    w.commit([_task(w, p, ids) for p, ids in PARTS.items()])
    code, out, _ = _run("inspect", [url, "--json"], capsys)
    report = json.loads(out)
    assert code == 0
    assert report["instants"][0]["state"] == "committed"
    assert report["instants"][0]["files"] == 3
    assert report["visible"]["rows"] == 300
    code, out, _ = _run("inspect", [url], capsys)
    assert code == 0
    assert "committed" in out
    assert "visible: 3 files" in out


@pytest.mark.parametrize(
    ("name", "argv", "needle"),
    [
        ("rollback", ["--job-id", "Bad_Job", "--journal", "/tmp/j"], "--job-id"),
        ("rollback", ["--job-id", "ok-1", "--journal", " "], "--journal"),
        ("inspect", [], "table"),
        ("rollback", ["--job-id", "ok-1", "--journal", "/tmp/j", "--bogus"], "--bogus"),
    ],
)
# A missing --job-id or --journal (required unless --app) is refused by the entry point:
# tests/spark_lib/test_cli_bad_input.py.
def test_bad_flags_name_the_flag(
    name: str, argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        _parser(name).parse_args([name, *argv])
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err


def test_bad_storage_options_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SPARKGUARD_STORAGE_OPTIONS", "{not json")
    code, _, err = _run("rollback", ["--job-id", "ok-1", "--journal", str(tmp_path)], capsys)
    assert code == 2
    assert "SPARKGUARD_STORAGE_OPTIONS" in err
    monkeypatch.setenv("SPARKGUARD_STORAGE_OPTIONS", "[1]")
    code, _, err = _run("inspect", [str(tmp_path)], capsys)
    assert code == 2
    assert "JSON object" in err


def test_inspect_missing_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run("inspect", [str(tmp_path / "nope")], capsys)
    assert code == 2
    assert "does not exist" in err


def test_rollback_with_nothing_to_do_is_quick(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "idle-1").mkdir()  # the job's journal folder, no table recorded in it
    code, out, _ = _run(
        "rollback", ["--job-id", "idle-1", "--journal", str(tmp_path), "--json"], capsys
    )
    assert code == 0
    assert json.loads(out)["instantsRolledBack"] == []


def test_inspect_table_shows_each_instant_s_owner(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Orphan recovery (``rollback --owner '<its owner>'``) needs the owner the table shows."""
    url = str(tmp_path / "t")
    owner = "k8s:spark-jobs/nightly-orders-europe/4f2a9c1e-7b3d-4e8f-9a0b-1c2d3e4f5a6b"
    w = _start(url, "", {}, "nightly-orders-europe-2026-11-22", owner=owner)
    _task(w, 0, PARTS[0])  # left in flight: the orphan a user must roll back by its owner
    code, out, _ = _run("inspect", [url], capsys)
    assert code == 0
    header = next(line for line in out.splitlines() if "instant" in line and "state" in line)
    assert "owner" in header
    row = next(line for line in out.splitlines() if "inflight" in line)
    assert owner in row  # whole, on one line: it is copied into rollback --owner


def _commit_files(url: str, job_id: str, rows: list[int]) -> None:
    """A committed instant listing one file per entry of ``rows`` (-1: unknown, as the JVM
    protocol records ORC, JSON and CSV files and the streaming sink records every file)."""
    from sparkguard.spark_lib import filemanager
    from sparkguard.spark_lib.storage import timeline

    manager, path = filemanager.resolve(url)
    tl = timeline.Timeline(manager, path)
    instant = tl.start(job_id, attempt=0, marker_type="DIRECT")
    tl.commit(
        instant,
        [
            timeline.DataFile(path=f"part-{i:05d}-{job_id}-c000.orc", size=100, rows=n)
            for i, n in enumerate(rows)
        ],
        extra={"operation": "append", "format": "orc"},
    )


def test_inspect_never_sums_unknown_row_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = str(tmp_path / "t")
    _commit_files(url, "orc-1", [-1, -1])  # nothing known
    code, out, _ = _run("inspect", [url], capsys)
    assert code == 0
    assert "visible: 2 files, 200 bytes, rows unknown;" in out
    assert " -2 " not in out  # no sum of unknowns in a table cell
    assert " -1 " not in out
    assert " ? " in next(line for line in out.splitlines() if "orc-1" in line)
    code, out, _ = _run("inspect", [url, "--json"], capsys)
    report = json.loads(out)
    assert report["visible"]["rows"] is None
    assert report["visible"]["rowsKnown"] == 0
    assert report["visible"]["filesRowsUnknown"] == 2
    assert report["instants"][0]["rows"] is None

    _commit_files(url, "parquet-1", [40, 2])  # now some are known: a lower bound
    code, out, _ = _run("inspect", [url], capsys)
    assert code == 0
    assert "visible: 4 files, 400 bytes, >= 42 rows (2 files unknown);" in out
    report = json.loads(_run("inspect", [url, "--json"], capsys)[1])
    assert report["visible"] == {
        "files": 4,
        "bytes": 400,
        "rows": None,
        "rowsKnown": 42,
        "filesRowsUnknown": 2,
    }
    by_job = {i["jobId"]: i for i in report["instants"]}
    assert by_job["parquet-1"]["rows"] == 42
    assert by_job["parquet-1"]["filesRowsUnknown"] == 0
    assert by_job["orc-1"]["rows"] is None
