"""Overwrites through the JVM commit protocol, seen by every kind of reader: an unchanged
PySpark job's ``mode("overwrite")`` (static, and dynamic partition overwrite) replaces the data
at its commit; killed mid-write, the old data stays whole and is all a directory reader sees
(the new files are hidden temp files until the outcome), ``sparkguard rollback`` removes the
dead write's files, and the rerun replaces the table exactly once.

Two views are checked each time: the committed-only reader (``reader.committed_paths``,
``sparkguard inspect``) and a plain directory reader (pyarrow's dataset discovery, which skips
``_``/``.`` names as Spark's listing does).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from sparkguard import cli
from sparkguard.spark_lib.spark import sparkconf
from sparkguard.spark_lib.storage import reader
from tests.jvm.conftest import job_command, job_env, run_job
from tests.support.process import kill_session

pytestmark = pytest.mark.spark

OLD, NEW = "jvm-ow-old", "jvm-ow-new"  # one job id per run, as the operator gives them


def _conf(job: str, journal: Path, **extra: str) -> dict[str, str]:
    return {**sparkconf.build_spark_conf(job, journal=str(journal)), **extra}


def _directory_ids(table: Path) -> list[int]:
    """What a plain directory reader sees (the ``n`` column of every listed file)."""
    dataset = pads.dataset(str(table), format="parquet", partitioning="hive")
    return sorted(dataset.to_table(columns=["n"]).column("n").to_pylist())


def _inspect(table: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert cli.main(["inspect", str(table), "--json"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def _data_files(table: Path) -> list[str]:
    return sorted(
        str(p.relative_to(table))
        for p in table.rglob("*.parquet")
        if reader.is_data_path(str(p.relative_to(table)))
    )


def test_an_overwrite_replaces_the_table_for_both_readers_and_removes_plain_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table, journal = tmp_path / "table", tmp_path / "journal"
    assert run_job("plain_write.py", str(table), "1000", "4", conf=_conf(OLD, journal)) == {
        "rows": 1000,
        "ids": 1000,
    }
    # A file written before the table opted into sparkguard: no instant lists it.
    legacy = pa.table({"n": pa.array(range(5000, 5010), pa.int64())})
    pq.write_table(legacy, table / "legacy.parquet")
    assert len(_directory_ids(table)) == 1010

    args = ("500", "2", "overwrite", "-", "10000")
    result = run_job("plain_write.py", str(table), *args, conf=_conf(NEW, journal))
    assert result == {"rows": 500, "ids": 500}  # the job's own spark.read.parquet of the dir

    new_names = [f"part-{p:05d}-{NEW}-w000-c000.snappy.parquet" for p in range(2)]
    assert reader.committed_paths(str(table)) == [str(table / n) for n in new_names]
    assert _data_files(table) == new_names  # the superseded and the plain file are deleted
    assert _directory_ids(table) == list(range(10000, 10500))
    doc = _inspect(table, capsys)
    assert [(i["jobId"], i["operation"]) for i in doc["instants"]] == [
        (OLD, "append"),
        (NEW, "overwrite"),
    ]
    assert doc["visible"]["rows"] == 500
    assert doc["superseded"] == 4  # still in the timeline's history, no longer on storage


def test_a_dynamic_partition_overwrite_replaces_only_the_partitions_it_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table, journal = tmp_path / "table", tmp_path / "journal"
    # 0..999 into k=0..3; then 10000..10099 all into k=1 (10000 + n, n % 4 = 0 -> 1).
    run_job(
        "plain_write.py",
        str(table),
        "1000",
        "2",
        "append",
        "-",
        "0",
        "n % 4",
        conf=_conf(OLD, journal),
    )
    dynamic = _conf(NEW, journal, **{"spark.sql.sources.partitionOverwriteMode": "dynamic"})
    result = run_job(
        "plain_write.py",
        str(table),
        "100",
        "2",
        "overwrite",
        "-",
        "10000",
        "IF(n >= 10000, 1, n % 4)",
        conf=dynamic,
    )
    assert result == {"rows": 750 + 100, "ids": 850}

    expected = sorted([n for n in range(1000) if n % 4 != 1] + list(range(10000, 10100)))
    assert _directory_ids(table) == expected
    committed = [Path(p).relative_to(table).as_posix() for p in reader.committed_paths(str(table))]
    assert sorted(committed) == _data_files(table)
    assert all(NEW in f for f in committed if f.startswith("k=1/"))
    doc = _inspect(table, capsys)
    (replacing,) = [i for i in doc["instants"] if i["jobId"] == NEW]
    assert (replacing["operation"], replacing["partitions"]) == ("overwrite-partitions", ["k=1"])
    assert doc["visible"]["rows"] == len(expected)


#: The killed overwrite: 8 files written two at a time (local[2]), enough rows that the kill
#: at half its temp files lands before the outcome (two waves of tasks still to run then).
ROWS = 1_000_000
PARTITIONS = 8


def _new_files(table: Path) -> list[Path]:
    return [p for p in table.glob("part-*") if f"-{NEW}-" in p.name]


def _new_temp_files(table: Path) -> list[Path]:
    return [p for p in table.glob(".part-*.sg-tmp-*") if f"-{NEW}-" in p.name]


#: Where the overwrite is killed: half its files written (under their temp names: published
#: only after the outcome), or its outcome written (then the renames and the deletes of W9b may
#: or may not have run: rollback finishes them).
STAGES: dict[str, Callable[[Path], bool]] = {
    "half-temps": lambda t: len(_new_temp_files(t)) >= PARTITIONS // 2,
    "outcome": lambda t: any(
        p.name.endswith(f"-{NEW}.outcome") for p in (t / "_sparkguard" / "timeline").iterdir()
    ),
}


def _start_overwrite(table: Path, journal: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        job_command(
            "plain_write.py",
            str(table),
            str(ROWS),
            str(PARTITIONS),
            "overwrite",
            "-",
            "100000000",
            conf=_conf(NEW, journal),
        ),
        env=job_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


@pytest.mark.parametrize("stage", list(STAGES))
def test_an_overwrite_killed_mid_write_leaves_the_old_data_then_the_rerun_replaces_it_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], stage: str
) -> None:
    table, journal = tmp_path / "table", tmp_path / "journal"
    run_job("plain_write.py", str(table), "1000", "4", conf=_conf(OLD, journal))
    old = {p.name: p.read_bytes() for p in table.glob("part-*")}

    proc = _start_overwrite(table, journal)
    try:
        deadline = time.monotonic() + 300
        while not STAGES[stage](table):
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else ""
                pytest.fail(f"the job exited {proc.returncode} before {stage}:\n{err[-3000:]}")
            assert time.monotonic() < deadline, f"{stage} was never reached"
            time.sleep(0.002)
    finally:
        kill_session(proc.pid)  # the whole driver: Python, its Spark JVM, its workers
        proc.wait(timeout=60)
        if proc.stderr:
            proc.stderr.close()

    if stage == "half-temps":
        # Undecided: both readers see the old table, before any rollback; the old files whole.
        assert reader.committed_paths(str(table)) == [str(table / n) for n in sorted(old)]
        assert {n: (table / n).read_bytes() for n in old} == old
        assert _directory_ids(table) == list(range(1000)), "no file of the running overwrite"
    capsys.readouterr()
    code = cli.main(["rollback", "--job-id", NEW, "--journal", str(journal), "--json", "--quiet"])
    assert code == 0, capsys.readouterr().out
    if stage == "half-temps":
        assert _new_files(table) == []
        assert _new_temp_files(table) == []
        assert _directory_ids(table) == list(range(1000)), "the old data, intact"
    else:
        # Committed: rollback finished the deletes the dead driver may not have done.
        assert sorted(p.name for p in table.glob("part-*")) == sorted(
            p.name for p in _new_files(table)
        )

    # The rerun: a new driver run of the same job (skipped if its overwrite had committed).
    result = run_job(
        "plain_write.py",
        str(table),
        str(ROWS),
        str(PARTITIONS),
        "overwrite",
        "-",
        "100000000",
        conf=_conf(NEW, journal),
    )
    assert result == {"rows": ROWS, "ids": ROWS}
    committed = sorted(reader.committed_paths(str(table)))
    assert committed == sorted(str(p) for p in table.glob("part-*")), "no stray data file"
    assert all(f"-{NEW}-" in p for p in committed)
    leftovers = [p.name for p in table.rglob("*") if ".sg-tmp-" in p.name]
    assert leftovers == []
    markers_root = table / "_sparkguard" / "markers"
    assert not markers_root.exists() or list(markers_root.iterdir()) == []


def test_an_adopted_table_is_overwritten_as_committed_and_a_failed_overwrite_keeps_it(
    tmp_path: Path,
) -> None:
    """Files plain Spark wrote, once adopted (``sparkguard adopt``), are committed files to the
    JVM protocol too: a failed overwrite leaves them whole (its deletes wait for its commit),
    and a committed one replaces them."""
    table, journal = tmp_path / "t", tmp_path / "journal"
    table.mkdir()
    pq.write_table(pa.table({"n": pa.array([-3, -2, -1], pa.int64())}), table / "part-0.parquet")
    assert cli.main(["adopt", str(table)]) == 0
    adopted = reader.committed_paths(str(table))
    assert len(adopted) == 1
    args = ("plain_write.py", str(table), "40", "2", "overwrite")
    failed = run_job(*args, "30", conf=_conf("jvm-ow-adopt", journal), expect_exit=3)
    assert failed == {"failed": True}
    assert cli.main(["rollback", "--job-id", "jvm-ow-adopt", "--journal", str(journal)]) == 0
    assert reader.committed_paths(str(table)) == adopted
    assert _directory_ids(table) == [-3, -2, -1]  # every reader: the adopted rows, whole
    run_job(*args, conf=_conf("jvm-ow-adopt", journal))
    assert _directory_ids(table) == list(range(40))
    assert not (table / "part-0.parquet").exists()  # replaced, as any committed file
