"""Routes, parameters, auth and validation, through create_app + aiohttp_client."""

from __future__ import annotations

import asyncio
import os
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from sparkguard.sidecar import app, config
from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.storage import markers
from tests.sidecar.conftest import AUTH, INSTANT, marker_dir_under

Client = TestClient[Any, Any]


def files_in(directory: str) -> dict[str, bytes]:
    return {name: Path(directory, name).read_bytes() for name in sorted(os.listdir(directory))}


def write_corrupt(directory: str, content: bytes) -> None:
    os.makedirs(directory)
    Path(directory, "MARKERS0").write_bytes(content)


def exists(path: str) -> bool:
    return os.path.exists(path)


def marked(directory: str) -> set[str]:
    manager, path = filemanager.resolve(directory)
    return markers.read_marked_files(manager, path)


async def until_pending(client: Client, count: int) -> None:
    """Wait (bounded) until ``count`` markers wait in the app's batcher: the explicit signal that
    the requests sent so far were received and queued."""
    batcher = client.server.app[app.BATCHER_KEY]
    for _ in range(10_000):
        if batcher.pending == count:
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"{batcher.pending} markers pending, expected {count}")


async def create(client: Client, directory: str, name: str, route: str = "create") -> Any:
    response = await client.post(
        f"/v1/markers/{route}", json={"markerdir": directory, "markername": name}, headers=AUTH
    )
    assert response.status == 200, await response.text()
    return await response.json()


async def test_create_all_exists_delete(client: Client, root: str) -> None:
    directory = marker_dir_under(root)
    answer = await client.get(
        "/v1/markers/dir/exists", params={"markerdir": directory}, headers=AUTH
    )
    assert (await answer.json()) == {"exists": False}

    assert (await create(client, directory, "p=1/part-00000-job-1-c000.parquet")) == {
        "markername": "p=1/part-00000-job-1-c000.parquet.marker.CREATE",
        "created": True,
    }
    await create(client, directory, "part-00001-job-1-c000.parquet", "create-and-merge")
    await create(client, directory, "part-00002-job-1-c000.parquet.marker.APPEND", "append")
    # The generic route takes any IO type in a full name, like Hudi's.
    await create(client, directory, "part-00003-job-1-c000.parquet.marker.MERGE")

    answer = await client.get("/v1/markers/all", params={"markerdir": directory}, headers=AUTH)
    assert (await answer.json())["markers"] == [
        "p=1/part-00000-job-1-c000.parquet.marker.CREATE",
        "part-00001-job-1-c000.parquet.marker.MERGE",
        "part-00002-job-1-c000.parquet.marker.APPEND",
        "part-00003-job-1-c000.parquet.marker.MERGE",
    ]
    on_disk = files_in(directory)
    assert on_disk["MARKERS.type"] == b"TIMELINE_SERVER_BASED"
    assert set(on_disk) >= {"MARKERS.type", "MARKERS0"}
    assert marked(directory) == {
        "p=1/part-00000-job-1-c000.parquet",
        "part-00001-job-1-c000.parquet",
        "part-00002-job-1-c000.parquet",
        "part-00003-job-1-c000.parquet",
    }
    answer = await client.get(
        "/v1/markers/dir/exists", params={"markerdir": directory}, headers=AUTH
    )
    assert (await answer.json()) == {"exists": True}

    answer = await client.post(
        "/v1/markers/dir/delete", data={"markerdir": directory}, headers=AUTH
    )
    assert answer.status == 200
    assert (await answer.json())["deleted"] >= 2
    assert not exists(directory)
    answer = await client.get("/v1/markers/all", params={"markerdir": directory}, headers=AUTH)
    assert (await answer.json())["markers"] == []
    # Deleting again is fine (idempotent), and the directory can be used again afterwards.
    answer = await client.post(
        "/v1/markers/dir/delete", data={"markerdir": directory}, headers=AUTH
    )
    assert answer.status == 200
    await create(client, directory, "part-00009-job-1-c000.parquet")
    assert marked(directory) == {"part-00009-job-1-c000.parquet"}


