"""Ownership of instants: two owners (two apps) with one job id on one table.

Owner A writes with real PySpark; owner B's write is driven in-process through the writer's own
driver and task code (so the test can hold it in flight). A's rollback must leave B's in-flight
instant and files alone, A's next write must refuse to run beside it, B then commits; a forced
rollback still rolls back another owner's instant.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors
from sparkguard.spark_lib.spark import writer
from sparkguard.spark_lib.storage import markers, reader, rollback, timeline
from tests.spark_lib.spark_conftest import (
    assert_exactly_once,
    assert_no_strays,
    ids_df,
    spark,
    undecided,
)
from tests.spark_lib.test_rollback import PARTS, SCHEMA, _task

__all__ = ["spark"]

pytestmark = pytest.mark.spark
JOB = "shared-job"
OWNER_A = "k8s:team-a/nightly/1a2b3c"
OWNER_B = "k8s:team-b/nightly/4d5e6f"


@pytest.fixture(params=["local", "s3"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str, str, dict[str, Any]]:
    """(table URL, journal of A, journal of B, storage options) on local disk or S3."""
    if request.param == "local":
        return str(tmp_path / "t"), str(tmp_path / "ja"), str(tmp_path / "jb"), {}
    bucket = request.getfixturevalue("s3_bucket")
    options = request.getfixturevalue("s3_options")
    return f"{bucket}/t", f"{bucket}/ja", f"{bucket}/jb", options


def _conf(owner: str, journal: str, options: dict[str, Any]) -> dict[str, str]:
    return {
        "spark.sparkguard.jobId": JOB,
        "spark.sparkguard.owner": owner,
        "spark.sparkguard.journal": journal,
        "spark.sparkguard.storageOptions": json.dumps(options),
    }


def _start_b(url: str, journal: str, options: dict[str, Any], **opts: str) -> writer.BatchWriter:
    cls = writer.source_class(_conf(OWNER_B, journal, options))
    built = cls(options={"path": url, **opts}).writer(SCHEMA, False)
    assert isinstance(built, writer.BatchWriter)
    return built


def _spark_write_a(spark: Any, url: str, journal: str, options: dict[str, Any], df: Any) -> None:
    writer.register(spark, conf=_conf(OWNER_A, journal, options))
    df.write.format("sparkguard").mode("append").save(url)


def test_rollback_of_one_owner_leaves_another_owners_instant_alone(
    spark: Any, where: tuple[str, str, str, dict[str, Any]]
) -> None:
    url, journal_a, journal_b, options = where
    # A's write fails in every task attempt: Spark aborts it, A's instant is rolled back, and
    # A's journal now names the table.
    failing = ids_df(spark, range(300)).selectExpr("if(id = 7, raise_error('boom'), id) as id", "s")
    with pytest.raises(Exception, match="boom"):
        _spark_write_a(spark, url, journal_a, options, failing)
    tl = timeline.timeline_for(url, storage_options=options)
    (a1,) = tl.instant_ids(job_id=JOB)
    assert tl.status(a1).owner == OWNER_A
    assert tl.status(a1).state is timeline.State.ROLLED_BACK

    # B (same job id, another app) is in flight with three files.
    wb = _start_b(url, journal_b, options)
    assert tl.status(wb.instant).owner == OWNER_B
    messages = [_task(wb, p, ids) for p, ids in PARTS.items()]
    b_files = [f.path for m in messages for f in m.files]
    manager, table = filemanager.resolve(url, storage_options=options)

    # A's recovery: B's instant is reported, not touched. (A's own rolled-back instant may show
    # up again: a task of A's failed stage that was still running when Spark aborted can publish
    # its file after the abort's rollback, and this pass rightly removes that late file.)
    summary = rollback.rollback_job(JOB, journal_a, owner=OWNER_A, storage_options=options)
    assert set(summary.instants_rolled_back) <= {a1}
    assert wb.instant not in summary.instants_rolled_back
    assert summary.to_json()["instantsOtherOwner"] == [
        {"instant": wb.instant, "table": reader.table_url(url), "owner": OWNER_B}
    ]
    assert tl.status(wb.instant).state is timeline.State.INFLIGHT
    assert all(manager.exists(f"{table}/{path}") for path in b_files)

    # A's next attempt (real Spark) refuses to write beside B's in-flight instant.
    with pytest.raises(Exception, match="in flight for owner") as refused:
        _spark_write_a(spark, url, journal_a, options, ids_df(spark, range(300)))
    assert wb.instant in str(refused.value)
    assert f"--owner '{OWNER_B}'" in str(refused.value)

    # B commits: its rows are there exactly once, nothing stray.
    wb.commit(list(messages))
    assert_exactly_once(url, range(300), options)
    assert_no_strays(url, options)

    # A forced rollback does roll back another owner's in-flight instant (an orphan).
    again = _start_b(url, journal_b, options, rerun="rewrite")
    late = [_task(again, p, ids) for p, ids in PARTS.items()]
    forced = rollback.rollback_job(
        JOB, journal_a, owner=OWNER_A, force=True, storage_options=options
    )
    assert forced.instants_rolled_back == (again.instant,)
    assert forced.to_json()["instantsOtherOwner"] == []
    with pytest.raises(errors.InstantDecidedError):
        again.commit(list(late))
    assert undecided(url, options) == []
    assert_exactly_once(url, range(300), options)
    assert_no_strays(url, options)


def test_default_owner_and_owner_validation(tmp_path: Path) -> None:
    manager, table = filemanager.resolve(str(tmp_path / "t"))
    tl = timeline.Timeline(manager, table)
    instant = tl.start("job-x", attempt=0, marker_type="DIRECT")
    assert tl.status(instant).owner == "job:job-x"
    # An inflight written before owners existed has the default owner too.
    path = f"{table}/_sparkguard/timeline/{instant}.inflight"
    doc = json.loads(manager.read_bytes(path))
    del doc["owner"]
    manager.write_bytes(path, json.dumps(doc).encode(), overwrite=True)
    assert tl.status(instant).owner == "job:job-x"
    assert rollback.rollback_table(str(tmp_path / "t"), owner="k8s:a/b/c").details[0].action == (
        rollback.Action.OTHER_OWNER
    )
    assert rollback.rollback_table(str(tmp_path / "t")).instants_rolled_back == (instant,)
    with pytest.raises(errors.ConfigError, match="owner"):
        tl.start("job-x", attempt=0, marker_type="DIRECT", owner="bad\nowner")


def test_cli_owner_and_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``sparkguard rollback --owner/--force``: the orphan is named with the way to recover it."""
    import argparse

    from sparkguard.spark_lib.tools import commands

    url, journal = str(tmp_path / "t"), str(tmp_path / "j")
    wb = _start_b(url, journal, {})
    _task(wb, 0, PARTS[0])

    def run(*argv: str) -> tuple[int, str]:
        parser = argparse.ArgumentParser(prog="sparkguard")
        commands.add_arguments(parser.add_subparsers().add_parser("rollback"))
        code = commands.run(
            parser.parse_args(["rollback", "--job-id", JOB, "--journal", journal, *argv])
        )
        return code, capsys.readouterr().out

    code, out = run()  # default owner job:shared-job: B's instant is left alone
    assert code == 0
    assert f"left alone: {wb.instant}" in out
    assert f"--owner '{OWNER_B}'" in out
    assert timeline.timeline_for(url).status(wb.instant).state is timeline.State.INFLIGHT
    code, out = run("--owner", OWNER_A, "--json")
    assert json.loads(out)["instantsOtherOwner"][0]["owner"] == OWNER_B
    code, out = run("--owner", OWNER_B, "--json")
    assert json.loads(out)["instantsRolledBack"] == [wb.instant]
    assert json.loads(out)["filesDeleted"] == 1
    orphan = _start_b(url, journal, {})
    code, out = run("--force", "--json")
    assert json.loads(out)["instantsRolledBack"] == [orphan.instant]
    assert json.loads(out)["force"] is True
    with pytest.raises(SystemExit) as bad:
        run("--owner", "bad\towner")
    assert bad.value.code == 2
    assert "--owner" in capsys.readouterr().err


