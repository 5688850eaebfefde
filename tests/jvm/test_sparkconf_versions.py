"""``sparkguard spark-conf`` prints the conf for the job's Spark: the supported lines (4.0 to
4.3) get the JVM layer (on 4.0 without the streaming classes, which need 4.1), an unsupported
one a one-line refusal naming it, the supported lines and the fix (exit status 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkguard import cli
from sparkguard.spark_lib.base import errors
from sparkguard.spark_lib.spark import sparkconf, sparkversions


@pytest.mark.parametrize("version", ["4.1.4", "4.2.1", "4.3.0", "4.3"])
def test_from_4_1_on_the_conf_is_the_whole_layer(version: str) -> None:
    assert sparkconf.build_spark_conf("j", spark_version=version) == sparkconf.build_spark_conf("j")


def test_on_4_0_streaming_stays_spark_s_own_and_the_batch_protocol_is_set() -> None:
    conf = sparkconf.build_spark_conf("j", spark_version="4.0.5")
    full = sparkconf.build_spark_conf("j")
    assert conf[sparkconf.COMMIT_PROTOCOL_KEY] == sparkconf.PROTOCOL_CLASS
    assert set(full) - set(conf) == {
        sparkconf.CHECKPOINT_MANAGER_KEY,
        sparkconf.STREAMING_COMMIT_PROTOCOL_KEY,
    }


def test_on_4_0_an_s3a_journal_is_refused_in_one_line() -> None:
    with pytest.raises(errors.ConfigError) as caught:
        sparkconf.build_spark_conf("j", spark_version="4.0.5", journal="s3a://b/journal")
    assert "Spark 4.1 or newer" in str(caught.value)
    assert "Python writer" in str(caught.value)
    sparkconf.build_spark_conf("j", spark_version="4.1.4", journal="s3a://b/journal")


@pytest.mark.parametrize("version", ["3.5.9", "3.5", "4.4.0", "2.4.8"])
def test_cli_refuses_an_unsupported_spark_in_one_line(
    version: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["spark-conf", "--job-id", "j", "--spark-version", version]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"sparkguard spark-conf: error: Spark {version} (--spark-version) is not supported "
        "(supported: Spark 4.0, 4.1, 4.2, 4.3): run the job on a supported Spark, or remove "
        "sparkguard's conf (spark.sql.sources.commitProtocolClass and the jar in spark.jars) "
        "from this job; run 'sparkguard spark-conf --help' for the options\n"
    )


def test_cli_defaults_to_the_installed_pyspark(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sparkversions, "installed_pyspark", lambda: "3.5.9")
    assert cli.main(["spark-conf", "--job-id", "j", "--journal", "/j"]) == 2
    assert "Spark 3.5.9 (the installed PySpark; give --spark-version) is not supported" in (
        capsys.readouterr().err
    )
    monkeypatch.setattr(sparkversions, "installed_pyspark", lambda: "4.0.5")
    assert cli.main(["spark-conf", "--job-id", "j", "--journal", "/j"]) == 0
    captured = capsys.readouterr()
    assert sparkconf.CHECKPOINT_MANAGER_KEY not in captured.out
    assert "on Spark 4.0.5 streaming queries keep Spark's own" in captured.err


def test_the_python_lines_are_the_jar_s() -> None:
    # The jar's SparkVersions.SUPPORTED says the same (SparkVersionsTest checks its message).
    assert sparkversions.SUPPORTED_LINES == ("4.0", "4.1", "4.2", "4.3")
    with pytest.raises(sparkversions.UnsupportedSparkError, match="not a Spark version"):
        sparkversions.check("latest", what="--spark-version")


def test_the_compatibility_tier_runs_every_supported_line() -> None:
    root = Path(__file__).resolve().parents[2]
    releases = [
        line.split()
        for line in (root / "tests" / "compat" / "versions.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    supported = [v for v, expect in releases if expect in {"supported", "pinned"}]
    assert tuple(".".join(v.split(".")[:2]) for v in supported) == sparkversions.SUPPORTED_LINES
    (pinned,) = [v for v, expect in releases if expect == "pinned"]
    assert f"pyspark=={pinned}\n" in (root / "constraints.txt").read_text()
    oldest = sparkversions.SUPPORTED_LINES[0]
    assert all(v < oldest for v, expect in releases if expect == "refused")
