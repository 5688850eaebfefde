"""benchmarks/commit_protocol.py starts and switches the protocols it claims to; the S3 proxy names
operations right. Functional only: nothing here is timed (the figures are the benchmark's)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str) -> ModuleType:
    """A benchmark module by file (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    sys.path.append(str(BENCHMARKS))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module


def run_benchmark(name: str, *flags: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``benchmarks/<name>.py`` with ``flags`` to its end, its output captured."""
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / f"{name}.py"), *flags],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )


def test_help_runs_without_spark() -> None:
    result = run_benchmark("commit_protocol", "--help")
    assert result.returncode == 0, result.stderr
    assert "--quick" in result.stdout
    assert "local,s3,hdfs,both,all" in result.stdout.replace(" ", "").replace("\n", "")


@pytest.mark.parametrize(
    ("modes", "named"), [("sparkguard,foo", "(foo unknown)"), (" , ", "--modes (none)")]
)
def test_a_bad_modes_list_is_refused_naming_the_choices(modes: str, named: str) -> None:
    result = run_benchmark("commit_protocol", "--modes", modes)
    assert result.returncode == 2, result.stdout
    assert named in result.stderr
    assert "use a comma-separated subset of builtin, magic, sparkguard" in result.stderr


def test_each_mode_sets_its_protocol_and_unsets_the_others_keys() -> None:
    bench = load("commit_protocol")
    jar = "/opt/sparkguard-spark.jar"
    sparkguard = bench.mode_conf("sparkguard", "bench-s3-0", jar=jar)
    assert sparkguard[bench.PROTOCOL_KEY] == "io.sparkguard.spark.SparkguardCommitProtocol"
    assert sparkguard["spark.sparkguard.jobId"] == "bench-s3-0"
    assert sparkguard[bench.COMMITTER_NAME_KEY] is None
    assert "spark.jars" not in sparkguard  # on the session's classpath from the start
    builtin = bench.mode_conf("builtin", "x", jar=jar)
    assert builtin[bench.PROTOCOL_KEY].endswith("SQLHadoopMapReduceCommitProtocol")
    assert builtin["spark.sparkguard.jobId"] is None
    magic = bench.mode_conf("magic", "x", jar=jar)
    assert magic[bench.PROTOCOL_KEY].endswith("cloud.PathOutputCommitProtocol")
    assert magic[bench.PARQUET_COMMITTER_KEY].endswith("BindingParquetOutputCommitter")
    assert magic[bench.COMMITTER_NAME_KEY] == "magic"


@pytest.mark.parametrize(
    ("method", "path", "query", "headers", "expected"),
    [
        ("HEAD", "/b/t/part-0.parquet", "", {}, "HEAD"),
        ("GET", "/b", "list-type=2&prefix=t/", {}, "LIST"),
        ("GET", "/b/t/_SUCCESS", "", {}, "GET"),
        ("GET", "/b/t/k", "uploadId=1", {}, "LIST"),
        ("PUT", "/b/t/k", "", {}, "PUT"),
        ("PUT", "/b/t/k", "partNumber=1&uploadId=1", {}, "PUT"),
        ("PUT", "/b/t/k", "", {"X-Amz-Copy-Source": "/b/t/j"}, "COPY"),
        ("DELETE", "/b/t/k", "", {}, "DELETE"),
        ("POST", "/b", "delete", {}, "DELETE"),
        ("POST", "/b/t/k", "uploads", {}, "MPU"),
        ("POST", "/b/t/k", "uploadId=1", {}, "MPU"),
        ("DELETE", "/b/t/k", "uploadId=1", {}, "MPU"),
    ],
)
def test_proxy_names_s3_operations(
    method: str, path: str, query: str, headers: dict[str, str], expected: str
) -> None:
    proxy = load("_s3proxy")
    assert proxy.operation(method, path, query, headers) == expected
