#!/usr/bin/env bash
# The image's install steps, shared by the Dockerfile and tests/chart/test_image.py.
#   image-install.sh pyspark <dir> <src>   the PySpark that constraints.txt pins, alone, into <dir>
#                                          (a pip --target directory): the jar stage compiles the
#                                          JVM layer against <dir>/pyspark/jars
#   image-install.sh deps <venv> <src>     dependencies only (a cacheable layer: pyproject + pins)
#   image-install.sh app  <venv> <src>     sparkguard itself, no dependencies; needs the JVM jar
#                                          in <src>/spark_lib/jars/ (the Dockerfile's jar stage,
#                                          scripts/image-build-jar.sh, builds it); then perms
#   image-install.sh perms <dir>           every file under <dir> readable (and executable where
#                                          its owner's is) by its group and others, writable by
#                                          its owner only: the image runs as any UID in group 0
#                                          (OpenShift assigns one) with a read-only root
set -euo pipefail
export PYTHONSAFEPATH=1
phase=$1 dest=$2 src=${3:-}
extras="s3,sidecar,operator,cli"
jar="spark_lib/jars/sparkguard-spark.jar"
case "$phase" in
  pyspark)
    # Only its jars are used: no dependencies (py4j), no venv.
    python3 -m pip install --disable-pip-version-check -q --no-deps --target "$dest" \
      -c "$src/constraints.txt" pyspark
    ;;
  deps)
    venv=$dest
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    # Install the dependencies of a stub project with the same pyproject, then drop the stub:
    # the layer depends on pyproject.toml and constraints.txt only, not on the source.
    stub=$(mktemp -d)
    cp "$src/pyproject.toml" "$src/constraints.txt" "$stub/"
    : > "$stub/README.md"
    # An empty folder for every package pyproject.toml declares (spark_lib's subpackages and
    # the data-only jars included): setuptools refuses a declared package without its folder.
    python3 -c 'import sys, tomllib
for name in tomllib.load(open(sys.argv[1], "rb"))["tool"]["setuptools"]["packages"]:
    print(name.replace(".", "/"))' "$stub/pyproject.toml" | while read -r pkg; do
      mkdir -p "$stub/src/$pkg" && : > "$stub/src/$pkg/__init__.py"
    done
    "$venv/bin/pip" install --disable-pip-version-check -q -c "$stub/constraints.txt" "$stub[$extras]"
    "$venv/bin/pip" uninstall -q -y sparkguard
    rm -rf "$stub"
    ;;
  app)
    venv=$dest
    # The jar is package data that setuptools would silently leave out: refuse to build an
    # image whose library lacks the JVM layer, before and after the install.
    if [ ! -f "$src/$jar" ]; then
      echo "image-install.sh: $src/$jar is missing; build it first (the Dockerfile's jar stage runs scripts/image-build-jar.sh; on a host, scripts/build-jvm.sh)" >&2
      exit 2
    fi
    "$venv/bin/pip" install --disable-pip-version-check -q --no-deps "$src"
    if ! "$venv/bin/python" -c 'import importlib.resources as r, sys
sys.exit(not r.files("sparkguard.spark_lib").joinpath("jars/sparkguard-spark.jar").is_file())'; then
      echo "image-install.sh: sparkguard installed into $venv without its jar; check [tool.setuptools.package-data] in pyproject.toml" >&2
      exit 1
    fi
    "$0" perms "$venv"
    ;;
  perms)
    chmod -R go=u-w "$dest"
    ;;
  *)
    echo "image-install.sh: unknown phase '$phase'; use pyspark, deps, app or perms" >&2
    exit 2
    ;;
esac
