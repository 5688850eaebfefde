"""The distribution maps the fixed folders to sparkguard.* in editable and wheel installs, and
carries the JVM layer's jar (built by scripts/build-jvm.sh, which scripts/test.sh runs first) and
every package's py.typed; setuptools builds it without a warning about its configuration."""

from __future__ import annotations

import importlib
import operator
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

from sparkguard.spark_lib.spark import sparkconf

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["sparkguard.spark_lib", "sparkguard.sidecar", "sparkguard.operator"]
JAR_IN_WHEEL = "sparkguard/spark_lib/jars/sparkguard-spark.jar"
#: What the clean copies leave out: build outputs (but not the jar) and what never ships.
COPY_IGNORE = shutil.ignore_patterns(
    ".git", ".venv", ".cache", "build", "dist", "*.egg-info", "target", "__pycache__",
    "tests", "benchmarks", "charts", "docs", "demo-output",
)  # fmt: skip
#: Imports every package, proves the stdlib operator module is intact, prints where each
#: package, its py.typed and the jar are (the bare venv has no fsspec: find the jar the way
#: sparkconf.jar_path does).
PROBE = (
    "import importlib, operator, importlib.resources as r;"
    f"names = ['sparkguard', *{PACKAGES!r}];"
    "mods = [importlib.import_module(m) for m in names];"
    "print(*[m.__file__ for m in mods]);"
    "assert hasattr(operator, 'itemgetter');"
    "print(*[r.files(m).joinpath('py.typed').is_file() for m in names]);"
    "print(r.files('sparkguard.spark_lib').joinpath('jars/sparkguard-spark.jar'))"
)


#: Imports every module of the library from wherever ``sparkguard`` is installed (pkgutil walks
#: the subpackages) and prints each module's name and file.
MODULES_PROBE = (
    "import importlib, pkgutil, warnings, sparkguard.spark_lib as lib;"
    "warnings.simplefilter('ignore', DeprecationWarning);"  # the old flat paths' aliases
    "infos = pkgutil.walk_packages(lib.__path__, 'sparkguard.spark_lib.');"
    "[print(i.name, importlib.import_module(i.name).__file__) for i in infos]"
)


def _library_modules() -> set[str]:
    """Every module of spark_lib in the checkout (subpackages included, not the JVM module)."""
    source = ROOT / "spark_lib"
    names = set()
    for path in source.rglob("*.py"):
        parts = path.relative_to(source).with_suffix("").parts
        if "jvm" in parts:
            continue
        names.add(".".join(("sparkguard", "spark_lib", *parts)).removesuffix(".__init__"))
    return names - {"sparkguard.spark_lib"}


def _declared_packages() -> list[str]:
    with (ROOT / "pyproject.toml").open("rb") as handle:
        return list(tomllib.load(handle)["tool"]["setuptools"]["packages"])


def test_pyproject_declares_every_subpackage_of_the_library() -> None:
    """``packages`` is an explicit list: a subpackage of spark_lib left out of it would be
    missing from the wheel and the image while every test of the checkout passes."""
    on_disk = {
        ".".join(("sparkguard", *p.parent.relative_to(ROOT).parts))
        for p in (ROOT / "spark_lib").rglob("__init__.py")
        if "jvm" not in p.parts
    }
    assert {"sparkguard.spark_lib.storage", "sparkguard.spark_lib.filemanager"} <= on_disk
    assert on_disk <= set(_declared_packages())


def _setuptools_warnings(output: str) -> list[str]:
    """The warnings setuptools printed while pip built sparkguard (``<Category>: <message>``)."""
    return re.findall(r"\b(\w*Warning|InformationOnly): (.*)", output)


def _probe(python: Path, *, cwd: Path) -> list[str]:
    out = subprocess.run(
        [python, "-c", PROBE], check=True, capture_output=True, text=True, cwd=cwd
    ).stdout
    return out.splitlines()


def test_editable_install_imports_the_three_folders() -> None:
    for name, folder in zip(PACKAGES, ["spark_lib", "sidecar", "operator"], strict=True):
        module = importlib.import_module(name)
        # src/sparkguard/<folder> is a symlink to the top-level folder
        assert Path(module.__file__ or "").parent == ROOT / "src" / "sparkguard" / folder
        assert Path(module.__file__ or "").resolve().parent == ROOT / folder
    # The stdlib module is untouched by our operator/ folder.
    assert Path(operator.__file__ or "").parent != ROOT / "operator"


