"""The compatibility tier: sparkguard on every Spark release tests/compat/versions.txt lists,
each with its own PySpark (scripts/fetch-spark-compat.sh), the results docs/compatibility.md
tabulates.

For a supported release: an unchanged append under ``sparkguard spark-conf --spark-version``
SIGKILLed (driver and JVM) once a data file is published, ``sparkguard rollback``, then one
driver that reruns the append exactly once (every row once), makes the same append (a few
thousand rows) to an ``hdfs://`` table on the run's HDFS minicluster (the pinned Hadoop's
NameNode, the release's own Hadoop client) and, where the JVM layer writes S3A (4.1+), to an
``s3a://`` table on the test S3 server (the S3A jars of the release's own Hadoop), runs a
streaming query, stops it and restarts it (every row once), appends through the Python writer,
and reads a CSV file with the jar in ``spark.jars``; each store's table then holds every row
once, only committed data files and no temp file (S3: no multipart upload left), and
``sparkguard rollback`` of the job leaves it whole. For the
unsupported release: ``spark-conf`` (from its installed PySpark) refuses it in one line, and
with the jar in ``spark.jars`` a plain read works while a guarded write and
``format("sparkguard")`` fail with the jar's one-line refusal. Two JVM starts per supported
release, one for the refused one; small data.

And on every supported release the version-sensitive part of the JUnit suite (``junit.txt``:
which classes, from which line, and why) runs against the shipped jar and that release's jars
(``scripts/build-jvm.sh --tests-only``, Maven offline). Its stamp skips Maven when the jar, the
test sources, the pom and the release's jars are unchanged since a run that passed; the test
then reads that run's Surefire reports.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

from sparkguard.spark_lib.spark import sparkconf, sparkversions
from sparkguard.spark_lib.storage import reader
from tests.jvm import stores
from tests.jvm.conftest import job_env, kill_when, rollback_as_init_container
from tests.support import cached_jars, hdfs, jvm_options, s3server

pytestmark = [pytest.mark.spark, pytest.mark.compat]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CACHE = cached_jars.cache_root() / "compat"
ROWS = 40_000
#: the rows of the append to each remote store's table (the store is the point, not the size)
STORE_ROWS = 4_000
JOB = "compat-1"


def _releases() -> list[tuple[str, str]]:
    lines = (HERE / "versions.txt").read_text().splitlines()
    return [
        (parts[0], parts[1])
        for parts in (line.split() for line in lines)
        if parts and not parts[0].startswith("#")
    ]


def _pinned() -> str:
    (pin,) = re.findall(r"^pyspark==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M)
    return pin


def _site(version: str) -> Path:
    """The site-packages of ``version``'s PySpark venv (scripts/fetch-spark-compat.sh)."""
    site = CACHE / version / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    assert (CACHE / version / ".complete").is_file(), (
        f"no PySpark {version} venv in {CACHE}: run scripts/fetch-spark-compat.sh "
        "(scripts/test.sh does, before pytest)"
    )
    return site / "site-packages"


def _env(version: str) -> dict[str, str]:
    """A job's environment with ``version``'s PySpark first on PYTHONPATH (the pinned one is
    the project's own venv), and a class-data archive of that release's jars (the session's
    is of the pinned release's: tests/support/jvm_options.py dumps one per release once per
    machine, under ``~/.cache/sparkguard/cds/``)."""
    env = job_env()
    env["SPARK_SUBMIT_OPTS"] = re.sub(r"-XX:SharedArchiveFile=\S+", "", env["SPARK_SUBMIT_OPTS"])
    if version != _pinned():
        site = _site(version)
        env["PYTHONPATH"] = str(site)
        archive, _ = jvm_options.ensure_archive(CACHE.parent, site=site)
        if archive is not None:  # without one the JVMs only start slower
            env["SPARK_SUBMIT_OPTS"] += f" -XX:SharedArchiveFile={archive} {jvm_options.QUIET_CDS}"
    env["PYSPARK_PYTHON"] = sys.executable  # the Python writer's workers: this release's PySpark
    return env