async def test_parameters_in_query_form_or_json(client: Client, root: str) -> None:
    directory = marker_dir_under(root)
    response = await client.post(
        "/v1/markers/create",
        params={"markerdir": directory, "markername": "a.parquet"},
        headers=AUTH,
    )
    assert response.status == 200
    response = await client.post(
        "/v1/markers/create", data={"markerdir": directory, "markername": "b.parquet"}, headers=AUTH
    )
    assert response.status == 200
    response = await client.post(
        "/v1/markers/create",
        params={"markerdir": directory},
        json={"markername": "c.parquet"},
        headers=AUTH,
    )
    assert response.status == 200
    assert marked(directory) == {"a.parquet", "b.parquet", "c.parquet"}


async def test_duplicates_are_written_once(client: Client, root: str) -> None:
    directory = marker_dir_under(root)
    names = [f"part-{i % 7:05d}.parquet" for i in range(60)]
    await asyncio.gather(*(create(client, directory, name) for name in names))
    await create(client, directory, "part-00000.parquet")
    lines = [
        line
        for name, content in files_in(directory).items()
        if name.startswith("MARKERS") and name != "MARKERS.type"
        for line in content.decode().splitlines()
    ]
    assert sorted(lines) == sorted({f"{n}.marker.CREATE" for n in names})


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({}, "missing bearer token"),
        ({"Authorization": "Bearer wrong"}, "wrong bearer token"),
        ({"Authorization": "Basic czNjcjN0"}, "missing bearer token"),
    ],
)
async def test_auth_required(
    client: Client, root: str, headers: dict[str, str], message: str
) -> None:
    directory = marker_dir_under(root)
    response = await client.post(
        "/v1/markers/create", json={"markerdir": directory, "markername": "a"}, headers=headers
    )
    assert response.status == 401
    assert message in (await response.json())["error"]
    assert not exists(directory)
    # Operational routes stay open.
    for path in ("/healthz", "/readyz", "/metrics"):
        assert (await client.get(path)).status == 200


@pytest.mark.parametrize(
    ("params", "status", "message"),
    [
        ({"markername": "a"}, 400, "markerdir is missing"),
        ({"markerdir": "{dir}"}, 400, "markername is missing"),
        ({"markerdir": "{dir}", "markername": "../escape"}, 400, "'..'"),
        ({"markerdir": "{dir}", "markername": "a/../../b"}, 400, "'..'"),
        ({"markerdir": "{dir}", "markername": "/etc/passwd"}, 400, "absolute"),
        ({"markerdir": "{dir}", "markername": "a//b"}, 400, "non-empty"),
        ({"markerdir": "{dir}", "markername": "a\nb"}, 400, "control character"),
        ({"markerdir": "{dir}", "markername": "x" * 300}, 400, "limit is 255"),
        ({"markerdir": "{dir}", "markername": "a/" * 600}, 400, "limit is"),
        ({"markerdir": "{root}/t/_sparkguard/markers/../../x", "markername": "a"}, 400, "'..'"),
        (
            {"markerdir": "{root}/t/_sparkguard/markers/not-an-instant", "markername": "a"},
            400,
            "not an instant id",
        ),
        ({"markerdir": "{root}/t/data", "markername": "a"}, 400, "not a marker directory"),
        (
            {"markerdir": "relative/_sparkguard/markers/" + INSTANT, "markername": "a"},
            400,
            "relative path",
        ),
        (
            {"markerdir": "/elsewhere/t/_sparkguard/markers/" + INSTANT, "markername": "a"},
            403,
            "outside the sidecar's allowed roots",
        ),
        (
            {"markerdir": "{root}x/t/_sparkguard/markers/" + INSTANT, "markername": "a"},
            403,
            "outside",
        ),
        ({"markerdir": "{dir}", "markername": "a", "other": "1"}, 400, "unknown parameter"),
    ],
)
async def test_bad_parameters_are_refused(
    client: Client, root: str, params: dict[str, str], status: int, message: str
) -> None:
    directory = marker_dir_under(root)
    body = {k: v.format(dir=directory, root=root) for k, v in params.items()}
    response = await client.post("/v1/markers/create", json=body, headers=AUTH)
    assert response.status == status
    answer = await response.json()
    assert message in answer["error"], answer
    assert not exists(f"{root}/t")


