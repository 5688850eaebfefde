"""A streaming file sink through sparkguard's JVM protocol on local disk, 2,000 micro-batches:
storage operations, names listed, S3-style requests and latency per batch, batches 100-200
against the last 100: the per-batch cost must stay flat (docs/benchmarks.md).

    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/stream_timeline.py [--batches 2000] [--off]

``--off`` runs it with ``spark.sparkguard.timeline.snapshotEvery=0`` (no compaction).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))  # appended: never shadow the stdlib

from tests.jvm import stream_cost


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--snapshot-every", type=int, default=10)
    parser.add_argument("--off", action="store_true", help="snapshotEvery=0")
    args = parser.parse_args()
    every = 0 if args.off else args.snapshot_every
    with tempfile.TemporaryDirectory(prefix="sg-stream-cost-") as tmp:
        result = stream_cost.measure(Path(tmp), args.batches, every)
    summary = stream_cost.windows(result, (100, 200))
    over = stream_cost.within(summary, ("ops", "listed", "requests", "store_ms", "ms"))
    print(json.dumps({"batches": result["batches"], "snapshotEvery": every, "summary": summary}))
    for key, (early, late) in summary.items():
        print(
            f"stream timeline: {key} per batch, batches 100-200: {early:.1f},"
            f" last 100: {late:.1f} ({late / early:.2f}x)"
        )
    print("within 10%" if not over else f"over 10%: {over}")
    return 0 if not over else 1


if __name__ == "__main__":
    sys.exit(main())
