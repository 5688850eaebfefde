#!/usr/bin/env bash
# The wheels the image's install steps need (scripts/image-install.sh pyspark/deps/app: the
# extras the image installs and PySpark, pinned by constraints.txt, and the build backend
# pyproject.toml names), fetched from PyPI into a wheelhouse under ~/.cache/sparkguard, so that
# the tests that run those steps (tests/chart/test_image.py) install with `--no-index` inside
# the network guard, where no registry is reached.
#
#   scripts/fetch-wheels.sh     prints the wheelhouse's directory (a no-op once complete)
set -euo pipefail
export PYTHONSAFEPATH=1
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[[ -x "$root/.venv/bin/python" ]] || {
  echo "fetch-wheels.sh: no venv at $root/.venv; run scripts/bootstrap.sh first" >&2
  exit 2
}
extras="s3,sidecar,operator,cli" # as scripts/image-install.sh installs them
stamp="$( { echo "extras=$extras pyspark"; cat "$root/pyproject.toml" "$root/constraints.txt"; } | sha256sum | cut -c1-16)"
dir="${SPARKGUARD_CACHE:-$HOME/.cache/sparkguard}/wheelhouse/$stamp"
if [[ -f "$dir/.complete" ]]; then
  echo "$dir"
  exit 0
fi
echo "fetch-wheels.sh: fetching the image's wheels into $dir" >&2
rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
pip=("$root/.venv/bin/python" -m pip --disable-pip-version-check)
# Wheels, not sources: `pip wheel` takes PySpark's (published as a source archive) from pip's
# cache of wheels it built, so nothing is built at test time. The dependencies of the image's
# extras, PySpark (the image's jar stage compiles against its jars) and the build backend that
# pyproject.toml names; the project itself is built from the source by the test.
"${pip[@]}" wheel -q -w "$dir.tmp" -c "$root/constraints.txt" \
  "$root[$extras]" pyspark "setuptools>=77" wheel >&2
rm -f "$dir.tmp"/sparkguard-*
touch "$dir.tmp/.complete"
rm -rf "$dir" && mv "$dir.tmp" "$dir"
echo "$dir"
