"""The fence without a read per flush: conditional rewrites of the batch files.

The sidecar reads the instant's outcome when it loads a directory, around the creation of a
batch file and after a conditional rewrite lost; a rewrite of a file it wrote or read is
conditional on that version (S3 ``If-Match``, local disk an atomic exchange) and reads nothing.
Each test drives the batcher in-process on local disk and on the S3 test server, counts its
outcome reads, and races a real rollback against it at one chosen point.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from typing import Any

import pytest

from sparkguard.sidecar import batcher, config, errors, metrics, outcomes, validation
from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors as lib_errors
from sparkguard.spark_lib.base import paths
from sparkguard.spark_lib.filemanager import rename
from sparkguard.spark_lib.storage import markers, rollback, timeline

TIMELINE_TYPE = markers.MarkerType.TIMELINE_SERVER_BASED.value


@dataclasses.dataclass
class Store:
    """A table on one store, its instant, and what the batcher needs to reach it."""

    url: str  # the table's URL
    options: dict[str, Any]
    manager: filemanager.FileManager
    tl: timeline.Timeline
    instant: str
    root: str  # the allowed root

    @property
    def marker_url(self) -> str:
        return f"{self.url}/_sparkguard/markers/{self.instant}"

    @property
    def marker_path(self) -> str:
        return markers.marker_dir(self.tl.table, self.instant)

    def protocol(self) -> str:
        return "s3" if self.url.startswith("s3://") else "file"

    def roll_back(self) -> rollback.RollbackSummary:
        return rollback.rollback_table(self.url, job_id="job-1", storage_options=self.options)

    def data(self, name: str) -> str:
        return paths.join(self.tl.table, name)


@pytest.fixture
def store(table: tuple[str, dict[str, Any], str]) -> Store:
    url, options, root = table  # tests/sidecar/conftest.py: local disk or the S3 test server
    tl = timeline.timeline_for(url, storage_options=options)
    instant = tl.start("job-1", attempt=1, marker_type=TIMELINE_TYPE)
    return Store(url, options, tl.manager, tl, instant, root)


@pytest.fixture
def outcome_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every read of an ``.outcome`` the batcher makes (``.inflight`` reads not counted)."""
    reads: list[str] = []
    real = outcomes.is_decided

    def counting(manager: filemanager.FileManager, path: str) -> bool:
        if path.endswith(".outcome"):
            reads.append(path)
        return real(manager, path)

    monkeypatch.setattr(outcomes, "is_decided", counting)
    return reads


class Batcher:
    """An in-process batcher over one store (one batch file unless told otherwise)."""

    def __init__(self, store: Store, manager: Any | None = None, *, batch_threads: int = 1) -> None:
        settings = config.SidecarConfig(
            allowed_roots=(store.root,),
            auth_disabled=True,
            batch_interval_ms=5,
            batch_threads=batch_threads,
        )
        self.store = store
        self.batcher = batcher.MarkerBatcher(
            settings,
            metrics.build_metrics(),
            managers={store.protocol(): manager or store.manager},
        )
        self.dir = validation.validate_marker_dir(store.marker_url, allowed_roots=(store.root,))

    async def __aenter__(self) -> Batcher:
        self.batcher.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.batcher.drain(5)
        await self.batcher.close()

    async def delete_dir(self) -> int:
        return await asyncio.wait_for(self.batcher.delete_dir(self.dir), timeout=30)

    async def create(self, name: str) -> bool:
        return await asyncio.wait_for(
            self.batcher.create(self.dir, markers.marker_name(name)), timeout=30
        )


def on_storage(store: Store) -> set[str]:
    return markers.read_marked_files(store.manager, store.marker_path)


def batch_file(store: Store, index: int = 0) -> str:
    return paths.join(store.marker_path, f"MARKERS{index}")


async def test_rewrites_read_no_outcome_and_a_deleted_file_refuses_the_next_flush(
    store: Store, outcome_reads: list[str]
) -> None:
    async with Batcher(store) as sidecar:
        for i in range(5):  # five flushes, each awaited: five writes of MARKERS0
            assert await sidecar.create(f"part-{i}.parquet")
        # Loading the directory, and before and after creating MARKERS0; no rewrite reads.
        assert len(outcome_reads) == 3
        assert store.manager.versioned_writes
        assert on_storage(store) == {f"part-{i}.parquet" for i in range(5)}
        # A rollback claims the instant, reads MARKERS0, deletes it: between two flushes.
        summary = await asyncio.to_thread(store.roll_back)
        assert summary.markers_deleted == 2  # MARKERS0 and MARKERS.type
        with pytest.raises(errors.InstantDecidedError, match=re.escape(store.instant)):
            await sidecar.create("part-late.parquet")  # its conditional rewrite finds no file
        assert len(outcome_reads) == 4  # read once, after the rewrite lost
        with pytest.raises(errors.InstantDecidedError):
            await sidecar.create("part-later.parquet")
        assert len(outcome_reads) == 4  # decided sticks: no storage call at all
    assert not store.manager.list_files(store.marker_path)  # nothing re-created the directory
    assert "part-late.parquet" not in store.tl.status(store.instant).rolled_back_names