async def test_io_type_must_match_route(client: Client, root: str) -> None:
    directory = marker_dir_under(root)
    response = await client.post(
        "/v1/markers/append",
        json={"markerdir": directory, "markername": "a.parquet.marker.CREATE"},
        headers=AUTH,
    )
    assert response.status == 400
    assert "IO type CREATE" in (await response.json())["error"]


async def test_oversize_and_malformed_bodies(client: Client, root: str) -> None:
    directory = marker_dir_under(root)
    response = await client.post(
        "/v1/markers/create",
        json={"markerdir": directory, "markername": "a" * 100_000},
        headers=AUTH,
    )
    assert response.status == 413
    assert "larger than" in (await response.json())["error"]
    response = await client.post(
        "/v1/markers/create",
        data=b"{not json",
        headers={**AUTH, "Content-Type": "application/json"},
    )
    assert response.status == 400
    response = await client.post(
        "/v1/markers/create", data=b"x", headers={**AUTH, "Content-Type": "text/plain"}
    )
    assert response.status == 400
    assert "unsupported body type" in (await response.json())["error"]
    response = await client.post(
        "/v1/markers/create",
        params={"markerdir": directory, "markername": "a"},
        json={"markername": "b"},
        headers=AUTH,
    )
    assert response.status == 400
    assert "twice" in (await response.json())["error"]


#: every route taking markerdir/markername, with its method and what it takes besides markerdir
MARKER_ROUTES = [
    ("POST", "create", True),
    ("POST", "create-and-merge", True),
    ("POST", "append", True),
    ("GET", "all", False),
    ("GET", "dir/exists", False),
    ("POST", "dir/delete", False),
]
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def bad_escape_cases(directory: str) -> list[tuple[str, str, str, str]]:
    """(method, route, query-or-form string, the parameter it names) for every marker route: an
    escape of a byte that is not UTF-8 (%FF, %FE would both decode to U+FFFD)."""
    quoted_dir = urllib.parse.quote(directory, safe="/")
    table, _, instant_dir = quoted_dir.partition("/_sparkguard/")
    bad_dir = f"{table}%FF/_sparkguard/{instant_dir}"  # a table named t<0xFF>: no marker dir
    cases = []
    for method, route, takes_name in MARKER_ROUTES:
        name = "&markername=a.parquet" if takes_name else ""
        cases.append((method, route, f"markerdir={bad_dir}{name}", "markerdir"))
        if takes_name:
            cases.append(
                (method, route, f"markerdir={quoted_dir}&markername=%FFx.parquet", "markername")
            )
            cases.append(
                (method, route, f"markerdir={quoted_dir}&markername=a%C3%28.parquet", "markername")
            )
    return cases


