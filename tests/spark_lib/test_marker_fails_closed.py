"""The marker path fails closed: a task whose marker the sidecar did not acknowledge writes no
data file. Each way a sidecar fails is tried against the writer's own task code (no Spark):
it answers 500 or 503, resets the connection, accepts and never answers (a timeout), or nothing
listens (unreachable, or restarted and not back yet). The task raises a marker error naming
the sidecar, and the table holds no data file; the rollback then finds nothing to delete.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors
from sparkguard.spark_lib.spark import marker_http
from sparkguard.spark_lib.storage import rollback
from tests.spark_lib.spark_conftest import data_files_on_storage
from tests.spark_lib.test_rollback import PARTS, _start, _task
from tests.support.bad_endpoint import misbehaving_endpoint

KINDS = ["500", "503", "reset", "silent", "unreachable"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_marker_not_acknowledged_fails_the_task_before_its_data_file(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The executors' client, with a 1.5 s deadline instead of a minute (same code path).
    monkeypatch.setattr(
        marker_http,
        "HttpMarkerClient",
        functools.partial(marker_http.HttpMarkerClient, deadline_s=1.5, request_timeout_s=0.4),
    )
    url, journal = str(tmp_path / "t"), str(tmp_path / "journal")
    with misbehaving_endpoint(kind) as endpoint:
        w = _start(
            url, journal, {}, f"closed-{kind}", markerType="TIMELINE_SERVER_BASED",
            markerEndpoint=endpoint,
        )  # fmt: skip
        with pytest.raises(errors.MarkerError, match=r"127\.0\.0\.1") as caught:
            _task(w, 0, PARTS[0])
    assert data_files_on_storage(url) == set(), kind  # nothing written without its marker
    retried = kind != "500"  # 500 is not a transient answer: refused at once
    assert isinstance(caught.value, errors.MarkerServiceUnavailableError) is retried, caught.value
    summary = rollback.rollback_job(f"closed-{kind}", journal)
    assert summary.files_deleted == 0
    manager, base = filemanager.resolve(url)
    assert not manager.exists(base) or data_files_on_storage(url) == set()
