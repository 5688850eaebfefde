#!/usr/bin/env bash
# Creates .venv (git-ignored) with the pinned dependencies and sparkguard installed editable.
# Idempotent: re-installs only when pyproject.toml or constraints.txt changed.
set -euo pipefail
# The repo has a top-level operator/ folder: never let `python -m` put the cwd first on
# sys.path, or it would shadow the standard library's operator module.
export PYTHONSAFEPATH=1
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if ! "$PY" -c 'import sys; sys.exit(sys.version_info[:2] < (3, 11))'; then
  echo "bootstrap: sparkguard needs Python >= 3.11 (found $("$PY" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2
  exit 2
fi
if ! command -v java >/dev/null 2>&1; then
  echo "bootstrap: PySpark needs a Java runtime (17 recommended) on PATH; install one (e.g. apt-get install openjdk-17-jre-headless)" >&2
  exit 2
fi

stamp_want=$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)
stamp_file=.venv/.sparkguard-deps
if [ -x .venv/bin/python ] && [ "$(cat "$stamp_file" 2>/dev/null)" = "$stamp_want" ]; then
  exit 0
fi
echo "bootstrap: installing dependencies into .venv (pinned by constraints.txt)" >&2
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip >&2
.venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]' >&2
echo "$stamp_want" > "$stamp_file"
