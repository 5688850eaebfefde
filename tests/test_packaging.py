"""The distribution maps the fixed folders to sparkguard.* in editable and wheel installs."""

from __future__ import annotations

import importlib
import operator
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["sparkguard.spark_lib", "sparkguard.sidecar", "sparkguard.operator"]


def test_editable_install_imports_the_three_folders() -> None:
    for name, folder in zip(PACKAGES, ["spark_lib", "sidecar", "operator"], strict=True):
        module = importlib.import_module(name)
        assert Path(module.__file__ or "").parent == ROOT / folder
    # The stdlib module is untouched by our operator/ folder.
    assert Path(operator.__file__ or "").parent != ROOT / "operator"


@pytest.mark.slow
def test_built_wheel_imports_the_three_folders(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
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
            str(ROOT),
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
    ]:
        assert required in names, f"{required} missing from {wheel.name}"
    assert not any(n.startswith(("tests/", "operator/", "spark_lib/")) for n in names)

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
        "assert hasattr(operator, 'itemgetter')"
    )
    out = subprocess.run(
        [python, "-c", probe], check=True, capture_output=True, text=True, cwd=tmp_path
    ).stdout
    assert str(ROOT) not in out  # imported from the wheel, not from the checkout
    assert "site-packages/sparkguard/operator/__init__.py" in out