@pytest.mark.slow
def test_built_wheel_imports_the_three_folders(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    # Build from a clean copy: an in-tree build reuses build/ and *.egg-info/SOURCES.txt from
    # earlier builds, which would let a file missing from the package data slip in.
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=COPY_IGNORE, symlinks=True)
    build = subprocess.run(
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
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    # e.g. "Package 'sparkguard.spark_lib.jars' is absent from the `packages` configuration"
    assert _setuptools_warnings(build.stdout + build.stderr) == [], build.stderr
    (wheel,) = dist.glob("sparkguard-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in [
        # every declared package but the data-only jars/: spark_lib's subpackages included
        *(f"{n.replace('.', '/')}/__init__.py" for n in _declared_packages() if "jars" not in n),
        "sparkguard/cli.py",
        "sparkguard/py.typed",
        "sparkguard/spark_lib/py.typed",
        "sparkguard/sidecar/py.typed",
        "sparkguard/operator/py.typed",
        JAR_IN_WHEEL,
        # the first-write rules admission reads (the jar carries its own copy)
        "sparkguard/spark_lib/spark/first_write_rules.json",
    ]:
        assert required in names, f"{required} missing from {wheel.name}"
    assert [n for n in names if "/jars/" in n] == [JAR_IN_WHEEL]  # no stamp, no placeholder
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
    files, typed, jar = _probe(python, cwd=tmp_path)
    assert str(ROOT) not in files  # imported from the wheel, not from the checkout
    assert "site-packages/sparkguard/operator/__init__.py" in files
    assert typed == "True True True True"
    assert jar.endswith(f"site-packages/{JAR_IN_WHEEL}")  # the helper finds the installed jar

    # Every module of the library, subpackages included, imports from the wheel. The bare venv
    # lacks the library's dependencies (fsspec, pyarrow, pyspark): a .pth lends it those of
    # the running venv, appended after the wheel's site-packages (that directory's own .pth
    # files, among them the editable install's, are not read).
    (site,) = (env_dir / "lib").glob("python3*/site-packages")
    (site / "lent-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    imported = subprocess.run(
        [python, "-c", MODULES_PROBE], check=True, capture_output=True, text=True, cwd=tmp_path
    ).stdout
    where = dict(line.split(" ", 1) for line in imported.splitlines())
    assert set(where) == _library_modules()
    assert all(f"{site}/sparkguard/spark_lib/" in file for file in where.values()), where


@pytest.mark.slow
def test_editable_install_imports_every_package_and_finds_the_jar(tmp_path: Path) -> None:
    """``pip install -e`` of a clean copy (with its built jar) into a fresh venv, as
    scripts/bootstrap.sh does, with the setuptools the project pins (no build isolation, so
    no index is needed)."""
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=COPY_IGNORE, symlinks=True)
    assert (source / "spark_lib" / "jars" / "sparkguard-spark.jar").is_file()
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False, system_site_packages=True)
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-build-isolation",
            "--ignore-installed",  # never touch the running venv's own sparkguard
            "--disable-pip-version-check",
            "--prefix",
            str(env_dir),
            "-e",
            str(source),
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    # Not even setuptools' "Editable installation." notice (be careful with folders named like
    # the package in the working directory), which its import finder prints for any layout but
    # src/: a src layout is installed with a plain .pth, and nothing named sparkguard is left
    # at the top of the checkout to shadow it.
    assert _setuptools_warnings(install.stdout + install.stderr) == [], install.stderr
    pth = list((env_dir / "lib").glob("python3*/site-packages/__editable__.sparkguard-*.pth"))
    assert [p.read_text().strip() for p in pth] == [str(source / "src")]
    files, typed, jar = _probe(env_dir / "bin" / "python", cwd=tmp_path)
    for name, folder in zip(PACKAGES, ["spark_lib", "sidecar", "operator"], strict=True):
        assert f"{source / 'src' / 'sparkguard' / folder / '__init__.py'}" in files.split(), name
        assert (source / "src" / "sparkguard" / folder).resolve() == source / folder
    assert typed == "True True True True"
    assert Path(jar).resolve() == source / "spark_lib" / "jars" / "sparkguard-spark.jar"