class ClaimDuringRewrite:
    """The store's file manager, but a rollback claims the instant while the next rewrite of
    ``MARKERS0`` is in flight (after the sidecar chose to write it, before it lands)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.armed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store.manager, name)

    @property
    def versioned_writes(self) -> bool:
        return self._store.manager.versioned_writes

    def write_versioned(self, path: str, data: bytes, expected: str | None) -> str:
        if self.armed and expected is not None and paths.basename(path) == "MARKERS0":
            self.armed = False
            assert self._store.tl.claim_rollback(self._store.instant)
        return self._store.manager.write_versioned(path, data, expected)


async def test_a_claim_during_a_rewrite_is_read_by_the_rollback(
    store: Store, outcome_reads: list[str]
) -> None:
    manager = ClaimDuringRewrite(store)
    async with Batcher(store, manager) as sidecar:
        assert await sidecar.create("part-0.parquet")
        manager.armed = True
        # Acknowledged without a check: it landed on a file the claim's rollback will read.
        assert await sidecar.create("part-1.parquet")
        assert not manager.armed
        reads = len(outcome_reads)
        store.manager.write_bytes(store.data("part-1.parquet"), b"data")  # the task goes on
        summary = await asyncio.to_thread(store.roll_back)  # resumes the claimed instant
        assert summary.files_deleted == 1
        with pytest.raises(errors.InstantDecidedError):
            await sidecar.create("part-2.parquet")
        assert len(outcome_reads) == reads + 1
    status = store.tl.status(store.instant)
    assert status.state is timeline.State.ROLLED_BACK
    assert {"part-0.parquet", "part-1.parquet"} <= set(status.rolled_back_names)
    assert not store.manager.exists(store.data("part-1.parquet"))
    assert not store.manager.list_files(store.marker_path)


async def test_a_rewrite_between_the_rollbacks_read_and_delete_is_read_before_the_delete(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R4 read MARKERS0; the sidecar appends to it (acknowledged, no check) and its task writes
    the file; R7 finds the version changed, records and deletes the new file, then deletes that
    version; the sidecar's next rewrite fails and is refused."""
    loop = asyncio.get_running_loop()
    async with Batcher(store) as sidecar:
        assert await sidecar.create("part-0.parquet")
        real_delete = rollback._delete
        acked: list[bool] = []

        def delete_then_sidecar_appends(*args: Any, **kwargs: Any) -> Any:
            monkeypatch.setattr(rollback, "_delete", real_delete)
            result = real_delete(*args, **kwargs)  # R5, after R4 read MARKERS0
            acked.append(
                asyncio.run_coroutine_threadsafe(sidecar.create("part-1.parquet"), loop).result()
            )
            store.manager.write_bytes(store.data("part-1.parquet"), b"late")
            return result

        monkeypatch.setattr(rollback, "_delete", delete_then_sidecar_appends)
        await asyncio.to_thread(store.roll_back)
        assert acked == [True]
        with pytest.raises(errors.InstantDecidedError):
            await sidecar.create("part-2.parquet")
    assert "part-1.parquet" in store.tl.status(store.instant).rolled_back_names
    assert not store.manager.exists(store.data("part-1.parquet"))
    assert not store.manager.list_files(store.marker_path)


async def test_a_delete_after_a_claim_leaves_the_unchecked_file_for_the_next_pass(
    store: Store,
) -> None:
    """The JVM's abort claims, reads the markers, deletes their files, then has the sidecar
    delete the directory. A marker acknowledged by a conditional rewrite after that read is in
    no record: its file stays, and the next rollback pass reads it and deletes its data file."""
    async with Batcher(store) as sidecar:
        assert await sidecar.create("part-0.parquet")
        assert store.tl.claim_rollback(store.instant)
        read = on_storage(store)  # the abort's read, after its claim
        assert await sidecar.create("part-1.parquet")  # a rewrite: acknowledged, unchecked
        store.manager.write_bytes(store.data("part-1.parquet"), b"zombie")
        await sidecar.delete_dir()
        assert read == {"part-0.parquet"}
        assert on_storage(store) == {"part-0.parquet", "part-1.parquet"}  # MARKERS0 kept
        with pytest.raises(errors.InstantDecidedError):
            await sidecar.create("part-2.parquet")
    store.roll_back()
    assert not store.manager.exists(store.data("part-1.parquet"))
    assert "part-1.parquet" in store.tl.status(store.instant).rolled_back_names
    assert not store.manager.list_files(store.marker_path)


