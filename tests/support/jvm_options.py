"""The JVM options of every Spark driver the tests start (``SPARK_SUBMIT_OPTS``).

A test's Spark driver is a short-lived JVM on a 2-core machine shared by two pytest workers.
Most of its CPU goes to loading and verifying ~15,000 classes, to the C2 compiler compiling
code it will run for seconds, and to G1's concurrent threads. So the tests run their drivers

* with the C1 compiler only and the serial collector, and
* with an application class-data-sharing archive (AppCDS) of the classes a small Spark job
  loads, dumped once per machine into ``~/.cache/sparkguard/cds/`` (keyed by the JDK, the
  PySpark jars and these flags) by a real job the first time a run needs it.

tests/README.md has the figures. Tests only: the demo, the benchmarks and users' jobs keep
the JVM's defaults. Without a usable archive (the dump failed, another venv's classpath) the
JVM runs as usual: ``-Xlog`` keeps its CDS warnings off the jobs' stdout, which tests parse.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support import run_tmp

COMPILER_AND_GC = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
QUIET_CDS = "-Xlog:cds=off,cds+dynamic=off"

# What the archive is dumped from: a session, a parquet write and read, a small aggregation.
_DUMP_JOB = """
from pyspark.sql import SparkSession
import sys
spark = (SparkSession.builder.master("local[2]").appName("sparkguard-tests-cds")
         .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
         .config("spark.sql.shuffle.partitions", "2").getOrCreate())
out = sys.argv[1]
spark.range(0, 1000, numPartitions=2).selectExpr("id", "id % 3 AS k").write.parquet(out)
spark.read.parquet(out).groupBy("k").count().collect()
spark.stop()
"""


def _pyspark_jars(site: Path | None = None) -> Path:
    """The jars of this interpreter's PySpark, or of the one installed in ``site``."""
    if site is not None:
        return site / "pyspark" / "jars"
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def archive_path(cache_root: Path, site: Path | None = None) -> Path:
    """Where the archive for this JDK, this PySpark install (or ``site``'s) and these flags
    lives."""
    jars = _pyspark_jars(site)
    java = subprocess.run(
        ["java", "-version"], capture_output=True, text=True, check=False
    ).stderr.strip()
    key = hashlib.sha256(
        "\n".join([java, str(jars), *sorted(os.listdir(jars)), COMPILER_AND_GC]).encode()
    ).hexdigest()[:16]
    return cache_root / "cds" / f"spark-{key}.jsa"


def ensure_archive(
    cache_root: Path, *, site: Path | None = None, timeout: float = 600
) -> tuple[Path | None, str]:
    """The archive's path, dumping it first when missing; ``(None, why)`` when it cannot be.
    ``site``: a site-packages directory whose PySpark (another release's, first on the dump
    job's PYTHONPATH) the archive is of, instead of this interpreter's.

    Safe for concurrent runs: one dumps under a lock, into a temporary name renamed when whole.
    """
    path = archive_path(cache_root, site)
    if path.exists():
        return path, "cached"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return path, "dumped by a concurrent run"
        with tempfile.TemporaryDirectory(prefix="sg-cds-") as work:
            partial = path.with_name(f".{path.name}.{os.getpid()}")
            env = {
                **os.environ,
                "PYTHONSAFEPATH": "1",
                "SPARK_LOCAL_IP": "127.0.0.1",
                **({"PYTHONPATH": str(site)} if site is not None else {}),
                "SPARK_SUBMIT_OPTS": (
                    f"{COMPILER_AND_GC} {run_tmp.java_options(Path(work))} "
                    f"-XX:ArchiveClassesAtExit={partial}"
                ),
            }
            try:
                done = subprocess.run(
                    [sys.executable, "-c", _DUMP_JOB, str(Path(work) / "out")],
                    env=env,
                    cwd=work,
                    capture_output=True,
                    timeout=timeout,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                return None, f"the dump job did not finish in {timeout:.0f}s"
            if done.returncode != 0 or not partial.exists():
                with contextlib.suppress(FileNotFoundError):
                    partial.unlink()
                tail = done.stderr.decode(errors="replace").strip().splitlines()[-3:]
                return None, f"the dump job exited {done.returncode}: {' | '.join(tail)}"
            partial.rename(path)
    return path, "dumped"


def java_options(archive: Path | None) -> str:
    """The test JVMs' options: C1, the serial collector and the archive when there is one."""
    if archive is None:
        return COMPILER_AND_GC
    return f"{COMPILER_AND_GC} -XX:SharedArchiveFile={archive} {QUIET_CDS}"


def spark_submit_opts(archive: Path | None, *, tmpdir: Path) -> str:
    """The test drivers' JVM options (:func:`java_options`); their temp files
    (``java.io.tmpdir``: Spark's local directories, the codecs' native libraries) in
    ``tmpdir``."""
    return f"{java_options(archive)} {run_tmp.java_options(tmpdir)}"
