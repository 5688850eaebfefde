"""Operator settings from SPARKGUARD_* variables; errors name the variable and the fix."""

from __future__ import annotations

import base64

import pytest

from sparkguard.operator import config as config_
from sparkguard.operator import errors, rollbacks


def test_defaults_need_a_cert_in_external_mode() -> None:
    with pytest.raises(errors.ConfigError, match="SPARKGUARD_WEBHOOK_CERT_FILE"):
        config_.load_config({})


def test_values_are_parsed() -> None:
    config = config_.load_config(
        {
            "SPARKGUARD_NAMESPACES": "jobs, etl",
            "SPARKGUARD_WEBHOOK_MODE": "managed",
            "SPARKGUARD_WEBHOOK_PORT": "8443",
            "SPARKGUARD_WEBHOOK_FAILURE_POLICY": "Ignore",
            "SPARKGUARD_SIDECAR_BATCH_THREADS": "8",
            "SPARKGUARD_SIDECAR_CPU_LIMIT": "500m",
            "SPARKGUARD_JOURNAL_ROOT": "s3://bucket/journal/",
            "SPARKGUARD_METRICS_PORT": "0",
            "SPARKGUARD_MAX_CONCURRENT_ROLLBACKS": "2",
            "SPARKGUARD_ERROR_BACKOFF": "1m",
            "UNRELATED": "ignored",
        }
    )
    assert config.namespaces == ("jobs", "etl")
    assert not config.clusterwide
    assert config.webhook_mode is config_.WebhookMode.MANAGED
    assert config.webhook_port == 8443
    assert config.webhook_ignore_failures
    assert config.sidecar_batch_threads == 8
    assert config.sidecar_cpu_limit == "500m"
    assert config.journal_root == "s3://bucket/journal"
    assert config.metrics_port == 0
    assert config.max_concurrent_rollbacks == 2
    assert config.error_backoff_seconds == 60


def test_every_bad_variable_is_named_with_its_fix() -> None:
    with pytest.raises(errors.ConfigError) as caught:
        config_.load_config(
            {
                "SPARKGUARD_WEBHOOK_MODE": "sometimes",
                "SPARKGUARD_WEBHOOK_PORT": "99999",
                "SPARKGUARD_SIDECAR_MEMORY_LIMIT": "lots",
                "SPARKGUARD_NAMESPACES": "Jobs",
                "SPARKGUARD_MAX_CONCURRENT_ROLLBACKS": "0",
                "SPARKGUARD_JOURNAL_ROOT": "bucket/journal",
                "SPARKGUARD_WEBHOOK_FAILURE_POLICY": "maybe",
            }
        )
    message = str(caught.value)
    for expected in (
        "SPARKGUARD_WEBHOOK_MODE='sometimes' must be one of: managed, external, disabled",
        "SPARKGUARD_WEBHOOK_PORT='99999' must be a port number 1..65535",
        "SPARKGUARD_SIDECAR_MEMORY_LIMIT='lots' must be a Kubernetes quantity",
        "SPARKGUARD_NAMESPACES='Jobs'",
        "SPARKGUARD_MAX_CONCURRENT_ROLLBACKS='0' must be an integer 1..256",
        "SPARKGUARD_JOURNAL_ROOT='bucket/journal' must be a URL",
        "SPARKGUARD_WEBHOOK_FAILURE_POLICY='maybe' must be 'Fail'",
    ):
        assert expected in message


def test_delete_rollback_timeout_defaults_to_two_minutes_and_takes_durations() -> None:
    managed = {"SPARKGUARD_WEBHOOK_MODE": "managed"}
    assert config_.load_config(managed).delete_rollback_timeout_seconds == 120
    assert (
        config_.load_config(
            {**managed, "SPARKGUARD_DELETE_ROLLBACK_TIMEOUT": "5m"}
        ).delete_rollback_timeout_seconds
        == 300
    )


@pytest.mark.parametrize("bad", ["0", "2h", "soon", "-5", ""])
def test_a_bad_delete_rollback_timeout_is_named_with_its_fix(bad: str) -> None:
    with pytest.raises(errors.ConfigError) as caught:
        config_.load_config(
            {"SPARKGUARD_WEBHOOK_MODE": "managed", "SPARKGUARD_DELETE_ROLLBACK_TIMEOUT": bad}
        )
    assert (
        f"SPARKGUARD_DELETE_ROLLBACK_TIMEOUT={bad!r} must be a duration from 1s to 1h, "
        "e.g. '120' (seconds) or '2m'"
    ) in str(caught.value)


def test_half_a_certificate_is_refused() -> None:
    with pytest.raises(errors.ConfigError, match="set both"):
        config_.load_config(
            {"SPARKGUARD_WEBHOOK_MODE": "managed", "SPARKGUARD_WEBHOOK_CERT_FILE": "/tls.crt"}
        )


def test_storage_options_from_a_secret() -> None:
    data = {
        k: base64.b64encode(v.encode()).decode()
        for k, v in {
            "AWS_ACCESS_KEY_ID": "AKIA",
            "AWS_SECRET_ACCESS_KEY": "s3cr3t",
            "AWS_ENDPOINT_URL": "http://minio:9000",
            "AWS_REGION": "eu-west-1",
            "OTHER": "x",
        }.items()
    }
    options = rollbacks.storage_options_from_secret(rollbacks.decode_secret_data(data))
    assert options == {
        "key": "AKIA",
        "secret": "s3cr3t",
        "endpoint_url": "http://minio:9000",
        "client_kwargs": {"region_name": "eu-west-1"},
    }


def test_undecodable_secret_names_the_key() -> None:
    with pytest.raises(errors.OperatorError, match="'AWS_ACCESS_KEY_ID' is not base64"):
        rollbacks.decode_secret_data({"AWS_ACCESS_KEY_ID": "***"})


@pytest.mark.parametrize(("raw", "expected"), [("auto", None), ("true", True), ("false", False)])
def test_native_sidecar_setting(raw: str, expected: bool | None) -> None:
    env = {"SPARKGUARD_WEBHOOK_MODE": "managed", "SPARKGUARD_SIDECAR_NATIVE": raw}
    assert config_.load_config(env).sidecar_native is expected


def test_bad_native_sidecar_setting_is_named() -> None:
    env = {"SPARKGUARD_WEBHOOK_MODE": "managed", "SPARKGUARD_SIDECAR_NATIVE": "sometimes"}
    with pytest.raises(errors.ConfigError, match=r"SPARKGUARD_SIDECAR_NATIVE.*'auto', 'true'"):
        config_.load_config(env)
