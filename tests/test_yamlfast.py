"""tests/support/yamlfast.py: the same objects as PyYAML's safe loader, from libyaml's parser."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.kubebench.bench import APACHE_SPARK_OPERATOR_CRD, SPARK_OPERATOR_CRDS
from tests.support import yamlfast


def test_the_c_parser_is_used_where_pyyaml_has_it() -> None:
    assert yaml.__with_libyaml__, "PyYAML without libyaml: the tests' manifests parse 10x slower"
    assert yamlfast._LOADER is yaml.CSafeLoader


@pytest.mark.parametrize(
    "path", [APACHE_SPARK_OPERATOR_CRD, *SPARK_OPERATOR_CRDS.values()], ids=lambda p: p.name
)
def test_manifests_load_as_the_safe_loader_loads_them(path: Path) -> None:
    text = path.read_text()
    assert yamlfast.load_all(text) == list(yaml.safe_load_all(text))


def test_a_document_with_tags_the_safe_loader_refuses_is_refused() -> None:
    with pytest.raises(yaml.constructor.ConstructorError):
        yamlfast.load("!!python/object/apply:os.system ['true']")
    assert yamlfast.load("a: [1, 2]\nb: 2026-12-08\n") == yaml.safe_load(
        "a: [1, 2]\nb: 2026-12-08\n"
    )
    assert yamlfast.load_all("---\n---\na: 1\n") == [None, {"a": 1}]
