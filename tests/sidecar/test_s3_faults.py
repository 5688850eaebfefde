"""The sidecar's background delete (W10 of a sealed marker directory) under a flaky S3
(``tests/support/s3faults.py``): a burst of 503 SlowDown on its LISTs and DELETEs is ridden
through by botocore's retries, and the directory is gone; an outage that outlasts the retries
leaves the directory (a warning says so) for the next rollback pass, as a driver killed
before W10 does."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from sparkguard.sidecar import app, config
from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.storage import markers
from tests.sidecar.conftest import AUTH, TOKEN, marker_dir_under
from tests.support.s3faults import Fault, Op, S3FaultFront

pytestmark = pytest.mark.s3


async def _seal_and_delete(
    settings: config.SidecarConfig, directory: str, front: S3FaultFront, *, outage_s: float
) -> None:
    """Mark a file, seal the directory (the commit's read), ask for its delete (answered at
    once, run in the background) while the front fails every LIST and DELETE; stopping the app
    waits for the delete."""
    client: TestClient[Any, Any] = TestClient(TestServer(app.create_app(settings)))
    await client.start_server()
    try:
        body = {"markerdir": directory, "markername": "part-0.parquet"}
        assert (await client.post("/v1/markers/create", json=body, headers=AUTH)).status == 200
        params = {"markerdir": directory}
        assert (await client.post("/v1/markers/dir/seal", json=params, headers=AUTH)).status == 200
        for op in (Op.LIST, Op.DELETE):
            front.burst(op, Fault.SLOWDOWN, outage_s)
        answer = await client.post("/v1/markers/dir/delete", json=params, headers=AUTH)
        assert await answer.json() == {"deleted": None, "background": True}
    finally:
        await client.close()


@pytest.mark.parametrize(
    "outage", ["burst", pytest.param("longer-than-the-retries", marks=pytest.mark.slow)]
)
async def test_background_delete_under_s3_faults(
    s3_faults: S3FaultFront, s3_bucket: str, outage: str, caplog: pytest.LogCaptureFixture
) -> None:
    options: dict[str, Any] = s3_faults.storage_options
    outage_s = 1.0
    if outage != "burst":
        outage_s = 600.0
        options = {**options, "config_kwargs": {"retries": {"total_max_attempts": 2}}}
    settings = config.SidecarConfig(
        allowed_roots=(s3_bucket,), token=TOKEN, batch_interval_ms=5, storage_options=options
    )
    directory = marker_dir_under(s3_bucket, storage_options=s3_faults.storage_options)
    manager, path = filemanager.resolve(directory, storage_options=s3_faults.storage_options)
    with caplog.at_level(logging.WARNING, logger="sparkguard.sidecar"):
        await _seal_and_delete(settings, directory, s3_faults, outage_s=outage_s)
    with s3_faults.off():
        left = markers.read_marked_files(manager, path)
    faults = (
        s3_faults.injected[(Op.LIST, Fault.SLOWDOWN)]
        + s3_faults.injected[(Op.DELETE, Fault.SLOWDOWN)]
    )
    assert faults > 0, s3_faults.report()
    if outage == "burst":
        assert left == set()
        assert "could not delete the sealed marker directory" not in caplog.text
    else:
        assert left == {"part-0.parquet"}  # stays for the next rollback pass
        assert "could not delete the sealed marker directory" in caplog.text
