"""The S3 test tier of the JVM layer: a plain PySpark ``df.write.parquet("s3a://...")`` works
against the test S3 server with the S3A jars fetched by scripts/fetch-s3a.sh."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.jvm import s3a
from tests.jvm.conftest import run_job
from tests.support import s3server

pytestmark = [pytest.mark.spark, pytest.mark.s3]


def test_fetched_jars_are_s3a_without_the_sdk_bundle_or_what_spark_ships(s3a_jars: Path) -> None:
    names = {p.name for p in s3a_jars.glob("*.jar")}
    assert "hadoop-aws-3.5.0.jar" in names
    assert {
        "s3-2.35.4.jar",
        "s3-transfer-manager-2.35.4.jar",
        "netty-nio-client-2.35.4.jar",
    } <= names
    assert not any(
        n.startswith(("bundle-", "wildfly-openssl", "netty-", "slf4j", "httpc"))
        for n in names
        if n != "netty-nio-client-2.35.4.jar"
    )
    assert sum(p.stat().st_size for p in s3a_jars.glob("*.jar")) < 20 * 2**20


def test_plain_pyspark_writes_parquet_through_s3a(
    s3_server: s3server.S3Server, s3a_jars: Path
) -> None:
    bucket = s3_server.create_bucket()
    result = run_job(
        "plain_write.py",
        f"s3a://{bucket}/plain/table",
        "1000",
        "4",
        conf=s3a.spark_conf(s3_server, s3a_jars),
    )
    assert result == {"rows": 1000, "ids": 1000}
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=bucket)["Contents"]]
    data = [k for k in keys if k.endswith(".parquet")]
    assert len(data) == 4
    assert all(k.startswith("plain/table/part-0000") for k in data)
    assert "plain/table/_SUCCESS" in keys
