"""The README's first command: `sparkguard demo` recovers a killed Spark job exactly once, on the
zero-code path by default (an unchanged ``df.write.parquet`` under the conf of
``sparkguard spark-conf``, written by sparkguard's JVM commit protocol) and with sparkguard's
Python writer behind ``--writer fsspec``, which it picks by itself for an ``s3://`` table."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.storage import rollback, timeline
from sparkguard.spark_lib.tools import demo
from tests.support import s3server

pytestmark = pytest.mark.spark
SPARKGUARD = str(Path(sys.executable).parent / "sparkguard")


def _demo(
    *args: str, cwd: Path, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SPARKGUARD, "demo", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONSAFEPATH": "1", **(env or {})},
        cwd=cwd,
        timeout=600,
        check=False,
    )


def _committed(
    table: Path | str, options: Mapping[str, Any] | None = None
) -> list[timeline.InstantStatus]:
    manager, path = filemanager.resolve(str(table), storage_options=options)
    statuses = timeline.Timeline(manager, path).statuses(job_id=demo.JOB_ID)
    return [s for s in statuses if s.state is timeline.State.COMMITTED]


def _assert_recovered(out: str, rows: int) -> None:
    lines = out.strip().splitlines()
    assert lines[-1] == (
        f"exactly-once: OK ({rows} rows, 0 duplicates, 0 missing, 0 uncommitted files, "
        "0 temp files)"
    )
    assert "temp files of writes cut short (hidden from every reader): " in out
    assert "no temp file left behind" in out
    assert "ok   attempt 0 died in the middle of its write" in out
    assert "instant(s) still inflight: " in out
    # the killed first write created the table: the rollback removed its location, so the
    # final timeline holds only the rerun's commit (docs/storage-contract.md, "The life of a table")
    assert "the dead attempt had created the table: its location was removed" in out
    assert "rolled_back" not in out.rsplit("Verify the table", 1)[-1]
    assert f"$ sparkguard rollback --job-id {demo.JOB_ID} --journal " in out
    assert "FAIL" not in out


def test_demo_recovers_an_unchanged_job_exactly_once(tmp_path: Path) -> None:
    """The default: the JVM path, at the default size (the kill point's margin is sized for it).
    Fails if the job wrote through sparkguard's Python API, if the conf did not route Spark's
    own writer through the JVM protocol, or if the demo's conf is not `sparkguard spark-conf`'s."""
    work = tmp_path / "demo"
    result = _demo("--dir", str(work), cwd=tmp_path)
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    rows = demo.DEFAULT_SIZES[demo.Writer.JVM].rows
    _assert_recovered(out, rows)
    assert "writer: jvm, the zero-code path" in out
    assert "killed once 8 of its data files are written" in out
    # Before any rollback a plain directory reader lists nothing of the dead write.
    assert "data files a plain directory reader lists, none committed: 0" in out
    assert "ok   a plain spark.read.parquet of the directory sees the committed rows only" in out
    assert "ok   the job loaded no sparkguard Python module (it said: none)" in out
    assert f"ok   committed by Spark's own writer through {rollback.JVM_PROTOCOL}" in out

    # The conf the demo shows is what `sparkguard spark-conf` prints for the command it shows.
    shown = out.split("$ sparkguard spark-conf ", 1)[1].splitlines()
    command = shlex.split(shown[0])
    conf_lines = [line.strip() for line in shown[1:] if line.strip().startswith("--conf ")]
    cli = subprocess.run(
        [SPARKGUARD, "spark-conf", *command],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
        check=True,
    )
    assert conf_lines == cli.stdout.strip().splitlines()
    assert "--conf spark.sparkguard.markers.type=TIMELINE_SERVER_BASED" in conf_lines

    # The table says which protocol committed it, and the rerun's attempt number reached it.
    (commit,) = _committed(work / "table")
    assert commit.extra.get("protocol") == rollback.JVM_PROTOCOL
    assert str(commit.extra.get("attempt")) == "1"
    # The job's own last line (its output is kept in the working directory).
    log = (work / "attempt-1.log").read_text()
    assert f"{demo.PLAIN_JOB_DONE}none" in log


def test_demo_falls_back_to_the_fsspec_writer_where_the_jvm_cannot_write(
    tmp_path: Path, s3_server: s3server.S3Server, s3_bucket: str
) -> None:
    """An ``s3://`` table (no Hadoop FileSystem for it here): the demo says why and runs
    sparkguard's Python writer, killed while its fault hook pauses a task; a plain directory
    reader sees nothing of the dead write; the commit is the Python writer's (no JVM protocol in
    the timeline)."""
    table = f"{s3_bucket}/demo"
    result = _demo(
        "--storage", table, "--rows", "20000", "--partitions", "6", cwd=tmp_path,
        env=s3_server.env(),
    )  # fmt: skip
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    _assert_recovered(out, 20000)
    assert (
        "writer: fsspec, sparkguard's Python writer (df.write.format('sparkguard')), because the "
        "Hadoop inside PySpark has no FileSystem for s3:// here"
    ) in out
    assert "ok   committed by sparkguard's Python writer" in out
    # The Python writer publishes after the outcome too: the dead write's files are unfinished
    # uploads, which no directory reader lists.
    assert "data files a plain directory reader lists, none committed: 0" in out
    assert "ok   a plain spark.read.parquet of the directory sees the committed rows only" in out
    assert "spark-conf" not in out
    (commit,) = _committed(table, s3_server.storage_options)
    assert "protocol" not in commit.extra


def _demo_in_process(
    *args: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, cwd: Path
) -> tuple[int, str]:
    """``sparkguard demo ARGS`` through the command line's entry point in this process: (exit
    status, stderr). Each bad flag is refused before anything starts, so a process per flag
    would only add an interpreter's start; ``test_demo_rejects_bad_flags`` runs one in its own
    process, as a user does."""
    from sparkguard import cli

    monkeypatch.chdir(cwd)
    capsys.readouterr()
    try:
        code = cli.main(["demo", *args])
    except SystemExit as exc:  # argparse's refusal
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def test_demo_rejects_bad_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _demo("--rows", "0", cwd=tmp_path)  # the command as a user runs it
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == "demo: --rows must be >= 1, got 0"  # one line, no traceback

    def demo(*args: str) -> tuple[int, str]:
        return _demo_in_process(*args, capsys=capsys, monkeypatch=monkeypatch, cwd=tmp_path)

    for args, needle in [
        (["--partitions", "3"], "--partitions must be >= 4 with the jvm writer"),
        (["--writer", "fsspec", "--partitions", "1"], "--partitions must be >= 2 with the fsspec"),
        (["--rows", "0"], "--rows must be >= 1, got 0"),
        (["--writer", "jvm", "--storage", "s3://bucket/demo"], "--writer jvm cannot write"),
    ]:
        code, err = demo(*args)
        assert code == 2, err
        assert needle in err
        assert len(err.strip().splitlines()) == 1, err
    code, err = demo("--rows", "many")
    assert code == 2
    assert "--rows" in err
    code, err = demo("--writer", "scala")
    assert code == 2
    assert "--writer" in err
    for storage, needle in [("foo://b/demo", "cannot open foo://"), ("memory://d", "one process")]:
        code, err = demo("--storage", storage)
        assert code == 2, err
        lines = err.strip().splitlines()
        assert len(lines) == 1, err  # one line, no traceback
        assert f"--storage {storage!r}" in lines[0]
        assert needle in lines[0]
