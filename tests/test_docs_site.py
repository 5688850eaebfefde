"""The docs site builds with ``mkdocs build --strict``, and a broken reference fails the build.

The site is docs/*.md through mkdocs.yml; links to repository files outside docs/ go through
scripts/mkdocs_hooks.py (checked against the checkout, rewritten to plain references). The
failing cases build a tiny project of their own in tmp_path with the same hook and theme.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HOOK = REPO / "scripts" / "mkdocs_hooks.py"


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of one config into ``site``; never ``-q``: quiet mode stops
    strict mode from counting warnings."""
    env = {**os.environ, "PYTHONSAFEPATH": "1", "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [
            *(sys.executable, "-m", "mkdocs", "build", "--strict"),
            *("--config-file", str(config), "--site-dir", str(site)),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def make_project(root: Path, page: str, *, nav: tuple[str, ...] = ("index.md",)) -> Path:
    """A one-page site in ``root`` with the repository's hook, a file ``src.py`` beside docs/
    and a Markdown file ``NOTES.md`` with one heading."""
    (root / "docs").mkdir()
    (root / "docs" / "index.md").write_text(page)
    (root / "src.py").write_text("x = 1\n")
    (root / "NOTES.md").write_text("# Notes\n\n## The second part\n")
    config = root / "mkdocs.yml"
    nav_lines = "".join(f"  - {entry}\n" for entry in nav)
    config.write_text(
        "site_name: tiny\nstrict: true\ntheme:\n  name: material\n"
        f"hooks:\n  - {HOOK}\n"
        "validation:\n  omitted_files: warn\n  unrecognized_links: warn\n  anchors: warn\n"
        f"nav:\n{nav_lines}"
    )
    return config


def test_the_docs_site_builds_strict(tmp_path: Path) -> None:
    result = build(REPO / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr
    # A link to a repository file outside docs/ is a plain reference on the site.
    operator_page = (tmp_path / "site" / "operator" / "index.html").read_text()
    assert "<code>spark_lib/jvm/README.md</code>" in operator_page
    assert "../spark_lib/jvm/README.md" not in operator_page


def test_a_link_to_a_repository_file_becomes_a_plain_reference(tmp_path: Path) -> None:
    config = make_project(
        tmp_path, "# Home\n\n[the source](../src.py), [notes](../NOTES.md#the-second-part)\n"
    )
    result = build(config, tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr
    home = (tmp_path / "site" / "index.html").read_text()
    assert "the source (<code>src.py</code>)" in home
    assert 'notes (<code>NOTES.md</code>, "The second part")' in home


@pytest.mark.parametrize(
    ("page", "nav", "message"),
    [
        pytest.param(
            "# Home\n\n[gone](../gone.py)\n",
            ("index.md",),
            "docs/index.md: link to '../gone.py': no such file in the repository",
            id="repository-file-missing",
        ),
        pytest.param(
            "# Home\n\n[notes](../NOTES.md#no-such-part)\n",
            ("index.md",),
            "docs/index.md: link to '../NOTES.md#no-such-part': no heading #no-such-part",
            id="repository-heading-missing",
        ),
        pytest.param(
            "# Home\n\n[other](other.md)\n",
            ("index.md",),
            "contains a link 'other.md', but the target is not found",
            id="page-missing",
        ),
        pytest.param(
            "# Home\n\n[there](#nowhere)\n",
            ("index.md",),
            "contains a link '#nowhere', but there is no such anchor",
            id="anchor-missing",
        ),
        pytest.param(
            "# Home\n",
            ("index.md", "missing.md"),
            "A reference to 'missing.md' is included in the 'nav' configuration",
            id="nav-page-missing",
        ),
    ],
)
def test_a_broken_reference_fails_the_build(
    tmp_path: Path, page: str, nav: tuple[str, ...], message: str
) -> None:
    result = build(make_project(tmp_path, page, nav=nav), tmp_path / "site")
    assert result.returncode != 0
    assert message in result.stdout + result.stderr
