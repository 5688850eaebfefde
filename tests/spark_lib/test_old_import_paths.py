"""The flat import paths earlier releases documented still work, with a DeprecationWarning.

``spark_lib``'s modules live in subpackages now (docs/decisions.md, "Layout and packaging").
The paths the README and docs showed users (``from sparkguard.spark_lib import writer,
reader``, ``sparkguard.spark_lib.marker_http.HttpMarkerClient``, ``sparkguard.spark_lib.
rollback``) are aliases of the moved modules: the very same module object, and a warning that
names the new path.
"""

# rewrite_imports: skip-file (this module names the old paths on purpose)

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Iterator

import pytest

#: old path -> the module it is now
ALIASES = {
    "sparkguard.spark_lib.writer": "sparkguard.spark_lib.spark.writer",
    "sparkguard.spark_lib.reader": "sparkguard.spark_lib.storage.reader",
    "sparkguard.spark_lib.rollback": "sparkguard.spark_lib.storage.rollback",
    "sparkguard.spark_lib.marker_http": "sparkguard.spark_lib.spark.marker_http",
}


@pytest.fixture
def forget_aliases() -> Iterator[None]:
    """Each test imports the old paths afresh (an alias warns when it is first imported)."""
    import sparkguard.spark_lib as lib

    def forget() -> None:
        for old in ALIASES:
            sys.modules.pop(old, None)
            lib.__dict__.pop(old.rsplit(".", 1)[1], None)

    forget()
    yield
    forget()


@pytest.mark.usefixtures("forget_aliases")
@pytest.mark.parametrize(("old", "new"), ALIASES.items())
def test_old_path_is_the_new_module_and_warns(old: str, new: str) -> None:
    with pytest.warns(DeprecationWarning, match=rf"{old} is deprecated; import {new} instead"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)


@pytest.mark.usefixtures("forget_aliases")
def test_readme_import_line_keeps_working() -> None:
    namespace: dict[str, object] = {}
    with pytest.warns(DeprecationWarning, match="is deprecated; import") as caught:
        exec("from sparkguard.spark_lib import writer, reader", namespace)  # noqa: S102
    assert namespace["writer"] is importlib.import_module("sparkguard.spark_lib.spark.writer")
    assert namespace["reader"] is importlib.import_module("sparkguard.spark_lib.storage.reader")
    assert callable(namespace["reader"].committed_paths)  # type: ignore[attr-defined]
    assert sorted(str(w.message).split()[0] for w in caught) == [
        "sparkguard.spark_lib.reader",
        "sparkguard.spark_lib.writer",
    ]


def test_a_script_sees_the_warning_at_its_own_import_line() -> None:
    """Python shows a DeprecationWarning by default only when it is attributed to ``__main__``:
    the alias points it at the importing line, not at the import machinery."""
    script = (
        "from sparkguard.spark_lib.marker_http import HttpMarkerClient\nprint(HttpMarkerClient)"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert "sparkguard.spark_lib.spark.marker_http.HttpMarkerClient" in result.stdout
    assert result.stderr.startswith(
        "<string>:1: DeprecationWarning: sparkguard.spark_lib.marker_http"
    )
    assert "import sparkguard.spark_lib.spark.marker_http instead" in result.stderr
