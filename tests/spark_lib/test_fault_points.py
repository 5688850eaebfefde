"""The fault registry (spark_lib/spark/faults.py): complete, covered by tests, off by default.

* every point the code fires is a registry member, and every member is fired somewhere;
* every member has a test that injects it on local disk and one on the S3 server (read from
  pytest's own collection of the fault suites, so a new point without a test fails here);
* the ``sparkguard.faults`` option is refused unless ``SPARKGUARD_ENABLE_FAULTS=1``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sparkguard.spark_lib.base import errors
from sparkguard.spark_lib.spark import faults

REPO = Path(__file__).resolve().parents[2]
FAULT_SUITES = (
    "tests/spark_lib/test_writer.py",
    "tests/spark_lib/test_writer_faults.py",
    "tests/spark_lib/test_streaming.py",
)
STORES = ("local", "s3")


def test_every_point_the_code_fires_is_registered_and_every_registered_point_fires() -> None:
    used: set[str] = set()
    values = {point.value for point in faults.Point}
    for source in sorted((REPO / "spark_lib").rglob("*.py")):  # subpackages included
        text = source.read_text()
        # A point spelled as a string (the demo's fault list) must be a registered one.
        for spelled in re.findall(r"[\"'](task:[a-z-]+|driver:[a-z-]+|commit:[a-z-]+)[\"']", text):
            assert spelled in values, f"{source.name} names an unregistered fault point {spelled}"
        used.update(re.findall(r"\bPoint\.([A-Z_]+)\b", text))
    registered = {point.name for point in faults.Point}
    assert used - registered == set(), "fired but not registered"
    assert registered - used == set(), "registered but never fired"


def _collected_cases() -> set[tuple[str, str, str]]:
    """(test file, store, point) of every parametrized test of the fault suites, as pytest
    collects them: ids are ``<store>-<case>``, the case being the point's name, or the point's
    name, ``/`` and a variant (``task:after-file/stream``)."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", *FAULT_SUITES],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {case for line in done.stdout.splitlines() if (case := _case(line)) is not None}


def _case(line: str) -> tuple[str, str, str] | None:
    """(test file, store, point) of one collected test id, or None if not parametrized."""
    found = re.match(r"^(\S+?)::\S+\[(\w+)-(.+)\]$", line)
    if found is None:
        return None
    return found.group(1), found.group(2), found.group(3).split("/", 1)[0]


def test_a_case_counts_for_its_own_point_only() -> None:
    # Points are matched by equality: one whose name is a prefix of another's (task:after vs
    # task:after-file) must not borrow the other's tests.
    path = "tests/spark_lib/test_streaming.py"
    assert _case(f"{path}::test_x[s3-task:after-file/stream]") == (path, "s3", "task:after-file")
    assert _case(f"{path}::test_x[local-task:after-file]") == (path, "local", "task:after-file")
    assert _case(f"{path}::test_x") is None


def test_every_registered_point_has_a_test_on_local_disk_and_on_s3() -> None:
    cases = _collected_cases()
    missing = [
        f"{point.value} on {store}"
        for point in faults.Point
        for store in STORES
        if (store, point.value) not in {(s, tested) for _, s, tested in cases}
    ]
    assert missing == [], f"fault points without a test: {missing}"
    # Every point of the batch writer is also a SIGKILL of the whole driver (on local disk).
    killed = {
        tested
        for path, s, tested in cases
        if path.endswith("test_writer_faults.py") and s == "local"
    }
    not_killed = [
        point.value
        for point in faults.Point
        if not point.value.startswith("stream:") and point.value not in killed
    ]
    assert not_killed == [], f"batch fault points without a driver-kill test: {not_killed}"


# ------------------------------------------------------------------------------------------
# The switch.
# ------------------------------------------------------------------------------------------

ON = {faults.ENV_VAR: "1"}


