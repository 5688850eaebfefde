"""``tests/support/schedule.py``: the longest work unit is handed out first, a unit's tests stay
together and in order, an unknown module counts the default, and ``record`` turns a JUnit XML
into the per-module seconds ``tests/durations.json`` holds."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support import pytester_conftest, schedule

pytest_plugins = ["pytester"]


@dataclass
class _Mark:
    args: tuple[str, ...]


@dataclass
class _Item:
    nodeid: str
    groups: list[str] = field(default_factory=list)

    def iter_markers(self, name: str) -> list[_Mark]:
        return [_Mark((g,)) for g in self.groups] if name == "xdist_group" else []


def test_the_heaviest_unit_goes_first_and_keeps_its_tests_in_order() -> None:
    items = [
        _Item("tests/a.py::t1"),
        _Item("tests/node.py::n1", ["kube-node"]),
        _Item("tests/b.py::t2"),
        _Item("tests/node.py::n2", ["kube-node"]),
        _Item("tests/c.py::t3", ["spark-session:tests/c.py"]),
        _Item("tests/c.py::t4", ["spark-session:tests/c.py"]),
        _Item("tests/new.py::t5"),
    ]
    per_test = {"tests/a.py": 5.0, "tests/b.py": 50.0, "tests/node.py": 100.0, "tests/c.py": 4.0}
    schedule.order(items, per_test)
    assert [i.nodeid for i in items] == [
        "tests/node.py::n1",  # 200 s as one unit
        "tests/node.py::n2",
        "tests/b.py::t2",  # 50
        "tests/c.py::t3",  # 8 as one unit
        "tests/c.py::t4",
        "tests/a.py::t1",  # 5
        "tests/new.py::t5",  # unknown: the default, 1
    ]


def test_record_sums_each_module_and_load_gives_seconds_per_test(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    (root / "tests" / "e2e").mkdir(parents=True)
    (root / "tests" / "e2e" / "test_x.py").write_text("")
    (root / "tests" / "test_y.py").write_text("")
    xml = tmp_path / "run.xml"
    xml.write_text(
        "<testsuites><testsuite>"
        '<testcase classname="tests.e2e.test_x" name="a" time="10.5"/>'
        '<testcase classname="tests.e2e.test_x.TestCase" name="b" time="1.5"/>'
        '<testcase classname="tests.test_y" name="c" time="3"/>'
        '<testcase classname="gone.module" name="d" time="99"/>'
        "</testsuite></testsuites>"
    )
    recorded = schedule.record(xml, root=root)
    assert recorded["modules"] == {
        "tests/e2e/test_x.py": {"tests": 2, "seconds": 12.0},
        "tests/test_y.py": {"tests": 1, "seconds": 3.0},
    }
    durations = tmp_path / "durations.json"
    durations.write_text(json.dumps(recorded))
    assert schedule.load(durations) == {"tests/e2e/test_x.py": 6.0, "tests/test_y.py": 3.0}
    assert schedule.load(tmp_path / "missing.json") == {}


@pytest.mark.parametrize(
    ("argv", "content", "error"),
    [
        ([], None, "usage: python tests/support/schedule.py record RUN.xml"),
        (["recrod", "run.xml"], None, "usage: python tests/support/schedule.py record RUN.xml"),
        (["record", "missing.xml"], None, "cannot read missing.xml as a JUnit XML report"),
        (["record", "run.xml"], "<testsuites><testcase", "cannot read run.xml as a JUnit XML"),
    ],
)
def test_record_refuses_bad_arguments_and_files_in_one_line(
    *,
    argv: list[str],
    content: str | None,
    error: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    if content is not None:
        (tmp_path / "run.xml").write_text(content)
    assert schedule.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""  # nothing that a redirect into tests/durations.json would keep
    assert err.count("\n") == 1
    assert error in err, err


def test_the_checked_in_durations_name_only_modules_that_exist() -> None:
    """A module renamed or removed leaves a stale entry: harmless to a run (it only orders),
    but the file is refreshed with the tree (tests/README.md, "How two cores are used")."""
    per_test = schedule.load()
    assert per_test, "tests/durations.json is missing or empty"
    missing = [m for m in per_test if not (schedule.TESTS.parent / m).is_file()]
    assert not missing, f"tests/durations.json names modules that are gone: {missing}"


CONFTEST = pytester_conftest.collection_hook(
    Path(schedule.__file__).resolve(),
    """
    import json, os
    if getattr(config.option, "loadgroup", False):
        schedule.order(items, json.loads(os.environ["PER_TEST"]))
    """,
)

LIGHT = """
import os, time
import pytest

@pytest.mark.parametrize("n", range(4))
def test_light(n):
    with open(os.path.join(os.environ["ORDER_LOG"], f"light-{n}"), "w") as out:
        out.write(str(time.monotonic_ns()))
"""
HEAVY = """
import os, time

def test_heavy():
    with open(os.path.join(os.environ["ORDER_LOG"], "heavy"), "w") as out:
        out.write(str(time.monotonic_ns()))
"""


def test_xdist_hands_out_the_heaviest_test_first(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real xdist run with scripts/test.sh's options: the heavy module's test, collected
    last, starts before every light one."""
    log = tmp_path / "order"
    log.mkdir()
    monkeypatch.setenv("ORDER_LOG", str(log))
    monkeypatch.setenv("PER_TEST", json.dumps({"test_a_light.py": 1.0, "test_b_heavy.py": 60.0}))
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_a_light=LIGHT, test_b_heavy=HEAVY)
    result = pytester.runpytest_subprocess(
        "-n", "1", "--dist", "loadgroup", "--no-loadscope-reorder", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=5)
    started = {p.name: int(p.read_text()) for p in log.iterdir()}
    assert started["heavy"] < min(v for k, v in started.items() if k != "heavy"), started
