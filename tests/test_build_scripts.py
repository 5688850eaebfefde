"""The bench's build scripts decide "up to date" from a stamp: the same inputs give the same
stamp, whatever path the script is called by (scripts/test.sh calls them relative to the
checkout, the bench's fixtures by an absolute path)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APACHE = Path("tests/kubebench/build-apache-operator.sh")


def _stamp(script: Path, cwd: Path) -> str:
    done = subprocess.run(
        [str(script), "--stamp"], cwd=cwd, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    return line


def test_the_apache_operator_builds_stamp_does_not_depend_on_the_calling_path() -> None:
    stamps = {
        _stamp(APACHE, ROOT),
        _stamp(Path("kubebench") / APACHE.name, ROOT / "tests"),
        _stamp(ROOT / APACHE, Path("/")),
    }
    assert len(stamps) == 1, stamps
    assert len(stamps.pop()) == 64
