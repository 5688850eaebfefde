"""``df.write.parquet`` through three commit protocols, on local disk, S3 and HDFS, in one run.

    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/commit_protocol.py [--quick] [--rows N]
        [--partitions P] [--rounds R] [--latency-ms MS] [--storage local|s3|hdfs|both|all]
        [--phases] [--rpcs] [--prompt-close] [--local-dir DIR]

The same cached DataFrame (long, int, double and string columns) is written, unchanged, by:

- ``builtin``: Spark's default, ``SQLHadoopMapReduceCommitProtocol`` + Parquet's
  ``FileOutputCommitter`` with algorithm v1 (task attempt dir -> task commit rename -> job commit
  rename, ``_SUCCESS``); on S3A a rename is a COPY + DELETE per file, twice;
- ``magic`` (S3 only): the S3A magic committer through ``spark-hadoop-cloud``
  (``PathOutputCommitProtocol`` + ``BindingParquetOutputCommitter``, ``fs.s3a.committer.name=
  magic``): tasks upload to their final keys as uncompleted multipart uploads, the job commit
  completes them; what S3 users pick today;
- ``sparkguard``: ``io.sparkguard.spark.SparkguardCommitProtocol`` with the conf of
  ``build_spark_conf`` (direct markers), each write with its own job id.

One Spark driver (``local[2]``) does every write: the jars of all three (sparkguard's jar, the S3A
jars and spark-hadoop-cloud, from ``scripts/fetch-s3a.sh --magic-committer``) are on its classpath
and the protocol is switched per write with ``spark.conf.set`` (Spark reads
``spark.sql.sources.commitProtocolClass`` from the session conf at every write), so every mode
shares the same JVM, the same cached DataFrame and the same warm S3A connections. The S3 store is
moto's server behind ``benchmarks/_s3proxy.py`` (``--latency-ms`` per request, default 20 ms),
which counts the requests of each write by operation. The HDFS store is a real one on
127.0.0.1: Hadoop's MiniDFSCluster (one NameNode, one DataNode, replication 1;
``tests/support/hdfs.py``, its jars from ``scripts/fetch-jars.sh hdfs-minicluster``), where
``builtin``'s renames are NameNode metadata operations and sparkguard publishes each file by
temp file + hsync + ``FileContext.rename`` (``HadoopRenameAtomicStore``).

Procedure: each mode writes once untimed (JIT, class loading, S3A clients warm for all), then R
>= 3 timed rounds with the order of the modes rotated each round (and the stores' order rotated
too); each write goes to a fresh table and is checked afterwards, untimed
(``_SUCCESS`` of the FileOutputCommitter, the magic committer's JSON ``_SUCCESS``, sparkguard's
committed outcome), then deleted. The best round of each mode is compared. ``--quick`` is the
same procedure on less data (1M rows, 8 partitions instead of 3M rows, 16 partitions).

Printed per mode: best time, data files, files/s, and (S3) storage requests per file with the
operations they were, (HDFS, with ``--rpcs``) the NameNode RPCs per file by method (the
NameNode's ``RpcDetailedActivityForPort<port>`` counters over its ``/jmx``, which it refreshes
every 10 s: the benchmark waits 11 s before and after each write, untimed; the DataNodes' own
RPCs left out). Before the last line: ``hdfs sparkguard/builtin = <h>`` (builtin time /
sparkguard time on HDFS, as r below), then, with S3,
``requests per file: default=<a> magic=<b> sparkguard=<c>`` (every storage request of the best
round's write, divided by its data files). Last line (one line; wrapped here):
``commit protocol: local sparkguard/builtin = <r>, s3 builtin/sparkguard = <x>x,
s3 magic/sparkguard = <y>x``
(r: throughput ratio on local disk, i.e. builtin time / sparkguard time; x, y: time ratios on S3).
A mode that cannot run (sparkguard on ``s3a://`` with a jar built before the protocol's S3
store) prints ``n/a (<why>)`` in place of its figures.

Before the last line: ``publication window: <store> <mode> <ms> ms/<n> files, ...``: how long a
directory reader sees part of the best round's write. sparkguard: from its outcome written to
its last data file published (renames; on S3 upload completions), by the driver's own count;
magic: from the first upload its job commit completes to the last; builtin on S3: from the
first COPY of the job commit onto a final key to the last (both from the proxy's log). Run with
``--partitions 1000`` for the window of 1,000 files (on S3 with ``--modes sparkguard,magic``:
``--modes`` runs a subset of the protocols, and a ratio whose mode did not run prints
``n/a``).

``--phases`` splits each best time into the write's Spark job (tasks with their task commits)
and the rest (the driver's planning, job setup and job commit), from Spark's event log.
``--prompt-close`` gives every HDFS client of the session, builtin's too, the completion polling
of sparkguard's own HDFS clients (``HadoopRenameAtomicStore.promptClose``: a closed file's
``complete`` asked again after 25 ms instead of 400 ms), to separate what that setting gains
from the rest. ``--local-dir /dev/shm`` puts the local tables on tmpfs, where fsync is free:
sparkguard publishes each file durably (fsync of the file and its directory, markers and timeline
likewise), Spark's default protocol fsyncs nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.append(os.path.dirname(os.path.abspath(__file__)))  # _common, beside this file
os.environ.setdefault("PYTHONSAFEPATH", "1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"  # never probe the instance-metadata address
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from _common import ProxiedS3, log, proxied_s3, rotated

from tests.support import cached_jars, hdfs

LOCAL_KINDS = ("builtin", "sparkguard")
S3_KINDS = ("builtin", "magic", "sparkguard")
PROTOCOL_KEY = "spark.sql.sources.commitProtocolClass"
PARQUET_COMMITTER_KEY = "spark.sql.parquet.output.committer.class"
COMMITTER_NAME_KEY = "fs.s3a.committer.name"  # copied from the session conf into the job's conf
BUILTIN_PROTOCOL = "org.apache.spark.sql.execution.datasources.SQLHadoopMapReduceCommitProtocol"
BUILTIN_PARQUET_COMMITTER = "org.apache.parquet.hadoop.ParquetOutputCommitter"
CLOUD_PROTOCOL = "org.apache.spark.internal.io.cloud.PathOutputCommitProtocol"
CLOUD_PARQUET_COMMITTER = "org.apache.spark.internal.io.cloud.BindingParquetOutputCommitter"
OPERATIONS = ("HEAD", "LIST", "GET", "PUT", "COPY", "DELETE", "MPU")
#: The proxy's key categories: data (the table's keys, Spark's _temporary and __magic too),
#: markers and the rest of _sparkguard/ (timeline), other (bucket-level requests).
CATEGORIES = ("data", "markers", "sparkguard", "other")


@dataclasses.dataclass
class Result:
    """The timed writes of one (storage, mode)."""

    times: list[float] = dataclasses.field(default_factory=list)
    files: list[int] = dataclasses.field(default_factory=list)
    requests: list[dict[str, int]] = dataclasses.field(default_factory=list)
    #: per round, the publication window in seconds (:func:`publication_window`), or None
    windows: list[float | None] = dataclasses.field(default_factory=list)
    unavailable: str | None = None

    def best(self) -> int:
        """Index of the best (fastest) round."""
        return min(range(len(self.times)), key=self.times.__getitem__)


def fetch_jars() -> Path:
    """The S3A jars + spark-hadoop-cloud (cached under ~/.cache/sparkguard by the script)."""
    try:
        return cached_jars.fetch("s3a", "--magic-committer")
    except RuntimeError as exc:
        raise SystemExit(str(exc)) from None


def mode_conf(kind: str, job_id: str, *, jar: str) -> dict[str, str | None]:
    """Session conf for one write of ``kind`` (``None``: unset the key); ``jar`` is sparkguard's
    jar, already on the session's classpath (so ``spark.jars`` is not part of the result)."""
    from sparkguard.spark_lib.spark import sparkconf

    sparkguard_keys = dict.fromkeys(
        k for k in sparkconf.build_spark_conf(job_id, jar=jar) if k.startswith("spark.sparkguard.")
    )
    if kind == "builtin":
        return {
            PROTOCOL_KEY: BUILTIN_PROTOCOL,
            PARQUET_COMMITTER_KEY: BUILTIN_PARQUET_COMMITTER,
            COMMITTER_NAME_KEY: None,
            **sparkguard_keys,
        }
    if kind == "magic":
        return {
            PROTOCOL_KEY: CLOUD_PROTOCOL,
            PARQUET_COMMITTER_KEY: CLOUD_PARQUET_COMMITTER,
            COMMITTER_NAME_KEY: "magic",
            **sparkguard_keys,
        }
    conf: dict[str, str | None] = {
        PARQUET_COMMITTER_KEY: BUILTIN_PARQUET_COMMITTER,
        COMMITTER_NAME_KEY: None,
    }
    built = sparkconf.build_spark_conf(job_id, jar=jar)
    conf.update({k: v for k, v in built.items() if k != sparkconf.JARS_KEY})
    return conf


