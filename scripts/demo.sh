#!/usr/bin/env bash
# Sets up and runs the local demo on embedded defaults.
set -euo pipefail
# The repo has a top-level operator/ folder: never let `python -m` put the cwd first on
# sys.path, or it would shadow the standard library's operator module.
export PYTHONSAFEPATH=1
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec .venv/bin/sparkguard demo "$@"
