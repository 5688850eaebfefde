"""Finding the driver's process in a /proc-like directory (the regular-sidecar fallback)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from sparkguard.sidecar import process_watch

SPARK_SUBMIT = re.compile("org.apache.spark.deploy.SparkSubmit")


def _process(proc: Path, pid: int, argv: list[str], *, parent: int = 1) -> None:
    entry = proc / str(pid)
    entry.mkdir()
    (entry / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))
    (entry / "stat").write_text(f"{pid} (a (weird) name) S {parent} 1 1 0")


def test_matches_the_command_line_as_pgrep_f_does(tmp_path: Path) -> None:
    _process(tmp_path, 1, ["/pause"])
    _process(tmp_path, 7, ["/usr/bin/tini", "-s", "--", "/opt/spark/bin/spark-submit"])
    _process(tmp_path, 9, ["java", "-cp", "/opt/spark/jars/*", SPARK_SUBMIT.pattern, "--conf"])
    _process(tmp_path, 12, [])  # a zombie: its command line reads empty
    (tmp_path / "self").mkdir()  # not a pid
    assert process_watch.matching_pids(SPARK_SUBMIT, proc_root=tmp_path) == [9]
    assert process_watch.matching_pids(SPARK_SUBMIT, proc_root=tmp_path, exclude=[9]) == []
    assert process_watch.matching_pids(re.compile("^/pause$"), proc_root=tmp_path) == [1]
    assert process_watch.matching_pids(SPARK_SUBMIT, proc_root=tmp_path / "missing") == []


def test_own_lineage_is_the_process_and_its_ancestors(tmp_path: Path) -> None:
    _process(tmp_path, 1, ["/pause"], parent=0)
    _process(tmp_path, 5, ["sh", "-c", "sparkguard sidecar"], parent=1)
    _process(tmp_path, 8, ["sparkguard", "sidecar"], parent=5)
    _process(tmp_path, 9, ["java"], parent=1)
    assert process_watch.own_lineage(8, proc_root=tmp_path) == {8, 5, 1}
    assert os.getpid() in process_watch.own_lineage(os.getpid())