class Storage:
    """Where the tables go, how to list and check them (uncounted) and how to delete them."""

    name: str

    def url(self, table: str) -> str:
        raise NotImplementedError

    def keys(self, table: str) -> dict[str, int]:
        """Every object/file of the table, relative name -> size."""
        raise NotImplementedError

    def read(self, table: str, name: str) -> bytes:
        raise NotImplementedError

    def delete(self, table: str) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """Zero the request counters (S3)."""

    def counts(self) -> dict[str, int]:
        return {}


class LocalStorage(Storage):
    name = "local"

    def __init__(self, base: str) -> None:
        self.base = base

    def url(self, table: str) -> str:
        return f"file://{self.base}/{table}"

    def keys(self, table: str) -> dict[str, int]:
        root = Path(self.base, table)
        return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}

    def read(self, table: str, name: str) -> bytes:
        return Path(self.base, table, name).read_bytes()

    def delete(self, table: str) -> None:
        shutil.rmtree(Path(self.base, table), ignore_errors=True)


class HdfsStorage(Storage):
    """Tables in one directory of the minicluster; checks and cleanup over WebHDFS."""

    name = "hdfs"

    def url(self, table: str) -> str:
        return self.cluster.url(self.base, table)

    def keys(self, table: str) -> dict[str, int]:
        root = f"{self.base}/{table}"
        found = self.fs.find(root, detail=True)
        return {name[len(root) + 1 :]: int(info["size"]) for name, info in found.items()}

    def read(self, table: str, name: str) -> bytes:
        data: bytes = self.fs.cat_file(f"{self.base}/{table}/{name}")
        return data

    def delete(self, table: str) -> None:
        self.fs.rm(f"{self.base}/{table}", recursive=True)

    #: The NameNode's JMX answers are cached this long (Hadoop's metrics period, 10 s, + 1 s).
    JMX_CACHE_S = 11.0

    def __init__(self, cluster: hdfs.MiniHdfs, *, count_rpcs: bool = False) -> None:
        self.cluster = cluster
        self.base = "/bench"
        self.fs = hdfs.HdfsOverWebHdfs(skip_instance_cache=True, **cluster.storage_options)
        self.count_rpcs = count_rpcs
        self.before: dict[str, int] = {}

    def reset(self) -> None:
        if self.count_rpcs:
            time.sleep(self.JMX_CACHE_S)  # the earlier write's RPCs in the counters
            self.before = namenode_rpcs(self.cluster)

    def counts(self) -> dict[str, int]:
        """The client RPCs the NameNode served since :meth:`reset`, by method (``op:<Method>``);
        nothing unless ``count_rpcs`` (each read waits out the JMX cache: untimed, but slow)."""
        if not self.count_rpcs:
            return {}
        time.sleep(self.JMX_CACHE_S)
        after = namenode_rpcs(self.cluster)
        spent = {m: n - self.before.get(m, 0) for m, n in after.items()}
        counts = {f"op:{m}": n for m, n in spent.items() if n > 0}
        counts["total"] = sum(spent.values())
        return counts


