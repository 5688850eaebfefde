"""sparkguard's CheckpointFileManager on S3 through S3A (the test S3 server behind the request-
counting proxy, no latency): the shared vectors of the atomic file manager, a streaming query's
checkpoint written with one conditional PUT per file, and a second query on the same checkpoint
refused with Spark's concurrent-update error (by whichever of Spark's checks fires first; the
race only the conditional PUT decides is in test_checkpoint_race.py). On a real HDFS (the
minicluster: temp file + hsync + ``FileContext.rename`` on a NameNode): the same shared vectors.
On both: a query SIGKILLed at a seeded random moment restarts from its checkpoint exactly once
(repeated kills of one query: test_foreach_batch.py, test_streaming_sink_s3.py).

Requests are counted, never timed."""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.spark import sparkconf
from tests.jvm import s3a, stores
from tests.jvm.conftest import JOBS, job_env, run_job
from tests.support import hdfs, s3server
from tests.support.process import kill_session
from tests.support.s3faults import Fault, Op, S3FaultFront

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
#: Spark's errors for a second query on a checkpoint in use: the losing conditional PUT
#: (FileAlreadyExistsException in HDFSMetadataLog) or the batch found already written.
CONCURRENT_ERRORS = (
    "Multiple streaming queries are concurrently using",
    "CONCURRENT_STREAM_LOG_UPDATE",
)


@contextlib.contextmanager
def counting_proxy(server: s3server.S3Server) -> Iterator[str]:
    """benchmarks/_s3proxy.py in front of ``server`` without latency or throttling: it only
    logs each request (``GET /_proxy/requests``). Yields its URL."""
    port = s3server.free_port()
    proxy = f"http://127.0.0.1:{port}"
    args = [
        sys.executable, str(ROOT / "benchmarks" / "_s3proxy.py"), "--port", str(port),
        "--upstream", server.endpoint, "--latency-ms", "0",
        "--write-rate", "1000000", "--read-rate", "1000000",
    ]  # fmt: skip
    process = subprocess.Popen(args, env={**os.environ, "PYTHONSAFEPATH": "1"})
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                requests_of(proxy)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield proxy
    finally:
        process.terminate()
        process.wait(timeout=30)


def requests_of(proxy: str) -> list[dict[str, Any]]:
    import urllib.request

    with urllib.request.urlopen(f"{proxy}/_proxy/requests", timeout=10) as answer:  # noqa: S310
        result: list[dict[str, Any]] = json.loads(answer.read())
    return without_create_probes(result)


