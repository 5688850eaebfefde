"""Every benchmark starts the way docs/benchmarks.md shows it: ``.venv/bin/python
benchmarks/<name>.py`` from the repository's root, with or without ``PYTHONSAFEPATH``.

Run as a script, a file's own folder comes first on ``sys.path``: a benchmark named like a
standard-library or installed module (``operator.py`` once was) shadows it for the whole
process, and the interpreter dies before argparse runs. ``_``-prefixed files are helpers."""

from __future__ import annotations

import importlib.metadata
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
SCRIPTS = sorted(path.stem for path in BENCHMARKS.glob("[!_]*.py"))


def test_there_are_scripts_to_check() -> None:
    assert "writer" in SCRIPTS
    assert "recovery" in SCRIPTS


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_prints_its_usage_without_pythonsafepath(name: str) -> None:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONSAFEPATH"}
    result = subprocess.run(
        [str(REPO / ".venv" / "bin" / "python"), f"benchmarks/{name}.py", "--help"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: {name}.py"), result.stdout


def test_no_file_in_benchmarks_is_named_like_a_module_it_could_shadow() -> None:
    """Helpers too: ``benchmarks/`` is on every benchmark's ``sys.path``."""
    taken = set(sys.stdlib_module_names)
    taken |= set(importlib.metadata.packages_distributions())
    elsewhere = [entry for entry in sys.path if Path(entry or ".").resolve() != BENCHMARKS]
    taken |= {module.name for module in pkgutil.iter_modules(elsewhere)}
    names = {path.stem for path in BENCHMARKS.glob("*.py")}
    shadowing = sorted(names & taken)
    assert not shadowing
