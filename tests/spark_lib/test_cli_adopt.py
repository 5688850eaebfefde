"""``sparkguard adopt``: a table plain Spark wrote gets its files recorded once as a committed
baseline; the committed-only reader then sees them, and a killed first protected write is rolled
back around them. The command runs as the installed ``sparkguard``, as a user runs it."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from sparkguard.spark_lib.storage import reader
from tests.spark_lib.test_cli_locations import one_line, sparkguard
from tests.spark_lib.test_rollback import PARTS, _start, _task


def _listed(table: Path) -> list[str]:
    """What a reader listing the directory sees (Spark skips names starting with _ or .)."""
    return sorted(
        str(p)
        for p in table.rglob("*")
        if p.is_file() and not any(s.startswith(("_", ".")) for s in p.relative_to(table).parts)
    )


def test_an_adopted_table_keeps_its_files_through_a_killed_first_write(tmp_path: Path) -> None:
    table, journal = tmp_path / "orders", tmp_path / "journal"
    (table / "day=1").mkdir(parents=True)
    pq.write_table(pa.table({"id": [1, 2]}), table / "part-00000.parquet")
    pq.write_table(pa.table({"id": [3]}), table / "day=1" / "part-00001.parquet")
    (table / "_SUCCESS").write_text("")
    before = _listed(table)
    assert reader.committed_paths(str(table)) == []  # not adopted: the reader hides them

    done = sparkguard("adopt", str(table))
    assert done.returncode == 0, done.stderr
    assert "adopted 2 files" in done.stdout
    assert reader.committed_paths(str(table)) == before

    # The first protected write dies after one task (no commit), and is rolled back.
    _task(_start(str(table), str(journal), {}, "first-write"), 0, PARTS[0])
    assert len(_listed(table)) == 3
    done = sparkguard("rollback", "--job-id", "first-write", "--journal", str(journal))
    assert done.returncode == 0, done.stderr
    assert "rolled back: 1" in done.stdout
    # Every reader sees the same files: the adopted ones, untouched.
    assert _listed(table) == before
    assert reader.committed_paths(str(table)) == before

    done = sparkguard("adopt", str(table))  # recorded once
    assert done.returncode == 2
    assert "was adopted already" in one_line(done.stderr)
