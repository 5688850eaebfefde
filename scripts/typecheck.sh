#!/usr/bin/env bash
# mypy --strict over the three packages, through src/sparkguard/ (whose spark_lib, sidecar and
# operator are symlinks to the top-level folders: the installed layout).
set -euo pipefail
# The repo has a top-level operator/ folder: never let `python -m` put the cwd first on
# sys.path, or it would shadow the standard library's operator module.
export PYTHONSAFEPATH=1
cd "$(dirname "$0")/.."
MYPYPATH=src .venv/bin/mypy --config-file pyproject.toml -p sparkguard
