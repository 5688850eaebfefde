"""The ``sparkguard`` command line on bad input: one line naming the input and the fix, the
documented exit status (2 bad input, 1 storage failure), never a traceback.

Most cases run ``sparkguard.cli.main`` in-process (the entry point's function); one runs the
installed ``sparkguard`` script as a subprocess, as a user would.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sparkguard import cli
from tests.spark_lib.test_rollback import PARTS, _start, _task


def _main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "plain.txt"
    path.write_text("not a table\n")
    return path


def test_inspect_a_file(a_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _main(["inspect", str(a_file)], capsys)
    assert code == 2
    line = _one_line(err)
    assert str(a_file) in line
    assert "is a file" in line
    assert "table's directory" in line


def test_rollback_journal_is_a_file(a_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _main(["rollback", "--job-id", "j-1", "--journal", str(a_file)], capsys)
    assert code == 2
    line = _one_line(err)
    assert "--journal" in line
    assert str(a_file) in line
    assert "is a file" in line


def test_rollback_missing_journal_is_an_error_unless_allowed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "no-such-journal")
    code, out, err = _main(["rollback", "--job-id", "j-1", "--journal", missing], capsys)
    assert code == 2
    line = _one_line(err)
    assert "--journal" in line
    assert missing in line
    assert "does not exist" in line
    assert out == ""
    # The operator's rollback initContainer runs before a job's first write: no journal yet.
    code, out, err = _main(
        ["rollback", "--job-id", "j-1", "--journal", missing, "--allow-missing-journal"], capsys
    )
    assert code == 0
    assert "does not exist yet: nothing to roll back" in err
    assert "tables: 0" in out
    assert not Path(missing).exists()


def test_unsupported_protocol_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, what in [
        (["inspect", "foo://bucket/t"], "table 'foo://bucket/t'"),
        (["rollback", "--job-id", "j-1", "--journal", "foo://bucket/j"], "--journal"),
    ]:
        code, _, err = _main(argv, capsys)
        assert code == 2, argv
        line = _one_line(err)
        assert what in line
        assert "foo://" in line
        assert "s3://" in line  # what to use instead
        assert "spark.sparkguard" not in line  # no conf key the command line cannot set


def test_memory_url_says_it_is_per_process(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _main(["inspect", "memory://sg-cli-none"], capsys)
    assert code == 2
    assert "inside one process" in _one_line(err)


def test_journal_entry_whose_table_became_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, journal = str(tmp_path / "t"), str(tmp_path / "j")
    w = _start(url, journal, {}, "became-file")
    _task(w, 0, PARTS[0])
    shutil.rmtree(url)
    Path(url).write_text("someone put a file here\n")
    code, out, err = _main(["rollback", "--job-id", "became-file", "--journal", journal], capsys)
    # Nothing of the job can be under a file: reported as a missing table, nothing touched.
    assert code == 0
    assert "Traceback" not in err
    assert f"table missing (no timeline; nothing done there): {url}" in out
    assert Path(url).read_text() == "someone put a file here\n"


def test_unexpected_errors_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from sparkguard.spark_lib.tools import commands

    def broken(*args: object, **kwargs: object) -> int:
        raise KeyError("boom")

    monkeypatch.setattr(commands, "run_inspect", broken)
    code, _, err = _main(["inspect", str(tmp_path)], capsys)
    assert code == 1
    line = _one_line(err)
    assert "unexpected error: KeyError" in line
    assert "--log-level DEBUG" in line


def test_the_installed_command_on_a_file(a_file: Path) -> None:
    script = Path(sys.executable).with_name("sparkguard")
    assert script.exists(), "the sparkguard entry point is not installed in this venv"
    done = subprocess.run(
        [str(script), "inspect", str(a_file)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "is a file" in _one_line(done.stderr)
    assert done.stdout == ""


@pytest.mark.parametrize(
    ("argv", "command", "names"),
    [
        (
            ["rollback", "--job-id", "Bad_Job", "--journal", "/j"],
            "rollback",
            ["--job-id 'Bad_Job' is"],
        ),
        (
            ["rollback", "--job-id", "j-1", "--journal", "/j", "--owner", ""],
            "rollback",
            ["--owner ''"],
        ),
        (["rollback", "--job-id", "j-1"], "rollback", ["--journal is required"]),
        (["rollback"], "rollback", ["--job-id, --journal are required"]),
        (["inspect"], "inspect", ["table is required"]),
        (["spark-conf", "--journal", "/j"], "spark-conf", ["--job-id is required"]),
        (["spark-conf", "--job-id", "j", "--format", "xml"], "spark-conf", ["--format", "'xml'"]),
        (["bundle"], "bundle", ["--dest is required"]),
        (["sidecar", "--bogus"], "sidecar", ["unrecognized arguments: --bogus"]),
        (["operator", "--webhook-mode", "x"], "operator", ["--webhook-mode", "'x'"]),
        (["operator", "-n"], "operator", ["--namespace: expected one argument"]),
        (["demo", "--rows", "many"], "demo", ["--rows", "'many'"]),
        ([], None, ["COMMAND is required"]),
        (["nope"], None, ["COMMAND", "'nope'"]),
    ],
)
def test_argument_errors_are_one_line_pointing_to_help(
    argv: list[str], command: str | None, names: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/writer.md, "CLI": bad input is one line naming the input and the fix (no usage
    block), exit status 2."""
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    line = _one_line(err)
    prog = "sparkguard" if command is None else f"sparkguard {command}"
    assert line.startswith(f"{prog}: error: "), line
    assert "usage:" not in err
    for name in names:
        assert name in line
    assert line.endswith(f"; run '{prog} --help' for the options"), line
    assert "argument --" not in line  # argparse's prefix, said twice with our messages


