"""The operator's own API requests end: a connection that never answers fails the request
(within :data:`kube.REQUEST_TIMEOUT`) instead of holding a thread, and the recovery on it, for ever.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import urllib3
from kubernetes import client

from sparkguard.operator import kube
from tests.operator.apps import spark_app
from tests.support.bad_endpoint import misbehaving_endpoint


@pytest.fixture
def silent_apiserver() -> Iterator[str]:
    """An address that accepts connections and reads requests, and never answers one."""
    with misbehaving_endpoint("silent") as endpoint:
        yield endpoint


def _client(host: str) -> kube.KubeClient:
    configuration = client.Configuration()
    configuration.host = host
    configuration.retries = False  # the operator's own retry is the next reconcile step
    return kube.KubeClient(client.ApiClient(configuration), request_timeout=(1.0, 0.5))


@pytest.mark.parametrize("request_kind", ["get", "patch", "event", "lease"])
async def test_a_request_the_api_server_never_answers_fails_instead_of_hanging(
    silent_apiserver: str, request_kind: str
) -> None:
    api = _client(silent_apiserver)
    app = spark_app("quiet")
    app["metadata"]["uid"] = "uid-quiet"
    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "get": lambda: api.get_app("default", "quiet"),
        "patch": lambda: api.patch_app(
            "default", "quiet", {"metadata": {}}, uid="uid-quiet", resource_version="1"
        ),
        "event": lambda: api.post_event(app, type="Normal", reason="Resubmitted", message="m"),
        "lease": lambda: api.get_lease("default", "sparkguard"),
    }
    # The outer bound only keeps a regression from hanging the suite; the request's own
    # timeout (half a second) is what ends it.
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        await asyncio.wait_for(calls[request_kind](), timeout=60)
