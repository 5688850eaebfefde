"""Settings from SparkConf keys and write options: precedence, placeholders, clear errors."""

from __future__ import annotations

import pytest

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors
from sparkguard.spark_lib.spark import config, writer
from sparkguard.spark_lib.storage import markers


def test_options_override_conf_and_driver_host_is_substituted() -> None:
    settings = config.parse_settings(
        conf={
            "spark.sparkguard.jobId": "conf-job",
            "spark.sparkguard.attempt": "2",
            "spark.sparkguard.markers.type": "TIMELINE_SERVER_BASED",
            "spark.sparkguard.markers.endpoint": "http://{driverHost}:8765",
            "spark.driver.host": "10.0.0.7",
            "spark.sparkguard.journal": "s3://b/journal",
            "spark.sparkguard.createMode": "check-then-put",
        },
        options={"JOBID": "opt-job", "fileManager": "rename"},
    )
    assert settings.job_id == "opt-job"
    assert settings.attempt == 2
    assert settings.marker_type is markers.MarkerType.TIMELINE_SERVER_BASED
    assert settings.marker_endpoint == "http://10.0.0.7:8765"
    assert settings.file_manager is filemanager.Kind.RENAME
    assert settings.create_mode is filemanager.CreateMode.CHECK_THEN_PUT


@pytest.mark.parametrize(
    ("conf", "needle"),
    [
        ({}, "spark.sparkguard.jobId"),
        ({"spark.sparkguard.jobId": "UPPER"}, "spark.sparkguard.jobId"),
        ({"spark.sparkguard.jobId": "j", "spark.sparkguard.attempt": "x"}, "attempt"),
        ({"spark.sparkguard.jobId": "j", "spark.sparkguard.markers.type": "weird"}, "markers.type"),
        (
            {
                "spark.sparkguard.jobId": "j",
                "spark.sparkguard.markers.type": "TIMELINE_SERVER_BASED",
            },
            "markers.endpoint",
        ),
        (
            {
                "spark.sparkguard.jobId": "j",
                "spark.sparkguard.markers.endpoint": "http://{driverHost}:1",
            },
            "spark.driver.host",
        ),
        ({"spark.sparkguard.jobId": "j", "spark.sparkguard.fileManager": "ftp"}, "fileManager"),
        ({"spark.sparkguard.jobId": "j", "spark.sparkguard.storageOptions": "{"}, "storageOptions"),
    ],
)
def test_bad_settings_name_the_key(conf: dict[str, str], needle: str) -> None:
    with pytest.raises(errors.ConfigError, match=needle.replace(".", r"\.")):
        config.parse_settings(conf=conf)


def test_direct_marker_client(tmp_path: object) -> None:
    manager, _ = filemanager.resolve("memory://x")
    settings = config.parse_settings(conf={"spark.sparkguard.jobId": "j"})
    assert isinstance(config.marker_client_for(settings, manager), markers.DirectMarkerClient)


def test_names_and_partition_values() -> None:
    assert writer.data_file_name(partition=3, token="job", seq=0, ext="parquet") == (
        "part-00003-job-c000.parquet"
    )
    assert writer.partition_dir(["a", "b"], ["x/y", None]) == "a=x%2Fy/b=__HIVE_DEFAULT_PARTITION__"
    assert writer.escape_partition_value(True) == "true"


def test_the_writer_is_known_by_the_name_it_is_registered_under() -> None:
    conf = {"spark.sparkguard.jobId": "j"}
    assert writer.source_class(conf).name() == writer.NAME == "sparkguard"
    fsspec = writer.source_class(conf, name=writer.FSSPEC_NAME)
    assert fsspec.name() == "sparkguard-fsspec"
    assert fsspec.conf == conf


class _NoJvmSession:
    """A session whose driver has no JVM in this process (Spark Connect), recording
    registrations."""

    def __init__(self) -> None:
        self.registered: list[str] = []
        self.dataSource = self
        self.sparkContext = self
        self.conf = self

    def register(self, cls: type[writer.SparkguardDataSource]) -> None:
        self.registered.append(cls.name())

    def getConf(self) -> _NoJvmSession:
        return self

    def getAll(self) -> list[tuple[str, str]]:
        return []

    def get(self, key: str, default: str | None = None) -> str | None:
        return default


def test_without_the_jvm_front_both_names_are_the_fsspec_writer() -> None:
    session = _NoJvmSession()
    assert not writer.jvm_front_available(session)
    cls = writer.register(session, conf={"spark.sparkguard.jobId": "j"})
    assert cls.name() == writer.NAME
    assert session.registered == [writer.FSSPEC_NAME, writer.NAME]
