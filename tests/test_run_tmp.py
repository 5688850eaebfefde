"""The run's own temp directory (tests/support/run_tmp.py): everything a run writes to a temp
directory goes under it, the run removes it at its end, and what still lands beside it in the
temp directory is named (and fails the run when no other process could have made it)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from tests.support import run_tmp

REPO = Path(__file__).resolve().parents[1]


def _run() -> Path:
    return Path(os.environ[run_tmp.ENV])


def test_python_temp_files_and_tmp_path_are_in_the_run_directory(tmp_path: Path) -> None:
    run = _run()
    assert os.environ["TMPDIR"] == str(run)
    assert Path(tempfile.gettempdir()) == run
    assert tmp_path.is_relative_to(run)
    child = subprocess.run(
        [sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(child.stdout.strip()) == run


def test_the_test_jvms_are_given_the_run_directory() -> None:
    assert run_tmp.java_options(_run()) in os.environ["SPARK_SUBMIT_OPTS"].split()


def test_litter_is_what_is_new_and_named_like_the_tests_files() -> None:
    before = {"spark-old", "notes.txt"}
    after = {*before, "spark-1", "liblz4-java-2.so", "blockmgr-3", "sg-shared-driver-4", "x.log"}
    assert run_tmp.litter(after, before=before) == [
        "blockmgr-3",
        "liblz4-java-2.so",
        "sg-shared-driver-4",
        "spark-1",
    ]


def test_foreign_makers_are_jvms_and_test_runs_outside_our_process_tree() -> None:
    processes = {
        1: (0, "/sbin/init"),
        10: (1, "bash scripts/test.sh"),
        11: (10, "python -m pytest -n 2"),  # ours
        12: (11, "python -c import xdist.worker"),
        13: (12, "java -cp spark.jar org.apache.spark.deploy.SparkSubmit pyspark-shell"),
        20: (1, "java -jar someone-elses.jar"),
        21: (1, "python -m pytest tests/jvm"),
        22: (1, "vim notes.txt"),
    }
    assert run_tmp.foreign_makers(processes, ours=11) == {
        20: "java -jar someone-elses.jar",
        21: "python -m pytest tests/jvm",
    }


def _nested_run(
    tmp_path: Path, test: str, *, alone: bool
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """A pytest run of ``test`` with this suite's root conftest, its temp directory
    ``<tmp_path>/root``; ``alone``: it sees no other process that could make litter."""
    root = tmp_path / "root"
    root.mkdir()
    project = tmp_path / "project"
    project.mkdir()
    patch = "run_tmp.foreign_makers = lambda processes, *, ours: {}" if alone else ""
    (project / "conftest.py").write_text(
        textwrap.dedent(
            f"""
            from tests.support import run_tmp
            {patch}
            pytest_plugins = ["tests.conftest"]
            """
        )
    )
    (project / "test_nested.py").write_text(textwrap.dedent(test))
    env = {k: v for k, v in os.environ.items() if k != run_tmp.ENV}
    env["TMPDIR"] = str(root)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-o",
            f"pythonpath={REPO}",
            str(project),
        ],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    return result, root


def test_a_run_fails_on_what_it_left_beside_its_directory(tmp_path: Path) -> None:
    leak = """
        import os
        from pathlib import Path

        def test_leaks():
            run = Path(os.environ["SPARKGUARD_TEST_TMP"])
            (run.parent / "sg-leaked-by-a-test").write_text("")
            (run / "spark-inside-the-run-directory").mkdir()
        """
    result, root = _nested_run(tmp_path, leak, alone=True)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 passed" in result.stdout
    assert f"the run left sg-leaked-by-a-test in {root}" in result.stdout
    assert sorted(p.name for p in root.iterdir()) == ["sg-leaked-by-a-test"]  # its own: gone


def test_a_failed_run_removes_its_directory_too(tmp_path: Path) -> None:
    fails = """
        import os
        from pathlib import Path

        def test_fails():
            (Path(os.environ["SPARKGUARD_TEST_TMP"]) / "spark-1").mkdir()
            assert False
        """
    result, root = _nested_run(tmp_path, fails, alone=False)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 failed" in result.stdout
    assert "the run left" not in result.stdout
    assert list(root.iterdir()) == []
