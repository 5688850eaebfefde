"""Storage requests and time per checkpoint file, in one run:

* on the S3 API (moto server on 127.0.0.1): sparkguard's direct put (one conditional PUT) vs the
  minimal rename on S3 (PUT a temp object, COPY it to the final key, DELETE the temp: three
  requests, made with a plain boto3 client), and, labelled apart, the same rename through
  fsspec (sparkguard's ``rename`` file manager kind: ``mv`` plus its existence checks);
* on the local filesystem: sparkguard's rename-based publication (temp file, fsync, rename,
  fsync dir) vs a plain write (no atomicity, no durability).

Every kind writes once untimed first, then R >= 3 rounds run with the order rotated each round;
the best round of each kind is reported. ``--quick`` is the same procedure on 30 files.

Usage: python benchmarks/checkpoint.py [--files N] [--size BYTES] [--rounds R] [--quick]
Last line: ``requests per file: direct=<n> minimal-rename=<m> fsspec-rename=<k>``.

``--jvm`` measures Spark's own checkpoint instead: a Structured Streaming query of small
micro-batches (``rate-micro-batch`` -> ``noop``, so the checkpoint is the only storage work)
with its checkpoint on ``s3a://`` on the S3 server behind the 20 ms latency proxy, once with
Spark's default CheckpointFileManager and once with sparkguard's, in one run (rounds rotate
the order; each query is its own Spark process, tests/jvm/jobs/stream_checkpoint.py). It prints
the storage requests per checkpoint file (every request on the checkpoint's keys and listings,
including Spark's own existence checks and the query's start, divided by the files written)
and the micro-batch latency (``triggerExecution``, median over the batches after the first
two) of each, and ends with ``checkpoint jvm: requests per file default/sparkguard = <x>x,
batch latency default/sparkguard = <y>x`` (one line).
``--jvm --quick``: 12 micro-batches, one round; otherwise 30 micro-batches, two rounds.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.append(os.path.dirname(os.path.abspath(__file__)))  # _common, beside this file

from _common import log, percentile, proxied_s3, rotated

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import paths
from tests.support import s3server

Writer = Callable[[str, bytes], None]  # (name, payload) -> None


def count_requests(client: Any) -> collections.Counter[str]:
    """Count every S3 API call a botocore client makes, by operation name."""
    counter: collections.Counter[str] = collections.Counter()

    def on_call(event_name: str, **_: Any) -> None:
        counter[event_name.rsplit(".", maxsplit=1)[-1]] += 1

    client.meta.events.register("before-call.s3", on_call)
    return counter


def manager_writer(manager: filemanager.FileManager, base: str) -> Writer:
    def write(name: str, payload: bytes) -> None:
        manager.write_bytes(paths.join(base, name), payload)

    return write


def minimal_rename_writer(client: Any, bucket: str, prefix: str) -> Writer:
    """The least a rename costs on S3: PUT temp, COPY to the final key, DELETE temp."""

    def write(name: str, payload: bytes) -> None:
        temp, final = f"{prefix}/.{name}.tmp", f"{prefix}/{name}"
        client.put_object(Bucket=bucket, Key=temp, Body=payload)
        client.copy_object(Bucket=bucket, Key=final, CopySource={"Bucket": bucket, "Key": temp})
        client.delete_object(Bucket=bucket, Key=temp)

    return write


def plain_writer(base: Path) -> Writer:
    base.mkdir(parents=True, exist_ok=True)

    def write(name: str, payload: bytes) -> None:
        (base / name).write_bytes(payload)

    return write


def run_kinds(
    kinds: dict[str, Writer], *, files: int, rounds: int, payload: bytes
) -> dict[str, float]:
    """Untimed warm-up of each kind, then ``rounds`` rotated rounds; best seconds per file."""
    best = dict.fromkeys(kinds, float("inf"))
    order = tuple(kinds)
    for n in range(-1, rounds):
        for kind in rotated(order, n):
            started = time.perf_counter()
            for i in range(files if n >= 0 else 1):
                kinds[kind](f"r{n + 1}-state-{i:05d}.bin", payload)
            if n >= 0:
                best[kind] = min(best[kind], (time.perf_counter() - started) / files)
    return best


JOBS = Path(__file__).resolve().parents[1] / "tests" / "jvm" / "jobs"
JVM_KINDS = ("default", "sparkguard")


def run_stream(conf: dict[str, str], checkpoint: str, batches: int) -> dict[str, Any]:
    """tests/jvm/jobs/stream_checkpoint.py in its own process (its own Spark JVM)."""
    import json
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PYSPARK_", "SPARK_"))}
    # Only ever 127.0.0.1; never the instance-metadata address.
    env.update(
        {"PYTHONSAFEPATH": "1", "AWS_EC2_METADATA_DISABLED": "true", "SPARK_LOCAL_IP": "127.0.0.1"}
    )
    args = [sys.executable, str(JOBS / "stream_checkpoint.py"), json.dumps(conf), checkpoint]
    result = subprocess.run(
        [*args, "noop", str(batches - 1), "10"],
        capture_output=True, text=True, env=env, timeout=1800, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"the streaming query failed:\n{result.stderr[-4000:]}")
    answer: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return answer


def checkpoint_requests(
    log_: list[dict[str, Any]], bucket: str, prefix: str
) -> list[dict[str, Any]]:
    """The proxy's requests on the checkpoint: its keys, or listings of a prefix under it."""
    import urllib.parse

    keys = f"/{bucket}/{prefix}"
    found = []
    for r in log_:
        listed = urllib.parse.parse_qs(r["query"]).get("prefix", [None])[0]
        if r["path"].startswith(keys) or (listed is not None and listed.startswith(prefix)):
            found.append(r)
    return found


