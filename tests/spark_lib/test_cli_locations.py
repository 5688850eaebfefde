"""What a user types by hand on day one, run as the installed ``sparkguard`` command: a recovery
command given the wrong location never does nothing silently, a command on a directory sparkguard
never wrote says so, and every command checks a journal location the same way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkguard import cli
from tests.spark_lib.test_rollback import PARTS, _start, _task

SCRIPT = Path(sys.executable).with_name("sparkguard")


def sparkguard(*argv: str) -> subprocess.CompletedProcess[str]:
    """The installed command, as a user runs it."""
    return subprocess.run(
        [str(SCRIPT), *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
        timeout=120,
        check=False,
    )


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture(scope="module")
def chart_journal(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(journal root, table): job ``etl.nightly`` of namespace ``etl`` failed after one task,
    its journal in ``<root>/etl`` as the operator lays it out (``<journal root>/<namespace>``)."""
    base = tmp_path_factory.mktemp("dayone")
    root, table = base / "journal", base / "table"
    (root / "other-ns").mkdir(parents=True)
    _task(_start(str(table), str(root / "etl"), {}, "etl.nightly"), 0, PARTS[0])
    assert (root / "etl" / "etl.nightly").is_dir()
    return root, table


def test_rollback_given_the_journal_root_names_the_namespace_folder(
    chart_journal: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = chart_journal
    done = sparkguard("rollback", "--job-id", "etl.nightly", "--journal", str(root))
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert f"no {root}/etl.nightly/" in line  # where it looked
    assert f"found {root}/etl/etl.nightly: use --journal {root}/etl" in line
    assert done.stdout == ""
    # Another namespace's folder: the job's folder beside it is named.
    code = cli.main(["rollback", "--job-id", "etl.nightly", "--journal", str(root / "other-ns")])
    assert code == 2
    assert f"use --journal {root}/etl" in one_line(capsys.readouterr().err)


def test_rollback_given_a_table_as_journal_says_so(chart_journal: tuple[Path, Path]) -> None:
    _, table = chart_journal
    done = sparkguard("rollback", "--job-id", "etl.nightly", "--journal", str(table))
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert "is a table, not a journal" in line
    assert str(table) in line


def test_rollback_of_a_job_the_journal_never_saw(chart_journal: tuple[Path, Path]) -> None:
    root, _ = chart_journal
    done = sparkguard("rollback", "--job-id", "never.ran", "--journal", str(root / "etl"))
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert "has no record of job never.ran" in line
    assert "--allow-missing-journal" in line
    # The operator's rollback initContainer runs before a job's first write: that is no error.
    done = sparkguard(
        "rollback",
        "--job-id",
        "never.ran",
        "--journal",
        str(root / "etl"),
        "--allow-missing-journal",
    )
    assert done.returncode == 0, done.stderr
    assert "tables: 0" in done.stdout


def test_inspect_on_plain_parquet_says_it_is_no_sparkguard_table(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    pq.write_table(pa.table({"id": [1, 2, 3]}), plain / "part-00000.parquet")
    done = sparkguard("inspect", str(plain))
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert "no sparkguard timeline" in line
    assert "readers see none of its files" in line  # what that means
    assert "visible" not in done.stdout


@pytest.mark.parametrize(
    ("journal", "needle"),
    [
        ("ftp://h/j", "cannot open ftp:// locations"),
        ("s3:/bucket", "write s3://bucket"),
        ("memory://x", "inside one process"),
    ],
)
def test_spark_conf_checks_the_journal_as_rollback_does(
    journal: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    done = sparkguard("spark-conf", "--job-id", "j-1", "--for-pod", "--journal", journal)
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert f"--journal {journal!r}" in line
    assert needle in line
    assert done.stdout == ""
    # rollback (in-process: the same entry point) says the same
    assert cli.main(["rollback", "--job-id", "j-1", "--journal", journal]) == 2
    said = one_line(capsys.readouterr().err).split(": error: ", 1)[1]
    assert said in line


def test_spark_conf_for_a_pod_names_the_bundle_as_the_operator_injects_it() -> None:
    from sparkguard.operator import mutation

    done = sparkguard(
        "spark-conf",
        "--job-id",
        "etl.nightly",
        "--journal",
        "s3a://bucket/sparkguard/journal/etl",
        "--for-pod",
        "--format",
        "json",
    )
    assert done.returncode == 0, done.stderr
    conf = json.loads(done.stdout)
    assert conf["spark.jars"] == mutation.JAR_URI
    assert (
        conf["spark.jars"]
        == "local:///opt/sparkguard/lib/sparkguard/spark_lib/jars/sparkguard-spark.jar"
    )
    assert done.stderr == ""
