"""The README's first command: `sparkguard demo` recovers a killed Spark job exactly once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark
SPARKGUARD = str(Path(sys.executable).parent / "sparkguard")


def _demo(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    return subprocess.run(
        [SPARKGUARD, "demo", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=600,
        check=False,
    )


def test_demo_recovers_exactly_once(tmp_path: Path) -> None:
    result = _demo(
        "--dir", str(tmp_path / "demo"), "--rows", "20000", "--partitions", "6", cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == (
        "exactly-once: OK (20000 rows, 0 duplicates, 0 missing, 0 uncommitted files, 0 temp files)"
    )
    out = result.stdout
    assert "temp files of writes cut short (never visible): " in out
    assert "no temp file left behind" in out
    assert "attempt 0 died in the middle of its write" in out
    assert "instant(s) still inflight: " in out
    # the killed first write created the table: the rollback removed its location, so the
    # final timeline holds only the rerun's commit (docs/storage-contract.md, "The life of a table")
    assert "the dead attempt had created the table: its location was removed" in out
    assert "rolled_back" not in out.rsplit("Verify the table", 1)[-1]
    assert "committed" in out
    assert "FAIL" not in out


def test_demo_rejects_bad_flags(tmp_path: Path) -> None:
    result = _demo("--partitions", "1", cwd=tmp_path)
    assert result.returncode == 2
    assert "--partitions must be >= 2" in result.stderr
    result = _demo("--rows", "many", cwd=tmp_path)
    assert result.returncode == 2
    assert "--rows" in result.stderr
    for storage, needle in [("foo://b/demo", "cannot open foo://"), ("memory://d", "one process")]:
        result = _demo("--storage", storage, cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr  # one line, no traceback
        assert f"--storage {storage!r}" in lines[0]
        assert needle in lines[0]
