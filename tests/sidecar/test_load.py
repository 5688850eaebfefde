"""Concurrent clients against a real sidecar process: every marker acknowledged is written once.

Functional only: unit tests do not time things. The throughput and memory figures come from
``benchmarks/sidecar_load.py`` (docs/benchmarks.md). Runs against the local filesystem: the
batching logic is the same for every store, and the S3 kill -9 test (test_durability.py) covers
the S3 path. 32 clients at once is the point (the batching of concurrent requests), not the
count each sends: 40 each, every tenth retried.
"""

from __future__ import annotations

import os
import threading
import urllib.request
from pathlib import Path

import pytest

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.spark.marker_http import HttpMarkerClient
from sparkguard.spark_lib.storage import markers
from tests.sidecar.conftest import TOKEN, free_port, marker_dir_under, run_sidecar

CLIENTS = 32
PER_CLIENT = 40


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"metric {name} not exposed")


@pytest.mark.parametrize("flush_mode", ["interval", "group-commit"])
def test_concurrent_clients_each_marker_written_once(root: str, flush_mode: str) -> None:
    directory = marker_dir_under(root)
    port = free_port()
    env = {"SPARKGUARD_SIDECAR_FLUSH_MODE": flush_mode, "SPARKGUARD_SIDECAR_MAX_PENDING": "10000"}
    with run_sidecar(port=port, roots=root, extra_env=env):
        endpoint = f"http://127.0.0.1:{port}"
        errors: list[BaseException] = []
        start = threading.Barrier(CLIENTS)

        def client_thread(c: int) -> None:
            client = HttpMarkerClient(endpoint, token=TOKEN, deadline_s=120)
            try:
                start.wait()
                for i in range(PER_CLIENT):
                    name = f"c{c:02d}/part-{i:05d}-job-1-c000.parquet"
                    client.create(directory, name)
                    if i % 10 == 0:
                        client.create(directory, name)  # a retried create: acknowledged again
            except BaseException as exc:
                errors.append(exc)
            finally:
                client.close()

        threads = [threading.Thread(target=client_thread, args=(c,)) for c in range(CLIENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)  # a bound against a hang, not a measurement
        assert not any(t.is_alive() for t in threads), "clients still running after 300 s"
        assert not errors, errors[:3]
        total = CLIENTS * PER_CLIENT
        assert metric(port, "sparkguard_sidecar_pending_markers") == 0
        written = 'sparkguard_sidecar_markers_acknowledged_total{how="written"}'
        assert metric(port, written) == total
        assert metric(port, "sparkguard_sidecar_flush_batch_size_count") >= 1

    lines = [
        line
        for name in os.listdir(directory)
        if name.startswith("MARKERS") and name != "MARKERS.type"
        for line in Path(directory, name).read_text().splitlines()
    ]
    assert len(lines) == total, "duplicate or missing names in the MARKERS files"
    assert len(set(lines)) == total
    manager, path = filemanager.resolve(directory)
    assert len(markers.read_marked_files(manager, path)) == total
