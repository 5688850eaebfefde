"""Copy the library into a directory that Spark's Python can import (``sparkguard bundle``).

The operator's initContainer runs this in the sparkguard image and writes into a volume shared
with the driver and executors, whose ``PYTHONPATH`` then includes it; so any Spark image works,
as long as its Python is 3.11+ and it has pyarrow (PySpark's Arrow path needs it anyway) and the
fsspec backend of the table's store (``s3fs`` for S3; it has native dependencies, so it must
come from the image, not from this bundle). The bundle holds pure Python (sparkguard's library
and fsspec) plus the JVM layer's jar, at ``sparkguard/spark_lib/jars/sparkguard-spark.jar``
(for ``spark.jars``; see :mod:`sparkguard.spark_lib.spark.sparkconf`); an install without the jar is
refused. Copies land in a temp directory first and are renamed into place, so a killed
initContainer never leaves a half bundle under the final name.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from sparkguard import __version__
from sparkguard.spark_lib.spark import sparkconf

#: Packages copied whole (pure Python).
PURE_PACKAGES = ("fsspec",)
#: Parts of sparkguard the Spark job needs (never the sidecar or operator).
SPARKGUARD_FILES = ("__init__.py", "py.typed")
#: Never copied from the library's folder: bytecode, and the JVM module's sources and build tree
#: (in a checkout; the built jar is in jars/).
LIBRARY_IGNORE = ("__pycache__", "*.pyc", "jvm", ".*")
#: Where the jar lands, relative to the bundle's root.
JAR_IN_BUNDLE = sparkconf.JAR_IN_BUNDLE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the bundle command's flags."""
    parser.add_argument("--dest", required=True, help="directory to copy the library into")


def _package_dir(name: str) -> Path:
    module = importlib.import_module(name)
    if module.__file__ is None:
        raise SystemExit(f"bundle: cannot locate package {name!r}")
    return Path(module.__file__).parent


def _publish(staging: Path, final: Path) -> None:
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)


def build_bundle(dest: Path) -> list[str]:
    """Copy sparkguard's library and its pure-Python dependencies into ``dest``.

    Returns the top-level names written. Each is staged and renamed into place. Raises
    :class:`~sparkguard.spark_lib.spark.sparkconf.JarNotBuiltError` when this install has no jar.
    """
    sparkconf.jar_path()  # fail before writing anything
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory(dir=dest, prefix=".bundle-") as tmp:
        staging = Path(tmp) / "sparkguard"
        staging.mkdir()
        root = _package_dir("sparkguard")
        for name in SPARKGUARD_FILES:
            shutil.copy2(root / name, staging / name)
        shutil.copytree(
            _package_dir("sparkguard.spark_lib"),
            staging / "spark_lib",
            ignore=shutil.ignore_patterns(*LIBRARY_IGNORE),
        )
        _publish(staging, dest / "sparkguard")
        written.append("sparkguard")
        for package in PURE_PACKAGES:
            package_staging = Path(tmp) / package
            shutil.copytree(
                _package_dir(package),
                package_staging,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
            )
            _publish(package_staging, dest / package)
            written.append(package)
    manifest = {
        "sparkguard": __version__,
        "python": sys.version.split()[0],
        "contents": written,
        "jar": JAR_IN_BUNDLE,
    }
    (dest / "SPARKGUARD_BUNDLE.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return written


def run(args: argparse.Namespace) -> int:
    """Build the bundle; prints what it wrote."""
    dest = Path(args.dest)
    try:
        written = build_bundle(dest)
    except sparkconf.JarNotBuiltError as exc:
        print(f"sparkguard bundle: {exc}", file=sys.stderr)
        return 1
    print(
        f"sparkguard {__version__} bundle written to {dest}: {', '.join(written)}; "
        f"jar: {dest / JAR_IN_BUNDLE}"
    )
    return 0
