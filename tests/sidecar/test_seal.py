"""The commit's seal (W8): once the commit read its markers, the sidecar acknowledges no marker
of that directory, without a storage read (docs/sidecar.md, "The commit's seal")."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from sparkguard.sidecar import (
    app,
    batcher,
    batchfiles,
    config,
    errors,
    metrics,
    outcomes,
    validation,
)
from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.spark.marker_http import HttpMarkerClient
from sparkguard.spark_lib.storage import markers, timeline
from tests.sidecar.conftest import AUTH, TOKEN, marker_dir_under

Client = TestClient[Any, Any]


def started(
    url: str, options: dict[str, Any], root: str, **settings: Any
) -> tuple[timeline.Timeline, validation.MarkerDir, batcher.MarkerBatcher]:
    """An instant opened on the table (W2) and a batcher for its marker directory."""
    tl = timeline.timeline_for(url, storage_options=options)
    instant = tl.start(
        "job-1", attempt=1, marker_type=markers.MarkerType.TIMELINE_SERVER_BASED.value
    )
    marker_dir = validation.validate_marker_dir(
        f"{url}/_sparkguard/markers/{instant}", allowed_roots=(root,)
    )
    fields: dict[str, Any] = {
        "allowed_roots": (root,),
        "auth_disabled": True,
        "batch_interval_ms": 5,
        "batch_threads": 1,
        **settings,
    }
    protocol = "s3" if url.startswith("s3://") else "file"
    sidecar = batcher.MarkerBatcher(
        config.SidecarConfig(**fields), metrics.build_metrics(), managers={protocol: tl.manager}
    )
    sidecar.start()
    return tl, marker_dir, sidecar


def on_storage(tl: timeline.Timeline, marker_dir: validation.MarkerDir) -> set[str]:
    return markers.read_marked_files(tl.manager, markers.marker_dir(tl.table, marker_dir.instant))


@pytest.fixture
def no_storage_reads(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Call to make any outcome lookup or batch write of the sidecar fail the test."""

    def forbid() -> None:
        def fail(*args: Any) -> Any:
            raise AssertionError("the sealed directory touched storage")

        for name in ("is_decided", "read_outcome"):
            monkeypatch.setattr(outcomes, name, fail)
        for name in ("write_batch_file", "read_batch_file"):
            monkeypatch.setattr(batchfiles, name, fail)

    return forbid


async def test_a_sealed_directory_acknowledges_no_marker_and_reads_nothing(
    table: tuple[str, dict[str, Any], str], no_storage_reads: Callable[[], None]
) -> None:
    """Between the commit's read (W8) and its outcome (W9) the instant is undecided on storage:
    without the seal a straggler's marker is acknowledged by a conditional rewrite (no lookup)
    and its data file is a stray the commit does not list. With it: 409 at once, for a new name
    and for a re-sent one, and nothing touches storage."""
    tl, marker_dir, sidecar = started(*table)
    try:
        for i in range(3):  # MARKERS0 created, then rewritten conditionally
            await asyncio.wait_for(
                sidecar.create(marker_dir, f"part-{i}.parquet.marker.CREATE"), 30
            )
        names = await sidecar.seal(marker_dir)
        assert len(names) == 3
        no_storage_reads()
        for name in ("part-straggler.parquet.marker.CREATE", "part-1.parquet.marker.CREATE"):
            with pytest.raises(errors.InstantDecidedError, match="being committed") as refusal:
                await asyncio.wait_for(sidecar.create(marker_dir, name), 30)
            assert refusal.value.instant == marker_dir.instant
        assert await sidecar.seal(marker_dir) == names  # idempotent: a retried commit read
    finally:
        await sidecar.drain(5)
        await sidecar.close()
    assert on_storage(tl, marker_dir) == {f"part-{i}.parquet" for i in range(3)}


