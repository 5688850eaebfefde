"""The adaptive flush policy, the choice of batch file, and the directory delete that needs no
outcome lookup (docs/sidecar.md, "Flush policies" and "Decided instants")."""

from __future__ import annotations

import asyncio
import os
import pathlib
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from sparkguard.sidecar import (
    app,
    batcher,
    config,
    dirstate,
    flushpolicy,
    metrics,
    outcomes,
    validation,
)
from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import paths
from sparkguard.spark_lib.storage import markers, timeline
from tests.sidecar.conftest import AUTH, marker_dir_under

Client = TestClient[Any, Any]
FULL = flushpolicy.FILE_FULL_BYTES


async def create(client: Client, directory: str, name: str) -> None:
    response = await client.post(
        "/v1/markers/create", json={"markerdir": directory, "markername": name}, headers=AUTH
    )
    assert response.status == 200, await response.text()


async def flushes(client: Client) -> tuple[float, float]:
    """(flushes that wrote a batch, names they wrote) from the metrics."""
    text = await (await client.get("/metrics")).text()

    def value(name: str) -> float:
        return float(text.split(f"sparkguard_sidecar_flush_batch_size_{name} ")[1].split()[0])

    return value("count"), value("sum")


def batch_files(directory: str) -> set[str]:
    return {name for name in os.listdir(directory) if name.startswith("MARKERS")} - {"MARKERS.type"}


@pytest.mark.parametrize(
    ("sizes", "busy", "threads", "expected"),
    [
        ({}, set(), 20, 0),  # nothing written yet: the first file
        ({0: 100}, set(), 20, 0),  # appends go to the first file ...
        ({0: 100}, {0}, 20, 1),  # ... unless it is being written: a new one
        ({0: 100, 1: 9, 2: 5, 3: 1}, set(), 20, 0),
        ({0: 100, 1: 9, 2: 5, 3: 1}, {0}, 20, 1),  # the first that is not being written
        ({0: 100, 1: 9, 2: 5, 3: 1}, {0, 1, 2, 3}, 20, 4),
        ({0: FULL, 1: FULL, 2: 10, 3: 0}, set(), 20, 2),  # full files take no more
        ({0: FULL, 1: FULL, 2: FULL, 3: FULL}, set(), 5, 4),  # all full: a new file if any
        ({0: FULL + 5, 1: FULL + 1, 2: FULL + 9, 3: FULL}, set(), 4, 3),  # then the smallest
        ({0: FULL + 5, 1: FULL + 1, 2: FULL + 9, 3: FULL}, {3}, 4, 1),
        ({0: FULL * 2}, set(), 1, 0),  # one file: always that one
    ],
)
def test_pick_batch_file(
    sizes: dict[int, int], busy: set[int], threads: int, expected: int
) -> None:
    assert flushpolicy.pick_batch_file(sizes, busy, threads) == expected


@pytest.mark.parametrize(
    ("rate", "arrived_at", "expected"),
    [
        (0.0, 10.0, 10.05),  # slow names: a 50 ms pause after the newest flushes
        (95.0, 10.0, 10.05),  # 95/s x 250 ms < 24: still slow
        (96.0, 10.0, 10.25),  # fast enough to fill a batch in time: a gap is a stall
        (500.0, 10.0, 10.25),
        (0.0, 10.22, 10.25),  # never later than the interval after the oldest
    ],
)
def test_flush_due(rate: float, arrived_at: float, expected: float) -> None:
    due = flushpolicy.flush_due(
        queued_at=10.0, arrived_at=arrived_at, rate=rate, interval_s=0.25, batch_size=24
    )
    assert due == pytest.approx(expected)


async def test_adaptive_flushes_a_full_batch_at_once(
    aiohttp_client: Callable[..., Any], make_config: Callable[..., config.SidecarConfig], root: str
) -> None:
    """``batch_size`` queued names start a flush without waiting for the interval (a minute
    here, whose fifth is 12 s: the guard below fails first if the size does not count)."""
    settings = make_config(
        flush_mode=config.FlushMode.ADAPTIVE, batch_size=8, batch_interval_ms=60_000
    )
    client: Client = await aiohttp_client(app.create_app(settings))
    directory = marker_dir_under(root)
    names = [f"part-{i:05d}.parquet" for i in range(8)]
    await asyncio.wait_for(asyncio.gather(*(create(client, directory, n) for n in names)), 5)
    assert await flushes(client) == (1.0, 8.0)


async def test_adaptive_flushes_a_lone_marker_and_fills_one_file(
    aiohttp_client: Callable[..., Any], make_config: Callable[..., config.SidecarConfig], root: str
) -> None:
    """Fewer names than ``batch_size`` are flushed once the interval (or a pause) is up; one
    flush at a time appends to the first file while it is not full (a file created costs two
    outcome reads: no more are created than concurrent flushes need)."""
    settings = make_config(
        flush_mode=config.FlushMode.ADAPTIVE, batch_size=1_000, batch_interval_ms=20
    )
    client: Client = await aiohttp_client(app.create_app(settings))
    directory = marker_dir_under(root)
    for i in range(6):
        await create(client, directory, f"part-{i:05d}.parquet")
    assert await flushes(client) == (6.0, 6.0)
    assert batch_files(directory) == {"MARKERS0"}
    content = (pathlib.Path(directory) / "MARKERS0").read_text().split()
    assert content == [f"part-{i:05d}.parquet.marker.CREATE" for i in range(6)]


