#!/usr/bin/env bash
# The compatibility tier's PySpark installs (tests/compat/): one venv per Spark release that
# tests/compat/versions.txt lists (the newest patch of each supported line PyPI serves, and the
# unsupported release whose refusal is tested), cached outside the checkout:
#
#   ${SPARKGUARD_CACHE:-$HOME/.cache/sparkguard}/compat/<version>/      (a venv with PySpark only)
#
# The line the project's own venv pins (constraints.txt) needs none: the tier uses .venv for it.
# Each venv holds PySpark and py4j only; the tier runs the project's .venv Python with that
# venv's site-packages first on PYTHONPATH, so the driver and its JVM are that release's while
# sparkguard and its dependencies are the checkout's. PySpark is a ~400 MB source archive on
# PyPI: pip downloads it once (pip's cache), and builds nothing at test time. scripts/test.sh
# runs this before pytest, outside the network guard (inside it no registry is reachable).
#
#   scripts/fetch-spark-compat.sh     prints the cache directory (a no-op once complete)
set -euo pipefail
export PYTHONSAFEPATH=1
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[[ -x "$root/.venv/bin/python" ]] || {
  echo "fetch-spark-compat.sh: no venv at $root/.venv; run scripts/bootstrap.sh first" >&2
  exit 2
}
cache="${SPARKGUARD_CACHE:-$HOME/.cache/sparkguard}/compat"
pinned="$(sed -n 's/^pyspark==//p' "$root/constraints.txt")"
mkdir -p "$cache"
while read -r version _; do
  [[ -z "$version" || "$version" == \#* || "$version" == "$pinned" ]] && continue
  venv="$cache/$version"
  [[ -f "$venv/.complete" ]] && continue
  echo "fetch-spark-compat.sh: PySpark $version into $venv" >&2
  rm -rf "$venv"
  "$root/.venv/bin/python" -m venv --without-pip "$venv"
  # The project's pip installs into the new venv (--prefix would not give it its own site).
  "$root/.venv/bin/python" -m pip --disable-pip-version-check -q \
    --python "$venv/bin/python" install "pyspark==$version" >&2
  touch "$venv/.complete"
done <"$root/tests/compat/versions.txt"
echo "$cache"
