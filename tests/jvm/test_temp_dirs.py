"""The test drivers keep their temp files in the run's own directory (tests/support/run_tmp.py),
which the run removes at its end: a killed driver's unpacked native libraries and Spark
directories do not stay behind in /tmp."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.jvm.conftest import run_job
from tests.support import run_tmp

pytestmark = pytest.mark.spark


@pytest.mark.parametrize(
    "conf",
    [{}, {"spark.driver.memory": "1g"}],  # a launch setting: a process of its own
    ids=["shared-driver", "own-process"],
)
def test_a_test_driver_keeps_its_temp_files_in_the_run_directory(
    tmp_path: Path, conf: dict[str, str]
) -> None:
    run = Path(os.environ[run_tmp.ENV])
    found = run_job("temp_dirs.py", str(tmp_path / "out"), conf=conf)
    assert Path(found["tmpdir"]) == run
    names = [Path(lib).name for lib in found["nativeLibs"]]
    assert any(name.startswith("liblz4-java") for name in names), found
    assert any("snappyjava" in name for name in names), found
    for path in [found["sparkFiles"], *found["nativeLibs"]]:
        assert Path(path).is_relative_to(run), path
