"""One function builds the Spark conf that enables the JVM layer; ``sparkguard spark-conf``
prints it as spark-submit arguments, JSON or a properties file, and rejects bad input in one
line naming the flag and the fix (exit status 2)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from sparkguard import cli
from sparkguard.spark_lib.base import errors
from sparkguard.spark_lib.spark import sparkconf

JAR = str(sparkconf.jar_path())
STREAMING = "io.sparkguard.spark.SparkguardStreamingCommitProtocol"


def test_direct_markers_by_default() -> None:
    conf = sparkconf.build_spark_conf("nightly-1")
    assert conf == {
        "spark.sql.sources.commitProtocolClass": "io.sparkguard.spark.SparkguardCommitProtocol",
        "spark.sql.streaming.checkpointFileManagerClass": (
            "io.sparkguard.spark.SparkguardCheckpointFileManager"
        ),
        "spark.sql.streaming.commitProtocolClass": STREAMING,
        "spark.jars": JAR,
        "spark.sparkguard.jobId": "nightly-1",
        "spark.sparkguard.markers.type": "DIRECT",
        "spark.hadoop.fs.sg-s3a.impl": "io.sparkguard.spark.OwnedFileSystem",
        "spark.hadoop.fs.sg-file.impl": "io.sparkguard.spark.OwnedLocalFileSystem",
        "spark.hadoop.fs.sg-hdfs.impl": "io.sparkguard.spark.OwnedHdfsFileSystem",
    }


def test_sidecar_markers_owner_journal_and_jar_location() -> None:
    conf = sparkconf.build_spark_conf(
        "nightly-1",
        owner="k8s:jobs/nightly/4f2a9c",
        markers="sidecar",
        endpoint="http://{driverHost}:8765",
        token_file="/var/run/sparkguard/token",
        journal="s3://b/journal",
        jar="local:///opt/sparkguard/lib/sparkguard/spark_lib/jars/sparkguard-spark.jar",
    )
    assert conf == {
        "spark.sql.sources.commitProtocolClass": "io.sparkguard.spark.SparkguardCommitProtocol",
        "spark.sql.streaming.checkpointFileManagerClass": (
            "io.sparkguard.spark.SparkguardCheckpointFileManager"
        ),
        "spark.sql.streaming.commitProtocolClass": STREAMING,
        "spark.jars": "local:///opt/sparkguard/lib/sparkguard/spark_lib/jars/sparkguard-spark.jar",
        "spark.sparkguard.jobId": "nightly-1",
        "spark.sparkguard.owner": "k8s:jobs/nightly/4f2a9c",
        "spark.sparkguard.markers.type": "TIMELINE_SERVER_BASED",
        "spark.sparkguard.markers.endpoint": "http://{driverHost}:8765",
        "spark.sparkguard.markers.tokenFile": "/var/run/sparkguard/token",
        "spark.sparkguard.journal": "s3://b/journal",
        "spark.hadoop.fs.sg-s3a.impl": "io.sparkguard.spark.OwnedFileSystem",
        "spark.hadoop.fs.sg-file.impl": "io.sparkguard.spark.OwnedLocalFileSystem",
        "spark.hadoop.fs.sg-hdfs.impl": "io.sparkguard.spark.OwnedHdfsFileSystem",
    }


def test_the_streaming_file_sink_protocol_is_on_by_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Both streaming classes by default (the file sink's protocol and the checkpoint
    manager); --no-streaming-sink leaves the sink to
    Spark's own protocol and keeps the checkpoint manager."""
    key = "spark.sql.streaming.commitProtocolClass"
    assert sparkconf.build_spark_conf("stream-1")[key] == STREAMING
    assert key not in sparkconf.build_spark_conf("stream-1", streaming_sink=False)
    capsys.readouterr()
    assert cli.main(["spark-conf", "--job-id", "stream-1", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[key] == STREAMING
    argv = ["spark-conf", "--job-id", "stream-1", "--no-streaming-sink", "--format", "json"]
    assert cli.main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert key not in printed
    assert printed[sparkconf.CHECKPOINT_MANAGER_KEY] == sparkconf.CHECKPOINT_MANAGER_CLASS


def test_streaming_checkpoints_use_the_jar_s_checkpoint_file_manager() -> None:
    conf = sparkconf.build_spark_conf("stream-1")
    key = "spark.sql.streaming.checkpointFileManagerClass"
    assert conf[key] == "io.sparkguard.spark.SparkguardCheckpointFileManager"
    assert conf[key] == sparkconf.CHECKPOINT_MANAGER_CLASS
    # The class is in the jar the same conf puts on spark.jars.
    import zipfile

    with zipfile.ZipFile(conf["spark.jars"]) as jar:
        assert "io/sparkguard/spark/SparkguardCheckpointFileManager.class" in jar.namelist()


def test_the_python_writer_accepts_the_same_settings() -> None:
    from sparkguard.spark_lib.spark import config

    conf = sparkconf.build_spark_conf(
        "nightly-1", markers="sidecar", endpoint="http://127.0.0.1:8765", journal="/j"
    )
    settings = config.parse_settings(conf=conf)
    assert settings.job_id == "nightly-1"
    assert settings.marker_type.value == "TIMELINE_SERVER_BASED"
    assert settings.marker_endpoint == "http://127.0.0.1:8765"
    assert settings.journal == "/j"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"job_id": "Bad_Id"}, "job_id 'Bad_Id' is not valid"),
        ({"job_id": "j", "markers": "hdfs"}, "markers 'hdfs' is not valid: use 'direct'"),
        ({"job_id": "j", "markers": "sidecar"}, "markers sidecar needs the sidecar's address"),
        (
            {"job_id": "j", "markers": "sidecar", "endpoint": "127.0.0.1:8765"},
            "endpoint '127.0.0.1:8765' is not an http(s) URL",
        ),
        ({"job_id": "j", "endpoint": "http://x:1"}, "endpoint applies only to markers sidecar"),
        ({"job_id": "j", "token_file": "/t"}, "token_file applies only to markers sidecar"),
        ({"job_id": "j", "owner": " "}, "owner ' ' is not valid"),
        ({"job_id": "j", "owner": "a\nb"}, "owner 'a\\nb' is not valid"),
        ({"job_id": "j", "jar": "a.jar,b.jar"}, "contains a comma"),
        ({"job_id": "j", "journal": ""}, "journal '' is not valid"),
    ],
)
def test_bad_input_names_the_parameter(kwargs: dict[str, str], message: str) -> None:
    job_id = kwargs.pop("job_id")
    with pytest.raises(errors.ConfigError) as raised:
        sparkconf.build_spark_conf(job_id, **kwargs)  # type: ignore[arg-type]
    assert message in str(raised.value)


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(["spark-conf", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_args_format_is_conf_lines_for_spark_submit(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _cli(
        ["--job-id", "j-1", "--markers", "sidecar", "--endpoint", "http://{driverHost}:8765"],
        capsys,
    )
    assert code == 0
    assert "Traceback" not in err  # stderr: only the note that no journal was given
    words = shlex.split(out)  # what a shell makes of it
    assert words[0::2] == ["--conf"] * 10
    assert dict(w.split("=", 1) for w in words[1::2]) == sparkconf.build_spark_conf(
        "j-1", markers="sidecar", endpoint="http://{driverHost}:8765"
    )
    assert all(line.startswith("--conf ") for line in out.splitlines())


def test_json_format(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(["--job-id", "j-1", "--format", "json", "--journal", "/j"], capsys)
    assert code == 0
    assert json.loads(out) == sparkconf.build_spark_conf("j-1", journal="/j")


def test_properties_format_escapes_for_java_properties(tmp_path: Path) -> None:
    text = sparkconf.format_conf({"a.b": r"C:\dir\x.jar", "c": " lead", "d": "x=y:z"}, "properties")
    assert text.splitlines() == [r"a.b=C:\\dir\\x.jar", r"c=\ lead", "d=x=y:z"]


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["--job-id", "UPPER"], ["--job-id 'UPPER' is not valid"]),
        (["--job-id", "j", "--markers", "sidecar"], ["--markers sidecar", "--endpoint"]),
        (["--job-id", "j", "--token-file", "/t"], ["--token-file applies only to --markers"]),
        (["--job-id", "j", "--markers", "nfs"], ["--markers 'nfs' is not valid"]),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(
    argv: list[str], names: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _cli(argv, capsys)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("sparkguard spark-conf: error: ")
    assert lines[0].endswith("; run 'sparkguard spark-conf --help' for the options")
    for name in names:
        assert name in lines[0]


def test_cli_without_a_built_jar_says_how_to_build_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sparkconf, "JARS_DIR", tmp_path)
    code, out, err = _cli(["--job-id", "j"], capsys)
    assert (code, out) == (1, "")
    assert err.count("\n") == 1
    assert "scripts/build-jvm.sh" in err
    assert "--jar PATH" in err
    # An explicit location needs no local jar (e.g. the bundle's path inside a pod).
    code, out, _ = _cli(["--job-id", "j", "--jar", "local:///opt/x.jar"], capsys)
    assert code == 0
    assert "--conf spark.jars=local:///opt/x.jar" in out.splitlines()


def test_extra_jars_come_first_and_keep_sparkguard_s_jar(
    capsys: pytest.CaptureFixture[str],
) -> None:
    s3a = "/opt/jars/hadoop-aws-3.4.1.jar, /opt/jars/s3-2.29.52.jar"
    conf = sparkconf.build_spark_conf("j-1", extra_jars=s3a)
    assert conf["spark.jars"] == f"/opt/jars/hadoop-aws-3.4.1.jar,/opt/jars/s3-2.29.52.jar,{JAR}"
    # Our jar among them already: listed once, where the user put it.
    mine = f"{JAR},/opt/x.jar"
    assert sparkconf.build_spark_conf("j-1", extra_jars=mine)["spark.jars"] == mine
    code, out, _ = _cli(["--job-id", "j-1", "--extra-jars", "/opt/x.jar"], capsys)
    assert code == 0
    assert f"--conf spark.jars=/opt/x.jar,{JAR}" in out.splitlines()


@pytest.mark.parametrize("value", ["", "a.jar,,b.jar", "a.jar,", " , "])
def test_extra_jars_with_an_empty_entry_are_refused(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _cli(["--job-id", "j-1", "--extra-jars", value], capsys)
    assert (code, out) == (2, "")
    assert "--extra-jars" in err
    assert err.count("\n") == 1


def test_without_a_journal_the_cli_says_rollback_will_not_find_the_job(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = _cli(["--job-id", "j-1"], capsys)
    assert code == 0
    assert "spark.sparkguard.journal" not in out  # stdout stays a clean conf
    assert "no --journal" in err
    assert "sparkguard rollback" in err
    code, out, err = _cli(["--job-id", "j-1", "--journal", "/j"], capsys)
    assert (code, err) == (0, "")


def test_the_help_example_sets_the_journal_its_rollback_reads(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A user who copies the two commands of ``--help`` can roll back by hand."""
    with pytest.raises(SystemExit):
        cli.main(["spark-conf", "--help"])
    text = capsys.readouterr().out.replace("\\\n", " ")
    conf_command = next(line for line in text.splitlines() if "$(sparkguard spark-conf" in line)
    rollback_command = next(
        line.strip() for line in text.splitlines() if line.strip().startswith("sparkguard rollback")
    )
    conf_argv = shlex.split(conf_command.split("$(", 1)[1].split("|", 1)[0])[2:]
    code, out, _ = _cli(conf_argv, capsys)
    assert code == 0
    conf = dict(w.split("=", 1) for w in shlex.split(out)[1::2])
    rollback_argv = shlex.split(rollback_command)
    journal = rollback_argv[rollback_argv.index("--journal") + 1]
    assert conf["spark.sparkguard.journal"] == journal
    job_id = rollback_argv[rollback_argv.index("--job-id") + 1]
    assert conf["spark.sparkguard.jobId"] == job_id
    cli.build_parser().parse_args(rollback_argv[1:])  # a valid rollback command line
