"""`sparkguard demo` without Spark: which writer it picks and why, that its default job is
plain Spark, and what it counts as leftovers (tests/e2e/test_demo.py runs it)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors
from sparkguard.spark_lib.spark import sparkconf
from sparkguard.spark_lib.tools import demo


@pytest.fixture
def jar_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A package that carries the JVM layer's jar (whether or not this checkout built it)."""
    (tmp_path / sparkconf.JAR_NAME).write_bytes(b"PK")
    monkeypatch.setattr(sparkconf, "JARS_DIR", tmp_path)


@pytest.mark.usefixtures("jar_built")
@pytest.mark.parametrize("url", ["/data/demo", "relative/table", "file:///data/demo"])
def test_local_tables_are_written_on_the_zero_code_path(url: str) -> None:
    assert demo.choose_writer(None, url) == (demo.Writer.JVM, None)
    assert demo.choose_writer("jvm", url) == (demo.Writer.JVM, None)
    assert demo.choose_writer("fsspec", url) == (demo.Writer.FSSPEC, None)


@pytest.mark.usefixtures("jar_built")
@pytest.mark.parametrize("url", ["s3://bucket/demo", "gs://bucket/demo", "s3a://bucket/demo"])
def test_stores_the_jvm_cannot_open_here_fall_back_to_fsspec_with_a_reason(url: str) -> None:
    writer, reason = demo.choose_writer(None, url)
    assert writer is demo.Writer.FSSPEC
    assert reason is not None
    assert f"no FileSystem for {url.split('://', maxsplit=1)[0]}://" in reason
    with pytest.raises(errors.ConfigError, match=r"--writer jvm cannot write .*drop --writer"):
        demo.choose_writer("jvm", url)


def test_without_the_jar_the_demo_falls_back_to_fsspec_naming_the_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sparkconf, "JARS_DIR", tmp_path)  # no jar there
    writer, reason = demo.choose_writer(None, "/data/demo")
    assert writer is demo.Writer.FSSPEC
    assert reason is not None
    assert "scripts/build-jvm.sh" in reason
    with pytest.raises(errors.ConfigError, match="no JVM layer jar"):
        demo.choose_writer("jvm", "/data/demo")


def test_the_default_job_is_plain_spark() -> None:
    """The zero-code path's job never imports sparkguard and writes with Spark's own parquet
    writer in append mode."""
    source = demo.PLAIN_JOB.read_text()
    tree = ast.parse(source)
    imported = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported += [alias.name for alias in node.names]
    assert not [name for name in imported if name.split(".")[0] == "sparkguard"], imported
    assert 'frame.write.mode("append").parquet(table)' in source
    # unchanged, it runs as a SparkApplication too (tests/e2e/test_recovery_on_node.py): a
    # driver address of its own would send the executor pods to their own loopback
    assert "spark.driver.host" not in source


def test_leftovers_are_what_no_reader_sees_and_no_commit_keeps(tmp_path: Path) -> None:
    """Data files are what Spark lists; a temp file or a checksum of a gone file is a leftover,
    a checksum beside its file is not."""
    table = tmp_path / "table"
    (table / "k=1").mkdir(parents=True)
    (table / "_sparkguard" / "timeline").mkdir(parents=True)
    for name in [
        "part-00000-j-w000-c000.snappy.parquet",
        ".part-00000-j-w000-c000.snappy.parquet.crc",  # beside its file: fine
        ".part-00001-j-w000-c000.snappy.parquet.crc",  # its file is gone: a leftover
        ".part-00002-j-w000-c000.snappy.parquet.sg-tmp-0123456789ab",  # a write cut short
        "k=1/part-00003-j-w000-c000.snappy.parquet",
        "_SUCCESS",
        "_sparkguard/timeline/.x.outcome.crc",  # sparkguard's own folder: not the table's data
    ]:
        (table / name).write_text("x")
    manager, path = filemanager.resolve(str(table))
    assert demo._data_files(manager, path) == [
        "k=1/part-00003-j-w000-c000.snappy.parquet",
        "part-00000-j-w000-c000.snappy.parquet",
    ]
    assert demo._temp_files(manager, path) == [
        ".part-00001-j-w000-c000.snappy.parquet.crc",
        ".part-00002-j-w000-c000.snappy.parquet.sg-tmp-0123456789ab",
    ]
    gone = tmp_path / "gone"
    assert demo._data_files(manager, str(gone)) == []
    assert demo._temp_files(manager, str(gone)) == []
