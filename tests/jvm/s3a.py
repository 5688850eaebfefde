"""The S3A filesystem for PySpark against the test S3 server: jars (scripts/fetch-s3a.sh) + conf."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support import s3server

ROOT = Path(__file__).resolve().parents[2]


def fetch_jars() -> Path:
    """The directory of S3A jars (fetched into the cache on first use); fails the test run with
    the script's message when they cannot be had."""
    result = subprocess.run(
        [str(ROOT / "scripts" / "fetch-s3a.sh")], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"scripts/fetch-s3a.sh failed:\n{result.stderr}")
    return Path(result.stdout.strip())


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