def _stores(
    version: str, request: pytest.FixtureRequest, cluster: hdfs.MiniHdfs
) -> list[stores.Store]:
    """A fresh directory of each remote store the JVM layer writes on ``version``: the run's
    HDFS minicluster, and on 4.1+ (S3A's conditional create) a bucket of the session's S3
    server through the S3A jars of the release's own Hadoop (scripts/fetch-spark-compat.sh
    fetched them)."""
    found = [stores.on_hdfs(cluster)]
    if sparkversions.check(version, what="the release").s3a:
        server: s3server.S3Server = request.getfixturevalue("s3_server")
        jars = cached_jars.fetch("s3a", pyspark_jars=_site(version) / "pyspark" / "jars")
        found.append(stores.on_s3(server, jars))
    return found


def _assert_only_committed_files(store: stores.Store) -> None:
    """``store``'s table holds its committed data files and nothing of a write in flight: no
    temp file, no ``_temporary``, no marker, no multipart upload."""
    table = store.url("table")
    listing = store.listing("table/")
    committed = reader.committed_files(table, storage_options=store.options)
    data = [name for name in listing if name.rsplit("/", 1)[-1].startswith("part-")]
    assert data, listing
    assert sorted(f"table/{c}" for c in committed) == data, listing
    assert [n for n in listing if ".sg-tmp-" in n or "_temporary" in n] == [], listing
    assert [n for n in listing if "/_sparkguard/markers/" in n] == [], listing
    assert store.uploads() == [], "an incomplete multipart upload left"


