"""scripts/test.sh runs pytest-xdist's loadgroup: every test of one ``xdist_group`` runs on one
worker (the kube tests are grouped by the bench they need). pytest-xdist 3.8 cannot suffix
node ids under pytest 9; ``tests/conftest.py`` does, and this proves the grouping really
happens."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import pytester_conftest

pytest_plugins = ["pytester"]

CONFTEST = pytester_conftest.collection_hook(
    Path(__file__).resolve().parent / "support" / "xdist_groups.py",
    "xdist_groups.suffix_node_ids(config, items)  # what tests/conftest.py runs",
)

TESTS = """
import os
import pytest

def _record(name):
    with open(os.path.join(os.environ["WORKERS_LOG"], name), "w") as out:
        out.write(os.environ.get("PYTEST_XDIST_WORKER", "none"))

@pytest.mark.xdist_group("bench")
@pytest.mark.parametrize("n", range(6))
def test_grouped(n):
    _record(f"grouped-{n}")

@pytest.mark.parametrize("n", range(6))
def test_free(n):
    _record(f"free-{n}")
"""


def test_one_group_runs_on_one_worker(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "workers"
    log.mkdir()
    monkeypatch.setenv("WORKERS_LOG", str(log))
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_groups=TESTS)
    result = pytester.runpytest_subprocess(
        "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider", "-p", "no:randomly"
    )
    result.assert_outcomes(passed=12)
    result.stdout.fnmatch_lines(["*test_grouped?0?@bench*"])
    grouped = {(log / f"grouped-{n}").read_text() for n in range(6)}
    assert len(grouped) == 1, f"the group ran on {sorted(grouped)}"
    assert grouped <= {"gw0", "gw1"}
