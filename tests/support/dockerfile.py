"""A model of the part of ``docker build`` that sparkguard's Dockerfile uses, for tests that
cannot run a Docker engine.

:func:`parse` splits the Dockerfile into stages; :func:`copy_context` copies the build context
as ``.dockerignore`` filters it; :func:`replay` performs a stage's ``WORKDIR``, ``COPY`` and
``RUN`` instructions on the host. Each stage gets a directory of its own standing for its root
filesystem: absolute paths in the stage are taken under it, and ``RUN`` runs the very command
the Dockerfile names, with the host's tools (its JDK, Maven and Python, not the base image's).

What it follows (the Dockerfile reference, https://docs.docker.com/reference/dockerfile/, and
the build-context page, https://docs.docker.com/build/concepts/context/#dockerignore-files):

- a trailing ``\\`` continues a line; a line starting with ``#`` is a comment ("Format");
- ``FROM <image> [AS <name>]`` starts a stage ("FROM");
- ``WORKDIR`` sets where relative paths resolve and where ``RUN`` starts ("WORKDIR");
- ``COPY [--from=<stage>] <src>... <dest>``: a directory's contents are copied, not the
  directory itself; a ``dest`` ending in ``/`` is a directory; a relative ``dest`` is under
  ``WORKDIR``; the sources of ``--from`` are absolute paths in that stage ("COPY");
- ``RUN <command>`` in shell form, here always one simple command ("RUN");
- ``.dockerignore``: one pattern a line, relative to the context root, ``#`` comments, Go's
  ``filepath.Match`` (``*`` never crosses ``/``), ``**`` for any number of directories, ``!``
  re-includes, the last matching line wins, and a path is excluded when it or one of its
  parent directories matches ("dockerignore files").

Not modelled: ``ENV``/``ARG`` (replayed commands run with the host environment, so they use the
host's pip and Maven caches), the exec form of ``RUN``, globs in ``COPY`` sources, ``USER`` and
file ownership, base images' contents.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath


@dataclass(frozen=True)
class Instruction:
    """One instruction: its keyword, its ``--flag=value`` options and its arguments.

    ``RUN``'s command is split the way a shell splits a simple command.
    """

    keyword: str
    flags: Mapping[str, str]
    args: tuple[str, ...]


@dataclass(frozen=True)
class Stage:
    """A ``FROM`` and the instructions up to the next one."""

    image: str
    name: str | None
    instructions: tuple[Instruction, ...] = field(default=())

    def find(self, keyword: str) -> list[Instruction]:
        """This stage's instructions with ``keyword``, in order."""
        return [i for i in self.instructions if i.keyword == keyword]


def _logical_lines(text: str) -> Iterable[str]:
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        yield pending + line
        pending = ""
    if pending.strip():
        yield pending


def _instruction(line: str) -> Instruction:
    keyword, _, rest = line.partition(" ")
    keyword = keyword.upper()
    words = rest.split() if keyword != "RUN" else shlex.split(rest)
    flags: dict[str, str] = {}
    while words and words[0].startswith("--"):
        name, _, value = words.pop(0)[2:].partition("=")
        flags[name] = value
    return Instruction(keyword=keyword, flags=flags, args=tuple(words))


def parse(dockerfile: Path) -> list[Stage]:
    """The Dockerfile's stages, in order (instructions before the first ``FROM`` are refused)."""
    stages: list[Stage] = []
    for line in _logical_lines(dockerfile.read_text()):
        instruction = _instruction(line)
        if instruction.keyword == "FROM":
            args = instruction.args
            name = args[2] if len(args) == 3 and args[1].upper() == "AS" else None
            stages.append(Stage(image=args[0], name=name))
            continue
        if not stages:
            raise ValueError(f"{dockerfile}: {instruction.keyword} before the first FROM")
        last = stages[-1]
        stages[-1] = Stage(last.image, last.name, (*last.instructions, instruction))
    return stages


