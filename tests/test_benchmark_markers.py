"""benchmarks/markers.py refuses a writer-process count it cannot split the writers into, naming
the flag and the range, before it starts any server. Functional only: nothing here is timed."""

from __future__ import annotations

import pytest

from tests.test_benchmark_commit_protocol import load, run_benchmark


@pytest.mark.parametrize("processes", ["0", "17"])
def test_writer_processes_out_of_range_is_refused_naming_the_flag(processes: str) -> None:
    result = run_benchmark("markers", "--writer-processes", processes)
    assert result.returncode == 2
    assert f"--writer-processes {processes}: use 1 to --writers (16)" in result.stderr


def test_job_paths_put_the_marker_directory_under_the_table() -> None:
    markers = load("markers")
    table, directory = markers.job_paths("bucket-1")
    assert table == "bucket-1/tbl"
    assert directory == f"s3://bucket-1/tbl/_sparkguard/markers/{markers.INSTANT}"
