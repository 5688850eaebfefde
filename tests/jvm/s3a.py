"""The S3A filesystem for PySpark against the test S3 server: jars (scripts/fetch-jars.sh s3a,
what scripts/fetch-s3a.sh runs) + conf."""

from __future__ import annotations

from pathlib import Path

from tests.support import cached_jars, s3server


def fetch_jars() -> Path:
    """The directory of S3A jars (fetched into the cache on first use); fails the test run with
    the script's message when they cannot be had."""
    return cached_jars.fetch("s3a")


def spark_conf(server: s3server.S3Server, jars: Path) -> dict[str, str]:
    """Spark conf for ``s3a://`` on ``server``: path-style, explicit keys and region, no TLS.

    The credential provider is pinned to the explicit keys, so the default chain never runs (it
    would probe the instance-metadata address).
    """
    prefix = "spark.hadoop.fs.s3a."
    explicit_keys = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
    return {
        "spark.jars": ",".join(str(p) for p in sorted(jars.glob("*.jar"))),
        f"{prefix}endpoint": server.endpoint,
        f"{prefix}endpoint.region": "us-east-1",
        f"{prefix}path.style.access": "true",
        f"{prefix}connection.ssl.enabled": "false",
        f"{prefix}access.key": "testing",
        f"{prefix}secret.key": "testing",
        f"{prefix}aws.credentials.provider": explicit_keys,
    }
