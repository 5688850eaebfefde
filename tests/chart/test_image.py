"""The image: hadolint-clean, built from the source alone, and its install steps produce working
entrypoints.

No Docker engine runs here, so the tests replay the Dockerfile's own stages on the host
(tests/support/dockerfile.py): the jar stage builds the JVM layer's jar from a clean build
context, and the install script runs in a fresh venv with every entrypoint the chart and the
operator use.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support import dockerfile

ROOT = Path(__file__).resolve().parents[2]
JAR = "spark_lib/jars/sparkguard-spark.jar"


@pytest.fixture
def offline_pip(monkeypatch: pytest.MonkeyPatch) -> Path:
    """pip installs from the wheelhouse of scripts/fetch-wheels.sh, never from an index: the
    tests run inside the network guard, where no registry is reached (scripts/test.sh fetches
    the wheelhouse before the guard starts; once complete, the script needs no network)."""
    fetched = subprocess.run(
        [str(ROOT / "scripts" / "fetch-wheels.sh")], capture_output=True, text=True, check=False
    )
    if fetched.returncode != 0:
        raise RuntimeError(f"scripts/fetch-wheels.sh failed:\n{fetched.stderr}")
    wheelhouse = Path(fetched.stdout.strip())
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheelhouse))
    return wheelhouse


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
    build = list(_stages()["build"].instructions)
    steps = [" ".join((i.keyword, *i.args)) for i in build]
    deps = steps.index("RUN scripts/image-install.sh deps /opt/sparkguard/venv /src")
    source = steps.index("COPY spark_lib/ spark_lib/")
    assert deps < source, "dependency layer comes before the source"
    assert source < steps.index("RUN scripts/image-install.sh app /opt/sparkguard/venv /src")


def test_the_images_files_are_readable_by_any_uid_and_writable_by_root_only(
    tmp_path: Path,
) -> None:
    """``image-install.sh app`` ends with its ``perms`` step on the venv: the image runs as any
    UID in group 0 (OpenShift assigns one), so group and others read (and run where the owner
    can) every file, and only the owner writes."""
    tree = tmp_path / "venv"
    (tree / "bin").mkdir(parents=True)
    (tree / "bin" / "tool").write_text("#!/bin/sh\n")
    (tree / "bin" / "tool").chmod(0o744)
    (tree / "private.py").write_text("")
    (tree / "private.py").chmod(0o600)
    (tree / "shared.py").write_text("")
    (tree / "shared.py").chmod(0o666)
    (tree / "bin").chmod(0o700)
    subprocess.run([str(ROOT / "scripts/image-install.sh"), "perms", str(tree)], check=True)
    modes = {p.relative_to(tree).as_posix(): p.stat().st_mode & 0o777 for p in tree.rglob("*")}
    assert modes == {"bin": 0o755, "bin/tool": 0o755, "private.py": 0o644, "shared.py": 0o644}
    script = (ROOT / "scripts/image-install.sh").read_text()
    app = script[script.index("  app)") : script.index("  perms)")]
    assert '"$0" perms "$venv"' in app


def _stages() -> dict[str | None, dockerfile.Stage]:
    return {stage.name: stage for stage in dockerfile.parse(ROOT / "Dockerfile")}


def _pinned_pyspark() -> str:
    match = re.search(r"^pyspark==(\S+)", (ROOT / "constraints.txt").read_text(), re.M)
    assert match, "constraints.txt pins pyspark"
    return match[1]


def test_dockerfile_builds_the_jar_it_ships() -> None:
    stages = _stages()
    # The jar stage: an official JDK 17 + Maven image, pinned by tag, running one script.
    jar = stages["jar"]
    image, _, tag = jar.image.partition(":")
    assert image == "maven", jar.image
    assert "eclipse-temurin-17" in tag, jar.image
    assert not tag.startswith("latest")
    (build_jar,) = jar.find("RUN")
    assert build_jar.args[0] == "scripts/image-build-jar.sh"
    pyspark_jars, src = build_jar.args[1:]
    # ... against the jars of the PySpark the pyspark stage installs from constraints.txt.
    (install_pyspark,) = stages["pyspark"].find("RUN")
    assert install_pyspark.args[:2] == ("scripts/image-install.sh", "pyspark")
    target = install_pyspark.args[2]
    (copy_jars,) = [c for c in jar.find("COPY") if c.flags.get("from") == "pyspark"]
    assert copy_jars.args == (f"{target}/pyspark/jars", pyspark_jars)
    # The Python build stage takes that jar, before it installs the app ...
    build = stages["build"]
    (copy_jar,) = [c for c in build.find("COPY") if c.flags.get("from") == "jar"]
    assert copy_jar.args == (f"{src}/{JAR}", "spark_lib/jars/")
    order = list(build.instructions)
    (install_app,) = [
        r for r in build.find("RUN") if r.args[:2] == ("scripts/image-install.sh", "app")
    ]
    assert order.index(copy_jar) < order.index(install_app)
    # ... and the final image takes that install.
    final = stages[None]
    assert any(
        c.flags.get("from") == "build" and c.args[0] == install_app.args[2]
        for c in final.find("COPY")
    )


def test_dockerignore_keeps_host_build_outputs_out() -> None:
    patterns = dockerfile.read_dockerignore(ROOT / ".dockerignore")
    for path in [
        JAR,  # a jar built on the host must not stand in for the jar stage's
        "spark_lib/jars/.sparkguard-spark.stamp",
        "spark_lib/jvm/target/sparkguard-spark.jar",
        "spark_lib/jvm/s3a/target/classes/x.class",
        ".cache/jvm/build.log",
        ".venv/bin/python",
    ]:
        assert dockerfile.is_ignored(path, patterns), path
    for path in [
        "spark_lib/jvm/pom.xml",
        "spark_lib/jvm/src/main/java/io/sparkguard/spark/BuildInfo.java",
        "spark_lib/spark/writer.py",
        "scripts/image-build-jar.sh",
        "scripts/build-jvm.sh",
        "constraints.txt",
    ]:
        assert not dockerfile.is_ignored(path, patterns), path


def test_jar_stage_refuses_jars_of_another_pyspark(tmp_path: Path) -> None:
    jars = tmp_path / "jars"
    jars.mkdir()
    (jars / "spark-core_2.13-0.0.1.jar").touch()
    result = subprocess.run(
        [str(ROOT / "scripts/image-build-jar.sh"), str(jars), str(ROOT)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"image-build-jar.sh: {jars} holds no spark-core_*-{_pinned_pyspark()}.jar, so it is not "
        f"the pyspark/jars of pyspark=={_pinned_pyspark()} (constraints.txt); pass the directory "
        "that scripts/image-install.sh pyspark installs"
    ]


@pytest.mark.slow
@pytest.mark.usefixtures("offline_pip")
def test_jar_stage_builds_the_jar_from_a_clean_context(tmp_path: Path) -> None:
    """Replays the pyspark and jar stages: the very commands the Dockerfile runs, on a copy of
    the build context that has no jar (Maven is offline once build-jvm.sh has fetched its
    plugins into ~/.cache/sparkguard/m2)."""
    stages = _stages()
    context = tmp_path / "context"
    dockerfile.copy_context(ROOT, context)
    assert not (context / "spark_lib" / "jars").exists()
    assert not (context / "spark_lib" / "jvm" / "target").exists()
    roots = {name: tmp_path / name for name in ("pyspark", "jar")}
    try:
        for name in roots:
            dockerfile.replay(stages[name], context=context, roots=roots)
        (copy_jar,) = [c for c in stages["build"].find("COPY") if c.flags.get("from") == "jar"]
        jar = roots["jar"] / copy_jar.args[0].lstrip("/")
        with zipfile.ZipFile(jar) as archive:
            names = set(archive.namelist())
            manifest = archive.read("META-INF/MANIFEST.MF").decode()
    finally:
        shutil.rmtree(roots["pyspark"], ignore_errors=True)  # half a gigabyte of PySpark
    sources = ROOT / "spark_lib" / "jvm" / "src" / "main" / "java"
    expected = {
        str(java.relative_to(sources).with_suffix(".class")) for java in sources.rglob("*.java")
    }
    assert expected <= names, sorted(expected - names)
    assert not any(n.endswith(".java") for n in names)
    assert f"Built-Against-Spark: {_pinned_pyspark()}" in manifest.splitlines()


@pytest.mark.slow
@pytest.mark.usefixtures("offline_pip")
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
    for path in venv.rglob("*"):  # the perms step: any UID in group 0 reads, root alone writes
        mode = path.lstat().st_mode
        if not path.is_symlink():
            assert mode & 0o044 == 0o044, path
            assert not mode & 0o022, path
    sparkguard = venv / "bin" / "sparkguard"
    # The entrypoint of each process the chart and the operator start (the bundle's runs below).
    for args in (["operator", "--help"], ["sidecar", "--help"], ["rollback", "--help"]):
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
            "import sparkguard.spark_lib.storage.rollback as f; print(f.__file__)",
            str(bundle),
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    assert probe.stdout.startswith(str(bundle))
