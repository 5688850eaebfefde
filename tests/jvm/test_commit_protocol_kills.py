"""An unchanged PySpark job writing through the JVM commit protocol is SIGKILLed (the whole
driver: its Python process and its Spark JVM) at each stage of a write, rolled back with
``sparkguard rollback`` as a user would, and rerun: every row exactly once, no uncommitted or
temp file left.

The stages are chosen explicitly (coverage is never left to chance): the inflight written, the
first marker, the first published file, half the files published, and the committed outcome
(killed after it: the rerun must skip the write, spark-operator#1854). A seeded draw adds kills
at random delays inside the write; the seed chooses only the delay.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sparkguard import cli
from sparkguard.spark_lib import reader, sparkconf
from tests.jvm.conftest import job_command, job_env, run_job

pytestmark = pytest.mark.spark

JOB = "jvm-kill-1"
ROWS = 3_000_000
PARTITIONS = 8


def _inflights(table: Path) -> list[Path]:
    return list((table / "_sparkguard" / "timeline").glob("*.inflight"))


def _markers(table: Path) -> list[Path]:
    return list((table / "_sparkguard" / "markers").glob("*/*.marker.*"))


def _published(table: Path) -> list[Path]:
    return list(table.glob("part-*"))


def _outcomes(table: Path) -> list[Path]:
    return list((table / "_sparkguard" / "timeline").glob("*.outcome"))


#: Each stage: is the write (at least) there yet?
STAGES: dict[str, Callable[[Path], bool]] = {
    "inflight": lambda t: bool(_inflights(t)),
    "first-marker": lambda t: bool(_markers(t)),
    "first-file": lambda t: bool(_published(t)),
    "half-files": lambda t: len(_published(t)) >= PARTITIONS // 2,
    "outcome": lambda t: bool(_outcomes(t)),
}


def _kill_when(
    table: Path, conf: dict[str, str], ready: Callable[[Path], bool], delay: float
) -> None:
    """Start the job, wait until ``ready(table)``, then ``delay`` seconds, then SIGKILL the whole
    driver (process group). Fails when the job ended before the stage was reached."""
    proc = subprocess.Popen(
        job_command("plain_write.py", str(table), str(ROWS), str(PARTITIONS), conf=conf),
        env=job_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not ready(table):
            if proc.poll() is not None:
                stderr = proc.stderr.read().decode() if proc.stderr else ""
                pytest.fail(f"the job exited {proc.returncode} before the stage:\n{stderr[-3000:]}")
            assert time.monotonic() < deadline, "the stage was never reached"
            time.sleep(0.002)
        time.sleep(delay)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        if proc.stderr:
            proc.stderr.close()


def _rollback(journal: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    capsys.readouterr()
    code = cli.main(["rollback", "--job-id", JOB, "--journal", str(journal), "--json", "--quiet"])
    out = capsys.readouterr().out
    assert code == 0, out
    summary: dict[str, object] = json.loads(out)
    return summary


def _assert_exactly_once(table: Path) -> None:
    result = run_job(
        "plain_write.py", str(table), str(ROWS), str(PARTITIONS),
        conf=sparkconf.build_spark_conf(JOB, journal=str(table.parent / "journal")),
    )  # fmt: skip
    assert result == {"rows": ROWS, "ids": ROWS}, "plain Spark's read of the directory"
    committed = sorted(reader.committed_paths(str(table)))
    on_disk = sorted(str(p) for p in _published(table))
    assert committed == on_disk, "every data file in the directory is committed"
    leftovers = [p.name for p in table.rglob("*") if ".sg-tmp-" in p.name or "_temporary" in p.name]
    assert leftovers == []
    markers_root = table / "_sparkguard" / "markers"
    assert not markers_root.exists() or list(markers_root.iterdir()) == []


@pytest.mark.parametrize("stage", list(STAGES))
def test_killed_at_each_stage_then_rolled_back_and_rerun_is_exactly_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], stage: str
) -> None:
    table, journal = tmp_path / "table", tmp_path / "journal"
    conf = sparkconf.build_spark_conf(JOB, journal=str(journal))
    _kill_when(table, conf, STAGES[stage], delay=0.0)
    assert _inflights(table), "the kill came after the write started"
    # What a user does after the crash: roll the job back, then resubmit it unchanged.
    summary = _rollback(journal, capsys)
    assert list(table.glob("part-*")) == [] or stage == "outcome", summary
    _assert_exactly_once(table)


@pytest.mark.parametrize("seed", [11, 23])
def test_killed_at_a_random_moment_of_the_write_then_rerun_is_exactly_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], seed: int
) -> None:
    table, journal = tmp_path / "table", tmp_path / "journal"
    conf = sparkconf.build_spark_conf(JOB, journal=str(journal))
    delay = random.Random(seed).uniform(0.0, 2.0)  # the seed picks the moment, not the coverage
    _kill_when(table, conf, STAGES["inflight"], delay=delay)
    _rollback(journal, capsys)
    _assert_exactly_once(table)
