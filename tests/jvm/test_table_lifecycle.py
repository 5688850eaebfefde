"""The life of a table through the JVM layer (docs/storage-contract.md, "The life of a table"):
an unchanged job's first write creates the table (``saveAsTable``, CTAS, ``df.write.parquet`` to
a new path), its driver is SIGKILLed mid-write, ``sparkguard rollback`` runs as the operator's
rollback initContainer runs it (the command line ``operator/mutation.build_rollback_init``
builds) and removes the location the write created; the rerun then creates the table (before:
Spark's ``LOCATION_ALREADY_EXISTS``) and holds every row once, for ``spark.table`` and for the
committed-only reader. On local disk, and on the S3 server through ``s3a://``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import fsspec
import pyarrow.parquet as pq
import pytest

from sparkguard import cli
from sparkguard.operator import appmeta, mutation
from sparkguard.operator import config as operator_config
from sparkguard.spark_lib.spark import sparkconf
from sparkguard.spark_lib.storage import reader
from sparkguard.spark_lib.tools import commands
from tests.jvm import s3a
from tests.jvm.conftest import job_command, kill_when, run_job

pytestmark = pytest.mark.spark

JOB = "orders-nightly"
#: Enough rows that the kill (at the first data file) lands inside the write; each case writes
#: them twice (the killed run and the rerun).
ROWS = 1_000_000
PARTITIONS = 8


def _rollback_init_container(
    journal: str,
    options: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> dict[str, Any]:
    """Run the command of the operator's rollback initContainer for this job (as built by the
    operator), with ``--json --quiet`` added to read its summary; fails unless it exits 0."""
    app_options = appmeta.Options(
        job_id=JOB,
        max_retries=3,
        backoff=1.0,
        backoff_max=10.0,
        marker_type=appmeta.MarkerType.DIRECT,
        storage_secret=None,
        journal=journal,
    )
    container = mutation.build_rollback_init(app_options, config=operator_config.OperatorConfig())
    command = container["command"]
    assert command[:2] == ["sparkguard", "rollback"]
    monkeypatch.setenv(commands.STORAGE_ENV, json.dumps(options))
    capsys.readouterr()
    code = cli.main([*command[1:], "--json", "--quiet"])
    out = capsys.readouterr().out
    assert code == 0, out
    summary: dict[str, Any] = json.loads(out)
    return summary


def _committed_ids(table: str, options: dict[str, Any]) -> list[int]:
    """Every ``n`` in the committed files of ``table`` (the committed-only reader, pyarrow)."""
    ids: list[int] = []
    for path in reader.committed_paths(table, storage_options=options):
        fs, _, (plain,) = fsspec.get_fs_token_paths(path, storage_options=options)
        with fs.open(plain, "rb") as handle:
            ids.extend(pq.read_table(handle).column("n").to_pylist())
    return ids


def _glob(table: str, pattern: str, options: dict[str, Any]) -> list[str]:
    fs, _, _ = fsspec.get_fs_token_paths(table, storage_options=options)
    fs.invalidate_cache()
    return list(fs.glob(f"{table}/{pattern}"))


@pytest.mark.parametrize("how", ["saveAsTable", "ctas", "parquet"])
def test_a_killed_first_write_rolled_back_by_the_init_container_then_rerun_creates_the_table(
    how: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    journal = str(tmp_path / "journal")
    conf = sparkconf.build_spark_conf(JOB, journal=journal)
    if how == "parquet":
        location = str(tmp_path / "orders")
        table = location
    else:
        location = str(tmp_path / "warehouse")
        conf["spark.sql.warehouse.dir"] = location
        table = str(tmp_path / "warehouse" / "orders")
    args = (how, location, str(ROWS), str(PARTITIONS))
    # The first data file written (under its temp name: published only after the outcome).
    kill_when(
        job_command("create_table.py", *args, conf=conf),
        lambda: bool(_glob(table, ".part-*.sg-tmp-*", {})),
        poll_s=0.002,
        log=tmp_path / "killed.log",
    )
    inflight = _glob(table, "_sparkguard/timeline/*.inflight", {})
    assert inflight, "the kill came after the write started"
    extra = json.loads(Path(inflight[0]).read_text())["extra"]
    assert extra.get("createdLocation") is True, extra

    summary = _rollback_init_container(journal, {}, capsys, monkeypatch)
    assert summary["tablesRemoved"] == [table], summary
    assert not Path(table).exists()

    result = run_job("create_table.py", *args, conf=conf, timeout=900)
    assert result == {"rows": ROWS, "ids": ROWS}, "spark.table / spark.read of the table"
    ids = _committed_ids(table, {})
    assert len(ids) == ROWS
    assert len(set(ids)) == ROWS


def test_a_table_that_existed_before_the_killed_write_is_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = str(tmp_path / "journal")
    table = str(tmp_path / "orders")
    Path(table).mkdir()
    (Path(table) / "legacy.parquet").write_bytes(b"a file the table held before sparkguard")
    conf = sparkconf.build_spark_conf(JOB, journal=journal)
    command = job_command("plain_write.py", table, str(ROWS), str(PARTITIONS), conf=conf)
    kill_when(command, lambda: bool(_glob(table, ".part-*.sg-tmp-*", {})), poll_s=0.002)
    summary = _rollback_init_container(journal, {}, capsys, monkeypatch)
    assert summary["tablesRemoved"] == []
    assert summary["instantsRolledBack"], summary
    assert _glob(table, "part-*", {}) == []
    assert (Path(table) / "legacy.parquet").exists()
    assert Path(table, "_sparkguard", "timeline").is_dir()


@pytest.mark.s3
def test_a_killed_first_write_to_a_new_s3a_path_leaves_no_key_after_the_rollback(
    tmp_path: Path,
    s3_server: Any,
    s3a_jars: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    journal = str(tmp_path / "journal")
    conf = sparkconf.build_spark_conf(JOB, journal=journal)
    storage = s3a.spark_conf(s3_server, s3a_jars)
    both = {**conf, **storage, "spark.jars": f"{conf['spark.jars']},{storage['spark.jars']}"}
    bucket = s3_server.create_bucket()
    table = f"s3a://{bucket}/orders"
    options = dict(s3_server.storage_options)
    client = s3_server.client()

    def uploads() -> list[str]:
        listed = client.list_multipart_uploads(Bucket=bucket, Prefix="orders/")
        return [u["Key"] for u in listed.get("Uploads", [])]

    kill_when(  # a data file written, left as a pending upload: before the commit
        job_command("create_table.py", "parquet", table, str(ROWS), str(PARTITIONS), conf=both),
        lambda: bool(uploads()),
        poll_s=0.05,
        log=tmp_path / "killed.log",
    )
    assert _glob(table, "part-*", options) == [], "no data file visible before the commit"
    summary = _rollback_init_container(journal, options, capsys, monkeypatch)
    assert summary["tablesRemoved"] == [table], summary
    fs = fsspec.filesystem("s3", **options)
    listed = fs.call_s3("list_objects_v2", Bucket=bucket, Prefix="orders")
    assert [o["Key"] for o in listed.get("Contents", [])] == [], "no key under the prefix"
    assert uploads() == [], "no upload left in progress"

    args = ("parquet", table, str(ROWS), str(PARTITIONS))
    result = run_job("create_table.py", *args, conf=both, timeout=900)
    assert result == {"rows": ROWS, "ids": ROWS}
    assert len(set(_committed_ids(table, options))) == ROWS