#: The DataNodes' own RPCs to the NameNode (heartbeats, block reports): not the write's.
DATANODE_RPCS = frozenset(
    {
        "SendHeartbeat",
        "BlockReceivedAndDeleted",
        "BlockReport",
        "CacheReport",
        "VersionRequest",
        "RegisterDatanode",
        "ErrorReport",
        "SendLifeline",
    }
)


def namenode_rpcs(cluster: hdfs.MiniHdfs) -> dict[str, int]:
    """The NameNode's RPC counters by method (its ``RpcDetailedActivityForPort<port>`` bean over
    the HTTP port's ``/jmx``), without the DataNodes' own RPCs: every NameNode operation the
    write's clients made, driver and tasks alike."""
    import urllib.request

    port = cluster.uri.rsplit(":", 1)[1]
    bean = f"Hadoop:service=NameNode,name=RpcDetailedActivityForPort{port}"
    url = f"http://127.0.0.1:{cluster.http_port}/jmx?qry={bean}"
    with urllib.request.urlopen(url, timeout=30) as answer:
        beans = json.load(answer)["beans"]
    counts: dict[str, int] = {}
    for key, value in (beans[0] if beans else {}).items():
        method = key[: -len("NumOps")]
        # Overall<Method> counts the same calls again (with their queue time); "(external)"
        # is no method of the client protocol.
        if (
            key.endswith("NumOps")
            and method not in DATANODE_RPCS
            and not method.startswith(("Overall", "("))
        ):
            counts[method] = int(value)
    return counts


