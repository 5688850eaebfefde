"""MkDocs hook (``hooks:`` in mkdocs.yml): links from the docs to repository files outside docs/.

The pages under docs/ are read on GitHub as well as on the site. On GitHub a link such as
``[the JVM layer](../spark_lib/jvm/README.md)`` works; MkDocs knows only the files under
``docs_dir`` and would report it as not found, which ``--strict`` turns into a failed build.
This hook checks every such link against the checkout before MkDocs sees the page: the file
must exist inside the repository, and a ``#fragment`` into a Markdown file must name one of its
headings (slugged as GitHub slugs them). A link that passes is rewritten to a plain reference,
the link text followed by the path in code (and the heading, for a fragment); a link that fails
stops the build with an error naming the page and the link. Links between pages under docs/
are left to MkDocs, whose strict mode fails on a missing page or anchor itself.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

# An inline link, not an image: [text](target) with no space in the target.
_LINK = re.compile(r"(?<!!)\[(?P<text>[^\]\n]*)\]\((?P<target>[^)\s]+)\)")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(?P<title>.+?)\s*#*\s*$")


def on_page_markdown(markdown: str, *, page: Any, config: Any, **_: Any) -> str:
    """Check and rewrite the page's links to repository files outside docs/ (see the module)."""
    docs_dir = Path(config.docs_dir).resolve()
    links = _RepositoryLinks(
        repo=Path(config.config_file_path).resolve().parent,
        docs_dir=docs_dir,
        page_dir=(docs_dir / page.file.src_path).parent,
    )
    lines = []
    in_fence = False
    for line in markdown.split("\n"):
        if _FENCE.match(line):
            in_fence = not in_fence
        lines.append(line if in_fence else links.rewrite_line(line))
    if links.errors:
        page_name = f"docs/{page.file.src_path}"
        raise PluginError("\n".join(f"{page_name}: {error}" for error in links.errors))
    return "\n".join(lines)


@dataclasses.dataclass
class _RepositoryLinks:
    """The links of one page to repository files outside docs/, and what was wrong with them."""

    repo: Path
    docs_dir: Path
    page_dir: Path
    errors: list[str] = dataclasses.field(default_factory=list)

    def rewrite_line(self, line: str) -> str:
        """The line with its repository links rewritten; code spans are left as they are."""
        pieces = []
        position = 0
        for span in _CODE_SPAN.finditer(line):
            pieces.append(_LINK.sub(self._rewrite_link, line[position : span.start()]))
            pieces.append(span.group(0))
            position = span.end()
        pieces.append(_LINK.sub(self._rewrite_link, line[position:]))
        return "".join(pieces)

    def _rewrite_link(self, match: re.Match[str]) -> str:
        target = match.group("target")
        if "://" in target or target.startswith(("#", "/", "mailto:")):
            return match.group(0)
        path_part, _, fragment = target.partition("#")
        resolved = (self.page_dir / path_part).resolve()
        if resolved.is_relative_to(self.docs_dir):
            return match.group(0)  # a page of the site: MkDocs checks it
        reference = self._reference(resolved, target=target, fragment=fragment)
        if reference is None:
            return match.group(0)
        label = match.group("text")
        relative = resolved.relative_to(self.repo).as_posix()
        return reference if label.strip("`") in (relative, target) else f"{label} ({reference})"

    def _reference(self, resolved: Path, *, target: str, fragment: str) -> str | None:
        """The plain reference to a repository file, or None (and an error) if it is broken."""
        if not resolved.is_relative_to(self.repo):
            self.errors.append(f"link to {target!r} leaves the repository")
            return None
        if not resolved.exists():
            self.errors.append(f"link to {target!r}: no such file in the repository")
            return None
        relative = resolved.relative_to(self.repo).as_posix()
        if not fragment:
            return f"`{relative}`"
        headings = _github_anchors(resolved) if resolved.suffix == ".md" else {}
        if fragment not in headings:
            self.errors.append(f"link to {target!r}: no heading #{fragment} in {relative}")
            return None
        return f'`{relative}`, "{headings[fragment]}"'


def _github_anchors(path: Path) -> dict[str, str]:
    """Anchor -> heading text of a Markdown file, as GitHub makes them (duplicates get -1, -2)."""
    anchors: dict[str, str] = {}
    seen: collections.Counter[str] = collections.Counter()
    in_fence = False
    for line in path.read_text(encoding="utf-8").split("\n"):
        if _FENCE.match(line):
            in_fence = not in_fence
        heading = None if in_fence else _HEADING.match(line)
        if heading is None:
            continue
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group("title"))
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        anchor = f"{slug}-{seen[slug]}" if seen[slug] else slug
        seen[slug] += 1
        anchors[anchor] = title.replace("`", "")
    return anchors
