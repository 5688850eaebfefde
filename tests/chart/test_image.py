"""The image: hadolint-clean, and its install steps produce working entrypoints.

No Docker engine runs here, so the test performs the Dockerfile's own install script in a fresh
venv and runs every entrypoint the chart and the operator use.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HADOLINT = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")


def _hadolint(dockerfile: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [HADOLINT, "--failure-threshold", "style", "--no-color", str(dockerfile)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_dockerfile_is_hadolint_clean() -> None:
    result = _hadolint(ROOT / "Dockerfile")
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_really_checks(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\n")
    result = _hadolint(bad)
    assert result.returncode != 0
    assert "DL3007" in result.stdout  # :latest
    assert "DL3013" in result.stdout  # unpinned pip install


def test_dockerfile_shape() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert len(re.findall(r"^FROM ", text, re.M)) >= 2, "multi-stage"
    assert re.search(r"^USER 65532", text, re.M), "non-root user"
    # the RUN lines, not comments that mention the steps
    deps = text.index("RUN scripts/image-install.sh deps")
    assert deps < text.index("COPY spark_lib/"), "dependency layer comes before the source"
    assert text.index("COPY spark_lib/") < text.index("RUN scripts/image-install.sh app")


@pytest.mark.slow
def test_image_install_steps_give_working_entrypoints(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    env.pop("VIRTUAL_ENV", None)
    for phase in ("deps", "app"):
        subprocess.run(
            [str(ROOT / "scripts/image-install.sh"), phase, str(venv), str(ROOT)],
            check=True,
            env=env,
            cwd=tmp_path,
        )
    sparkguard = venv / "bin" / "sparkguard"
    for args in (
        ["--help"],
        ["operator", "--help"],
        ["sidecar", "--help"],
        ["rollback", "--help"],
        ["bundle", "--help"],
    ):
        result = subprocess.run(
            [str(sparkguard), *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            check=False,
        )
        assert result.returncode == 0, f"sparkguard {' '.join(args)}: {result.stderr}"
        assert "usage: sparkguard" in result.stdout
    # The initContainer's bundle imports in a bare Python that has nothing installed.
    bundle = tmp_path / "bundle"
    subprocess.run([str(sparkguard), "bundle", "--dest", str(bundle)], check=True, env=env)
    probe = subprocess.run(
        [
            sys.executable,
            "-S",
            "-c",
            "import sys; sys.path.insert(0, sys.argv[1]);"
            "import sparkguard.spark_lib.filemanager as f; print(f.__file__)",
            str(bundle),
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    assert probe.stdout.startswith(str(bundle))
