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

from _common import rotated

from sparkguard.spark_lib import filemanager, paths
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=300)
    parser.add_argument("--size", type=int, default=64 * 1024)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds, at least 3")
    parser.add_argument("--quick", action="store_true", help="30 files (same procedure)")
    args = parser.parse_args()
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