def _failing_writes(monkeypatch: pytest.MonkeyPatch, error: OSError) -> None:
    """Every byte the local file manager writes from now on fails with ``error`` (as
    ``os.write`` does: the error names no file)."""
    from sparkguard.spark_lib.filemanager import rename

    def fail(self: object, data: object) -> None:
        raise error

    monkeypatch.setattr(rename._LocalAtomicStream, "_write", fail)


def _failed_rollback(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    *,
    error: OSError,
) -> tuple[str, str]:
    """Roll back an interrupted write while every write fails with ``error``; returns the
    table's path and the one line of stderr."""
    url, journal = str(tmp_path / "t"), str(tmp_path / "j")
    w = _start(url, journal, {}, "full-1")
    _task(w, 0, PARTS[0])
    _failing_writes(monkeypatch, error)
    code, _, err = _main(
        ["rollback", "--job-id", "full-1", "--journal", journal, "--quiet"], capsys
    )
    assert code == 1
    return url, _one_line(err)


def test_disk_full_during_rollback_names_the_path_and_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    url, line = _failed_rollback(tmp_path, monkeypatch, capsys, error=full)
    # The first write of a rollback decides the instant: <table>/_sparkguard/timeline/...
    assert f"the filesystem holding {url}/_sparkguard/timeline/" in line
    assert "is full (No space left on device)" in line
    assert "free space and run the rollback again" in line
    assert "credentials" not in line


def test_permission_denied_during_rollback_says_permissions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    denied = PermissionError(errno.EACCES, os.strerror(errno.EACCES))
    url, line = _failed_rollback(tmp_path, monkeypatch, capsys, error=denied)
    assert f"permission denied on {url}/_sparkguard/timeline/" in line
    assert "run the rollback again as a user who may write there" in line
    assert "credentials" not in line


def _store_error(error: OSError, url: str) -> OSError:
    error.filename = url
    return error


@pytest.mark.parametrize(
    ("error", "needles"),
    [
        (
            OSError(errno.EROFS, os.strerror(errno.EROFS), "/data/t/x"),
            ["/data/t/x is on a read-only filesystem", "remount"],
        ),
        (
            OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), "/data/t/x"),
            ["the filesystem holding /data/t/x is full", "quota"],
        ),
        (
            OSError(errno.EIO, os.strerror(errno.EIO), "/data/t/x"),
            ["I/O error on /data/t/x", "the disk or mount"],
        ),
        (
            OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), "/data/t"),
            ["/data/t is not a directory", "move that file away"],
        ),
        # s3fs: a PermissionError with the store's message and no errno (AccessDenied,
        # InvalidAccessKeyId, ExpiredToken, ...); the file manager names the URL
        (
            _store_error(PermissionError("Access Denied"), "s3://b/t/x"),
            ["access to s3://b/t/x was denied (Access Denied)", "credentials"],
        ),
    ],
)
def test_storage_errors_name_the_path_and_the_cause(error: OSError, needles: list[str]) -> None:
    from sparkguard.spark_lib.base import errors as sg_errors

    text = sg_errors.describe_storage_error(error, retry="run the rollback again")
    for needle in needles:
        assert needle in text
    assert text.endswith("run the rollback again")
    if "credentials" not in needles:
        assert "credentials" not in text


def test_storage_errors_of_other_commands_are_explained_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not only rollback and inspect: the entry point explains a storage error of any command."""
    from sparkguard.spark_lib.tools import bundle

    def full(dest: Path) -> list[str]:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dest))

    monkeypatch.setattr(bundle, "build_bundle", full)
    code, _, err = _main(["bundle", "--dest", str(tmp_path / "lib")], capsys)
    assert code == 1
    line = _one_line(err)
    assert line.startswith("sparkguard bundle: failed: ")
    assert f"the filesystem holding {tmp_path / 'lib'} is full" in line
    assert "unexpected error" not in line


@pytest.mark.parametrize("command", ["inspect", "rollback"])
def test_an_unknown_storage_option_for_a_local_path_is_refused(
    command: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """fsspec's local filesystem swallows any keyword: a misspelt option must not be silently
    ignored (an option of another store, e.g. S3's for tables a local journal names, is fine)."""
    url, journal = str(tmp_path / "t"), str(tmp_path / "j")
    w = _start(url, journal, {}, "opts-1")
    _task(w, 0, PARTS[0])
    monkeypatch.setenv("SPARKGUARD_STORAGE_OPTIONS", '{"endpont_url": "http://s3:9000"}')
    argv = (
        ["inspect", url]
        if command == "inspect"
        else ["rollback", "--job-id", "opts-1", "--journal", journal, "--quiet"]
    )
    code, out, err = _main(argv, capsys)
    assert (code, out) == (2, "")
    line = _one_line(err)
    assert line.startswith(f"sparkguard {command}: error: SPARKGUARD_STORAGE_OPTIONS: ")
    assert "'endpont_url' is not an option of file:// storage" in line
    assert "auto_mkdir" in line  # what it does take
    assert "remove it" in line
    # Nothing was rolled back: the task's file is still there, the instant still in flight.
    monkeypatch.setenv("SPARKGUARD_STORAGE_OPTIONS", "{}")
    code, out, _ = _main(["inspect", url, "--json"], capsys)
    assert code == 0
    assert '"inflight"' in out
