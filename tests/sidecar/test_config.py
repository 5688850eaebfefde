"""Settings from the environment and flags: defaults, overrides, errors naming the setting."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sparkguard.sidecar import config, errors

BASE = {
    "SPARKGUARD_SIDECAR_ALLOWED_ROOTS": "s3://bucket/wh/, /data/tables/",
    "SPARKGUARD_SIDECAR_TOKEN": "t",
}


def test_defaults_and_roots() -> None:
    settings = config.load_config(BASE)
    assert settings.allowed_roots == ("s3://bucket/wh", "/data/tables")
    assert settings.flush_mode is config.FlushMode.ADAPTIVE
    assert (settings.batch_size, settings.batch_interval_ms, settings.batch_threads) == (
        24,
        250,
        20,
    )
    assert settings.port == config.DEFAULT_PORT
    assert settings.token == "t"
    assert settings.storage_options == {}
    assert (settings.max_connections, settings.header_timeout_s, settings.body_timeout_s) == (
        1024,
        15.0,
        15.0,
    )


def test_flags_override_environment(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    env = {**BASE, "SPARKGUARD_SIDECAR_PORT": "1", "SPARKGUARD_STORAGE_OPTIONS": '{"anon": false}'}
    del env["SPARKGUARD_SIDECAR_TOKEN"]
    settings = config.load_config(
        env,
        {"port": "8080", "flush_mode": "Group-Commit", "token_file": str(token_file), "host": None},
    )
    assert settings.port == 8080
    assert settings.flush_mode is config.FlushMode.GROUP_COMMIT
    assert settings.token == "from-file"
    assert settings.storage_options == {"anon": False}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"SPARKGUARD_SIDECAR_ALLOWED_ROOTS": ""},
            "SPARKGUARD_SIDECAR_ALLOWED_ROOTS / --allowed-roots is empty",
        ),
        (
            {"SPARKGUARD_SIDECAR_ALLOWED_ROOTS": "relative/dir"},
            "neither a URL nor an absolute path",
        ),
        ({"SPARKGUARD_SIDECAR_ALLOWED_ROOTS": "s3://"}, "has no bucket"),
        ({"SPARKGUARD_SIDECAR_ALLOWED_ROOTS": "/a/../b"}, "'..'"),
        (
            {"SPARKGUARD_SIDECAR_PORT": "http"},
            "SPARKGUARD_SIDECAR_PORT / --port='http' is not an integer",
        ),
        ({"SPARKGUARD_SIDECAR_PORT": "70000"}, "out of range"),
        ({"SPARKGUARD_SIDECAR_BATCH_THREADS": "0"}, "SPARKGUARD_SIDECAR_BATCH_THREADS"),
        ({"SPARKGUARD_SIDECAR_BATCH_INTERVAL_MS": "-5"}, "BATCH_INTERVAL_MS"),
        (
            {"SPARKGUARD_SIDECAR_BATCH_SIZE": "0"},
            "SPARKGUARD_SIDECAR_BATCH_SIZE / --batch-size=0 is out of range; give a value in [1,",
        ),
        ({"SPARKGUARD_SIDECAR_FLUSH_MODE": "sometimes"}, "use one of interval, group-commit"),
        ({"SPARKGUARD_SIDECAR_SHUTDOWN_TIMEOUT_S": "nan"}, "positive number of seconds"),
        ({"SPARKGUARD_SIDECAR_AUTH_DISABLED": "maybe"}, "not a boolean"),
        (
            {"SPARKGUARD_SIDECAR_MAX_CONNECTIONS": "0"},
            "SPARKGUARD_SIDECAR_MAX_CONNECTIONS / --max-connections=0 is out of range",
        ),
        (
            {"SPARKGUARD_SIDECAR_HEADER_TIMEOUT_S": "0"},
            "SPARKGUARD_SIDECAR_HEADER_TIMEOUT_S / --header-timeout-s='0' is not a positive",
        ),
        (
            {"SPARKGUARD_SIDECAR_BODY_TIMEOUT_S": "soon"},
            "SPARKGUARD_SIDECAR_BODY_TIMEOUT_S / --body-timeout-s='soon' is not a positive",
        ),
        ({"SPARKGUARD_STORAGE_OPTIONS": "{oops"}, "SPARKGUARD_STORAGE_OPTIONS is not valid JSON"),
        ({"SPARKGUARD_STORAGE_OPTIONS": "[1]"}, "must be a JSON object"),
        ({"SPARKGUARD_SIDECAR_TOKEN": None}, "no bearer token configured"),
        ({"SPARKGUARD_SIDECAR_TOKEN": "  "}, "SPARKGUARD_SIDECAR_TOKEN is empty"),
        (
            {"SPARKGUARD_SIDECAR_TOKEN": None, "SPARKGUARD_SIDECAR_TOKEN_FILE": "/nonexistent/t"},
            "cannot be read",
        ),
        ({"SPARKGUARD_SIDECAR_TOKEN_FILE": "/t"}, "keep only one"),
        (
            {"SPARKGUARD_SIDECAR_EXIT_WITH_PROCESS": "SparkSubmit("},
            "--exit-with-process='SparkSubmit(' is not a regular expression",
        ),
        ({"SPARKGUARD_SIDECAR_EXIT_WITH_PROCESS_WAIT_S": "-1"}, "EXIT_WITH_PROCESS_WAIT_S"),
    ],
)
def test_bad_settings_name_the_setting(env: dict[str, str | None], message: str) -> None:
    merged = {**BASE, **env}
    values = {key: value for key, value in merged.items() if value is not None}
    with pytest.raises(errors.ConfigError) as caught:
        config.load_config(values)
    assert message in str(caught.value)


def test_auth_can_be_disabled_explicitly() -> None:
    env = {"SPARKGUARD_SIDECAR_ALLOWED_ROOTS": "/data", "SPARKGUARD_SIDECAR_AUTH_DISABLED": "true"}
    settings = config.load_config(env)
    assert settings.auth_disabled
    assert settings.token is None


def test_exit_with_process_is_off_unless_set() -> None:
    assert config.load_config(BASE).exit_with_process is None
    assert (
        config.load_config({**BASE, "SPARKGUARD_SIDECAR_EXIT_WITH_PROCESS": " "}).exit_with_process
        is None
    )
    settings = config.load_config(
        BASE, {"exit_with_process": "deploy\\.SparkSubmit", "exit_with_process_wait_s": "30"}
    )
    assert settings.exit_with_process is not None
    assert settings.exit_with_process.search("java -cp x org.apache.spark.deploy.SparkSubmit")
    assert (
        settings.exit_with_process_wait_s,
        config.load_config(BASE).exit_with_process_wait_s,
    ) == (
        30.0,
        300.0,
    )


def test_the_operator_and_the_chart_inject_the_sidecars_flush_defaults() -> None:
    """The flush policy's defaults live in three places: the sidecar's own, the operator's
    (which injects ``SPARKGUARD_SIDECAR_BATCH_INTERVAL_MS`` and ``_BATCH_THREADS`` into every
    driver pod) and the chart's values (which set the operator's). They must agree, or the
    injected sidecar does not run the policy that docs/benchmarks.md measured."""
    import yaml

    from sparkguard.operator import config as operator_config

    defaults = {f.name: f.default for f in dataclasses.fields(config.SidecarConfig)}
    operator = operator_config.OperatorConfig()
    chart = Path(__file__).parents[2] / "charts" / "sparkguard" / "values.yaml"
    values = yaml.safe_load(chart.read_text())["sidecar"]
    assert defaults["flush_mode"] is config.FlushMode.ADAPTIVE
    assert (
        defaults["batch_interval_ms"],
        operator.sidecar_batch_interval_ms,
        values["batchIntervalMs"],
    ) == (250, 250, 250)
    assert (
        defaults["batch_threads"],
        operator.sidecar_batch_threads,
        values["batchThreads"],
    ) == (20, 20, 20)
