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
# For each supported release on whose Hadoop sparkguard writes s3a:// (4.1+: S3A's conditional
# create), also the S3A jars of that release's own Hadoop (scripts/fetch-jars.sh s3a with
# SPARKGUARD_PYSPARK_JARS set to the venv's pyspark/jars): the tier's S3A append runs on them.
# The HDFS minicluster's jars (scripts/fetch-jars.sh hdfs-minicluster) are the pinned Hadoop's,
# one cluster for every release; scripts/test.sh fetches them.
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
python="$("$root/.venv/bin/python" -c 'import sys; print("python%d.%d" % sys.version_info[:2])')"
# Whether sparkguard's JVM layer writes s3a:// on a release (its own rule, not a copy of it).
s3a_line() {
  PYTHONPATH="$root/src" "$root/.venv/bin/python" -c \
    'import sys; from sparkguard.spark_lib.spark import sparkversions as v
sys.exit(0 if v.check(sys.argv[1], what="release").s3a else 1)' "$1"
}
mkdir -p "$cache"
while read -r version expect _; do
  [[ -z "$version" || "$version" == \#* || "$version" == "$pinned" ]] && continue
  venv="$cache/$version"
  if [[ ! -f "$venv/.complete" ]]; then
    echo "fetch-spark-compat.sh: PySpark $version into $venv" >&2
    rm -rf "$venv"
    "$root/.venv/bin/python" -m venv --without-pip "$venv"
    # The project's pip installs into the new venv (--prefix would not give it its own site).
    "$root/.venv/bin/python" -m pip --disable-pip-version-check -q \
      --python "$venv/bin/python" install "pyspark==$version" >&2
    touch "$venv/.complete"
  fi
  if [[ "$expect" == supported ]] && s3a_line "$version"; then
    SPARKGUARD_PYSPARK_JARS="$venv/lib/$python/site-packages/pyspark/jars" \
      "$root/scripts/fetch-jars.sh" s3a >/dev/null
  fi
done <"$root/tests/compat/versions.txt"
echo "$cache"