class S3Storage(Storage):
    name = "s3"

    def __init__(self, proxied: ProxiedS3, bucket: str) -> None:
        import boto3

        self.proxied = proxied
        self.bucket = bucket
        # Checks and cleanup go straight to moto: neither delayed nor counted by the proxy.
        options = proxied.s3.storage_options
        self.client = boto3.client(
            "s3",
            endpoint_url=proxied.s3.endpoint,
            aws_access_key_id=options["key"],
            aws_secret_access_key=options["secret"],
            region_name="us-east-1",
        )

    def url(self, table: str) -> str:
        return f"s3a://{self.bucket}/{table}"

    def _objects(self, table: str) -> Iterator[dict[str, Any]]:
        pages = self.client.get_paginator("list_objects_v2")
        for page in pages.paginate(Bucket=self.bucket, Prefix=table + "/"):
            yield from page.get("Contents", [])

    def keys(self, table: str) -> dict[str, int]:
        return {o["Key"][len(table) + 1 :]: int(o["Size"]) for o in self._objects(table)}

    def read(self, table: str, name: str) -> bytes:
        data: bytes = self.client.get_object(Bucket=self.bucket, Key=f"{table}/{name}")[
            "Body"
        ].read()
        return data

    def delete(self, table: str) -> None:
        keys = [{"Key": o["Key"]} for o in self._objects(table)]
        for start in range(0, len(keys), 1000):
            self.client.delete_objects(
                Bucket=self.bucket, Delete={"Objects": keys[start : start + 1000]}
            )
        # Uploads a failed write left open would keep their parts in moto's memory.
        uploads = self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=table + "/")
        for upload in uploads.get("Uploads", []):
            self.client.abort_multipart_upload(
                Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
            )

    def reset(self) -> None:
        self.proxied.reset()

    def counts(self) -> dict[str, int]:
        return self.proxied.stats()

    def requests(self) -> list[dict[str, Any]]:
        """Every request since :meth:`reset`, with the time its answer came (``at``)."""
        url = self.proxied.proxy + "/_proxy/requests"
        with urllib.request.urlopen(url, timeout=30) as answer:  # noqa: S310 - the proxy
            found: list[dict[str, Any]] = json.loads(answer.read())
        return found


def publication_window(spark: Any, store: Storage, table: str, kind: str) -> float | None:
    """Seconds during which a directory reader sees part of the write:

    * sparkguard: from its outcome written to its last data file published (the driver's own
      count, ``SparkguardCommitProtocol.lastPublication``: renames on local disk and HDFS,
      upload completions on S3);
    * magic (S3): from the first upload its job commit completes to the last (the proxy's log);
    * builtin on S3: from the first COPY onto a final key to the last (the job commit's
      renames); elsewhere not measured (None).
    """
    if kind == "sparkguard":
        last = str(spark._jvm.io.sparkguard.spark.SparkguardCommitProtocol.lastPublication())
        return float(last.split()[1]) / 1000 if last else None
    if not isinstance(store, S3Storage):
        return None
    data = [r for r in store.requests() if f"/{table}/" in r["path"]]
    if kind == "magic":
        times = [r["at"] for r in data if r["method"] == "POST" and "uploadId=" in r["query"]]
    else:
        times = [
            r["at"] for r in data if r["copy"] and "/_temporary/" not in r["path"]
        ]  # fmt: skip
    return max(times) - min(times) if times else None


