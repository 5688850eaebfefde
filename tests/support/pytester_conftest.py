"""A pytester run's conftest that loads one of ``tests/support``'s modules by its path (they
import nothing of the project, so a run in a temporary directory can use them) and calls it
from a last collection hook, as ``tests/conftest.py`` does in the real run."""

from __future__ import annotations

import textwrap
from pathlib import Path


def collection_hook(module: Path, body: str) -> str:
    """The conftest's text: ``module`` imported under its file's stem, then ``body`` (lines
    with ``config`` and ``items`` in scope) as a ``trylast`` ``pytest_collection_modifyitems``."""
    name = module.stem
    hook = textwrap.indent(textwrap.dedent(body).strip(), "    ")
    return f"""
import importlib.util
import pytest

_spec = importlib.util.spec_from_file_location({name!r}, {str(module)!r})
{name} = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module({name})

@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
{hook}
"""
