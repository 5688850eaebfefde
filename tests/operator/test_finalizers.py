"""The finalizer's decision table (pure): when to add it, roll back, or let an app go."""

from __future__ import annotations

from typing import Any

import pytest

from sparkguard.operator import appmeta, finalizers
from sparkguard.operator import config as config_
from tests.operator.apps import failed_status, spark_app

Step = finalizers.Step
GOING = "2026-11-22T10:00:00Z"


def _app(
    *,
    held: list[str] | None = None,
    deleting: bool = False,
    enabled: bool = True,
    status: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    app = spark_app("app", enabled=enabled, status=status, annotations=annotations)
    if held is not None:
        app["metadata"]["finalizers"] = held
    if deleting:
        app["metadata"]["deletionTimestamp"] = GOING
    return app


def test_an_opted_in_app_without_it_gets_it_added_beside_the_others(
    config: config_.OperatorConfig,
) -> None:
    decision = finalizers.decide(_app(held=["example.com/keep"]), config=config)
    assert decision.action is Step.ADD
    assert decision.patch == {
        "metadata": {"finalizers": ["example.com/keep", finalizers.FINALIZER]}
    }
    assert finalizers.decide(_app(held=[finalizers.FINALIZER]), config=config).action is (
        Step.NOTHING
    )


def test_never_added_to_apps_not_opted_in_or_with_bad_annotations(
    config: config_.OperatorConfig,
) -> None:
    assert finalizers.decide(_app(enabled=False), config=config).action is Step.NOTHING
    bad = _app(annotations={appmeta.MAX_RETRIES: "forever"})
    assert finalizers.decide(bad, config=config).action is Step.NOTHING


def test_an_opted_out_app_loses_it_and_keeps_the_others(config: config_.OperatorConfig) -> None:
    app = _app(enabled=False, held=["a.io/x", finalizers.FINALIZER, "b.io/y"])
    decision = finalizers.decide(app, config=config)
    assert decision.action is Step.REMOVE
    assert decision.patch == {"metadata": {"finalizers": ["a.io/x", "b.io/y"]}}
    app["metadata"]["annotations"][appmeta.ENABLED] = "false"
    assert finalizers.decide(app, config=config).action is Step.REMOVE


@pytest.mark.parametrize(
    "status",
    [
        failed_status(),
        {"applicationState": {"state": "RUNNING"}},
        {"applicationState": {"state": "SUBMITTED"}},
        {"applicationState": {"state": "FAILING"}},
        {"applicationState": {"state": "UNKNOWN"}},
    ],
    ids=lambda s: s["applicationState"]["state"],
)
def test_a_deleted_app_that_may_have_writes_in_flight_is_rolled_back_first(
    config: config_.OperatorConfig, status: dict[str, Any]
) -> None:
    app = _app(held=[finalizers.FINALIZER, "example.com/keep"], deleting=True, status=status)
    decision = finalizers.decide(app, config=config)
    assert decision.action is Step.ROLL_BACK
    assert decision.options is not None
    assert decision.options.job_id == "jobs.app"
    assert decision.patch == {"metadata": {"finalizers": ["example.com/keep"]}}


def test_a_deleted_app_that_can_have_nothing_undecided_goes_at_once(
    config: config_.OperatorConfig,
) -> None:
    completed = _app(
        held=[finalizers.FINALIZER],
        deleting=True,
        status={"applicationState": {"state": "COMPLETED"}},
    )
    never_started = _app(held=[finalizers.FINALIZER], deleting=True)
    for app in (completed, never_started):
        decision = finalizers.decide(app, config=config)
        assert decision.action is Step.REMOVE, decision
        assert decision.patch == {"metadata": {"finalizers": []}}
    # No state, but a recovery was recorded: it did run (spark-operator cleared its status).
    rerun = _app(
        held=[finalizers.FINALIZER], deleting=True, annotations={appmeta.HANDLED_FAILURE: "x"}
    )
    assert finalizers.decide(rerun, config=config).action is Step.ROLL_BACK


def test_deleted_apps_without_it_or_opted_out_are_let_go(config: config_.OperatorConfig) -> None:
    theirs = _app(held=["example.com/keep"], deleting=True, status=failed_status())
    assert finalizers.decide(theirs, config=config).action is Step.NOTHING
    opted_out = _app(enabled=False, held=[finalizers.FINALIZER], deleting=True)
    assert finalizers.decide(opted_out, config=config).action is Step.REMOVE
    bad = _app(
        held=[finalizers.FINALIZER],
        deleting=True,
        status=failed_status(),
        annotations={appmeta.MAX_RETRIES: "forever"},
    )
    decision = finalizers.decide(bad, config=config)
    assert decision.action is Step.REMOVE
    assert "sparkguard.io/max-retries" in decision.reason


def test_the_abandoned_message_says_what_is_left_and_the_command(
    config: config_.OperatorConfig,
) -> None:
    app = _app(annotations={appmeta.OWNER_ANNOTATION: "k8s:jobs/app/0123456789abcdef"})
    options = appmeta.parse(app, config=config).options
    assert options is not None
    message = finalizers.abandoned_message(app, options, timeout=120, error="OSError: down")
    assert "SPARKGUARD_DELETE_ROLLBACK_TIMEOUT=120s (last error: OSError: down)" in message
    assert "stay in flight" in message
    assert message.endswith(
        "sparkguard rollback --job-id jobs.app --journal s3://warehouse/_journal/jobs "
        "--owner 'k8s:jobs/app/0123456789abcdef'"
    )
