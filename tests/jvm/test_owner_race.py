"""O4 made atomic in the JVM protocol (docs/storage-contract.md, "Owner claims"): two Spark
drivers of different owners that open a write of one job id on one table at the same
millisecond, or a few milliseconds apart, never both write: exactly one does, round after
round (``tests/jvm/jobs/owner_race.py`` runs the protocol's driver steps in each). One pair of
drivers runs both timings, alternating round by round (the second driver's delay is 0 ms in
even rounds, 3 ms in odd ones). And across languages: the JVM protocol against the Python
writer (``owner_race_python.py``), both reading and writing the same claim files."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.spark import sparkconf
from sparkguard.spark_lib.storage import timeline
from tests.jvm.conftest import job_command, job_env

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROUNDS = 30


@pytest.mark.parametrize(
    ("delays_ms", "second"),
    [("0,3", "owner_race.py"), ("0", "owner_race_python.py")],
    ids=["same-millisecond-and-3ms-apart", "jvm-vs-python"],
)
def test_two_drivers_opening_one_job_at_once_exactly_one_writes(
    delays_ms: str, second: str, tmp_path: Path
) -> None:
    root = tmp_path / "race"
    root.mkdir()
    drivers = {}
    for name, script, owner, delay in (
        ("a", "owner_race.py", "k8s:ns/a/1", "0"),
        ("b", second, "k8s:ns/b/2", delays_ms),
    ):
        conf = sparkconf.build_spark_conf("race", owner=owner)
        drivers[name] = subprocess.Popen(
            job_command(script, str(root), str(ROUNDS), delay, name, conf=conf),
            env=job_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    try:
        for round_no in range(ROUNDS):
            deadline = time.monotonic() + 180
            while not all((root / f"ready-{round_no}-{n}").exists() for n in drivers):
                for name, proc in drivers.items():
                    if proc.poll() is not None:
                        pytest.fail(
                            f"driver {name} exited {proc.returncode}:\n{proc.stderr.read()}"
                        )
                assert time.monotonic() < deadline, f"round {round_no}: a driver never got ready"
                time.sleep(0.001)
            (root / f"go-{round_no}").touch()
        results = {}
        for name, proc in drivers.items():
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err[-3000:]
            results[name] = json.loads(out.strip().splitlines()[-1])
    finally:
        for proc in drivers.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    both_opened = 0
    for round_no in range(ROUNDS):
        outcome = {name: results[name][str(round_no)] for name in drivers}
        assert sorted(outcome.values()).count("wrote") == 1, (round_no, outcome)
        manager, path = filemanager.resolve(str(root / f"t{round_no}"))
        states = [s.state for s in timeline.Timeline(manager, path).statuses()]
        assert states.count(timeline.State.COMMITTED) == 1, (round_no, states)
        assert timeline.State.INFLIGHT not in states, (round_no, states)
        both_opened += len(states) == 2
    print(f"rounds where both drivers opened an instant: {both_opened}/{ROUNDS}")