def operation(r: dict[str, Any]) -> str:
    if r["method"] == "GET" and "list-type" in r["query"]:
        return "LIST"
    if r["method"] == "PUT" and r["copy"]:
        return "COPY"
    if r["method"] == "PUT" and r["conditional"]:
        return "PUT-if-none-match"
    return str(r["method"])


def main_jvm(*, quick: bool) -> None:
    import boto3

    from sparkguard.spark_lib.spark import sparkconf
    from tests.jvm import s3a

    batches, rounds = (12, 1) if quick else (30, 2)
    jars = s3a.fetch_jars()
    ours = sparkconf.build_spark_conf("checkpoint-bench")
    print(
        f"checkpoint jvm benchmark: rate-micro-batch -> noop, {batches} micro-batches of 10 rows,"
        f" checkpoint on s3a:// behind the 20 ms proxy, {rounds} round(s)"
    )
    per_file: dict[str, list[float]] = {k: [] for k in JVM_KINDS}
    latency: dict[str, list[float]] = {k: [] for k in JVM_KINDS}
    with proxied_s3(latency_ms=20, write_rate=3500) as s3:
        bucket = s3.s3.create_bucket()
        keys = s3.s3.storage_options
        client = boto3.client(
            "s3", endpoint_url=s3.s3.endpoint, aws_access_key_id=keys["key"],
            aws_secret_access_key=keys["secret"], region_name="us-east-1",
        )  # fmt: skip
        for n in range(rounds):
            for kind in rotated(JVM_KINDS, n):
                conf = s3a.spark_conf(s3.s3, jars)
                conf["spark.hadoop.fs.s3a.endpoint"] = s3.proxy
                if kind == "sparkguard":
                    conf["spark.jars"] += "," + ours["spark.jars"]
                    conf[sparkconf.CHECKPOINT_MANAGER_KEY] = ours[sparkconf.CHECKPOINT_MANAGER_KEY]
                prefix = f"r{n}-{kind}/cp/"
                s3.reset()
                log(f"round {n + 1}: {kind} manager, {batches} micro-batches")
                result = run_stream(conf, f"s3a://{bucket}/{prefix}".rstrip("/"), batches)
                requests = checkpoint_requests(proxy_requests(s3.proxy), bucket, prefix)
                listing = client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
                files = [o["Key"] for o in listing if not o["Key"].endswith("/")]
                ops = collections.Counter(operation(r) for r in requests)
                steady = sorted(result["batchMs"][2:])
                per_file[kind].append(len(requests) / len(files))
                latency[kind].append(percentile(steady, 0.5))
                breakdown = ", ".join(f"{op}={c / len(files):.1f}" for op, c in sorted(ops.items()))
                print(
                    f"  {kind:10s} round {n + 1}: {len(files)} checkpoint files, {len(requests)}"
                    f" requests = {len(requests) / len(files):.2f}/file ({breakdown});"
                    f" batch latency median {percentile(steady, 0.5):.0f} ms,"
                    f" p90 {percentile(steady, 0.9):.0f} ms"
                )
    req = {k: sum(v) / len(v) for k, v in per_file.items()}
    lat = {k: sum(v) / len(v) for k, v in latency.items()}
    for kind in JVM_KINDS:
        print(f"  {kind:10s}: {req[kind]:.2f} requests/file, batch latency {lat[kind]:.0f} ms")
    print(
        f"checkpoint jvm: requests per file default/sparkguard = "
        f"{req['default'] / req['sparkguard']:.1f}x, batch latency default/sparkguard = "
        f"{lat['default'] / lat['sparkguard']:.2f}x"
    )


