"""docs/operator.md's Events table lists every Event reason the operator posts.

The reasons are found in operator/'s source, not in a list kept by hand: the values of every
``Reason`` enum, every ``REASON`` constant, and every CamelCase string literal given as
``reason=`` to a call (a decision's ``reason=`` is a lower-case sentence, never an Event's).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CAMEL = re.compile(r"[A-Z][a-z]+(?:[A-Z][a-z]+)+|[A-Z][a-z]{3,}")


def emitted_reasons() -> dict[str, str]:
    """Every Event reason in operator/*.py, with the file that names it."""
    found: dict[str, str] = {}
    for source in sorted((REPO / "operator").glob("*.py")):
        tree = ast.parse(source.read_text(), filename=str(source))
        for node in ast.walk(tree):
            values: list[ast.expr] = []
            if isinstance(node, ast.ClassDef) and node.name == "Reason":
                values = [s.value for s in node.body if isinstance(s, ast.Assign)]
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == "REASON" for t in targets):
                    values = [node.value] if node.value is not None else []
            elif isinstance(node, ast.Call):
                values = [k.value for k in node.keywords if k.arg == "reason"]
            for value in values:
                if (
                    isinstance(value, ast.Constant)
                    and isinstance(value.value, str)
                    and CAMEL.fullmatch(value.value)
                ):
                    found.setdefault(value.value, source.name)
    return found


def documented_reasons() -> set[str]:
    """The first column of the table under docs/operator.md's "## Events"."""
    text = (REPO / "docs" / "operator.md").read_text()
    section = text.split("\n## Events\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([A-Za-z]+)` \|", section, flags=re.MULTILINE))


def test_every_event_the_operator_posts_is_in_the_docs_table() -> None:
    emitted = emitted_reasons()
    # the finder finds the four kinds of place a reason is named
    assert {"RollbackStarted", "RolledBackOnDelete", "Unprotected"} <= emitted.keys()
    assert "ResubmissionAbandoned" in emitted  # a literal reason= in recreation.py
    missing = {r: f for r, f in emitted.items() if r not in documented_reasons()}
    assert not missing, f"add these Events to docs/operator.md's Events table: {missing}"


def test_the_docs_table_lists_no_event_the_operator_never_posts() -> None:
    assert documented_reasons() - emitted_reasons().keys() == set()