async def test_a_committed_or_checked_directory_is_deleted_whole(store: Store) -> None:
    async with Batcher(store) as sidecar:
        assert await sidecar.create("part-0.parquet")
        assert await sidecar.create("part-1.parquet")  # unchecked
        store.tl.commit(store.instant, [])
        await sidecar.delete_dir()  # W10: the commit read its markers before it decided
        assert not store.manager.list_files(store.marker_path)
    other = store.tl.start("job-2", attempt=1, marker_type=TIMELINE_TYPE)
    store.instant = other
    async with Batcher(store) as sidecar:
        assert await sidecar.create("part-0.parquet")
        assert await sidecar.create("part-1.parquet")  # unchecked ...
        assert not await sidecar.create("part-1.parquet")  # ... until this check
        assert store.tl.claim_rollback(other)
        await sidecar.delete_dir()  # everything acknowledged predates the claim
        assert not store.manager.list_files(store.marker_path)


async def test_a_restarted_sidecar_resumes_a_directory_with_conditional_rewrites(
    store: Store, outcome_reads: list[str]
) -> None:
    async with Batcher(store) as first:
        assert await first.create("part-0.parquet")
        assert await first.create("part-1.parquet")
    outcome_reads.clear()
    async with Batcher(store) as second:
        assert not await second.create("part-0.parquet")  # known: acknowledged, not written
        assert await second.create("part-2.parquet")  # a rewrite of the version it loaded
        assert len(outcome_reads) == 2  # loading; the re-sent name's check before its 200
        # Another writer replaces MARKERS0 meanwhile: the rewrite loses, re-reads, retries.
        content = store.manager.read_bytes(batch_file(store))
        extra = markers.render_batch_file([markers.marker_name("part-x.parquet")])
        store.manager.write_bytes(batch_file(store), content + extra, overwrite=True)
        assert await second.create("part-3.parquet")
        assert len(outcome_reads) == 3
        assert await second.create("part-4.parquet")
        assert len(outcome_reads) == 3
    assert on_storage(store) == {f"part-{i}.parquet" for i in (0, 1, 2, 3, 4)} | {"part-x.parquet"}
    # A third sidecar after a rollback: refused at load, nothing written.
    summary = store.roll_back()
    assert summary.instants_rolled_back
    async with Batcher(store) as third:
        with pytest.raises(errors.InstantDecidedError):
            await third.create("part-5.parquet")
    assert not store.manager.list_files(store.marker_path)


async def test_a_file_removed_without_a_decision_is_recreated_with_its_names(
    store: Store, outcome_reads: list[str]
) -> None:
    """Someone deletes MARKERS0 although the instant is undecided: the lost rewrite re-reads,
    finds the outcome absent, and creates the file again with every name it had acknowledged
    (checked before and after, as any new file)."""
    async with Batcher(store) as sidecar:
        assert await sidecar.create("part-0.parquet")
        store.manager.delete(batch_file(store))
        assert await sidecar.create("part-1.parquet")
        assert len(outcome_reads) == 3 + 3  # the lost rewrite's check, then the new file's two
    assert on_storage(store) == {"part-0.parquet", "part-1.parquet"}


def test_stores_without_conditional_rewrites_read_the_outcome_around_every_flush(
    store: Store, outcome_reads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Local disk without RENAME_EXCHANGE, or an S3-like store that ignores If-Match (the first
    versioned write proves it): the flushes fall back to the outcome read before and after."""
    if store.protocol() == "file":

        def no_exchange(src: str, dst: str) -> None:
            raise lib_errors.UnsupportedStoreError("no RENAME_EXCHANGE here")

        monkeypatch.setattr(rename, "rename_exchange", no_exchange)
    else:
        fs = store.manager.fs
        real_call = fs.call_s3

        def ignores_if_match(method: str, *args: Any, **kwargs: Any) -> Any:
            if method == "put_object":
                kwargs.pop("IfMatch", None)  # as a store that does not know the header
            return real_call(method, *args, **kwargs)

        monkeypatch.setattr(fs, "call_s3", ignores_if_match)

    async def run() -> None:
        async with Batcher(store) as sidecar:
            for i in range(4):
                assert await sidecar.create(f"part-{i}.parquet")

    asyncio.run(run())
    assert not store.manager.versioned_writes
    # Loading (1), then two per flush once the store showed it has no conditional rewrite.
    assert len(outcome_reads) >= 1 + 2 * 3
    assert on_storage(store) == {f"part-{i}.parquet" for i in range(4)}