async def test_delete_after_the_commits_read_looks_nothing_up_and_removes_foreign_files(
    table: tuple[str, dict[str, Any], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit's read of the markers (the seal, W8) looks the outcome up once when batch
    files were rewritten unchecked; the delete (W10) then reads no outcome, deletes the files it
    knows (on S3 while it lists) and what else the listing found (a file another process put
    there)."""
    url, options, root = table
    tl = timeline.timeline_for(url, storage_options=options)
    batched = markers.MarkerType.TIMELINE_SERVER_BASED.value
    instant = tl.start("job-1", attempt=1, marker_type=batched)
    marker_dir = validation.validate_marker_dir(
        f"{url}/_sparkguard/markers/{instant}", allowed_roots=(root,)
    )
    settings = config.SidecarConfig(
        allowed_roots=(root,), auth_disabled=True, batch_interval_ms=5, batch_threads=1
    )
    protocol = "s3" if url.startswith("s3://") else "file"
    sidecar = batcher.MarkerBatcher(
        settings, metrics.build_metrics(), managers={protocol: tl.manager}
    )
    sidecar.start()
    lookups: list[str] = []
    real_is_decided = outcomes.is_decided

    def counting(manager: Any, path: str) -> bool:
        lookups.append(path)
        return real_is_decided(manager, path)

    monkeypatch.setattr(outcomes, "is_decided", counting)
    try:
        for i in range(3):  # MARKERS0 created (looked up around), then rewritten unchecked
            await asyncio.wait_for(sidecar.create(marker_dir, f"part-{i}.parquet"), 30)
        assert tl.manager.versioned_writes
        before = len(lookups)
        assert len(await sidecar.seal(marker_dir)) == 3
        assert [p.rsplit("/", 1)[1] for p in lookups[before:]] == [f"{instant}.outcome"]
        mdir = markers.marker_dir(tl.table, instant)
        tl.manager.write_bytes(paths.join(mdir, "stray.parquet.marker.CREATE"), b"")

        def no_read(*args: Any) -> None:
            raise AssertionError("the delete looked the outcome up")

        monkeypatch.setattr(outcomes, "read_outcome", no_read)
        monkeypatch.setattr(outcomes, "is_decided", no_read)
        # MARKERS0, MARKERS.type and the stray marker
        assert await asyncio.wait_for(sidecar.delete_dir(marker_dir), 30) == 3
        assert not tl.manager.list_files(mdir)
    finally:
        await sidecar.drain(5)
        await sidecar.close()


def test_every_client_waits_counts_only_clients_answered_before(root: str) -> None:
    """The adaptive rule's bookkeeping: a client's first marker does not make it one that may
    send the next name (at a job's start the pause rule batches arrivals); once answered it
    counts, and the rule holds while every such client waits."""
    marker_dir = validation.validate_marker_dir(marker_dir_under(root), allowed_roots=(root,))
    state = dirstate.DirState(marker_dir, filemanager.resolve(marker_dir.path)[0])
    state.sent("a", 1.0)
    state.sent("b", 1.0)
    assert not state.every_client_waits()  # nobody answered yet: no rule
    state.answered("a", 1.1)
    state.answered("b", 1.1)
    state.sent("a", 1.2)
    assert not state.every_client_waits()  # b is not waiting: it may send soon
    state.sent("a", 1.2)  # a second request of a's, still one waiting client
    state.sent("b", 1.3)
    assert state.every_client_waits()
    state.sent("c", 1.3)  # a newcomer does not hold the flush back
    assert state.every_client_waits()
    state.answered("a", 1.4)
    assert state.every_client_waits()  # a still has a request waiting
    state.answered("a", 1.4)
    assert not state.every_client_waits()
    dirstate.forget_idle_clients(state, since=2.0)  # a idle, gone; b and c still waiting
    assert state.every_client_waits()
    assert set(state.clients) == {"b"}


async def test_adaptive_flushes_at_once_when_every_client_answered_before_waits(
    make_config: Callable[..., config.SidecarConfig], root: str
) -> None:
    """With a batch of 2 and a minute's interval (whose fifth, 12 s, is far beyond the guards
    below): a name from one of two known clients waits, as the other may send the next one;
    once both wait (the second asks for the same name: still one queued) it flushes at once."""
    settings = make_config(
        flush_mode=config.FlushMode.ADAPTIVE, batch_size=2, batch_interval_ms=60_000
    )
    sidecar = batcher.MarkerBatcher(settings, metrics.build_metrics())
    sidecar.start()
    marker_dir = validation.validate_marker_dir(marker_dir_under(root), allowed_roots=(root,))
    try:
        await asyncio.wait_for(  # a full batch: both clients answered once
            asyncio.gather(
                sidecar.create(marker_dir, "part-00000.parquet", client="a"),
                sidecar.create(marker_dir, "part-00001.parquet", client="b"),
            ),
            10,
        )
        first = asyncio.ensure_future(sidecar.create(marker_dir, "part-00002.parquet", client="a"))
        done, _ = await asyncio.wait({first}, timeout=0.5)
        assert not done, "flushed while client b could still send a name"
        second = sidecar.create(marker_dir, "part-00002.parquet", client="b")
        assert await asyncio.wait_for(asyncio.gather(first, second), 5) == [True, True]
        assert (pathlib.Path(marker_dir.path) / "MARKERS0").read_text().split() == [
            f"part-{i:05d}.parquet" for i in range(3)
        ]
    finally:
        await sidecar.drain(5)
        await sidecar.close()
