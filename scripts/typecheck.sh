#!/usr/bin/env bash
# mypy --strict over the three packages. mypy cannot follow setuptools' package-dir mapping of an
# editable install, so we give it the installed layout as a tree of symlinks under .cache/.
set -euo pipefail
# The repo has a top-level operator/ folder: never let `python -m` put the cwd first on
# sys.path, or it would shadow the standard library's operator module.
export PYTHONSAFEPATH=1
cd "$(dirname "$0")/.."
tree=.cache/typecheck/sparkguard
rm -rf .cache/typecheck && mkdir -p "$tree"
for f in sparkguard/*.py sparkguard/py.typed; do ln -s "$PWD/$f" "$tree/"; done
ln -s "$PWD/spark_lib" "$tree/spark_lib"
ln -s "$PWD/sidecar" "$tree/sidecar"
ln -s "$PWD/operator" "$tree/operator"
MYPYPATH=.cache/typecheck .venv/bin/mypy --config-file pyproject.toml -p sparkguard