def _run(command: list[str], env: dict[str, str], *, timeout: float = 600) -> dict[str, object]:
    proc = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, f"{command[1]} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize(
    "version", [v for v, expect in _releases() if expect == "supported"], ids=str
)
def test_a_supported_release_runs_the_zero_code_path_streaming_and_rollback(
    version: str,
    tmp_path: Path,
    *,
    request: pytest.FixtureRequest,
    hdfs_cluster: hdfs.MiniHdfs,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = _env(version)
    journal = str(tmp_path / "journal")
    conf = sparkconf.build_spark_conf(JOB, journal=journal, spark_version=version)
    remote = _stores(version, request, hdfs_cluster)
    table = tmp_path / "table"
    killed = [
        "env",
        *(f"{k}={env[k]}" for k in ("PYTHONPATH", "SPARK_SUBMIT_OPTS") if k in env),
        sys.executable,
        str(ROOT / "tests" / "jvm" / "jobs" / "plain_write.py"),
        json.dumps(conf),
        str(table),
        str(ROWS),
        "4",
    ]
    kill_when(killed, lambda: any(table.glob("part-*")), log=tmp_path / "killed.log")
    # `sparkguard rollback` as the operator's initContainer runs it (fails the test unless 0).
    rollback_as_init_container(JOB, journal, {}, capsys, monkeypatch)

    # One driver for everything else: the remote stores' conf (S3A's jars in spark.jars) is in
    # it from its start.
    driver_conf = conf
    for store in remote:
        driver_conf = stores.with_jars(driver_conf, store.conf)
    result = _run(
        [
            sys.executable,
            str(HERE / "jobs" / "matrix_job.py"),
            json.dumps(driver_conf),
            str(tmp_path),
            str(ROWS),
            "supported",
            json.dumps({store.name: store.url("table") for store in remote}),
            str(STORE_ROWS),
        ],
        env,
    )
    assert result["version"] == version
    assert result["plain_read"] == 3
    assert result["rerun"] == {"rows": ROWS, "ids": ROWS}
    assert result["tables"] == {
        store.name: {"rows": STORE_ROWS, "ids": STORE_ROWS} for store in remote
    }
    for store in remote:
        _assert_only_committed_files(store)
    # The job's rollback as the initContainer runs it before a restart, one storage setting
    # for all its tables (local, HDFS, S3): every committed append stays whole.
    options = {k: v for store in remote for k, v in store.options.items()}
    summary = rollback_as_init_container(JOB, journal, options, capsys, monkeypatch)
    assert summary["filesDeleted"] == 0, summary
    for store in remote:
        _assert_only_committed_files(store)
    assert result["stream"] == {"rows": 200, "ids": 200}
    assert result["python_writer"] == 1000


@pytest.mark.parametrize("version", [v for v, expect in _releases() if expect == "refused"])
def test_an_unsupported_release_is_refused_in_one_line_and_never_broken(
    version: str, tmp_path: Path
) -> None:
    env = _env(version)
    cli = [sys.executable, "-c", "import sys; from sparkguard import cli; sys.exit(cli.main())"]
    proc = subprocess.run(
        [*cli, "spark-conf", "--job-id", JOB], env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    installed = "the installed PySpark; give --spark-version"
    assert proc.stderr.startswith(
        f"sparkguard spark-conf: error: {sparkversions.refusal(version, what=installed)}"
    )
    conf = sparkconf.build_spark_conf(JOB, journal=str(tmp_path / "journal"))
    result = _run(
        [
            sys.executable,
            str(HERE / "jobs" / "matrix_job.py"),
            json.dumps(conf),
            str(tmp_path),
            "3",
            "refused",
        ],
        env,
    )
    assert result["version"] == version
    assert result["plain_read"] == 3  # the jar in spark.jars breaks no read
    refusal = (
        f"sparkguard: Spark {version} is not supported (supported: Spark "
        f"{', '.join(sparkversions.SUPPORTED_LINES)}): "
    )
    assert refusal in str(result["write"]), result
    assert refusal in str(result["front"]), result


def _line(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def _junit_subset(version: str) -> tuple[list[str], list[str]]:
    """The JUnit sources ``junit.txt`` runs on ``version``'s line (as paths under
    ``io/sparkguard/spark/``) and those it leaves out there."""
    run: list[str] = []
    left_out: list[str] = []
    for line in (HERE / "junit.txt").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        source, first_line = line.split()[:2]
        if _line(version) < _line(first_line):
            left_out.append(source)
        elif source.endswith("Test.java"):
            run.append(source)
    return run, left_out


@pytest.mark.parametrize(
    "version", [v for v, expect in _releases() if expect == "supported"], ids=str
)
def test_the_version_sensitive_junit_tests_pass_on_a_supported_release(version: str) -> None:
    run, left_out = _junit_subset(version)
    package = "io/sparkguard/spark/"
    env = {
        **os.environ,
        "SPARKGUARD_PYSPARK_JARS": str(_site(version) / "pyspark" / "jars"),
        "SPARKGUARD_JUNIT_TESTS": ",".join(Path(source).stem for source in run),
        "SPARKGUARD_JUNIT_EXCLUDE": ",".join(package + source for source in left_out),
    }
    proc = subprocess.run(
        [str(ROOT / "scripts" / "build-jvm.sh"), "--tests-only"],
        env=env,
        capture_output=True,
        text=True,
        timeout=570,  # under pytest-timeout's 600 s (pyproject.toml): our message, not its
        check=False,
    )
    assert proc.returncode == 0, f"JUnit on Spark {version} failed:\n{proc.stderr[-6000:]}"
    reports = Path(proc.stdout.strip().splitlines()[-1])
    results = {}
    for report in reports.glob("TEST-*.xml"):
        suite = ElementTree.parse(report).getroot()  # noqa: S314 (our own Surefire report)
        counts = {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
        results[str(suite.get("name"))] = counts
    expected = {(package + source).removesuffix(".java").replace("/", ".") for source in run}
    assert set(results) == expected, f"Surefire reports in {reports}"
    for name, counts in results.items():
        assert counts["tests"] > 0, (name, counts)
        assert counts["failures"] == counts["errors"] == counts["skipped"] == 0, (name, counts)
