#!/usr/bin/env bash
# The whole test suite: lint, types, architecture contracts, then pytest (all tiers).
# Extra arguments go to pytest, e.g. scripts/test.sh tests/spark_lib -k atomic
set -euo pipefail
# The repo has a top-level operator/ folder: never let `python -m` put the cwd first on
# sys.path, or it would shadow the standard library's operator module.
export PYTHONSAFEPATH=1
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"

echo "== ruff"
ruff check .
ruff format --check .
echo "== mypy --strict"
scripts/typecheck.sh
echo "== import contracts"
# import-linter cannot follow the package-dir mapping either (and does not walk symlinked
# folders): give it a copy of the installed layout.
layout=.cache/importlint
rm -rf "$layout" && mkdir -p "$layout/sparkguard"
cp sparkguard/*.py "$layout/sparkguard/"
for pkg in spark_lib sidecar operator; do
  mkdir -p "$layout/sparkguard/$pkg" && cp "$pkg"/*.py "$layout/sparkguard/$pkg/"
done
# Run from inside the layout: lint-imports puts the cwd first on sys.path.
(cd "$layout" && PYTHONPATH="$PWD" lint-imports --no-cache --config ../../.importlinter)
echo "== jvm: maven build + surefire (scripts/build-jvm.sh; a no-op when nothing changed)"
# The JVM layer's jar ships inside the package (spark_lib/jars/) and the pytest tiers use it.
scripts/build-jvm.sh >/dev/null
echo "== pytest"
# pytest exits 5 when it collected no tests: that fails this script like any other failure.
exec python -m pytest "$@"
