"""benchmarks/timeline.py runs end to end at a tiny size and prints its last line. Functional
only: nothing here is timed, and the request counts are the benchmark's to report."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_timeline_benchmark_runs_at_a_tiny_size() -> None:
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / "timeline.py"), "--quick", "--sizes", "5,30", "--no-s3"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert re.fullmatch(
        r"timeline: reader requests at 30/5 instants = [0-9.]+x, write requests at 30/5 = "
        r"[0-9.]+x, rollback requests at 30/5 = [0-9.]+x",
        last,
    ), last
    assert "local disk, 30 instants: {'reader': " in result.stdout
