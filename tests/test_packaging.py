"""The distribution maps the fixed folders to sparkguard.* in editable and wheel installs, and
carries the JVM layer's jar (built by scripts/build-jvm.sh, which scripts/test.sh runs first)."""

from __future__ import annotations

import importlib
import operator
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from sparkguard.spark_lib import sparkconf

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["sparkguard.spark_lib", "sparkguard.sidecar", "sparkguard.operator"]
JAR_IN_WHEEL = "sparkguard/spark_lib/jars/sparkguard-spark.jar"


def test_editable_install_imports_the_three_folders() -> None:
    for name, folder in zip(PACKAGES, ["spark_lib", "sidecar", "operator"], strict=True):
        module = importlib.import_module(name)
        assert Path(module.__file__ or "").parent == ROOT / folder
    # The stdlib module is untouched by our operator/ folder.
    assert Path(operator.__file__ or "").parent != ROOT / "operator"


@pytest.mark.slow
def test_built_wheel_imports_the_three_folders(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    # Build from a clean copy: an in-tree build reuses build/ and *.egg-info/SOURCES.txt from
    # earlier builds, which would let a file missing from the package data slip in.
    source = tmp_path / "source"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", ".cache", "build", "dist", "*.egg-info", "target", "__pycache__",
            "tests", "benchmarks", "charts", "docs", "demo-output",
        ),
    )  # fmt: skip
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(dist),
            str(source),
        ],
        check=True,
        cwd=tmp_path,
    )
    (wheel,) = dist.glob("sparkguard-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in [
        "sparkguard/__init__.py",
        "sparkguard/cli.py",
        "sparkguard/py.typed",
        "sparkguard/spark_lib/filemanager.py",
        "sparkguard/spark_lib/py.typed",
        "sparkguard/sidecar/__init__.py",
        "sparkguard/operator/__init__.py",
        JAR_IN_WHEEL,
    ]:
        assert required in names, f"{required} missing from {wheel.name}"
    assert not any(n.startswith(("tests/", "operator/", "spark_lib/")) for n in names)
    # The JVM module's sources and build tree stay out: only the built jar ships.
    assert not any("/jvm/" in n for n in names), sorted(n for n in names if "/jvm/" in n)
    with zipfile.ZipFile(wheel) as whl:
        assert whl.read(JAR_IN_WHEEL) == sparkconf.jar_path().read_bytes()

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True, system_site_packages=True)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        cwd=tmp_path,
    )
    probe = (
        "import importlib, operator, sparkguard;"
        f"mods = [importlib.import_module(m) for m in {PACKAGES!r}];"
        "print(*[m.__file__ for m in mods]);"
        "assert hasattr(operator, 'itemgetter');"
        # (the base Python has no fsspec: find the jar the way sparkconf.jar_path does)
        "import importlib.resources as r;"
        "print(r.files('sparkguard.spark_lib').joinpath('jars/sparkguard-spark.jar'))"
    )
    out = subprocess.run(
        [python, "-c", probe], check=True, capture_output=True, text=True, cwd=tmp_path
    ).stdout
    assert str(ROOT) not in out  # imported from the wheel, not from the checkout
    assert "site-packages/sparkguard/operator/__init__.py" in out
    assert f"site-packages/{JAR_IN_WHEEL}" in out  # the helper finds the installed jar
