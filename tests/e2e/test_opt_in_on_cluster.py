"""Opting in an app that already runs, on the cluster with upstream's Kubeflow spark-operator.

What a user meets when they add ``sparkguard.io/enabled`` to an existing SparkApplication:
sparkguard's webhook mutates its spec (admission's own verdict, :func:`mutation.review`, applied
here as the API server would), and upstream's controller (v2.5.2) reruns any app whose spec
changed: the running driver is deleted and a new one submitted, this time with sparkguard's
containers and the app's own marker token (a downward API volume: no Secret in the
namespace). The label alone (the webhook off, or failing open) changes no spec: nothing reruns.
docs/cluster.md says so to users.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from sparkguard.operator import appmeta, mutation
from sparkguard.operator import config as config_
from tests.e2e.test_real_spark_operator import APPS, App, JsonObj, app_factory, wait_for

pytestmark = pytest.mark.kube
__all__ = ["app_factory"]  # the fixture, shared with upstream's own tests

CONFIG = config_.OperatorConfig(
    image="registry.example/sparkguard:test", journal_root="s3://warehouse/_journal"
)


def _opt_in(app: App, *, with_webhook: bool) -> None:
    """Add the opt-in label as a user would; with the webhook, also what admission adds."""
    stored = app.get()
    labelled: dict[str, Any] = {"metadata": {"labels": {appmeta.ENABLED: "true"}}}
    patch = labelled
    if with_webhook:
        wanted = mutation.apply_merge_patch(stored, labelled)
        verdict = mutation.review(
            wanted, old=stored, config=CONFIG, owner_id="o1", marker_token="t-opt-in"
        )
        assert verdict.allowed, verdict.message
        patch = mutation.merge_diff(stored, mutation.apply_merge_patch(wanted, verdict.patch))
        # no sparkguard operator runs on this cluster to take its finalizer off again
        patch["metadata"].pop("finalizers", None)
    app.cluster.request(
        "PATCH", f"{APPS}/{app.name}", patch, content_type="application/merge-patch+json"
    )


def test_the_label_alone_reruns_nothing_and_the_webhooks_opt_in_reruns_the_app_protected(
    app_factory: Callable[[str, JsonObj], App],
) -> None:
    """One app (each submission is a spark-submit JVM): the label alone first, then the spec
    change sparkguard's webhook makes of it."""
    app = app_factory("pi-opt-in", {"type": "Never"})
    first = app.wait_driver_pod()
    submission = app.get()["status"]["submissionID"]
    assert mutation.ROLLBACK_INIT_NAME not in str(first["spec"])
    states = app.states

    # the label alone (the webhook off, or failing open): stored, and nothing reruns
    _opt_in(app, with_webhook=False)
    wait_for(
        "the label to be stored",
        lambda: appmeta.ENABLED in (app.get()["metadata"].get("labels") or {}),
    )
    with pytest.raises(AssertionError, match="timed out"):
        wait_for("a rerun", lambda: "INVALIDATING" in app.states, timeout=5)
    assert app.states == states
    pod = app.driver_pod()
    assert pod is not None
    assert pod["metadata"]["uid"] == first["metadata"]["uid"]

    # what the webhook makes of it: a spec change, so upstream reruns the app
    _opt_in(app, with_webhook=True)
    second = app.wait_driver_pod(other_than=first["metadata"]["uid"])
    assert app.get()["status"]["submissionID"] != submission
    assert "INVALIDATING" in app.states, app.states
    # the rerun's driver pod: sparkguard's rollback initContainer, the app's marker token from
    # its annotation through a downward API volume, and no Secret volume of ours
    inits = [c["name"] for c in second["spec"].get("initContainers") or []]
    assert mutation.ROLLBACK_INIT_NAME in inits, inits
    assert second["metadata"]["annotations"][mutation.MARKER_TOKEN_ANNOTATION] == "t-opt-in"
    (token,) = [v for v in second["spec"]["volumes"] if v["name"] == mutation.TOKEN_VOLUME]
    assert "downwardAPI" in token
    assert "secret" not in token
