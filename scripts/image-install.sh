#!/usr/bin/env bash
# The image's install steps, shared by the Dockerfile and tests/chart/test_image.py.
#   image-install.sh deps <venv> <src>   dependencies only (a cacheable layer: pyproject + pins)
#   image-install.sh app  <venv> <src>   sparkguard itself, no dependencies; needs the JVM jar
#                                        built first (scripts/build-jvm.sh -> spark_lib/jars/)
set -euo pipefail
export PYTHONSAFEPATH=1
phase=$1 venv=$2 src=$3
extras="s3,sidecar,operator,cli"
case "$phase" in
  deps)
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    # Install the dependencies of a stub project with the same pyproject, then drop the stub:
    # the layer depends on pyproject.toml and constraints.txt only, not on the source.
    stub=$(mktemp -d)
    cp "$src/pyproject.toml" "$src/constraints.txt" "$stub/"
    : > "$stub/README.md"
    for pkg in sparkguard spark_lib sidecar operator; do mkdir -p "$stub/$pkg" && : > "$stub/$pkg/__init__.py"; done
    mkdir -p "$stub/spark_lib/jars"  # a declared (data-only) package
    "$venv/bin/pip" install --disable-pip-version-check -q -c "$stub/constraints.txt" "$stub[$extras]"
    "$venv/bin/pip" uninstall -q -y sparkguard
    rm -rf "$stub"
    ;;
  app)
    # The jar is package data built outside the image (the image has no JDK or Maven): refuse
    # to build an image whose library lacks the JVM layer.
    if [ ! -f "$src/spark_lib/jars/sparkguard-spark.jar" ]; then
      echo "image-install.sh: $src/spark_lib/jars/sparkguard-spark.jar is missing; run scripts/build-jvm.sh before building the image" >&2
      exit 2
    fi
    "$venv/bin/pip" install --disable-pip-version-check -q --no-deps "$src"
    ;;
  *)
    echo "image-install.sh: unknown phase '$phase'; use deps or app" >&2
    exit 2
    ;;
esac
