"""Storage requests and time per checkpoint file, in one run:

* on the S3 API (moto server on 127.0.0.1): sparkguard's direct put (one conditional PUT) vs a
  rename-based publication (temp object, then copy + delete: what a rename costs on S3);
* on the local filesystem: sparkguard's rename-based publication (temp file, fsync, rename,
  fsync dir) vs a plain write (no atomicity, no durability).

Usage: python benchmarks/checkpoint.py [--files N] [--size BYTES] [--quick]
Last line: ``requests per file: direct=<n> rename=<m>``.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parents[1]))  # appended: never shadow the stdlib

from sparkguard.spark_lib import filemanager, paths
from tests.support import s3server


def count_requests(manager: filemanager.FileManager) -> collections.Counter[str]:
    """Count every S3 API call the manager's filesystem makes, by operation name."""
    counter: collections.Counter[str] = collections.Counter()
    fs: Any = manager.fs
    fs.connect()

    def on_call(event_name: str, **_: Any) -> None:
        counter[event_name.rsplit(".", maxsplit=1)[-1]] += 1

    fs.s3.meta.events.register("before-call.s3", on_call)
    return counter


def write_files(manager: filemanager.FileManager, base: str, files: int, payload: bytes) -> float:
    started = time.perf_counter()
    for i in range(files):
        manager.write_bytes(paths.join(base, f"state-{i:05d}.bin"), payload)
    return time.perf_counter() - started


def plain_write(base: Path, files: int, payload: bytes) -> float:
    base.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for i in range(files):
        (base / f"state-{i:05d}.bin").write_bytes(payload)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=300)
    parser.add_argument("--size", type=int, default=64 * 1024)
    parser.add_argument("--quick", action="store_true", help="30 files")
    args = parser.parse_args()
    files = 30 if args.quick else args.files
    payload = b"c" * args.size
    print(f"checkpoint benchmark: {files} files of {args.size} bytes each")

    with s3server.run_s3_server() as server:
        bucket = server.create_bucket()
        results = {}
        for kind in ("direct-put", "rename"):
            manager, base = filemanager.resolve(
                f"s3://{bucket}/{kind}", storage_options=server.storage_options, kind=kind
            )
            counter = count_requests(manager)
            elapsed = write_files(manager, base, files, payload)
            total = sum(counter.values())
            results[kind] = total / files
            ops = ", ".join(f"{op}={n}" for op, n in sorted(counter.items()))
            print(
                f"  s3 {kind:10s}: {elapsed / files * 1000:7.2f} ms/file, "
                f"{total / files:.2f} requests/file ({ops})"
            )

    with tempfile.TemporaryDirectory() as tmp:
        manager, base = filemanager.resolve(f"{tmp}/rename")
        atomic = write_files(manager, base, files, payload)
        plain = plain_write(Path(tmp) / "plain", files, payload)
        print(f"  local rename-based: {atomic / files * 1000:7.3f} ms/file (fsync file + dir)")
        print(f"  local plain write : {plain / files * 1000:7.3f} ms/file (no atomicity)")
        print(f"  local atomic/plain time = {atomic / plain:.1f}x")

    print(f"requests per file: direct={results['direct-put']:.0f} rename={results['rename']:.0f}")


if __name__ == "__main__":
    main()
