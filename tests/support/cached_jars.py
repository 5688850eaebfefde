"""Jar lists fetched with Maven into the shared cache (``scripts/fetch-jars.sh``): the S3A
filesystem for PySpark (``s3a``) and Hadoop's minicluster (``hdfs-minicluster``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def cache_root() -> Path:
    """The shared cache's root, as the scripts read it: ``$SPARKGUARD_CACHE`` when set and
    not empty, else ``~/.cache/sparkguard``."""
    return Path(os.environ.get("SPARKGUARD_CACHE") or Path.home() / ".cache" / "sparkguard")


def fetch(jar_list: str, *args: str, pyspark_jars: Path | None = None) -> Path:
    """The directory of ``jar_list``'s jars under ~/.cache/sparkguard (Maven Central the first
    time, nothing afterwards) for the Hadoop of the project's PySpark, or of the PySpark whose
    ``jars`` directory ``pyspark_jars`` is; raises :class:`RuntimeError` with the script's
    message when they cannot be had."""
    command = [str(ROOT / "scripts" / "fetch-jars.sh"), jar_list, *args]
    env = dict(os.environ)
    if pyspark_jars is not None:
        env["SPARKGUARD_PYSPARK_JARS"] = str(pyspark_jars)
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        shown = " ".join(["scripts/fetch-jars.sh", jar_list, *args])
        raise RuntimeError(f"{shown} failed:\n{result.stderr}")
    return Path(result.stdout.strip())
