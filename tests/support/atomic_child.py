"""A writer process for crash tests: writes self-checking files through create_atomic forever.

Usage: python tests/support/atomic_child.py <url> <mode: overwrite|create> [<block_size>]
Storage options come as JSON in SPARKGUARD_TEST_STORAGE_OPTIONS. The parent SIGKILLs it.
Every file is ``SGT1 | length (8 bytes) | payload | sha256(payload)``, so a reader can tell a
whole file from a partial one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import sys

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors, paths


def frame(payload: bytes) -> bytes:
    return b"SGT1" + len(payload).to_bytes(8, "big") + payload + hashlib.sha256(payload).digest()


def is_whole(data: bytes) -> bool:
    if len(data) < 44 or data[:4] != b"SGT1":
        return False
    size = int.from_bytes(data[4:12], "big")
    payload = data[12 : 12 + size]
    return len(data) == 44 + size and hashlib.sha256(payload).digest() == data[12 + size :]


def main() -> None:
    url, mode = sys.argv[1], sys.argv[2]
    options = json.loads(os.environ.get("SPARKGUARD_TEST_STORAGE_OPTIONS", "{}"))
    manager, base = filemanager.resolve(url, storage_options=options)
    if len(sys.argv) > 3 and isinstance(manager, filemanager.DirectPutFileManager):
        manager.block_size = int(sys.argv[3])
    max_size = int(os.environ.get("SPARKGUARD_TEST_MAX_SIZE", str(3 * 1024 * 1024)))
    rng = random.Random(os.getpid())
    i = 0
    while True:
        payload = rng.randbytes(rng.randint(0, max_size))
        name = f"f{i % 4}" if mode == "overwrite" else f"x{i}"
        stream = manager.create_atomic(paths.join(base, name), overwrite=mode == "overwrite")
        data = frame(payload)
        for start in range(0, len(data), 256 * 1024):
            stream.write(data[start : start + 256 * 1024])
        with contextlib.suppress(errors.AlreadyExistsError):  # a lost create-if-absent race
            stream.close()
        print(name, flush=True)
        i += 1


if __name__ == "__main__":
    main()
