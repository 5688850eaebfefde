"""The opt-in annotations: parsing, defaults, and a message naming every bad one."""

from __future__ import annotations

import pytest

from sparkguard.operator import appmeta, durations
from sparkguard.operator import config as config_
from sparkguard.spark_lib.storage import timeline
from tests.operator.apps import spark_app


def test_not_opted_in_without_the_enabled_annotation(config: config_.OperatorConfig) -> None:
    assert appmeta.parse(spark_app(enabled=False), config=config) == appmeta.Parsed(enabled=False)


def test_enabled_false_opts_out_even_with_other_bad_annotations(
    config: config_.OperatorConfig,
) -> None:
    app = spark_app(annotations={appmeta.ENABLED: "false", appmeta.MAX_RETRIES: "lots"})
    assert not appmeta.parse(app, config=config).enabled


def test_defaults(config: config_.OperatorConfig) -> None:
    parsed = appmeta.parse(spark_app("nightly", namespace="jobs"), config=config)
    assert parsed.problems == ()
    assert parsed.options == appmeta.Options(
        job_id="jobs.nightly",
        max_retries=3,
        backoff=30.0,
        backoff_max=600.0,
        marker_type=appmeta.MarkerType.TIMELINE_SERVER,
        storage_secret=None,
        journal="s3://warehouse/_journal/jobs",
    )


def test_every_option_set(config: config_.OperatorConfig) -> None:
    app = spark_app(
        annotations={
            appmeta.JOB_ID: "sales-2026",
            appmeta.MAX_RETRIES: "0",
            appmeta.BACKOFF: "2m",
            appmeta.BACKOFF_MAX: "1h",
            appmeta.MARKER_TYPE: "direct",
            appmeta.STORAGE_SECRET: "s3-creds",
            appmeta.JOURNAL: "s3://other/journal/",
        }
    )
    options = appmeta.parse(app, config=config).options
    assert options == appmeta.Options(
        job_id="sales-2026",
        max_retries=0,
        backoff=120.0,
        backoff_max=3600.0,
        marker_type=appmeta.MarkerType.DIRECT,
        storage_secret="s3-creds",
        journal="s3://other/journal",
    )


@pytest.mark.parametrize(
    ("key", "value", "fix"),
    [
        (appmeta.ENABLED, "yes", 'write "true" or "false"'),
        (appmeta.JOB_ID, "Nightly_Sales", "lower-case letters"),
        (appmeta.JOB_ID, "-bad", "starting and ending with a letter or digit"),
        (appmeta.MAX_RETRIES, "many", "whole number 0..20"),
        (appmeta.MAX_RETRIES, "-1", "whole number 0..20"),
        (appmeta.MAX_RETRIES, "21", "whole number 0..20"),
        (appmeta.BACKOFF, "soon", "'30s', '2m', '1h30m'"),
        (appmeta.BACKOFF, "-5s", "'30s', '2m', '1h30m'"),
        (appmeta.BACKOFF, "30d", "'30s', '2m', '1h30m'"),
        (appmeta.BACKOFF, "25h", "at most 24h"),
        (appmeta.BACKOFF_MAX, "10x", "'30s', '2m', '1h30m'"),
        (appmeta.BACKOFF_MAX, "10s", "at least as long"),
        (appmeta.MARKER_TYPE, "SIDECAR", 'write "sidecar"'),
        (appmeta.STORAGE_SECRET, "Not A Name", "name a Secret"),
        (appmeta.JOURNAL, "bucket/journal", "write a URL"),
        ("sparkguard.io/max-retry", "3", "not a sparkguard annotation"),
    ],
)
def test_bad_annotation_is_named_with_its_fix(
    config: config_.OperatorConfig, key: str, value: str, fix: str
) -> None:
    parsed = appmeta.parse(spark_app(annotations={key: value}), config=config)
    assert parsed.enabled
    assert parsed.options is None
    assert [p.field for p in parsed.problems] == [key]
    assert fix in str(parsed.problems[0])
    assert str(parsed.problems[0]).startswith(f"{key}: ")


