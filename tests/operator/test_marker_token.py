"""Each app's own marker token: written at admission into its pods' annotations, projected into
the token file by a downward API volume. No Secret has to exist in the app's namespace, so
nothing sparkguard adds can hold a driver pod in ContainerCreating."""

from __future__ import annotations

from typing import Any

import pytest

from sparkguard.operator import appmeta, mutation
from sparkguard.operator import config as config_
from tests.operator.apps import apache_app, spark_app

TOKEN = mutation.MARKER_TOKEN_ANNOTATION


def _admitted(app: dict[str, Any], config: config_.OperatorConfig, **kw: Any) -> dict[str, Any]:
    verdict = mutation.review(app, config=config, owner_id="o1", native_sidecar=True, **kw)
    assert verdict.allowed, verdict.message
    return mutation.apply_merge_patch(app, verdict.patch)


def _tokens(app: dict[str, Any]) -> tuple[str | None, str | None]:
    spec = app["spec"]
    if mutation.kind_of(app) is mutation.APACHE:
        return tuple(  # type: ignore[return-value]
            spec[f"{role}Spec"]["podTemplateSpec"]["metadata"]["annotations"].get(TOKEN)
            for role in ("driver", "executor")
        )
    return spec["driver"]["annotations"].get(TOKEN), spec["executor"]["annotations"].get(TOKEN)


def _secret_volumes(node: Any) -> list[Any]:
    """Every Secret volume anywhere in ``node``."""
    if isinstance(node, dict):
        found = [node] if "secret" in node and "name" in node else []
        return found + [v for child in node.values() for v in _secret_volumes(child)]
    if isinstance(node, list):
        return [v for child in node for v in _secret_volumes(child)]
    return []


@pytest.mark.parametrize("make", [spark_app, apache_app], ids=["kubeflow", "apache"])
def test_an_app_gets_its_own_token_on_driver_and_executors_and_no_secret(
    make: Any, config: config_.OperatorConfig
) -> None:
    first = _admitted(make("a"), config, old=None, marker_token="t-first")
    second = _admitted(make("b"), config, old=None, marker_token="t-second")
    assert _tokens(first) == ("t-first", "t-first")
    assert _tokens(second) == ("t-second", "t-second")
    assert _secret_volumes(first["spec"]) == []
    volume = mutation.build_token_volume(config)
    assert volume["downwardAPI"]["items"] == [
        {
            "path": config.sidecar_token_key,
            "fieldRef": {"fieldPath": f"metadata.annotations['{TOKEN}']"},
        }
    ]
    spec = first["spec"]
    volumes = spec.get("volumes") or spec["driverSpec"]["podTemplateSpec"]["spec"]["volumes"]
    assert volume in volumes


def test_an_update_keeps_the_stored_token_even_when_the_change_drops_it(
    config: config_.OperatorConfig,
) -> None:
    stored = _admitted(spark_app(), config, old=None, marker_token="kept")
    edited = _admitted(stored, config, old=stored, marker_token="fresh")
    assert _tokens(edited) == ("kept", "kept")
    # kubectl replace from the original manifest: no annotations at all
    replaced = spark_app()
    replaced["metadata"]["annotations"][appmeta.OWNER_ANNOTATION] = stored["metadata"][
        "annotations"
    ][appmeta.OWNER_ANNOTATION]
    assert _tokens(_admitted(replaced, config, old=stored, marker_token="fresh")) == (
        "kept",
        "kept",
    )


def test_mutating_twice_changes_nothing_and_direct_markers_get_no_token(
    config: config_.OperatorConfig,
) -> None:
    once = _admitted(spark_app(), config, old=None, marker_token="t")
    assert mutation.mutate(once, config=config, native_sidecar=True, marker_token="u") == once
    direct = _admitted(
        spark_app(annotations={appmeta.MARKER_TYPE: "direct"}), config, old=None, marker_token="t"
    )
    assert TOKEN not in str(direct)


def test_an_app_admitted_with_the_token_secret_keeps_it(config: config_.OperatorConfig) -> None:
    """Apps admitted before the per-app token mount a Secret: an update leaves it alone."""
    old = _admitted(spark_app(), config, old=None, marker_token="t")
    for volume in old["spec"]["volumes"]:
        if volume["name"] == mutation.TOKEN_VOLUME:
            volume.pop("downwardAPI")
            volume["secret"] = {"secretName": "sparkguard-marker-token"}
    again = _admitted(old, config, old=old, marker_token="u")
    assert _secret_volumes(again["spec"]) == [
        {"name": mutation.TOKEN_VOLUME, "secret": {"secretName": "sparkguard-marker-token"}}
    ]
