"""The streaming file sink's cost per micro-batch as its timeline ages.

Shared by ``tests/jvm/test_stream_timeline_cost.py`` (a short run) and
``benchmarks/stream_timeline.py`` (2,000 batches). Runs ``tests/jvm/jobs/stream_requests.py``:
a parquet file-sink query through sparkguard's JVM protocol on local disk, one row per
micro-batch, with the JVM module's ``CountingAtomicStore`` counting the protocol's storage
operations per instant.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from sparkguard.spark_lib.spark import sparkconf
from tests.jvm.conftest import run_job

JOB = "stream-cost"
TOLERANCE = 0.10


def measure(workdir: Path, batches: int, snapshot_every: int) -> dict[str, Any]:
    """Run ``batches`` micro-batches; per batch: ``ops``, ``listed``, ``requests``, ``store_ms``
    (time in the protocol's storage operations) and ``ms`` (the batch's time)."""
    workdir.mkdir(parents=True, exist_ok=True)
    conf = {
        **sparkconf.build_spark_conf(JOB),
        "spark.hadoop.sparkguard.test.countStoreOps": "true",
        "spark.sparkguard.timeline.snapshotEvery": str(snapshot_every),
    }
    out = run_job(
        "stream_requests.py",
        str(workdir / "sink"),
        str(workdir / "cp"),
        str(batches),
        conf=conf,
        timeout=max(300, batches * 2),
    )
    counts = out["ops"]
    return {
        "batches": out["batches"],
        "ops": [c[0] for c in counts],
        "listed": [c[1] for c in counts],
        "requests": [c[2] for c in counts],
        "store_ms": [c[3] / 1e6 for c in counts],
        "ms": out["ms"],
    }


def windows(
    result: dict[str, Any], early: tuple[int, int], last: int = 100
) -> dict[str, tuple[float, float]]:
    """Per metric: (mean over batches ``early``, mean over the ``last`` batches); the batch's
    latency ``ms`` as medians (a loaded machine's stray pauses)."""
    start, end = early
    summary: dict[str, tuple[float, float]] = {}
    for key in ("ops", "listed", "requests", "store_ms"):
        values = result[key]
        # the last bucket ends with the query's stop, not with a next batch: leave it out
        values = values[:-1]
        summary[key] = (statistics.fmean(values[start:end]), statistics.fmean(values[-last:]))
    ms = result["ms"]
    summary["ms"] = (statistics.median(ms[start:end]), statistics.median(ms[-last:]))
    return summary


def within(summary: dict[str, tuple[float, float]], keys: tuple[str, ...]) -> list[str]:
    """The metrics of ``keys`` whose late window exceeds the early one by more than 10%."""
    return [
        f"{key}: {late:.1f} vs {early:.1f}"
        for key in keys
        for early, late in [summary[key]]
        if late > early * (1 + TOLERANCE)
    ]