def check_output(storage: Storage, table: str, kind: str) -> int:
    """Check (untimed) that ``kind``'s protocol really wrote the table; return its data files."""
    keys = storage.keys(table)
    data = [k for k in keys if os.path.basename(k).startswith("part-") and k.endswith(".parquet")]
    if not data:
        raise RuntimeError(f"{kind} on {storage.name}: no data file in {sorted(keys)[:10]}")
    if kind == "sparkguard":
        outcomes = [k for k in keys if k.startswith("_sparkguard/timeline/") and ".outcome" in k]
        if len(outcomes) != 1 or b"committed" not in storage.read(table, outcomes[0]):
            raise RuntimeError(f"sparkguard on {storage.name}: no committed outcome: {outcomes}")
    elif "_SUCCESS" not in keys:
        raise RuntimeError(f"{kind} on {storage.name}: no _SUCCESS")
    elif kind == "magic":
        success = json.loads(storage.read(table, "_SUCCESS"))
        if success.get("committer") != "magic":
            raise RuntimeError(f"magic on s3: _SUCCESS names {success.get('committer')!r}")
    elif keys["_SUCCESS"] != 0:
        raise RuntimeError(f"builtin on {storage.name}: _SUCCESS is not FileOutputCommitter's")
    return len(data)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1M rows, 8 partitions")
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--partitions", type=int, default=16, help="= data files per write")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds, at least 3")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="per S3 request")
    parser.add_argument(
        "--storage",
        choices=("local", "s3", "hdfs", "both", "all"),
        default="all",
        help="both: local and s3; all (default): local, s3 and hdfs",
    )
    parser.add_argument(
        "--phases",
        action="store_true",
        help="split each write's time into its Spark job (tasks, task commits) and the rest "
        "(driver: planning, job setup, job commit), from Spark's event log",
    )
    parser.add_argument(
        "--rpcs",
        action="store_true",
        help="count the NameNode's RPCs of each HDFS write by method (from its JMX counters, "
        "which it caches 10 s: waits 11 s before and after each write, untimed)",
    )
    parser.add_argument(
        "--prompt-close",
        action="store_true",
        help="give every HDFS client of the session (builtin's too) the prompt completion polling "
        "sparkguard's own clients use (dfs.client.block.write.locateFollowingBlock.initial."
        "delay.ms=25, .retries=10): what sparkguard gains beyond that setting",
    )
    parser.add_argument(
        "--local-dir",
        help="where the local tables go (default: the system temp dir); e.g. /dev/shm, where "
        "fsync costs nothing, to see what durable publication costs on disk",
    )
    parser.add_argument(
        "--modes",
        default=",".join(S3_KINDS),
        help="the protocols to run, comma-separated, of builtin, magic (S3 only) and sparkguard "
        "(default: all); e.g. --storage s3 --modes sparkguard,magic --partitions 1000 for the "
        "1,000-file publication window beside the magic committer's, where builtin's write "
        "through the 20 ms proxy takes over ten minutes a round",
    )
    args = parser.parse_args()
    args.modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    unknown = sorted(set(args.modes) - set(S3_KINDS))
    if unknown or not args.modes:
        parser.error(
            f"--modes {','.join(args.modes) or '(none)'}: use a comma-separated subset of "
            f"{', '.join(S3_KINDS)}" + (f" ({', '.join(unknown)} unknown)" if unknown else "")
        )
    if args.rounds < 3:
        parser.error(f"--rounds {args.rounds}: use at least 3 (best of >= 3 rotated rounds)")
    rows, partitions = (1_000_000, 8) if args.quick else (args.rows, args.partitions)
    storages = {"both": ("local", "s3"), "all": ("local", "s3", "hdfs")}.get(
        args.storage, (args.storage,)
    )

    from sparkguard.spark_lib.spark import sparkconf

    jars = [str(sparkconf.jar_path())]
    if "s3" in storages:
        jar_dir = fetch_jars()
        jars += [str(p) for p in sorted(jar_dir.glob("*.jar"))]
    with (
        tempfile.TemporaryDirectory(prefix="sg-bench-commit-", dir=args.local_dir) as base,
        contextlib.ExitStack() as servers,
    ):
        stores: dict[str, Storage] = {}
        if "local" in storages:
            stores["local"] = LocalStorage(base)
        if "s3" in storages:
            proxied = servers.enter_context(proxied_s3(latency_ms=args.latency_ms, write_rate=3500))
            stores["s3"] = S3Storage(proxied, proxied.s3.create_bucket())
        if "hdfs" in storages:
            cluster = servers.enter_context(hdfs.run_mini_hdfs())
            stores["hdfs"] = HdfsStorage(cluster, count_rpcs=args.rpcs)
        return run(args, rows, partitions, jars, stores)