def test_all_problems_are_reported_at_once(config: config_.OperatorConfig) -> None:
    app = spark_app(annotations={appmeta.MAX_RETRIES: "x", appmeta.MARKER_TYPE: "y"})
    fields = {p.field for p in appmeta.parse(app, config=config).problems}
    assert fields == {appmeta.MAX_RETRIES, appmeta.MARKER_TYPE}


def test_journal_needs_a_default_or_the_annotation(config: config_.OperatorConfig) -> None:
    bare = config_.OperatorConfig(webhook_mode=config_.WebhookMode.DISABLED)
    parsed = appmeta.parse(spark_app(), config=bare)
    assert [p.field for p in parsed.problems] == [appmeta.JOURNAL]
    assert "SPARKGUARD_JOURNAL_ROOT" in parsed.problems[0].message


def test_generate_name_needs_a_job_id(config: config_.OperatorConfig) -> None:
    app = spark_app()
    del app["metadata"]["name"]
    app["metadata"]["generateName"] = "nightly-"
    parsed = appmeta.parse(app, config=config)
    assert [p.field for p in parsed.problems] == [appmeta.JOB_ID]
    assert "generateName" in parsed.problems[0].message


@pytest.mark.parametrize(
    ("namespace", "name", "expected"),
    [
        ("jobs", "nightly", "jobs.nightly"),
        ("a-b", "c", "a-b.c"),
        ("a", "b-c", "a.b-c"),  # no collision with the line above: '.' is never in a namespace
    ],
)
def test_derived_job_id_is_readable_and_unambiguous(
    namespace: str, name: str, expected: str
) -> None:
    assert appmeta.derive_job_id(namespace=namespace, name=name) == expected


def test_derived_job_id_of_long_or_odd_names_is_valid_and_hashed() -> None:
    long_id = appmeta.derive_job_id(namespace="jobs", name="x" * 240)
    other = appmeta.derive_job_id(namespace="jobs", name="x" * 239 + "y")
    assert len(long_id) <= 100
    assert long_id != other
    assert timeline.validate_job_id(long_id) == long_id
    odd = appmeta.derive_job_id(namespace="Jobs", name="Nightly_Run")
    assert timeline.validate_job_id(odd) == odd
    assert odd.startswith("jobs.nightly-run-")
    assert appmeta.derive_job_id(namespace="Jobs", name="Nightly_Run") == odd  # deterministic


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("45", 45), ("0", 0), ("30s", 30), ("2m", 120), ("1h30m", 5400), ("1h2m3s", 3723)],
)
def test_durations(text: str, seconds: float) -> None:
    assert durations.parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text", ["", "1.5s", "2mm", "1m1m", "m", "1d", "-1", "\u0663", "\u0663s", "30s\n5s"]
)
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match=r"duration|repeats"):
        durations.parse_duration(text)


def test_format_duration() -> None:
    assert [durations.format_duration(s) for s in (0, 30, 90, 3600, 3723)] == [
        "0s",
        "30s",
        "1m30s",
        "1h",
        "1h2m3s",
    ]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (appmeta.MAX_RETRIES, " 3 "),
        (appmeta.MAX_RETRIES, "+3"),
        (appmeta.MAX_RETRIES, "\u0663"),  # ARABIC-INDIC DIGIT THREE: int() reads it as 3
        (appmeta.MAX_RETRIES, "03"),
        (appmeta.JOB_ID, "a..b"),
        (appmeta.JOB_ID, "a.-b"),
        (appmeta.JOB_ID, "sales\n"),
        (appmeta.JOB_ID, " sales"),
        (appmeta.BACKOFF, " 30s"),
        (appmeta.BACKOFF, "\u0663\u0660s"),
        (appmeta.BACKOFF, "+30"),
        (appmeta.BACKOFF_MAX, "010m"),
        (appmeta.ENABLED, "True"),
        (appmeta.MARKER_TYPE, "Direct"),
        (appmeta.STORAGE_SECRET, "creds\n"),
        (appmeta.JOURNAL, "s3://bucket/my journal"),
    ],
)
def test_values_have_one_canonical_ascii_form(
    config: config_.OperatorConfig, key: str, value: str
) -> None:
    parsed = appmeta.parse(spark_app(annotations={key: value}), config=config)
    assert parsed.options is None, f"{key}={value!r} was accepted"
    assert [p.field for p in parsed.problems] == [key]


