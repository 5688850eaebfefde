"""The operator's metrics that fold state: what rollbacks did, and apps by protection."""

from __future__ import annotations

import dataclasses
from typing import Any

from sparkguard.operator import metrics


@dataclasses.dataclass
class Summary:
    files_deleted: int
    details: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {"filesDeleted": self.files_deleted, "details": self.details}


def _value(m: metrics.Metrics, name: str, **labels: str) -> float:
    value = m.registry.get_sample_value(name, labels)
    assert value is not None, (name, labels)
    return value


def test_a_rollback_counts_each_instant_by_what_was_done_and_the_late_files() -> None:
    m = metrics.Metrics()
    m.record_rollback(
        Summary(
            files_deleted=7,
            details=[
                {"action": "rolled_back", "filesDeleted": 4, "markersDeleted": 2},
                {"action": "committed", "filesDeleted": 0, "markersDeleted": 0},
                {"action": "committed", "filesDeleted": 0, "markersDeleted": 3},
                # a driver killed while publishing: the rollback published the rest
                {"action": "committed", "filesDeleted": 0, "filesPublished": 5},
                {"action": "nothing", "filesDeleted": 3, "markersDeleted": 0},
                {"action": "nothing", "filesDeleted": 0, "markersDeleted": 0},
                {"action": "other_owner", "filesDeleted": 0, "markersDeleted": 0},
            ],
        )
    )
    instants = "sparkguard_operator_instants_total"
    assert _value(m, instants, action="rolled_back") == 1
    assert _value(m, instants, action="committed") == 1
    assert _value(m, instants, action="rolled_forward") == 2
    assert _value(m, "sparkguard_operator_late_files_removed_total") == 3
    assert _value(m, "sparkguard_operator_rollback_files_deleted_sum") == 7
    assert _value(m, "sparkguard_operator_rollback_files_deleted_count") == 1


def test_apps_are_counted_per_namespace_as_their_protection_changes() -> None:
    m = metrics.Metrics()
    apps = "sparkguard_operator_apps"
    m.track_app(("a", "x"), protected=True)
    m.track_app(("a", "y"), protected=True)
    m.track_app(("b", "z"), protected=False)
    m.track_app(("a", "y"), protected=True)  # an event that changes nothing
    assert _value(m, apps, app_namespace="a", protection="protected") == 2
    assert _value(m, apps, app_namespace="a", protection="unprotected") == 0
    assert _value(m, apps, app_namespace="b", protection="unprotected") == 1
    m.track_app(("a", "y"), protected=False)
    assert _value(m, apps, app_namespace="a", protection="protected") == 1
    assert _value(m, apps, app_namespace="a", protection="unprotected") == 1
    m.track_app(("a", "y"), protected=None)  # deleted
    m.track_app(("a", "gone"), protected=None)  # never seen
    assert _value(m, apps, app_namespace="a", protection="unprotected") == 0


def test_the_oldest_recovery_ages_until_it_ends() -> None:
    m = metrics.Metrics()
    oldest = "sparkguard_operator_oldest_recovery_seconds"
    assert _value(m, oldest) == 0
    m.track_recovery(("a", "x"), recovering=True)
    assert _value(m, oldest) > 0
    m.track_recovery(("a", "x"), recovering=False)
    assert _value(m, oldest) == 0