def proxy_requests(proxy: str) -> list[dict[str, Any]]:
    import json
    import urllib.request

    with urllib.request.urlopen(f"{proxy}/_proxy/requests", timeout=30) as answer:  # noqa: S310
        result: list[dict[str, Any]] = json.loads(answer.read())
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=300)
    parser.add_argument("--size", type=int, default=64 * 1024)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds, at least 3")
    parser.add_argument("--quick", action="store_true", help="30 files (same procedure)")
    parser.add_argument(
        "--jvm", action="store_true", help="Spark's checkpoint: default vs sparkguard manager"
    )
    args = parser.parse_args()
    if args.jvm:
        main_jvm(quick=args.quick)
        return
    if args.rounds < 3:
        parser.error(f"--rounds {args.rounds}: use at least 3 (best of >= 3 rotated rounds)")
    files = 30 if args.quick else args.files
    payload = b"c" * args.size
    print(f"checkpoint benchmark: {files} files of {args.size} bytes, best of {args.rounds} rounds")

    per_file: dict[str, float] = {}
    with s3server.run_s3_server() as server:
        import boto3

        bucket = server.create_bucket()
        counters: dict[str, collections.Counter[str]] = {}
        kinds: dict[str, Writer] = {}
        for kind, manager_kind in (("direct-put", "direct-put"), ("fsspec-rename", "rename")):
            manager, base = filemanager.resolve(
                f"s3://{bucket}/{kind}", storage_options=server.storage_options, kind=manager_kind
            )
            manager.fs.connect()
            counters[kind] = count_requests(manager.fs.s3)
            kinds[kind] = manager_writer(manager, base)
        keys = server.storage_options
        client = boto3.client(
            "s3", endpoint_url=server.endpoint, aws_access_key_id=keys["key"],
            aws_secret_access_key=keys["secret"], region_name="us-east-1",
        )  # fmt: skip
        counters["minimal-rename"] = count_requests(client)
        kinds["minimal-rename"] = minimal_rename_writer(client, bucket, "minimal-rename")
        best = run_kinds(kinds, files=files, rounds=args.rounds, payload=payload)
        calls = files * args.rounds + 1  # timed rounds + the warm-up file
        for kind in ("direct-put", "minimal-rename", "fsspec-rename"):
            total = sum(counters[kind].values())
            per_file[kind] = total / calls
            ops = ", ".join(f"{op}={n / calls:g}" for op, n in sorted(counters[kind].items()))
            print(
                f"  s3 {kind:14s}: {best[kind] * 1000:7.2f} ms/file, "
                f"{per_file[kind]:.2f} requests/file ({ops})"
            )

    with tempfile.TemporaryDirectory() as tmp:
        manager, base = filemanager.resolve(f"{tmp}/rename")
        local = run_kinds(
            {"atomic": manager_writer(manager, base), "plain": plain_writer(Path(tmp) / "plain")},
            files=files, rounds=args.rounds, payload=payload,
        )  # fmt: skip
        print(f"  local rename-based: {local['atomic'] * 1000:7.3f} ms/file (fsync file + dir)")
        print(f"  local plain write : {local['plain'] * 1000:7.3f} ms/file (no atomicity)")
        print(f"  local atomic/plain time = {local['atomic'] / local['plain']:.1f}x")

    print(
        f"requests per file: direct={per_file['direct-put']:.0f} "
        f"minimal-rename={per_file['minimal-rename']:.0f} "
        f"fsspec-rename={per_file['fsspec-rename']:.0f}"
    )


if __name__ == "__main__":
    main()
