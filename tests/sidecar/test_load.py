"""Load: 64 concurrent clients x 2,000 markers against a real sidecar process.

Runs against the local filesystem: on the 2 shared cores of CI, 128,000 markers through the moto
S3 server would take many minutes of moto's CPU without testing anything the S3 kill -9 test
(test_durability.py) does not already cover; the batching logic is the same for every store.
"""

from __future__ import annotations

import os
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from sparkguard.spark_lib import filemanager, markers
from sparkguard.spark_lib.marker_http import HttpMarkerClient
from tests.sidecar.conftest import TOKEN, free_port, marker_dir_under, rss_kib, run_sidecar

CLIENTS = 64
PER_CLIENT = 2_000


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"metric {name} not exposed")


@pytest.mark.slow
def test_64_clients_x_2000_markers(root: str) -> None:
    directory = marker_dir_under(root)
    port = free_port()
    env = {
        "SPARKGUARD_SIDECAR_FLUSH_MODE": "group-commit",
        "SPARKGUARD_SIDECAR_MAX_PENDING": "10000",
    }
    with run_sidecar(port=port, roots=root, extra_env=env) as process:
        endpoint = f"http://127.0.0.1:{port}"
        warmup = HttpMarkerClient(endpoint, token=TOKEN)
        warmup.create(marker_dir_under(root, table="warmup"), "w.parquet")
        warmup.close()
        rss_before = rss_kib(process.pid)
        errors: list[BaseException] = []
        start = threading.Barrier(CLIENTS)

        def client_thread(c: int) -> None:
            client = HttpMarkerClient(endpoint, token=TOKEN, deadline_s=120)
            try:
                start.wait()
                for i in range(PER_CLIENT):
                    client.create(directory, f"c{c:02d}/part-{i:05d}-job-1-c000.parquet")
            except BaseException as exc:
                errors.append(exc)
            finally:
                client.close()

        started = time.monotonic()
        threads = [threading.Thread(target=client_thread, args=(c,)) for c in range(CLIENTS)]
        for thread in threads:
            thread.start()
        peak_rss = rss_before
        while any(t.is_alive() for t in threads):
            peak_rss = max(peak_rss, rss_kib(process.pid))
            time.sleep(0.5)
            assert time.monotonic() - started < 480, "load did not finish in 8 minutes"
        elapsed = time.monotonic() - started
        assert not errors, errors[:3]
        total = CLIENTS * PER_CLIENT
        assert metric(port, "sparkguard_sidecar_pending_markers") == 0
        assert (
            metric(port, 'sparkguard_sidecar_markers_acknowledged_total{how="written"}')
            == total + 1
        )
        flushes = metric(port, "sparkguard_sidecar_flush_batch_size_count")
        rss_after = rss_kib(process.pid)

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
    growth_mib = (max(peak_rss, rss_after) - rss_before) / 1024
    print(
        f"{total} markers in {elapsed:.1f} s ({total / elapsed:.0f}/s), {flushes:.0f} flushes, "
        f"RSS {rss_before / 1024:.0f} -> peak {peak_rss / 1024:.0f} MiB"
    )
    # The state is the names themselves (~130k x ~60 bytes) plus the file contents: tens of MiB.
    assert growth_mib < 150, f"sidecar RSS grew by {growth_mib:.0f} MiB"
