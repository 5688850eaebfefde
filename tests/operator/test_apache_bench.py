"""The Apache operator bench's pure steps and its build script's refusals (no bench, no
build: ``tests/kubebench/apache.py``, ``tests/kubebench/build-apache-operator.sh``)."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

from tests.kubebench.apache import APACHE_OPERATOR_BUILD_SCRIPT, with_properties


def test_properties_are_set_in_place_and_the_others_appended() -> None:
    text = "# a comment\nspark.a=1\n#spark.b=commented\nspark.b = 2\nspark.c=3\n"
    out = with_properties(text, {"spark.b": "20", "spark.d": "4"})
    assert out == "# a comment\nspark.a=1\n#spark.b=commented\nspark.b=20\nspark.c=3\nspark.d=4\n"


def test_a_source_other_than_the_release_is_refused(tmp_path: Path) -> None:
    """The tarball's uncompressed tar must hash to the pinned sha256: anything else is refused
    before it is unpacked into the cache, and Maven is never run."""
    upstream = tmp_path / "upstream"
    upstream.mkdir()
    with tarfile.open(upstream / "apache-spark-kubernetes-operator-1.0.0.tar.gz", "w:gz") as tar:
        data = b"rootProject.name = 'apache-spark-kubernetes-operator'\n"
        info = tarfile.TarInfo("spark-kubernetes-operator-1.0.0/settings.gradle")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    cache = tmp_path / "cache"
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "SPARKGUARD_CACHE": str(cache),
        "SPARKGUARD_UPSTREAM_DIR": str(upstream),
    }
    proc = subprocess.run(
        ["bash", str(APACHE_OPERATOR_BUILD_SCRIPT)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert "refusing to build it" in proc.stderr
    assert proc.stdout == ""
    base = cache / "apache-operator" / "1.0.0"
    assert not (base / "src").exists()
    assert not (base / "build").exists()


def test_the_build_without_maven_fails_loudly(tmp_path: Path) -> None:
    tools = tmp_path / "bin"  # what the script needs before it looks for mvn, and no mvn
    tools.mkdir()
    for tool in ("dirname", "basename"):
        found = shutil.which(tool)
        assert found is not None
        (tools / tool).symlink_to(found)
    proc = subprocess.run(
        [shutil.which("bash") or "bash", str(APACHE_OPERATOR_BUILD_SCRIPT)],
        env={"PATH": str(tools), "HOME": str(tmp_path), "SPARKGUARD_CACHE": str(tmp_path)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1
    assert "'mvn' not found" in proc.stderr
    assert proc.stdout == ""