def test_option_is_refused_without_the_switch() -> None:
    raw = json.dumps([{"point": "task:end"}])
    for environ in ({}, {faults.ENV_VAR: "0"}, {faults.ENV_VAR: "yes"}):
        with pytest.raises(errors.ConfigError) as caught:
            faults.parse(raw, environ=environ)
        assert faults.OPTION in str(caught.value)
        assert f"{faults.ENV_VAR}=1" in str(caught.value)
    assert faults.parse("", environ={}) == ()  # no option: nothing to refuse
    assert faults.parse(raw, environ=ON) == (faults.Fault(point=faults.Point.TASK_END),)


def test_bad_fault_lists_name_the_option_and_the_points() -> None:
    bad = [
        "{",
        '{"point": "task:end"}',
        '[{"point": "task:nowhere"}]',
        '[{"point": "task:end", "action": "explode"}]',
        '[{"where": "task:end"}]',
    ]
    for raw in bad:
        with pytest.raises(errors.ConfigError, match=re.escape(faults.OPTION)) as caught:
            faults.parse(raw, environ=ON)
        assert "task:before-marker" in str(caught.value), raw


def test_fire_filters_records_and_refuses_without_the_switch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    signal_file, once = tmp_path / "signal", tmp_path / "once"
    (fault,) = faults.parse(
        json.dumps([{"point": "task:end", "partition": 1, "attempt": 0,
                     "signal": str(signal_file), "once": str(once)}]),
        environ=ON,
    )  # fmt: skip
    monkeypatch.setenv(faults.ENV_VAR, "1")
    faults.fire([fault], faults.Point.TASK_MID_FILE, partition=1, attempt=0)  # other point
    faults.fire([fault], faults.Point.TASK_END, partition=2, attempt=0)  # other partition
    faults.fire([fault], faults.Point.TASK_END, partition=1, attempt=1)  # other attempt
    assert not signal_file.exists()
    with pytest.raises(faults.InjectedFaultError, match=r"at task:end \(partition 1\)"):
        faults.fire([fault], faults.Point.TASK_END, partition=1, attempt=0)
    assert signal_file.read_text().split()[:3] == ["task:end", "1", "0"]
    faults.fire([fault], faults.Point.TASK_END, partition=1, attempt=0)  # once: already fired
    assert len(signal_file.read_text().splitlines()) == 1
    # An executor whose environment lacks the switch refuses a fault it was sent.
    monkeypatch.delenv(faults.ENV_VAR)
    once.unlink()
    with pytest.raises(errors.ConfigError, match=faults.ENV_VAR):
        faults.fire([fault], faults.Point.TASK_END, partition=1, attempt=0)
    faults.fire([fault], faults.Point.TASK_MID_FILE, partition=1, attempt=0)  # nothing to fire


CHILD = textwrap.dedent(
    """
    import sys
    from pyspark.sql import SparkSession
    from sparkguard.spark_lib.spark import faults, writer
    url, journal = sys.argv[1:3]
    spark = (SparkSession.builder.master("local[2,4]").config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1").getOrCreate())
    writer.register(spark, conf={"spark.sparkguard.jobId": "no-switch",
                                 "spark.sparkguard.journal": journal})
    try:
        (spark.range(10).write.format("sparkguard").mode("append")
         .option(faults.OPTION, '[{"point": "task:end"}]').save(url))
    except Exception as exc:
        print("refused:", exc, flush=True)
    else:
        print("accepted", flush=True)
    """
)


@pytest.mark.spark
def test_a_spark_job_without_the_switch_refuses_the_option(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != faults.ENV_VAR}
    env.update(PYTHONSAFEPATH="1", PYSPARK_PYTHON=sys.executable)
    url = tmp_path / "t"
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(url), str(tmp_path / "journal")],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert "refused:" in done.stdout, done.stdout[-2000:] + done.stderr[-3000:]
    assert faults.OPTION in done.stdout
    assert f"{faults.ENV_VAR}=1" in done.stdout
    assert not (url / "_sparkguard").exists()  # refused before the write began
