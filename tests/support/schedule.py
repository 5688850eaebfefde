"""Longest work first: the order in which pytest-xdist hands out work (no project imports, so a
pytester run can load it by path).

Under ``--dist loadgroup --no-loadscope-reorder`` xdist hands its work units (a group's tests,
or one ungrouped test) to whichever worker runs low, in collection order. Two cores and a few
units of minutes each (a cluster with real pods, the Apache operator's bench, the HDFS
minicluster) make that order the run's length: a long unit handed out last runs alone while
the other worker idles. :func:`order` sorts the collection so that the units with the most
recorded seconds come first (longest processing time first), each unit's tests keeping their
order. The seconds come from ``tests/durations.json`` (seconds per test, averaged over each
module, from a run's JUnit XML: ``python tests/support/schedule.py record RUN.xml``); a module
it does not know counts :data:`DEFAULT_SECONDS` per test. The order decides when a test runs,
never whether: a stale file only makes a run longer.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Final, Protocol, TypeVar
from xml.etree import ElementTree

TESTS: Final = Path(__file__).resolve().parents[1]
DURATIONS: Final = TESTS / "durations.json"
#: the seconds of a test whose module the file does not know (about the suite's median)
DEFAULT_SECONDS: Final = 1.0


class _Item(Protocol):
    @property
    def nodeid(self) -> str: ...

    def iter_markers(self, name: str) -> Iterable[object]: ...


_T = TypeVar("_T", bound=_Item)


def module_of(nodeid: str) -> str:
    """``tests/x/test_y.py`` of a node id (any ``@group`` suffix or parameters left out)."""
    return nodeid.split("::", 1)[0]


def load(path: Path = DURATIONS) -> dict[str, float]:
    """Seconds per test of each recorded module; ``{}`` when the file is missing."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return {
        module: float(entry["seconds"]) / max(int(entry["tests"]), 1)
        for module, entry in raw.get("modules", {}).items()
    }


def _unit(item: _Item) -> str:
    names = []
    for mark in item.iter_markers("xdist_group"):
        args: tuple[object, ...] = tuple(getattr(mark, "args", ()))
        names.append(str(args[0]) if args else "default")
    names.sort()
    return "@" + "_".join(names) if names else item.nodeid


def order(items: list[_T], per_test: dict[str, float]) -> None:
    """Sort ``items`` in place: the work unit with the most estimated seconds first (a stable
    sort: a unit's tests, and units of equal weight, keep the collection's order)."""
    weight: dict[str, float] = defaultdict(float)
    for item in items:
        weight[_unit(item)] += per_test.get(module_of(item.nodeid), DEFAULT_SECONDS)
    items.sort(key=lambda item: -weight[_unit(item)])


def record(junit_xml: Path, *, root: Path = TESTS.parent) -> dict[str, object]:
    """The ``durations.json`` of a run: per module, its tests and their seconds (setup, call
    and teardown, as JUnit XML reports them by default)."""
    modules: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    # our own run's report, written by pytest on this machine: not untrusted input
    for case in ElementTree.parse(junit_xml).getroot().iter("testcase"):  # noqa: S314
        module = _path_of(case.get("classname", ""), root)
        if module is None:
            continue
        modules[module][0] += 1
        modules[module][1] += float(case.get("time") or 0.0)
    return {
        "source": "python tests/support/schedule.py record RUN.xml (a whole warm run's JUnit XML)",
        "modules": {
            module: {"tests": int(n), "seconds": round(seconds, 1)}
            for module, (n, seconds) in sorted(modules.items())
        },
    }


def _path_of(classname: str, root: Path) -> str | None:
    """``tests.e2e.test_x`` or ``tests.e2e.test_x.TestCase``: the module's file path."""
    parts = classname.split(".")
    while parts:
        candidate = "/".join(parts) + ".py"
        if (root / candidate).is_file():
            return candidate
        parts.pop()
    return None


USAGE: Final = "usage: python tests/support/schedule.py record RUN.xml > tests/durations.json"


def main(argv: list[str]) -> int:
    """``record RUN.xml``: the durations file on stdout; a usage or read error on stderr (one
    line naming the file and the fix) and exit status 2, nothing on stdout."""
    if len(argv) != 2 or argv[0] != "record":
        print(USAGE, file=sys.stderr)
        return 2
    try:
        recorded = record(Path(argv[1]))
    except (OSError, ElementTree.ParseError) as exc:
        print(
            f"schedule.py record: cannot read {argv[1]} as a JUnit XML report ({exc}): give the "
            "file pytest's --junitxml wrote",
            file=sys.stderr,
        )
        return 2
    print(json.dumps(recorded, indent=1, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
