"""S3 requests per data file of one ``df.write.parquet("s3a://...")``: Spark's default commit
protocol vs sparkguard's JVM protocol (with S3A's default create, and with
``fs.s3a.create.performance=true``). Informative only: counts, not times.

    python benchmarks/s3_requests.py [--rows 100000] [--partitions 8]

moto's S3 server behind ``_s3proxy.py`` with no added latency counts the requests by category
(data, markers, sparkguard = the table's other ``_sparkguard/`` files, other). Each variant
writes a fresh table in its own Spark process; the proxy is reset once the session is up, so
only the write is counted (plus S3A's first probes of the bucket). Needs the jar
(``scripts/build-jvm.sh``) and the S3A jars (``scripts/fetch-s3a.sh``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import urllib.request

sys.path.append(os.path.dirname(os.path.abspath(__file__)))  # _common, beside this file
os.environ.setdefault("PYTHONSAFEPATH", "1")

from _common import REPO, log, proxied_s3

sys.path.append(str(REPO))  # appended: never shadow the stdlib

from sparkguard.spark_lib.spark import sparkconf
from tests.jvm import s3a


def job(conf_json: str, url: str, rows: int, partitions: int, proxy: str) -> None:
    """The write alone, in this process: reset the proxy's counters once Spark is up."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]").appName("s3-requests")
    builder = builder.config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
    for key, value in json.loads(conf_json).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:
        df = spark.range(0, rows, numPartitions=partitions)
        request = urllib.request.Request(proxy + "/_proxy/reset", method="POST")  # noqa: S310
        urllib.request.urlopen(request, timeout=10).close()  # noqa: S310
        df.write.mode("append").parquet(url)
    finally:
        spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--job", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job:
        conf_json, url, proxy = args.job
        job(conf_json, url, args.rows, args.partitions, proxy)
        return
    jars = s3a.fetch_jars()
    results: dict[str, dict[str, int]] = {}
    with proxied_s3(latency_ms=0, write_rate=1e9) as s3:
        storage = s3a.spark_conf(s3.s3, jars)
        storage["spark.hadoop.fs.s3a.endpoint"] = s3.proxy
        guard = sparkconf.build_spark_conf("s3-requests")
        jars_both = f"{guard['spark.jars']},{storage['spark.jars']}"
        guarded = {**guard, **storage, "spark.jars": jars_both}
        variants = {
            "builtin": storage,
            "sparkguard": guarded,
            "sparkguard+create.performance": {
                **guarded,
                "spark.hadoop.fs.s3a.create.performance": "true",
            },
        }
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SPARK_"))}
        env.update({"AWS_EC2_METADATA_DISABLED": "true", "SPARK_LOCAL_IP": "127.0.0.1"})
        for name, conf in variants.items():
            bucket = s3.s3.create_bucket()
            url = f"s3a://{bucket}/t"
            log(f"{name}: writing {args.rows} rows in {args.partitions} files to {url}")
            subprocess.run(
                [sys.executable, __file__, "--rows", str(args.rows), "--partitions",
                 str(args.partitions), "--job", json.dumps(conf), url, s3.proxy],
                check=True, env=env, capture_output=True,
            )  # fmt: skip
            results[name] = s3.stats()
    for name, stats in results.items():
        per_file = stats.get("total", 0) / args.partitions
        print(f"{name:32} {json.dumps(stats, sort_keys=True)}  per file: {per_file:.1f}")


if __name__ == "__main__":
    main()