async def test_percent_escapes_that_are_not_utf8_are_refused(client: Client, root: str) -> None:
    """%FF and %FE would both be read as U+FFFD: the marker would name another file than the
    one the client writes, and two different files would share it. Query string and form body,
    on every marker route."""
    directory = marker_dir_under(root)
    cases = bad_escape_cases(directory)
    for method, route, encoded, parameter in cases:
        where = [("query string", {"path": f"/v1/markers/{route}?{encoded}"})]
        if method == "POST":
            where.append(("form body", {"path": f"/v1/markers/{route}", "data": encoded}))
        for place, request in where:
            headers = {**AUTH, **FORM} if "data" in request else AUTH
            response = await client.request(method, request.pop("path"), headers=headers, **request)
            answer = await response.json()
            assert response.status == 400, (method, route, place, answer)
            message = answer["error"]
            assert f"parameter {parameter!r} in the {place}" in message, message
            assert "not UTF-8" in message, message
            assert "send UTF-8 percent-encoding" in message, message
    # Nothing but the instant's .inflight (written by marker_dir_under): no marker directory.
    assert os.listdir(root) == ["table"]
    assert os.listdir(os.path.join(root, "table")) == ["_sparkguard"]
    assert os.listdir(os.path.join(root, "table", "_sparkguard")) == ["timeline"]
    # Escapes of UTF-8 bytes are fine, in either place.
    quoted_dir = urllib.parse.quote(directory, safe="/")
    response = await client.post(
        f"/v1/markers/create?markerdir={quoted_dir}&markername=%C3%A9.parquet", headers=AUTH
    )
    assert response.status == 200, await response.text()
    response = await client.post(
        "/v1/markers/create",
        data=f"markerdir={quoted_dir}&markername=%C3%A8.parquet",
        headers={**AUTH, **FORM},
    )
    assert response.status == 200, await response.text()
    assert marked(directory) == {"\u00e9.parquet", "\u00e8.parquet"}


@pytest.mark.parametrize(
    ("body", "content_type", "key"),
    [
        (
            '{{"markerdir": "{dir}", "markername": "a", "markername": "b"}}',
            "application/json",
            "markername",
        ),
        (
            '{{"markerdir": "{dir}", "markerdir": "{dir}x", "markername": "a"}}',
            "application/json",
            "markerdir",
        ),
        ("markerdir={dir}&markername=a&markername=b", FORM["Content-Type"], "markername"),
    ],
    ids=["json markername", "json markerdir", "form markername"],
)
async def test_a_body_naming_a_parameter_twice_is_refused(
    client: Client, root: str, body: str, content_type: str, key: str
) -> None:
    """Not "the last one wins": the same message as a parameter in both query and body."""
    directory = marker_dir_under(root)
    response = await client.post(
        "/v1/markers/create",
        data=body.format(dir=directory).encode(),
        headers={**AUTH, "Content-Type": content_type},
    )
    assert response.status == 400
    assert (await response.json())["error"] == (
        f"parameter {key!r} is given twice with different values"
    )
    assert not exists(directory)
    # The same value twice is no conflict, as in the query string.
    same = f'{{"markerdir": "{directory}", "markername": "a", "markername": "a"}}'
    response = await client.post(
        "/v1/markers/create",
        data=same.encode(),
        headers={**AUTH, "Content-Type": "application/json"},
    )
    assert response.status == 200, await response.text()


async def test_bad_clients_do_not_disturb_good_ones(client: Client, root: str) -> None:
    directory = marker_dir_under(root)

    async def attacker(i: int) -> int:
        bodies = [
            {"markerdir": directory, "markername": f"../../etc/x{i}"},
            {"markerdir": directory, "markername": f"/abs/{i}"},
            {"markerdir": directory, "markername": "a" * 100_000},
            {"markerdir": "/etc/_sparkguard/markers/" + INSTANT, "markername": f"x{i}"},
        ]
        response = await client.post("/v1/markers/create", json=bodies[i % 4], headers=AUTH)
        return response.status

    async def good(i: int) -> int:
        response = await client.post(
            "/v1/markers/create",
            json={"markerdir": directory, "markername": f"part-{i:05d}.parquet"},
            headers=AUTH,
        )
        return response.status

    results = await asyncio.gather(*(f(i) for i in range(40) for f in (attacker, good)))
    bad, ok = results[0::2], results[1::2]
    assert all(400 <= status < 500 for status in bad), bad
    assert ok == [200] * 40
    assert marked(directory) == {f"part-{i:05d}.parquet" for i in range(40)}