#: ``--prompt-close``: the HDFS client settings of sparkguard's own clients
#: (``HadoopRenameAtomicStore.promptClose``), for every client of the session.
PROMPT_CLOSE = {
    "spark.hadoop.dfs.client.block.write.locateFollowingBlock.initial.delay.ms": "25",
    "spark.hadoop.dfs.client.block.write.locateFollowingBlock.retries": "10",
}


def build_session(
    jars: list[str], stores: dict[str, Storage], event_dir: str | None, *, prompt_close: bool
) -> Any:
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("bench-commit-protocol")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.memory", "2g")
        .config("spark.jars", ",".join(jars))
        # Spark's default is v1 already; pinned so "builtin" means the same on any Spark.
        .config("spark.hadoop.mapreduce.fileoutputcommitter.algorithm.version", "1")
    )
    # Hadoop settings of sparkguard's conf take effect at launch (a job started with the conf of
    # `sparkguard spark-conf` has them from its start), not when a write sets them.
    from sparkguard.spark_lib.spark import sparkconf

    for key, value in sparkconf.build_spark_conf("bench", jar=jars[0]).items():
        if key.startswith("spark.hadoop."):
            builder = builder.config(key, value)
    if event_dir:
        os.makedirs(event_dir, exist_ok=True)
        builder = (
            builder.config("spark.eventLog.enabled", "true")
            .config("spark.eventLog.dir", f"file://{event_dir}")
            .config("spark.eventLog.compress", "false")  # plain JSON lines, read below
        )
    on_hdfs = stores.get("hdfs")
    if isinstance(on_hdfs, HdfsStorage):
        for key, value in on_hdfs.cluster.spark_conf().items():
            builder = builder.config(key, value)
        for key, value in PROMPT_CLOSE.items() if prompt_close else ():
            builder = builder.config(key, value)
    s3 = stores.get("s3")
    if isinstance(s3, S3Storage):
        prefix = "spark.hadoop.fs.s3a."
        for key, value in {
            "endpoint": s3.proxied.proxy,  # through the latency proxy: every request counted
            "endpoint.region": "us-east-1",
            "path.style.access": "true",
            "connection.ssl.enabled": "false",
            "access.key": s3.proxied.s3.storage_options["key"],
            "secret.key": s3.proxied.s3.storage_options["secret"],
            # Explicit keys only: the default chain would probe the instance-metadata address.
            "aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
            # Hadoop 3.5.0's default is true already; pinned because the magic mode needs it.
            "committer.magic.enabled": "true",
        }.items():
            builder = builder.config(prefix + key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run(
    args: argparse.Namespace,
    rows: int,
    partitions: int,
    jars: list[str],
    stores: dict[str, Storage],
) -> int:
    event_dir = f"{tempfile.mkdtemp(prefix='sg-bench-events-')}/events" if args.phases else None
    spark = build_session(jars, stores, event_dir, prompt_close=args.prompt_close)
    df = spark.range(0, rows, numPartitions=partitions).selectExpr(
        "id",
        "cast(id % 1000 as int) as a",
        "cast(id as double) * 1.5 as d",
        "concat('name-', cast(id % 50000 as string)) as s",
    )
    df.cache().count()
    kinds = {
        name: tuple(k for k in every if k in args.modes)
        for name, every in {"local": LOCAL_KINDS, "s3": S3_KINDS, "hdfs": LOCAL_KINDS}.items()
    }
    results = {(s, k): Result() for s in stores for k in kinds[s]}
    print(
        f"rows={rows} partitions={partitions} rounds={args.rounds} (+1 untimed warm-up) "
        f"storages={','.join(stores)} s3 latency={args.latency_ms:g} ms/request "
        f"local dir={getattr(stores.get('local'), 'base', '-')}",
        flush=True,
    )

    def write(
        store: Storage, kind: str, label: str
    ) -> tuple[float, int, dict[str, int], float | None]:
        table = f"t-{kind}-{label}"
        for key, value in mode_conf(kind, f"bench-{store.name}-{label}", jar=jars[0]).items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
        store.reset()
        spark.sparkContext.setJobDescription(f"{store.name} {kind} {label}")
        started = time.perf_counter()
        df.write.mode("append").parquet(store.url(table))
        elapsed = time.perf_counter() - started
        spark.sparkContext.setJobDescription(None)
        counts = store.counts()
        window = publication_window(spark, store, table, kind)
        files = check_output(store, table, kind)
        store.delete(table)
        return elapsed, files, counts, window

    def describe(store: Storage, elapsed: float, files: int, counts: dict[str, int]) -> str:
        text = f"{elapsed:7.2f}s {files:3d} files {files / elapsed:7.1f} files/s"
        if counts:
            text += f"  {counts.get('total', 0) / files:6.1f} requests/file " + ops(counts)
        return text

    for store in stores.values():
        for kind in kinds[store.name]:
            try:
                elapsed, files, counts, _ = write(store, kind, "warm")
            except Exception as exc:  # only sparkguard on S3 may be missing; others must work
                if not (store.name == "s3" and kind == "sparkguard"):
                    raise
                why = first_line(exc)
                results[store.name, kind].unavailable = why
                store.delete(f"t-{kind}-warm")
                log(f"warm-up {store.name:5s} {kind:10s} n/a ({why})")
                continue
            log(f"warm-up {store.name:5s} {kind:10s} {describe(store, elapsed, files, counts)}")
    for n in range(args.rounds):
        for name in rotated(tuple(stores), n):
            store = stores[name]
            for kind in rotated(kinds[store.name], n):
                result = results[store.name, kind]
                if result.unavailable:
                    continue
                elapsed, files, counts, window = write(store, kind, str(n))
                result.times.append(elapsed)
                result.files.append(files)
                result.requests.append(counts)
                result.windows.append(window)
                log(
                    f"round {n} {store.name:5s} {kind:10s} "
                    f"{describe(store, elapsed, files, counts)}"
                )
    spark.stop()
    phases = job_seconds(event_dir) if event_dir else {}
    if event_dir:
        shutil.rmtree(os.path.dirname(event_dir), ignore_errors=True)
    return report(results, phases)


def first_line(exc: BaseException) -> str:
    """Why a write was refused, in one short line (py4j wraps the JVM exception in layers)."""
    text = str(exc)
    marker = "UnsupportedWriteException: "
    if marker in text:
        return text.split(marker, 1)[1].split(";", 1)[0].strip()[:200]
    return (text.strip().splitlines() or [type(exc).__name__])[0][:200]


def windows(results: dict[tuple[str, str], Result]) -> str:
    """The best round's publication window of each (storage, mode) that has one, e.g. ``s3
    sparkguard 120.5 ms/8 files, s3 magic 80.1 ms/8 files`` (:func:`publication_window`)."""
    shown = []
    for (store, kind), result in results.items():
        if result.unavailable or not result.windows:
            continue
        i = result.best()
        window = result.windows[i]
        if window is not None:
            shown.append(f"{store} {kind} {window * 1000:.1f} ms/{result.files[i]} files")
    return ", ".join(shown) or "n/a"


def ops(counts: dict[str, int]) -> str:
    """The requests by S3 operation, e.g. ``(HEAD 40 LIST 30 PUT 8)``."""
    named = [f"{o} {counts[f'op:{o}']}" for o in OPERATIONS if counts.get(f"op:{o}")]
    others = sorted(
        (k for k in counts if k.startswith("op:") and k[3:] not in OPERATIONS),
        key=lambda k: (-counts[k], k),
    )  # the NameNode's methods (HDFS)
    named += (f"{k[3:]} {counts[k]}" for k in others)
    return "(" + " ".join(named) + ")"


def job_seconds(event_dir: str) -> dict[str, float]:
    """Seconds spent inside Spark jobs, per job description (``<store> <kind> <round>``), from
    the event log: job submission to job end, i.e. the tasks with their task commits."""
    events: list[dict[str, Any]] = []
    for path in Path(event_dir).rglob("*"):  # Spark 4 writes a directory of rolled files
        if path.is_file() and path.name.startswith("events"):  # not .crc, not appstatus
            with path.open() as lines:
                events += (json.loads(line) for line in lines if line.strip())
    submitted: dict[int, tuple[str, int]] = {}
    for event in events:
        if event.get("Event") == "SparkListenerJobStart":
            description = (event.get("Properties") or {}).get("spark.job.description")
            if description:
                submitted[event["Job ID"]] = (description, event["Submission Time"])
    spent: dict[str, float] = {}
    for event in events:
        if event.get("Event") == "SparkListenerJobEnd" and event["Job ID"] in submitted:
            description, started = submitted[event["Job ID"]]
            seconds = (event["Completion Time"] - started) / 1000
            spent[description] = spent.get(description, 0.0) + seconds
    return spent


#: How the ``requests per file`` line names the S3 modes.
S3_NAMES = (("default", "builtin"), ("magic", "magic"), ("sparkguard", "sparkguard"))


def per_file(results: dict[tuple[str, str], Result], kind: str) -> str:
    """Storage requests per data file of ``kind``'s best S3 round, or ``n/a``."""
    result = results.get(("s3", kind))
    if result is None or result.unavailable or not result.times:
        return "n/a"
    i = result.best()
    return f"{result.requests[i].get('total', 0) / result.files[i]:.1f}"


def report(results: dict[tuple[str, str], Result], phases: dict[str, float]) -> int:
    best: dict[tuple[str, str], float] = {}
    print("best of each (storage, mode):")
    for (store, kind), result in results.items():
        if result.unavailable:
            print(f"  {store:5s} {kind:10s} n/a ({result.unavailable})")
            continue
        i = result.best()
        best[store, kind] = result.times[i]
        files = result.files[i]
        line = (
            f"  {store:5s} {kind:10s} {result.times[i]:7.2f}s  {files} files  "
            f"{files / result.times[i]:7.1f} files/s  rounds: "
            + ", ".join(f"{t:.2f}" for t in result.times)
        )
        if phases:
            inside = phases.get(f"{store} {kind} {i}", float("nan"))
            line += (
                f"\n        in the Spark job (tasks + task commits) {inside:.2f}s, outside it "
                f"(driver: planning, job setup, job commit) {result.times[i] - inside:.2f}s"
            )
        counts = result.requests[i]
        if counts:
            totals = sorted({c.get("total", 0) for c in result.requests})
            what = "NameNode RPCs" if store == "hdfs" else "storage requests"
            throttled = "" if store == "hdfs" else f"; throttled {counts.get('throttled', 0)}"
            line += (
                f"\n        {counts.get('total', 0) / files:.1f} {what} per file "
                f"({counts.get('total', 0)} in the best round; all rounds "
                f"{totals[0]}-{totals[-1]}{throttled})"
                f"\n        by operation {ops(counts)}"
            )
            if any(c in counts for c in CATEGORIES):
                line += ", by key: " + ", ".join(f"{c} {counts.get(c, 0)}" for c in CATEGORIES)
        print(line)

    def ratio(num: tuple[str, str], den: tuple[str, str], suffix: str) -> str:
        if num not in best or den not in best:
            missing = next(k for k in (num, den) if k not in best)
            why = results[missing].unavailable if missing in results else "not run"
            return f"n/a ({missing[0]} {missing[1]}: {why})"
        return f"{best[num] / best[den]:.2f}{suffix}"

    for num, den in (
        (("local", "builtin"), ("local", "sparkguard")),
        (("hdfs", "builtin"), ("hdfs", "sparkguard")),
        (("s3", "builtin"), ("s3", "sparkguard")),
        (("s3", "magic"), ("s3", "sparkguard")),
        (("s3", "builtin"), ("s3", "magic")),
    ):
        if num in best and den in best:
            per_round = zip(results[num].times, results[den].times, strict=True)
            print(
                f"per round {num[0]} {num[1]}/{den[1]} time: "
                + ", ".join(f"{a / b:.2f}" for a, b in per_round)
            )
    local = ratio(("local", "builtin"), ("local", "sparkguard"), "")
    s3_builtin = ratio(("s3", "builtin"), ("s3", "sparkguard"), "x")
    s3_magic = ratio(("s3", "magic"), ("s3", "sparkguard"), "x")
    if ("s3", "magic") in best and ("s3", "builtin") in best:
        print(f"s3 builtin/magic = {best['s3', 'builtin'] / best['s3', 'magic']:.2f}x (time)")
    on_hdfs = ratio(("hdfs", "builtin"), ("hdfs", "sparkguard"), "")
    print(f"hdfs sparkguard/builtin = {on_hdfs} (throughput: builtin time / sparkguard time)")
    if any(s == "s3" for s, _ in best):
        print("requests per file: " + " ".join(f"{n}={per_file(results, k)}" for n, k in S3_NAMES))
    print("publication window: " + windows(results))
    print(
        f"commit protocol: local sparkguard/builtin = {local}, s3 builtin/sparkguard = "
        f"{s3_builtin}, s3 magic/sparkguard = {s3_magic}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
