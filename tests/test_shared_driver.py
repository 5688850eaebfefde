"""The shared test driver (``tests/support/shared_driver.py``): jobs that nobody kills run one
after another in one warm driver process, each with a SparkContext of its own conf, and come
back as a process's would (exit code, stdout, stderr)."""

from __future__ import annotations

import json
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.jvm.conftest import job_env
from tests.support import shared_driver

JOB = textwrap.dedent(
    """
    import json, os, sys
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    conf = json.loads(sys.argv[1])
    left_over = SparkContext._active_spark_context is not None
    builder = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    fs = spark._jvm.org.apache.hadoop.fs.FileSystem
    print("noise before the answer")
    print(json.dumps({
        "pid": os.getpid(),
        "app": spark.sparkContext.applicationId,
        "mark": spark.conf.get("spark.test.mark"),
        "onlyFirst": spark.conf.get("spark.test.onlyFirst", None),
        "leftOver": left_over,
        "rows": spark.range(5).count(),
    }))
    mode = sys.argv[2]
    if mode == "raise":
        raise RuntimeError("the job broke")
    if mode == "exit3":
        sys.exit(3)  # without stopping its session: the driver must
    spark.stop()
    """
)


def test_launch_settings_and_the_switch_decide_what_is_shared(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert shared_driver.shareable({"spark.sql.shuffle.partitions": "2"})
    assert not shared_driver.shareable({"spark.driver.extraJavaOptions": "-Dx=1"})
    assert not shared_driver.shareable({"spark.driver.memory": "2g"})
    assert shared_driver.jars_of({"spark.jars": "/a.jar,,/b.jar"}) == {"/a.jar", "/b.jar"}
    monkeypatch.setenv("SPARKGUARD_TEST_SHARED_DRIVER", "0")
    assert not shared_driver.shareable({})


@pytest.mark.spark
def test_jobs_share_one_process_each_with_its_own_context_and_exit_code(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    driver = shared_driver.SharedDriver(env=job_env(), log_dir=tmp_path)
    try:

        def run(
            mark: str, mode: str, conf: dict[str, str] | None = None
        ) -> tuple[int, dict[str, Any], str]:
            conf = {"spark.test.mark": mark, **(conf or {})}
            done = driver.run(script, [json.dumps(conf), mode], conf, timeout=300)
            lines = done.stdout.strip().splitlines()
            assert lines[0] == "noise before the answer"
            return done.returncode, json.loads(lines[-1]), done.stderr

        code, first, _ = run("a", "exit3", {"spark.test.onlyFirst": "yes"})
        assert code == 3
        code, second, _ = run("b", "raise")
        assert code == 1
        # The first job left its session running: the driver stopped it before the second.
        assert second["leftOver"] is False
        assert second["pid"] == first["pid"], "one process for both jobs"
        assert (second["mark"], second["rows"]) == ("b", 5)
        assert second["app"] != first["app"], "a SparkContext of its own"
        assert first["onlyFirst"] == "yes"
        assert second["onlyFirst"] is None, "no setting of one job reaches the next"
        code, third, log = run("c", "ok")
        assert code == 0
        assert third["leftOver"] is False
        assert "RuntimeError: the job broke" not in log, "only this job's part of the log"
        # A job needing a jar the running JVM lacks gets a driver started with it.
        jar = tmp_path / "extra.jar"
        with zipfile.ZipFile(jar, "w") as empty:
            empty.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
        code, fourth, _ = run("d", "ok", {"spark.jars": str(jar)})
        assert code == 0
        assert fourth["pid"] != third["pid"]
        assert driver.jars == {str(jar)}
    finally:
        driver.stop()
    assert driver.proc is None
