"""A concurrent second query on the same checkpoint fails at once with Spark's usual
concurrent-update error (the conditional PUT is doing its job), on S3 as on HDFS: proven
deterministically for the race that only sparkguard's put-if-absent can decide.

Why not two real queries: Spark's ``HDFSMetadataLog.add`` asks ``exists(<log>/<n>)`` before it
writes a batch, and a second query almost always finds the batch already written there (Spark's
``CONCURRENT_STREAM_LOG_UPDATE``; see the two-process test in test_checkpoint_manager.py). The
case the conditional PUT exists for — both queries past that check, both publishing the same
file — depends on timing and cannot be produced on demand with two processes.

Design (decided here): a test-only ``RacingCheckpointFileManager`` (spark_lib/jvm/src/test/java,
never shipped; it extends the production ``SparkguardCheckpointFileManager``, which has no test
hook) is the query's checkpoint manager. For one configured metadata-log file (``offsets/1`` or
``commits/1``: reached after a whole batch 0), it lets Spark's existence check and the query's
write run unchanged, and at the stream's ``close()`` first publishes a competitor's version of
that same file through a second, plain ``SparkguardCheckpointFileManager`` (the other query's
put-if-absent landing between this query's check and its publication), then closes the query's
own stream. The competitor's version is the query's bytes with ``batchTimestampMs`` (offsets)
or ``nextBatchWatermarkMs`` (commits) set to ``COMPETITOR_MARK``, so the surviving file tells
whose it is. A real ``rate-micro-batch`` -> ``noop`` query runs with it (the test classes on the
driver's class path), and each test checks:

- the query fails with Spark's ``SparkConcurrentModificationException`` "Multiple streaming
  queries are concurrently using ...", caused directly by the ``FileAlreadyExistsException`` of
  sparkguard's put-if-absent (not ``CONCURRENT_STREAM_LOG_UPDATE``);
- the winner's file is intact: it parses and it is the competitor's (the mark);
- the query wrote nothing after it: no later commit, no temp file (``.<name>.sg-tmp-*``);
- on S3 (through S3A, the test S3 server behind the request-counting proxy; the race on
  ``offsets/1``, the same conditional PUT as ``commits/1``'s): that key got exactly the
  competitor's conditional PUT (200) and the query's conditional PUT (412), and the checkpoint
  no COPY and no DELETE;
- on local disk (``LocalAtomicFiles``: link) and on HDFS's mechanism (``RenameAtomicFiles``:
  ``FileContext.rename`` without overwrite, forced on ``file://`` by the tests-only
  ``sparkguard.test.hadoopRenameStoreForLocal``, over Hadoop's local filesystem): the same
  failure and file checks;
- on a real HDFS (the minicluster, marker ``hdfs``): the same, the loser refused by the
  NameNode's own ``rename(NONE)``.

The JUnit ``RacingCheckpointFileManagerTest`` drives Spark's ``CommitLog`` with the same manager
without a query. The test classes come from ``scripts/build-jvm.sh`` (``scripts/test.sh`` runs it
before pytest; it compiles them even with ``--skip-tests``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from sparkguard.spark_lib.spark import sparkconf
from tests.jvm import stores
from tests.jvm.conftest import run_job
from tests.jvm.test_checkpoint_manager import (
    assert_every_file_parses,
    checkpoint_files,
    counting_proxy,
    manager_conf,
    requests_of,
)
from tests.support import hdfs, s3server

pytestmark = [pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
TEST_CLASSES = ROOT / "spark_lib" / "jvm" / "target" / "test-classes"
RACING_CLASS = "io.sparkguard.spark.RacingCheckpointFileManager"
RACE_FILE_KEY = "spark.hadoop.sparkguard.test.race.file"
HDFS_SWITCH_KEY = "spark.hadoop.sparkguard.test.hadoopRenameStoreForLocal"
#: RacingCheckpointFileManager.COMPETITOR_MARK
COMPETITOR_MARK = 1234567890123
MARK_FIELD = {"offsets": "batchTimestampMs", "commits": "nextBatchWatermarkMs"}
SPARK_ERROR = "org.apache.spark.SparkConcurrentModificationException"
EXISTS_ERROR = "org.apache.hadoop.fs.FileAlreadyExistsException"


def log_of(race_file: str) -> str:
    """``offsets`` of ``offsets/1``."""
    return race_file.partition("/")[0]


def racing_conf(base: dict[str, str], race_file: str) -> dict[str, str]:
    """``base`` with the racing manager (from the JVM module's test classes) racing for
    ``race_file``."""
    racing = TEST_CLASSES / "io" / "sparkguard" / "spark" / "RacingCheckpointFileManager.class"
    if not racing.is_file():
        pytest.fail(f"{racing} is missing: run scripts/build-jvm.sh --force (it compiles them)")
    conf = dict(base)
    # The driver's own class path: the subclass and its parent must come from one class loader.
    conf["spark.driver.extraClassPath"] = f"{TEST_CLASSES}{os.pathsep}{sparkconf.jar_path()}"
    conf[sparkconf.CHECKPOINT_MANAGER_KEY] = RACING_CLASS
    conf[RACE_FILE_KEY] = race_file
    return conf


def assert_lost_to_put_if_absent(result: dict[str, Any], race_file: str) -> list[list[str]]:
    """The query failed, on ``race_file``'s log, with Spark's "Multiple streaming queries" error
    caused by sparkguard's FileAlreadyExistsException; returns the chain from that exception."""
    causes = result["causes"]
    classes = [c for c, _ in causes]
    assert SPARK_ERROR in classes, causes
    at = classes.index(SPARK_ERROR)
    message = causes[at][1]
    assert "Multiple streaming queries are concurrently using" in message, message
    assert message.rstrip(".").endswith("cp/" + log_of(race_file)), message
    assert classes[at + 1] == EXISTS_ERROR, causes  # sparkguard's put-if-absent, nothing else
    assert not any("CONCURRENT_STREAM_LOG_UPDATE" in m for _, m in causes), causes
    return [list(c) for c in causes[at + 1 :]]


def assert_competitors_file(body: bytes, race_file: str) -> None:
    """The surviving file parses (``v1``, then JSON lines) and is the competitor's."""
    header, metadata, *rest = body.decode().split("\n")
    assert header == "v1", body
    fields = json.loads(metadata)
    for line in rest:
        if line:
            json.loads(line)
    assert fields[MARK_FIELD[log_of(race_file)]] == COMPETITOR_MARK, fields


def assert_stopped_at(files: dict[str, bytes], race_file: str) -> None:
    """The checkpoint holds batch 0, the raced file and nothing after it; every file parses."""
    expected = {"cp/metadata", "cp/offsets/0", "cp/commits/0", "cp/offsets/1", f"cp/{race_file}"}
    assert {k for k in files if not k.endswith("/")} == expected, sorted(files)
    logs = assert_every_file_parses(files, "cp/")
    assert logs["metadata"] == 1


@pytest.mark.s3
def test_on_s3a_the_racing_query_loses_to_the_conditional_put(
    s3_server: s3server.S3Server, s3a_jars: Path
) -> None:
    """The race on ``offsets/1``. Spark writes ``commits/1`` through the same call
    (``HDFSMetadataLog.add`` -> ``createAtomic``, no overwrite) and sparkguard's manager puts
    both with the same conditional PUT, so one log is enough here; the race on ``commits/1`` runs
    on HDFS's rename and on a real NameNode (the two tests below)."""
    race_file = "offsets/1"
    bucket = s3_server.create_bucket()
    checkpoint = f"s3a://{bucket}/cp"
    with counting_proxy(s3_server) as proxy:
        conf = racing_conf(manager_conf(s3_server, s3a_jars, endpoint=proxy), race_file)
        result = run_job("stream_race.py", checkpoint, "3", conf=conf)
        log = requests_of(proxy)
    assert result["mechanism"].startswith("direct PUT, conditional"), result
    exists = assert_lost_to_put_if_absent(result, race_file)
    assert "412" in exists[0][1], exists  # sparkguard's translation of S3A's 412
    assert exists[1][0] == "org.apache.hadoop.fs.s3a.RemoteFileChangedException", exists

    key = f"cp/{race_file}"
    writes = [
        (r["method"], r["conditional"], r["status"])
        for r in log
        if r["path"] == f"/{bucket}/{key}" and r["method"] not in ("GET", "HEAD")
    ]
    # The competitor's conditional PUT, then the query's, refused: no copy, delete or retry.
    assert writes == [("PUT", True, 200), ("PUT", True, 412)], writes
    checkpoint_writes = [
        r for r in log if r["method"] not in ("GET", "HEAD") and "/cp" in r["path"]
    ]
    assert not any(r["copy"] or r["method"] == "DELETE" for r in checkpoint_writes)
    assert not any(".sg-tmp-" in r["path"] or ".tmp" in r["path"] for r in log)

    files = checkpoint_files(s3_server, bucket, "cp/")
    assert_competitors_file(files[key], race_file)
    assert_stopped_at(files, race_file)


@pytest.mark.parametrize(
    ("store", "race_file", "mechanism"),
    [
        ("local", "offsets/1", "local temp file + fsync + link/rename"),
        ("hdfs-rename", "commits/1", "temp file + hsync + FileContext.rename"),
    ],
)
def test_on_local_disk_and_hdfs_rename_the_racing_query_loses_to_put_if_absent(
    tmp_path: Path, store: str, race_file: str, mechanism: str
) -> None:
    checkpoint = tmp_path / "cp"
    base = {HDFS_SWITCH_KEY: "true"} if store == "hdfs-rename" else {}
    conf = racing_conf(base, race_file)
    result = run_job("stream_race.py", checkpoint.as_uri(), "3", conf=conf)
    assert result["mechanism"] == mechanism, result
    assert_lost_to_put_if_absent(result, race_file)

    names = sorted(str(p.relative_to(checkpoint)) for p in checkpoint.rglob("*") if p.is_file())
    assert not any(".sg-tmp-" in n for n in names), names
    files = {
        f"cp/{n}": (checkpoint / n).read_bytes()
        for n in names
        if not n.rsplit("/", 1)[-1].startswith(".")  # Hadoop's .<name>.crc beside each file
    }
    assert_competitors_file(files[f"cp/{race_file}"], race_file)
    assert_stopped_at(files, race_file)


@pytest.mark.hdfs
def test_on_a_real_namenode_the_racing_query_loses_to_put_if_absent(
    hdfs_cluster: hdfs.MiniHdfs,
) -> None:
    store = stores.on_hdfs(hdfs_cluster)
    race_file = "commits/1"
    result = run_job(
        "stream_race.py", store.url("cp"), "3", conf=racing_conf(store.conf, race_file)
    )
    assert result["mechanism"] == "temp file + hsync + FileContext.rename", result
    assert_lost_to_put_if_absent(result, race_file)
    files = store.files("cp/")
    assert not any(".sg-tmp-" in k for k in files), sorted(files)
    assert_competitors_file(files[f"cp/{race_file}"], race_file)
    assert_stopped_at(files, race_file)