def test_stream_registration_records_the_owner(tmp_path: Path) -> None:
    from sparkguard.spark_lib.spark import config, streaming

    conf = {"spark.sparkguard.jobId": "stream-owner", "spark.sparkguard.owner": OWNER_A}
    settings = config.parse_settings(conf=conf)
    target = writer.open_target(str(tmp_path / "t"), settings)
    streaming.ensure_registered(target, settings, fmt="parquet", schema_json="{}")
    (instant,) = target.timeline.instant_ids()
    assert target.timeline.status(instant).owner == OWNER_A


def test_stale_markers_of_a_committed_instant_spare_another_owners_live_names(
    tmp_path: Path,
) -> None:
    """A's driver died after committing, leaving markers of a failed attempt's name; B (same
    job id) is now writing that very name: A's cleanup must not delete B's file."""
    url = str(tmp_path / "t")
    manager, table = filemanager.resolve(url)
    tl = timeline.Timeline(manager, table)
    client = markers.DirectMarkerClient(manager)
    name = f"part-00001-{JOB}-c000.parquet"
    a = tl.start(JOB, attempt=0, marker_type="DIRECT", owner=OWNER_A)
    client.create(markers.marker_dir(table, a), name)
    tl.commit(a, [])
    b = tl.start(JOB, attempt=0, marker_type="DIRECT", owner=OWNER_B)
    client.create(markers.marker_dir(table, b), name)
    manager.write_bytes(f"{table}/{name}", b"B's data")
    summary = rollback.rollback_table(url, job_id=JOB, owner=OWNER_A)
    assert manager.exists(f"{table}/{name}")
    assert summary.files_deleted == 0
    assert [o.instant for o in summary.instants_other_owner] == [b]