async def test_metrics_count_routes_and_markers(client: Client, root: str) -> None:
    directory = marker_dir_under(root)
    await create(client, directory, "a.parquet")
    await create(client, directory, "a.parquet")
    await client.post("/v1/markers/create", json={"markerdir": directory})
    text = await (await client.get("/metrics")).text()
    assert 'sparkguard_sidecar_requests_total{route="create",status="200"} 2.0' in text
    assert 'sparkguard_sidecar_requests_total{route="create",status="401"} 1.0' in text
    assert 'sparkguard_sidecar_markers_acknowledged_total{how="written"} 1.0' in text
    assert 'sparkguard_sidecar_markers_acknowledged_total{how="known"} 1.0' in text
    assert "sparkguard_sidecar_flush_duration_seconds_count 1.0" in text
    assert "sparkguard_sidecar_flush_batch_size_count 1.0" in text
    assert "sparkguard_sidecar_pending_markers 0.0" in text


@pytest.mark.parametrize("mode", list(config.FlushMode))
async def test_flush_modes_batch_and_persist(
    aiohttp_client: Callable[..., Any],
    make_config: Callable[..., config.SidecarConfig],
    root: str,
    mode: config.FlushMode,
) -> None:
    settings = make_config(flush_mode=mode, batch_threads=4, batch_interval_ms=20)
    client: Client = await aiohttp_client(app.create_app(settings))
    directory = marker_dir_under(root)
    names = [f"p={i % 3}/part-{i:05d}.parquet" for i in range(400)]
    await asyncio.gather(*(create(client, directory, name) for name in names))
    # Every acknowledged marker is on storage, each exactly once, in at most batch_threads files.
    contents = files_in(directory)
    batch_files = [n for n in contents if n != "MARKERS.type"]
    assert set(batch_files) <= {f"MARKERS{i}" for i in range(4)}
    lines = [line for n in batch_files for line in contents[n].decode().splitlines()]
    assert sorted(lines) == sorted(f"{n}.marker.CREATE" for n in names)
    text = await (await client.get("/metrics")).text()
    flushes = float(text.split("sparkguard_sidecar_flush_batch_size_count ")[1].split()[0])
    assert flushes < len(names) / 4, "requests were not batched"

    # A second round appends to the same files, keeping the first round.
    more = [f"late-{i}.parquet" for i in range(50)]
    await asyncio.gather(*(create(client, directory, name) for name in more))
    assert marked(directory) == {*names, *more}


async def test_restarted_sidecar_knows_every_marker(
    aiohttp_client: Callable[..., Any], make_config: Callable[..., config.SidecarConfig], root: str
) -> None:
    directory = marker_dir_under(root)
    first: Client = await aiohttp_client(app.create_app(make_config(batch_threads=3)))
    for i in range(10):  # several flushes: several batch files
        await create(first, directory, f"a{i}.parquet")
    await first.close()
    before = files_in(directory)

    second: Client = await aiohttp_client(app.create_app(make_config(batch_threads=3)))
    # Re-creating an acknowledged marker is acknowledged without a new write.
    assert (await create(second, directory, "a3.parquet"))["created"] is False
    assert files_in(directory) == before
    answer = await second.get("/v1/markers/all", params={"markerdir": directory}, headers=AUTH)
    assert len((await answer.json())["markers"]) == 10
    # New markers are appended to the files the first sidecar wrote, never replacing them.
    for i in range(10):
        await create(second, directory, f"b{i}.parquet")
    assert marked(directory) == {f"{p}{i}.parquet" for p in "ab" for i in range(10)}


async def test_file_url_and_path_share_state(client: Client, root: str) -> None:
    directory = marker_dir_under(root)
    await asyncio.gather(
        create(client, directory, "a.parquet"),
        create(client, "file://" + directory, "b.parquet"),
        create(client, directory + "/", "c.parquet"),
    )
    assert marked(directory) == {"a.parquet", "b.parquet", "c.parquet"}