async def test_the_seal_refuses_queued_names_and_a_flush_that_ends_after_it(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name still queued at the seal is refused and never written; a flush running at the
    seal may write its names, but answers 409: no marker is acknowledged after the read."""
    root = str(tmp_path / "warehouse")
    url = f"{root}/orders"
    tl, marker_dir, sidecar = started(url, {}, root, flush_mode=config.FlushMode.GROUP_COMMIT)
    entered, release = threading.Event(), threading.Event()
    real_write = batchfiles.write_batch_file

    def gated(*args: Any) -> str | None:
        if b"part-1" in args[3]:  # the flush that runs across the seal
            entered.set()
            assert release.wait(30)
        return real_write(*args)

    monkeypatch.setattr(batchfiles, "write_batch_file", gated)
    try:
        await asyncio.wait_for(sidecar.create(marker_dir, "part-0.parquet.marker.CREATE"), 30)
        running = asyncio.ensure_future(sidecar.create(marker_dir, "part-1.parquet.marker.CREATE"))
        assert await asyncio.to_thread(entered.wait, 30)
        # group-commit: one flush of a directory at a time, so this one waits in the queue
        queued = asyncio.ensure_future(sidecar.create(marker_dir, "part-2.parquet.marker.CREATE"))
        await asyncio.sleep(0.05)
        assert not queued.done()
        assert await sidecar.seal(marker_dir) == ["part-0.parquet.marker.CREATE"]
        with pytest.raises(errors.InstantDecidedError, match="being committed"):
            await asyncio.wait_for(queued, 30)
        release.set()
        with pytest.raises(errors.InstantDecidedError, match="being committed"):
            await asyncio.wait_for(running, 30)
    finally:
        release.set()
        await sidecar.drain(5)
        await sidecar.close()
    assert on_storage(tl, marker_dir) == {"part-0.parquet", "part-1.parquet"}


async def test_a_seal_outlives_the_eviction_of_its_directorys_state(
    tmp_path: Any, no_storage_reads: Callable[[], None]
) -> None:
    """A sealed directory's state may be evicted (``max_cached_dirs``); the seal is kept by key,
    so a straggler that comes later is still refused without a lookup."""
    root = str(tmp_path / "warehouse")
    _tl, marker_dir, sidecar = started(f"{root}/orders", {}, root, max_cached_dirs=1)
    other = validation.validate_marker_dir(
        marker_dir_under(root, "customers"), allowed_roots=(root,)
    )
    try:
        await asyncio.wait_for(sidecar.create(marker_dir, "part-0.parquet.marker.CREATE"), 30)
        await sidecar.seal(marker_dir)
        await asyncio.wait_for(sidecar.create(other, "part-0.parquet.marker.CREATE"), 30)
        assert marker_dir.key not in sidecar._dirs  # evicted
        no_storage_reads()
        with pytest.raises(errors.InstantDecidedError, match="being committed"):
            await asyncio.wait_for(sidecar.create(marker_dir, "part-1.parquet.marker.CREATE"), 30)
    finally:
        await sidecar.drain(5)
        await sidecar.close()


async def test_seal_route_answers_the_markers_then_409(
    aiohttp_client: Callable[..., Any], make_config: Callable[..., config.SidecarConfig], root: str
) -> None:
    client: Client = await aiohttp_client(app.create_app(make_config()))
    directory = marker_dir_under(root)
    body = {"markerdir": directory, "markername": "part-0.parquet"}
    assert (await client.post("/v1/markers/create", json=body, headers=AUTH)).status == 200
    sealed = await client.post("/v1/markers/dir/seal", json={"markerdir": directory}, headers=AUTH)
    assert sealed.status == 200
    assert await sealed.json() == {"markers": ["part-0.parquet.marker.CREATE"]}
    body["markername"] = "part-1.parquet"
    refused = await client.post("/v1/markers/create", json=body, headers=AUTH)
    assert refused.status == 409
    answer = await refused.json()
    assert "being committed" in answer["error"]
    assert answer["instant"] == directory.rsplit("/", 1)[1]
    assert (await client.post("/v1/markers/dir/seal", json={}, headers=AUTH)).status == 400


async def test_a_sealed_directory_is_deleted_after_the_answer_and_before_the_sidecar_stops(
    make_config: Callable[..., config.SidecarConfig], root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """W10 of a sealed directory does not hold the commit: the route answers at once
    (``background``) and the delete runs on; a directory that is not sealed is deleted before
    the answer; the sidecar's stop waits for a delete still running."""
    settings = make_config()
    application = app.create_app(settings)
    server = TestServer(application)
    client: Client = TestClient(server)
    await client.start_server()
    sealed_dir = marker_dir_under(root, table="sealed")
    plain_dir = marker_dir_under(root, table="plain")
    manager, sealed_path = filemanager.resolve(sealed_dir)
    release = asyncio.Event()
    real_delete = application[app.BATCHER_KEY].delete_dir

    async def held_delete(marker_dir: validation.MarkerDir) -> int:
        if marker_dir.path == sealed_path:
            await release.wait()  # the delete is still running when the answer is sent
        return await real_delete(marker_dir)

    monkeypatch.setattr(application[app.BATCHER_KEY], "delete_dir", held_delete)
    try:
        for directory in (sealed_dir, plain_dir):
            body = {"markerdir": directory, "markername": "part-0.parquet"}
            assert (await client.post("/v1/markers/create", json=body, headers=AUTH)).status == 200
        params = {"markerdir": sealed_dir}
        assert (await client.post("/v1/markers/dir/seal", json=params, headers=AUTH)).status == 200
        answer = await client.post("/v1/markers/dir/delete", json=params, headers=AUTH)
        assert answer.status == 200
        assert await answer.json() == {"deleted": None, "background": True}
        assert markers.read_marked_files(manager, sealed_path) == {"part-0.parquet"}
        answer = await client.post(
            "/v1/markers/dir/delete", json={"markerdir": plain_dir}, headers=AUTH
        )
        assert await answer.json() == {"deleted": 2, "background": False}
        assert not filemanager.resolve(plain_dir)[0].exists(plain_dir)
    finally:
        asyncio.get_running_loop().call_later(0.2, release.set)
        await client.close()  # the app's cleanup: drain, then close waits for the delete
    assert not markers.read_marked_files(manager, sealed_path)


async def test_client_seal_and_its_fallback_on_an_older_sidecar(
    aiohttp_server: Callable[..., Any], make_config: Callable[..., config.SidecarConfig], root: str
) -> None:
    """``HttpMarkerClient.seal`` returns the marked data files; a sidecar without the route
    (404) is read through ``all`` instead, with a warning."""
    directory = marker_dir_under(root)
    server: TestServer = await aiohttp_server(app.create_app(make_config()))
    client = HttpMarkerClient(f"http://127.0.0.1:{server.port}", token=TOKEN, deadline_s=10)
    try:
        await asyncio.to_thread(client.create, directory, "p=1/part-0.parquet")
        assert await asyncio.to_thread(client.seal, directory) == {"p=1/part-0.parquet"}
    finally:
        client.close()

    async def all_route(request: web.Request) -> web.Response:
        return web.json_response({"markers": ["part-9.parquet.marker.CREATE"]})

    older = web.Application()
    older.router.add_get("/v1/markers/all", all_route)
    old_server: TestServer = await aiohttp_server(older)
    client = HttpMarkerClient(f"http://127.0.0.1:{old_server.port}", deadline_s=10)
    try:
        assert await asyncio.to_thread(client.seal, directory) == {"part-9.parquet"}
    finally:
        client.close()
    manager, path = filemanager.resolve(directory)
    assert markers.read_marked_files(manager, path) == {"p=1/part-0.parquet"}
