"""kill -9 the sidecar under load, round after round: no acknowledged marker may ever be lost.

The sidecar runs as a real subprocess; writer threads drive it through HttpMarkerClient and
record a marker only once its request got a 2xx. At a random moment the sidecar gets SIGKILL;
it is restarted on the same marker directory (so each round also proves the lazy reload: new
flushes append to the files a killed predecessor wrote) and, after every round, every recorded
marker must be found on storage by the library's own reader. The rounds are a seeded, varied
few (8 on local disk, 5 on S3, 3 under S3 faults): each alternates the flush mode and draws its
batch interval, its flush threads and its kill moment from the seed.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors
from sparkguard.spark_lib.spark.marker_http import HttpMarkerClient
from sparkguard.spark_lib.storage import markers
from tests.sidecar.conftest import TOKEN, free_port, marker_dir_under, run_sidecar
from tests.support import s3server
from tests.support.s3faults import REALISTIC, Fault, Op, S3FaultFront

WRITERS = 6


def drive_until_killed(
    endpoint: str, directory: str, process: Any, *, round_no: int, rng: random.Random
) -> tuple[set[str], int]:
    """Create markers from several threads; SIGKILL the sidecar at a random moment.

    Returns the data files whose create got a 2xx, and how many creates failed.
    """
    acked: set[str] = set()
    failed = [0]
    lock = threading.Lock()
    stop = threading.Event()
    answered = threading.Semaphore(0)  # released once per writer, at its first answer
    # The first request loads the store's client library and the directory (seconds on S3
    # on a busy machine): done once here, so the writers' short deadlines measure the batching.
    with HttpMarkerClient(endpoint, token=TOKEN, deadline_s=60) as warm_up:
        warm_up.create(directory, f"r{round_no:02d}/warm-up.parquet")
    acked.add(f"r{round_no:02d}/warm-up.parquet")

    def writer(w: int) -> None:
        client = HttpMarkerClient(endpoint, token=TOKEN, deadline_s=0.6, request_timeout_s=2.0)
        n = 0
        try:
            while not stop.is_set():
                name = f"r{round_no:02d}/w{w}/part-{n:05d}.parquet"
                n += 1
                try:
                    client.create(directory, name)
                except errors.MarkerError:
                    with lock:
                        failed[0] += 1
                    return
                finally:
                    if n == 1:
                        answered.release()  # acknowledged or failed: its first answer
                with lock:
                    acked.add(name)
        finally:
            client.close()

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(WRITERS)]
    for thread in threads:
        thread.start()
    # The kill window opens once every writer has had its first answer (an explicit signal, not
    # a guess at how long a loaded machine takes to start them), then the kill lands at a
    # random moment within it.
    for w in range(WRITERS):
        assert answered.acquire(timeout=60), f"only {w} of {WRITERS} writers got an answer"
    time.sleep(rng.uniform(0.0, 0.75))
    process.kill()  # SIGKILL: no drain, no goodbye
    process.wait(timeout=10)
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive(), "a writer hung past its deadline"
    return acked, failed[0]


def kill_loop(
    *,
    rounds: int,
    roots: str,
    directory: str,
    manager: filemanager.FileManager,
    path: str,
    extra_env: dict[str, str],
    seed: int,
) -> None:
    rng = random.Random(seed)
    all_acked: set[str] = set()
    total_failed = 0
    for round_no in range(rounds):
        port = free_port()
        mode = "group-commit" if round_no % 2 else "interval"
        env = {
            **extra_env,
            "SPARKGUARD_SIDECAR_FLUSH_MODE": mode,
            "SPARKGUARD_SIDECAR_BATCH_INTERVAL_MS": str(rng.choice([5, 20, 50])),
            "SPARKGUARD_SIDECAR_BATCH_THREADS": str(rng.choice([1, 4, 20])),
        }
        with run_sidecar(port=port, roots=roots, extra_env=env) as process:
            acked, failed = drive_until_killed(
                f"http://127.0.0.1:{port}", directory, process, round_no=round_no, rng=rng
            )
        all_acked |= acked
        total_failed += failed
        on_storage = markers.read_marked_files(manager, path)
        lost = all_acked - on_storage
        assert not lost, f"round {round_no} ({mode}): {len(lost)} acknowledged markers lost"
    assert len(all_acked) > rounds * WRITERS, "the writers barely ran; the test proves nothing"
    # A sidecar started on the survivors' files acknowledges every old marker without a write.
    port = free_port()
    with run_sidecar(port=port, roots=roots, extra_env=extra_env):
        client = HttpMarkerClient(f"http://127.0.0.1:{port}", token=TOKEN, deadline_s=30)
        assert client.all_marked(directory) >= all_acked
        for name in sorted(all_acked)[:20]:
            client.create(directory, name)
        client.close()
    assert markers.read_marked_files(manager, path) >= all_acked


@pytest.mark.slow
def test_kill_9_loses_no_acknowledged_marker_local(root: str) -> None:
    directory = marker_dir_under(root)
    manager, path = filemanager.resolve(directory)
    kill_loop(
        rounds=8,
        roots=root,
        directory=directory,
        manager=manager,
        path=path,
        extra_env={},
        seed=3,
    )


@pytest.mark.slow
@pytest.mark.s3
def test_kill_9_loses_no_acknowledged_marker_s3(
    s3_server: s3server.S3Server, s3_bucket: str, s3_options: dict[str, Any]
) -> None:
    directory = marker_dir_under(s3_bucket, storage_options=s3_options)
    manager, path = filemanager.resolve(directory, storage_options=s3_options)
    kill_loop(
        rounds=5,
        roots=s3_bucket,
        directory=directory,
        manager=manager,
        path=path,
        extra_env=s3_server.env(),
        seed=7,
    )


def test_torn_last_line_is_dropped_on_load_not_buried(tmp_path: Any) -> None:
    """A crash mid-append leaves a partial last line (never acknowledged). A restarted sidecar
    drops it, so its next append does not turn it into a garbage middle line that rollback
    would refuse."""
    from sparkguard.sidecar import batchfiles

    directory = tmp_path / "markers" / "20261123000000000-job"
    directory.mkdir(parents=True)
    (directory / "MARKERS0").write_bytes(b"a.parquet.marker.CREATE\nb.parq")
    manager, path = filemanager.resolve(str(directory))
    loaded = batchfiles.load_marker_dir(manager, path)
    assert loaded.names == {"a.parquet.marker.CREATE"}
    appended = loaded.files[0] + b"c.parquet.marker.CREATE\n"
    parsed = markers.parse_batch_content(appended, source="MARKERS0")
    assert parsed.names == ("a.parquet.marker.CREATE", "c.parquet.marker.CREATE")
    assert parsed.torn is None


@pytest.mark.slow
@pytest.mark.s3
def test_kill_9_under_s3_faults_loses_no_acknowledged_marker(
    s3_faults: S3FaultFront, s3_bucket: str
) -> None:
    """The sidecar's flushes go through the fault front (a few percent of every fault, and a
    burst of 503 SlowDown on every PUT at the start): a marker is acknowledged only once its
    flush got through, so no acknowledged marker is lost across kills; faults did fire."""
    options = s3_faults.storage_options
    directory = marker_dir_under(s3_bucket, storage_options=options)
    manager, path = filemanager.resolve(directory, storage_options=options)
    s3_faults.set_rates(REALISTIC)
    s3_faults.burst(Op.PUT, Fault.SLOWDOWN, 1.0)
    kill_loop(
        rounds=3,
        roots=s3_bucket,
        directory=directory,
        manager=_FaultsOff(manager, s3_faults),
        path=path,
        extra_env=s3_faults.env(),
        seed=11,
    )
    by_fault = s3_faults.injected_by_fault()
    assert by_fault[Fault.SLOWDOWN] > 0, s3_faults.report()
    assert sum(by_fault.values()) > by_fault[Fault.SLOWDOWN], s3_faults.report()


class _FaultsOff:
    """A file manager whose every call runs with the front's faults off (verification)."""

    def __init__(self, manager: filemanager.FileManager, front: S3FaultFront) -> None:
        self._manager = manager
        self._front = front

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._manager, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._front.off():
                return attribute(*args, **kwargs)

        return call