def without_create_probes(log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``log`` less the requests of the conditional-create probe (a hidden key a JVM writes
    twice, expecting 412, then deletes, once per bucket: ``ConditionalCreateProbe``), after
    checking that each probe made exactly those writes."""
    probes: dict[str, list[tuple[str, bool, int]]] = {}
    rest = []
    for r in log:
        if "/.sg-create-probe-" in r["path"]:
            probes.setdefault(r["path"], []).append((r["method"], r["conditional"], r["status"]))
        else:
            rest.append(r)
    # S3A's delete of the probe leaves a directory marker for its parent if nothing else is
    # there yet (an empty object named "<dir>/"): the probe's, not the write's
    parents = {key.rsplit("/", 1)[0] + "/" for key in probes}
    rest = [r for r in rest if not (r["method"] == "PUT" and r["path"] in parents)]
    for key, requests in probes.items():
        # two conditional PUTs (the second refused), then S3A's delete (HEAD first)
        assert requests[:2] == [("PUT", True, 200), ("PUT", True, 412)], (key, requests)
        rest_methods = [m for m, _, _ in requests[2:]]
        assert rest_methods.count("DELETE") == 1, (key, requests)
        assert set(rest_methods) <= {"HEAD", "GET", "DELETE"}, (key, requests)
    return rest


def manager_conf(server: s3server.S3Server, jars: Path, *, endpoint: str) -> dict[str, str]:
    """S3A on ``endpoint`` (the proxy) plus the checkpoint manager from build_spark_conf."""
    conf = s3a.spark_conf(server, jars)
    conf["spark.hadoop.fs.s3a.endpoint"] = endpoint
    return with_manager(conf)


def with_manager(conf: dict[str, str]) -> dict[str, str]:
    """A store's Spark ``conf`` plus the checkpoint manager from build_spark_conf."""
    ours = sparkconf.build_spark_conf("checkpoint-test")
    return stores.with_jars(
        conf,
        {
            "spark.jars": ours["spark.jars"],
            sparkconf.CHECKPOINT_MANAGER_KEY: ours[sparkconf.CHECKPOINT_MANAGER_KEY],
        },
    )


def checkpoint_files(server: s3server.S3Server, bucket: str, prefix: str) -> dict[str, bytes]:
    client = server.client()
    keys: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [o["Key"] for o in page.get("Contents", [])]
    return {k: client.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys}


def assert_every_file_parses(files: dict[str, bytes], prefix: str) -> Counter[str]:
    """Every metadata-log file is ``v<n>`` then JSON lines; ``metadata`` is one JSON object.
    Returns how many files of each log there are."""
    logs: Counter[str] = Counter()
    for key, body in files.items():
        rel = key[len(prefix) :].lstrip("/")
        if rel.endswith("/") or not body:
            continue  # S3A's directory markers
        if filemanager.is_temp_name(rel):
            continue  # a killed write's temp file on a rename store: hidden, Spark skips it
        text = body.decode()
        if rel == "metadata":
            json.loads(text)
            logs["metadata"] += 1
            continue
        log, _, name = rel.rpartition("/")
        assert name.isdigit() or name.endswith(".compact"), f"unexpected checkpoint file {key}"
        first, *rest = text.split("\n")
        assert first.startswith("v"), f"{key}: header {first!r}"
        assert first[1:].isdigit(), f"{key}: header {first!r}"
        for line in rest:
            if line:
                json.loads(line)  # a partial file fails here
        logs[log] += 1
    return logs


#: The shared vectors of the atomic file manager: (Python test, JUnit test, S3A probe key).
SHARED_VECTORS = (
    ("test_publishes_only_on_close", "publishesOnlyOnClose", "publishes_only_on_close"),
    ("test_cancel_leaves_nothing", "cancelLeavesNothing", "cancel_leaves_nothing"),
    (
        "test_create_if_absent_refuses_existing",
        "createIfAbsentRefusesExisting",
        "create_if_absent_refuses_existing",
    ),
    (
        "test_racing_creators_exactly_one_wins",
        "racingCreatorsExactlyOneWins",
        "racing_creators_exactly_one_wins",
    ),
    ("test_overwrite_replaces", "overwriteReplaces", "overwrite_replaces"),
)


@pytest.mark.parametrize(("python", "junit", "probe"), SHARED_VECTORS)
def test_shared_vector_exists_in_python_junit_and_the_s3a_probe(
    python: str, junit: str, probe: str
) -> None:
    """Each vector is asserted by the Python file manager's tests, by the JUnit test of the
    checkpoint manager and by the S3A probe job; renaming one without the others fails here."""
    python_tests = (ROOT / "tests" / "spark_lib" / "test_filemanager.py").read_text()
    junit_tests = (
        ROOT / "spark_lib" / "jvm" / "src" / "test" / "java" / "io" / "sparkguard" / "spark"
        / "SparkguardCheckpointFileManagerTest.java"
    ).read_text()  # fmt: skip
    assert f"def {python}(" in python_tests
    assert f"void {junit}()" in junit_tests
    assert f"# {python}" in (JOBS / "checkpoint_files.py").read_text()
    assert f'result["{probe}"]' in (JOBS / "checkpoint_files.py").read_text()


def assert_shared_vectors(result: dict[str, Any]) -> None:
    """The same vectors as tests/spark_lib/test_filemanager.py and the JUnit test."""
    assert result["publishes_only_on_close"] == {
        "visible_before_close": False,
        "content": "hello world",
    }
    assert result["cancel_leaves_nothing"] == {"exists": False, "names": []}
    assert result["create_if_absent_refuses_existing"] == {
        "error": "org.apache.hadoop.fs.FileAlreadyExistsException",
        "content": "first",
        "names": ["0"],
    }
    race = result["racing_creators_exactly_one_wins"]
    assert race["errors"].count(None) == 1
    assert race["errors"].count("org.apache.hadoop.fs.FileAlreadyExistsException") == 3
    assert race["content"] == "writer-0" * 100  # whole: the winner's bytes, nothing mixed
    assert race["names"] == ["0"]
    assert result["overwrite_replaces"] == {"content": "new"}


@pytest.mark.s3
def test_shared_vectors_on_s3a_one_conditional_put_per_file(
    s3_server: s3server.S3Server, s3a_jars: Path
) -> None:
    bucket = s3_server.create_bucket()
    with counting_proxy(s3_server) as proxy:
        conf = manager_conf(s3_server, s3a_jars, endpoint=proxy)
        result = run_job("checkpoint_files.py", f"s3a://{bucket}/cp", conf=conf)
        log = requests_of(proxy)
    assert result["mechanism"].startswith("direct PUT, conditional")
    assert_shared_vectors(result)

    writes = [r for r in log if r["method"] in ("PUT", "POST", "DELETE")]
    by_key: dict[str, list[tuple[str, bool, int]]] = {}
    for r in writes:
        by_key.setdefault(r["path"], []).append((r["method"], r["conditional"], r["status"]))
    base = f"/{bucket}/cp"
    # One request per published file: a conditional PUT (put-if-absent) or a plain one.
    assert by_key[f"{base}/publish/0"] == [("PUT", True, 200)]
    assert by_key[f"{base}/once/0"] == [("PUT", True, 200), ("PUT", True, 412)]
    assert by_key[f"{base}/race/0"] == [("PUT", True, 200)] + [("PUT", True, 412)] * 3
    assert by_key[f"{base}/replace/0"] == [("PUT", False, 200)] * 2
    # The cancelled stream sent nothing at all; no copies, deletes or temp objects anywhere.
    assert not any("/cancel" in r["path"] for r in writes)
    assert set(by_key) == {f"{base}/{d}/0" for d in ("publish", "once", "race", "replace")}
    assert not any(r["copy"] for r in log)


@pytest.mark.s3
def test_a_conditional_create_whose_answer_was_lost_is_its_own_not_a_lost_race(
    s3_server: s3server.S3Server, s3_faults: S3FaultFront, s3a_jars: Path
) -> None:
    """The store applies a conditional create, then the connection resets before its answer
    (the fault front); S3A's retry is refused with 412. The object there is this very create's
    (its write id in the object's metadata), so the create succeeded: the shared vectors hold
    unchanged, a second create of the name is still refused, and of four racing creators one
    wins. Without the write id the first create of each name failed as if it had lost a race.
    """
    bucket = s3_server.create_bucket()
    for name in ("publish", "once", "race"):
        s3_faults.fail_next(Op.PUT, Fault.RESET_AFTER, key=f"/{bucket}/cp/{name}/0")
    conf = manager_conf(s3_server, s3a_jars, endpoint=s3_faults.endpoint)
    result = run_job("checkpoint_files.py", f"s3a://{bucket}/cp", conf=conf)
    assert s3_faults.injected[(Op.PUT, Fault.RESET_AFTER)] == 3
    assert_shared_vectors(result)


@pytest.mark.hdfs
def test_shared_vectors_on_hdfs_by_rename_on_the_namenode(hdfs_cluster: hdfs.MiniHdfs) -> None:
    """The vectors on a real NameNode: the losers of the create race get HDFS's own
    ``FileAlreadyExistsException`` from ``rename(NONE)``, and no temp file is left."""
    store = stores.on_hdfs(hdfs_cluster)
    result = run_job("checkpoint_files.py", store.url("cp"), conf=with_manager(store.conf))
    assert result["mechanism"] == "temp file + hsync + FileContext.rename", result
    assert_shared_vectors(result)
    assert [k for k in store.listing() if ".sg-tmp-" in k] == []


@pytest.mark.s3
def test_streaming_checkpoint_on_s3a_one_put_per_file_and_every_file_parses(
    s3_server: s3server.S3Server, s3a_jars: Path
) -> None:
    bucket = s3_server.create_bucket()
    checkpoint, output = f"s3a://{bucket}/cp", f"s3a://{bucket}/out"
    with counting_proxy(s3_server) as proxy:
        conf = manager_conf(s3_server, s3a_jars, endpoint=proxy)
        result = run_job("stream_checkpoint.py", checkpoint, output, "3", conf=conf)
        log = requests_of(proxy)
    assert result["lastBatch"] >= 3
    rows = (result["lastBatch"] + 1) * 10  # read back through the sink's _spark_metadata
    assert result["sink"] == {"rows": rows, "distinct": rows, "max": rows - 1}
    files = checkpoint_files(s3_server, bucket, "cp/")
    logs = assert_every_file_parses(files, "cp/")
    assert logs["metadata"] == 1
    assert logs["offsets"] >= 4
    assert logs["commits"] >= 4
    sink_logs = assert_every_file_parses(
        checkpoint_files(s3_server, bucket, "out/_spark_metadata/"), "out/"
    )
    assert sink_logs["_spark_metadata"] >= 4

    # Each checkpoint file (offsets, commits, the sink's log, metadata) was created by exactly
    # one conditional PUT of its final key: no temp object, no copy, no delete.
    published = [k for k in files if not k.endswith("/")]
    published += list(checkpoint_files(s3_server, bucket, "out/_spark_metadata/"))
    for key in published:
        if key.endswith("/"):
            continue
        writes = [
            (r["method"], r["conditional"], r["status"])
            for r in log
            if r["path"] == f"/{bucket}/{key}" and r["method"] != "GET" and r["method"] != "HEAD"
        ]
        assert writes == [("PUT", True, 200)], (key, writes)
    checkpoint_writes = [
        r for r in log if r["method"] not in ("GET", "HEAD") and "/cp/" in r["path"] + "/"
    ]
    assert not any(r["copy"] or r["method"] == "DELETE" for r in checkpoint_writes)
    assert not any(".tmp" in r["path"] or ".sg-tmp-" in r["path"] for r in log)


@pytest.mark.s3
def test_second_query_on_the_same_checkpoint_fails_with_the_concurrent_update_error(
    s3_server: s3server.S3Server, s3a_jars: Path, tmp_path: Path
) -> None:
    """Two processes run the same query on one checkpoint without end: one of them must fail
    with Spark's concurrent-update error (the survivor is then killed), and every checkpoint
    file still parses.

    What this shows, honestly: a second query on a checkpoint in use is refused, by either of
    Spark's two checks, and nothing is left half-written. It does not show which mechanism
    fired: in the runs here it was nearly always Spark's own existence check before each
    metadata-log write (``CONCURRENT_STREAM_LOG_UPDATE``: the batch was already there), not
    sparkguard's conditional PUT. The race the conditional PUT decides (both queries past that
    check) is produced deterministically in test_checkpoint_race.py."""
    bucket = s3_server.create_bucket()
    checkpoint = f"s3a://{bucket}/cp"
    conf = manager_conf(s3_server, s3a_jars, endpoint=s3_server.endpoint)
    env = job_env()  # with the test JVM options
    args = [sys.executable, str(JOBS / "stream_checkpoint.py"), json.dumps(conf), checkpoint]
    queries: list[subprocess.Popen[bytes]] = []
    outputs = [(tmp_path / f"q{i}.out", tmp_path / f"q{i}.err") for i in range(2)]

    def start(i: int) -> None:
        out, err = outputs[i]
        with out.open("wb") as stdout, err.open("wb") as stderr:
            queries.append(
                subprocess.Popen(
                    [*args, "noop", "1000000"],
                    stdout=stdout,
                    stderr=stderr,
                    env=env,
                    start_new_session=True,  # its own process group: the JVM dies with it
                )
            )

    try:
        start(0)
        client = s3_server.client()
        deadline = time.monotonic() + 300
        while "Contents" not in client.list_objects_v2(Bucket=bucket, Prefix="cp/commits/1"):
            assert queries[0].poll() is None, outputs[0][1].read_text()[-3000:]
            assert time.monotonic() < deadline, "the first query made no progress in 300 s"
            time.sleep(0.5)
        start(1)
        deadline = time.monotonic() + 600
        while all(q.poll() is None for q in queries):
            assert time.monotonic() < deadline, "both queries ran side by side for 600 s"
            time.sleep(0.5)
        # The loser has exited; a survivor gets a moment in case it lost a later race too.
        with contextlib.suppress(subprocess.TimeoutExpired):
            for q in queries:
                q.wait(timeout=5)
    finally:
        for q in queries:
            kill_session(q.pid)
            q.wait()
    failed = [i for i, q in enumerate(queries) if q.returncode == 4]
    assert failed, [
        (q.returncode, outputs[i][1].read_text()[-2000:]) for i, q in enumerate(queries)
    ]
    for i in failed:
        error = json.loads(outputs[i][0].read_text().strip().splitlines()[-1])["error"]
        assert any(marker in error for marker in CONCURRENT_ERRORS), error
    assert_every_file_parses(checkpoint_files(s3_server, bucket, "cp/"), "cp/")


@pytest.mark.slow
@pytest.mark.parametrize("store", stores.params("s3", "hdfs"), indirect=True)
def test_sigkilled_query_restarts_from_its_checkpoint_exactly_once(
    store: stores.Store, tmp_path: Path
) -> None:
    """rate-micro-batch -> parquet on the store, SIGKILLed (the whole process group: driver and
    JVM) at a seeded random moment, restarted from the checkpoint: every checkpoint file parses
    and the sink, read through _spark_metadata, holds each input row exactly once."""
    rng = random.Random(13)  # the kill point: 0.44 s after the second commit
    checkpoint, output = store.url("cp"), store.url("out")
    conf = with_manager(store.conf)
    env = job_env()  # with the test JVM options
    args = [sys.executable, str(JOBS / "stream_checkpoint.py"), json.dumps(conf), checkpoint]

    def committed() -> int:
        names = [k.rsplit("/", 1)[-1] for k in store.listing("cp/commits/")]
        return max((int(n) for n in names if n.isdigit()), default=-1)

    target = committed() + rng.randint(1, 3)
    with (tmp_path / "killed.err").open("wb") as err:
        query = subprocess.Popen(
            [*args, output, "1000000"],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
            start_new_session=True,  # its own process group: the JVM dies with it
        )
    try:
        deadline = time.monotonic() + 300
        while committed() < target:
            assert query.poll() is None, (tmp_path / "killed.err").read_text()[-3000:]
            assert time.monotonic() < deadline, f"no commit {target} within 300 s"
            time.sleep(0.2)
        time.sleep(rng.uniform(0, 1.5))  # somewhere inside the next micro-batch
    finally:
        kill_session(query.pid)
        query.wait()
    last = committed() + 2
    result = run_job("stream_checkpoint.py", checkpoint, output, str(last), conf=conf)
    assert_every_file_parses(store.files("cp/"), "cp/")
    assert_every_file_parses(store.files("out/_spark_metadata/"), "out/")
    rows = (result["lastBatch"] + 1) * 10  # rate-micro-batch: 10 rows per batch, 0, 1, 2, ...
    assert result["sink"] == {"rows": rows, "distinct": rows, "max": rows - 1}
