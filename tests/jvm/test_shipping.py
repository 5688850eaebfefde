"""The JVM layer's jar travels with the library: the package, the initContainer bundle and the
image install all carry it, and each refuses, in one line, to go on without it."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sparkguard.spark_lib.spark import sparkconf
from sparkguard.spark_lib.tools import bundle

ROOT = Path(__file__).resolve().parents[2]


def test_jar_path_is_the_built_jar_in_the_package() -> None:
    path = sparkconf.jar_path()
    assert path == ROOT / "spark_lib" / "jars" / "sparkguard-spark.jar"
    with zipfile.ZipFile(path) as jar:
        names = set(jar.namelist())
    assert "io/sparkguard/spark/BuildInfo.class" in names
    assert not any(n.endswith(".java") for n in names)


def test_missing_jar_is_named_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sparkconf, "JARS_DIR", tmp_path)
    with pytest.raises(sparkconf.JarNotBuiltError, match=r"run scripts/build-jvm\.sh"):
        sparkconf.jar_path()


def test_bundle_carries_the_jar_and_not_the_jvm_sources(tmp_path: Path) -> None:
    dest = tmp_path / "lib"
    bundle.build_bundle(dest)
    jar = dest / bundle.JAR_IN_BUNDLE
    assert jar.read_bytes() == sparkconf.jar_path().read_bytes()
    library = dest / "sparkguard" / "spark_lib"
    assert not (library / "jvm").exists()
    assert not list(library.rglob(".*"))  # no stamps, locks or build logs
    manifest = json.loads((dest / "SPARKGUARD_BUNDLE.json").read_text())
    assert manifest["jar"] == "sparkguard/spark_lib/jars/sparkguard-spark.jar"


def test_bundle_holds_every_module_of_the_library_subpackages_included(tmp_path: Path) -> None:
    """The initContainer's copy is the whole library (spark_lib/storage/, spark_lib/spark/, ...),
    and its layers import in a bare Python (no site-packages: only what the bundle holds)."""
    dest = tmp_path / "lib"
    bundle.build_bundle(dest)
    source = ROOT / "spark_lib"
    expected = {p.relative_to(source) for p in source.rglob("*.py") if "jvm" not in p.parts}
    library = dest / "sparkguard" / "spark_lib"
    copied = {p.relative_to(library) for p in library.rglob("*.py")}
    assert expected <= copied
    assert Path("storage/rollback.py") in copied  # a subpackage's module, not just the top
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "import sparkguard.spark_lib.storage.rollback, sparkguard.spark_lib.spark.sparkconf;"
        "import sparkguard.spark_lib.tools.commands as m; print(m.__file__)"
    )
    result = subprocess.run(
        [sys.executable, "-S", "-c", probe, str(dest)],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    assert result.stdout.strip() == str(dest / "sparkguard/spark_lib/tools/commands.py")


def test_bundle_without_the_jar_fails_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sparkconf, "JARS_DIR", tmp_path / "none")
    dest = tmp_path / "lib"
    args = argparse.Namespace(dest=str(dest))
    assert bundle.run(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "build-jvm.sh" in err[0]
    assert not dest.exists()  # nothing half-written


def test_image_install_refuses_a_source_without_the_jar(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "spark_lib").mkdir(parents=True)
    result = subprocess.run(
        [str(ROOT / "scripts" / "image-install.sh"), "app", str(tmp_path / "venv"), str(src)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"image-install.sh: {src}/spark_lib/jars/sparkguard-spark.jar is missing; build it "
        "first (the Dockerfile's jar stage runs scripts/image-build-jar.sh; on a host, "
        "scripts/build-jvm.sh)"
    ]
    assert not (tmp_path / "venv").exists()