def read_dockerignore(path: Path) -> list[str]:
    """The patterns of a ``.dockerignore`` file, cleaned as Docker cleans them."""
    patterns = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        body = os.path.normpath(line.removeprefix("!").strip()).lstrip("/")
        patterns.append(("!" if negate else "") + body)
    return patterns


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            if pattern.startswith("/", i):  # "**/x" also matches "x"
                out[-1] = "(.*/)?"
                i += 1
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def is_ignored(path: str, patterns: list[str]) -> bool:
    """Whether ``.dockerignore`` ``patterns`` keep ``path`` (relative, ``/``-separated) out of
    the build context."""
    parts = PurePosixPath(path).parts
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        regex = _pattern_regex(pattern.removeprefix("!"))
        if any(regex.match(prefix) for prefix in prefixes):
            ignored = not negate
    return ignored


def copy_context(root: Path, dest: Path) -> None:
    """Copy the build context of ``root`` (what ``docker build root`` sends) into ``dest``."""
    ignore_file = root / ".dockerignore"
    patterns = read_dockerignore(ignore_file) if ignore_file.exists() else []
    can_prune = not any(p.startswith("!") for p in patterns)
    for folder, dirnames, filenames in os.walk(root):
        rel = Path(folder).relative_to(root)
        if can_prune:
            dirnames[:] = [d for d in dirnames if not is_ignored((rel / d).as_posix(), patterns)]
        for name in [d for d in dirnames if (Path(folder) / d).is_symlink()]:
            # the context holds a symlink as a symlink (os.walk does not descend into it)
            if not is_ignored((rel / name).as_posix(), patterns):
                (dest / rel).mkdir(parents=True, exist_ok=True)
                os.symlink(os.readlink(Path(folder) / name), dest / rel / name)
        for name in filenames:
            if is_ignored((rel / name).as_posix(), patterns):
                continue
            target = dest / rel / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(Path(folder) / name, target)


def _copy(source: Path, dest: Path, *, into_dir: bool) -> None:
    if source.is_dir():
        shutil.copytree(source, dest, dirs_exist_ok=True, symlinks=True)  # as COPY does
        return
    target = dest / source.name if into_dir else dest
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, target)


def replay(
    stage: Stage,
    *,
    context: Path,
    roots: Mapping[str, Path],
    env: Mapping[str, str] | None = None,
) -> None:
    """Perform ``stage``'s ``WORKDIR``, ``COPY`` and ``RUN`` instructions in ``roots[stage.name]``.

    ``COPY --from=<stage>`` reads from ``roots[<stage>]`` (replay that stage first). A failing
    ``RUN`` raises :class:`subprocess.CalledProcessError`.
    """
    if stage.name is None:
        raise ValueError(f"stage FROM {stage.image} has no name to find its root by")
    root = roots[stage.name]
    root.mkdir(parents=True, exist_ok=True)
    workdir = PurePosixPath("/")

    def host(path: str) -> Path:
        absolute = workdir / path  # an absolute path replaces the workdir
        return root / str(absolute).lstrip("/")

    for instruction in stage.instructions:
        if instruction.keyword == "WORKDIR":
            workdir = workdir / instruction.args[0]
            host(".").mkdir(parents=True, exist_ok=True)
        elif instruction.keyword == "COPY":
            *sources, dest = instruction.args
            into_dir = dest.endswith("/") or len(sources) > 1
            source_root = roots[instruction.flags["from"]] if "from" in instruction.flags else None
            for source in sources:
                if source_root is None:
                    origin = context / source
                else:
                    origin = source_root / source.lstrip("/")
                _copy(origin, host(dest), into_dir=into_dir)
        elif instruction.keyword == "RUN":
            # Paths in the stage live under its root; a relative program path is under WORKDIR.
            argv = [str(host(a)) if a.startswith("/") else a for a in instruction.args]
            if "/" in argv[0]:
                argv[0] = str(host(argv[0]))
            subprocess.run(argv, check=True, cwd=host("."), env=env)