async def test_queue_full_answers_503_with_retry_after(
    aiohttp_client: Callable[..., Any], make_config: Callable[..., config.SidecarConfig], root: str
) -> None:
    settings = make_config(max_pending=5, batch_interval_ms=60_000)  # nothing flushes for 1 min
    client: Client = await aiohttp_client(app.create_app(settings))
    directory = marker_dir_under(root)
    waiting = [
        asyncio.ensure_future(
            client.post(
                "/v1/markers/create",
                json={"markerdir": directory, "markername": f"w{i}"},
                headers=AUTH,
            )
        )
        for i in range(5)
    ]
    await until_pending(client, 5)  # all five are queued in the batcher
    # The gauge is read at the scrape (not set per request): it shows them.
    assert "sparkguard_sidecar_pending_markers 5.0" in await (await client.get("/metrics")).text()
    response = await client.post(
        "/v1/markers/create",
        json={"markerdir": directory, "markername": "one-too-many"},
        headers=AUTH,
    )
    assert response.status == 503
    assert response.headers["Retry-After"] == "60"
    assert "SPARKGUARD_SIDECAR_MAX_PENDING" in (await response.json())["error"]
    # Shutting the app down writes the waiting markers before answering them (none dropped).
    await client.server.app.shutdown()
    statuses = [(await w).status for w in waiting]
    assert statuses == [200] * 5
    assert marked(directory) == {f"w{i}" for i in range(5)}


async def test_shutdown_fails_what_it_cannot_write(
    aiohttp_client: Callable[..., Any],
    make_config: Callable[..., config.SidecarConfig],
    root: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sparkguard.sidecar import batchfiles

    def broken(*args: object) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(batchfiles, "write_batch_file", broken)
    settings = make_config(batch_interval_ms=60_000, shutdown_timeout_s=1.0)
    client: Client = await aiohttp_client(app.create_app(settings))
    directory = marker_dir_under(root)
    waiting = asyncio.ensure_future(
        client.post(
            "/v1/markers/create", json={"markerdir": directory, "markername": "a"}, headers=AUTH
        )
    )
    await until_pending(client, 1)  # queued in the batcher, not yet written
    await client.server.app.shutdown()
    response = await waiting
    assert response.status == 503
    assert "disk on fire" in (await response.json())["error"]
    assert (await client.get("/readyz")).status == 503


async def test_storage_failure_is_503_and_nothing_acknowledged(
    aiohttp_client: Callable[..., Any],
    make_config: Callable[..., config.SidecarConfig],
    root: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sparkguard.sidecar import batchfiles

    real = batchfiles.write_batch_file
    failures = [1]

    def flaky(*args: Any) -> None:
        if failures:
            failures.pop()
            raise OSError("throttled")
        real(*args)

    monkeypatch.setattr(batchfiles, "write_batch_file", flaky)
    client: Client = await aiohttp_client(app.create_app(make_config()))
    directory = marker_dir_under(root)
    response = await client.post(
        "/v1/markers/create", json={"markerdir": directory, "markername": "a"}, headers=AUTH
    )
    assert response.status == 503
    assert "throttled" in (await response.json())["error"]
    assert marked(directory) == set()
    await create(client, directory, "a")  # the retry succeeds
    assert marked(directory) == {"a"}


async def test_corrupt_marker_dir_is_refused(client: Client, root: str) -> None:
    directory = marker_dir_under(root)
    corrupt = b"not a marker name\n"
    write_corrupt(directory, corrupt)
    response = await client.post(
        "/v1/markers/create", json={"markerdir": directory, "markername": "a"}, headers=AUTH
    )
    assert response.status == 500
    assert "cannot be read" in (await response.json())["error"]
    assert files_in(directory) == {"MARKERS0": corrupt}
