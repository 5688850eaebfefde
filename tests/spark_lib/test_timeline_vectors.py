"""The shared timeline vectors (tests/vectors/timeline/<case>/): the Python reader over every
case, whichever side wrote it (``py-*`` by hand, ``jvm-*`` by the JVM module's code)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.storage import reader, snapshots

VECTORS = Path(__file__).resolve().parents[1] / "vectors" / "timeline"
CASES = sorted(p.name for p in VECTORS.iterdir() if (p / "expected.json").is_file())


def test_the_python_cases_are_there() -> None:
    assert {
        "py-torn-snapshot",
        "py-stale-pointer",
        "py-snapshot-racing-commit",
        "py-overwrite-covered",
    } <= set(CASES)


@pytest.mark.parametrize("case", CASES)
def test_the_python_reader_reads_every_vector(case: str, tmp_path: Path) -> None:
    table = tmp_path / case
    shutil.copytree(VECTORS / case, table)  # a copy: a reader must not change it, but be sure
    expected = json.loads((VECTORS / case / "expected.json").read_text())
    visible = reader.committed_files(str(table))
    assert {p: {"size": f.size, "rows": f.rows} for p, f in visible.items()} == expected["visible"]
    manager, path = filemanager.resolve(str(table))
    view = snapshots.load_view(manager, path)
    assert snapshots.committed_writes(view) == expected["committedWrites"]
    # Compacting the copy keeps what it reads.
    snapshots.compact(manager, path)
    assert reader.committed_files(str(table)) == visible
    assert (
        snapshots.committed_writes(snapshots.load_view(manager, path))
        == expected["committedWrites"]
    )
