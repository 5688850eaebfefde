"""benchmarks/timeline.py runs end to end at a small size and prints its last line. Nothing
here is timed; the request counts are deterministic, so their ratio is checked: a reader, a
write and a rollback of a table ten times as old cost the same requests."""

from __future__ import annotations

import re

from tests.test_benchmark_commit_protocol import run_benchmark


def test_timeline_benchmark_runs_at_a_tiny_size() -> None:
    result = run_benchmark("timeline", "--quick", "--sizes", "30,300", "--no-s3", timeout=300)
    assert result.returncode == 0, result.stderr
    last = result.stdout.strip().splitlines()[-1]
    match = re.fullmatch(
        r"timeline: reader requests at 300/30 instants = ([0-9.]+)x, write requests at 300/30 "
        r"= ([0-9.]+)x, rollback requests at 300/30 = ([0-9.]+)x",
        last,
    )
    assert match, last
    assert all(float(ratio) <= 1.2 for ratio in match.groups()), last
    assert "local disk, 300 instants: {'reader': " in result.stdout