def test_a_long_bad_value_is_echoed_cut() -> None:
    bad = "x" * 499 + "_"
    parsed = appmeta.parse(
        spark_app(annotations={appmeta.JOB_ID: bad}),
        config=config_.OperatorConfig(journal_root="s3://j"),
    )
    (problem,) = parsed.problems
    assert "x" * 64 in str(problem)
    assert "x" * 65 not in str(problem)
    assert "(500 characters)" in str(problem)
    assert len(str(problem)) < 400


def test_the_label_opts_in_and_the_annotation_still_works(
    config: config_.OperatorConfig,
) -> None:
    labelled = spark_app("run", enabled=False)
    labelled["metadata"]["labels"] = {appmeta.ENABLED_LABEL: "true"}
    assert appmeta.opted_in(labelled)
    parsed = appmeta.parse(labelled, config=config)
    assert parsed.options is not None
    assert parsed.options.job_id == "jobs.run"
    assert appmeta.opted_in(spark_app())
    off = spark_app(enabled=False)
    off["metadata"]["labels"] = {appmeta.ENABLED_LABEL: "false"}
    assert not appmeta.opted_in(off)


def test_label_and_annotation_must_agree(config: config_.OperatorConfig) -> None:
    app = spark_app(annotations={appmeta.ENABLED: "false"})
    app["metadata"]["labels"] = {appmeta.ENABLED_LABEL: "true"}
    parsed = appmeta.parse(app, config=config)
    assert [p.field for p in parsed.problems] == [appmeta.ENABLED]
    assert "keep only the label" in str(parsed.problems[0])
    bad_label = spark_app(enabled=False)
    bad_label["metadata"]["labels"] = {appmeta.ENABLED_LABEL: "yes"}
    (problem,) = appmeta.parse(bad_label, config=config).problems
    assert problem.field == "metadata.labels[sparkguard.io/enabled]"


def test_storage_owner_and_the_owner_annotation_is_known(config: config_.OperatorConfig) -> None:
    owner = appmeta.new_owner(namespace="jobs", name="etl", unique="0f0f")
    assert owner == "k8s:jobs/etl/0f0f"
    app = spark_app(annotations={appmeta.OWNER_ANNOTATION: owner})
    assert appmeta.storage_owner(app["metadata"]) == owner
    assert appmeta.parse(app, config=config).problems == ()
    assert appmeta.storage_owner(spark_app()["metadata"]) is None
    assert appmeta.storage_owner({}) is None


@pytest.mark.parametrize(
    ("raw", "wanted"),
    [
        ("sidecar", appmeta.MarkerType.TIMELINE_SERVER),
        ("timeline-server", appmeta.MarkerType.TIMELINE_SERVER),  # the former name
        ("direct", appmeta.MarkerType.DIRECT),
    ],
)
def test_marker_type_is_written_sidecar_or_direct(
    raw: str, wanted: appmeta.MarkerType, config: config_.OperatorConfig
) -> None:
    options = appmeta.parse(
        spark_app(annotations={appmeta.MARKER_TYPE: raw}), config=config
    ).options
    assert options is not None
    assert options.marker_type is wanted
    refused = appmeta.parse(spark_app(annotations={appmeta.MARKER_TYPE: "batched"}), config=config)
    assert 'write "sidecar"' in str(refused.problems[0])
