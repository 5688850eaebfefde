#!/usr/bin/env bash
# Sets up and runs the local demo on embedded defaults: .venv (scripts/bootstrap.sh), then the
# JVM layer's jar (scripts/build-jvm.sh: the demo's default job is an unchanged df.write.parquet
# through sparkguard's JVM commit protocol; a no-op when the jar is up to date, a few minutes
# the first time with a Java 17 JDK and Maven), then `sparkguard demo "$@"`.
# Without a JDK or Maven the demo runs sparkguard's Python writer instead and says why;
# `--writer fsspec` skips the jar.
set -euo pipefail
# The repo has a top-level operator/ folder: never let `python -m` put the cwd first on
# sys.path, or it would shadow the standard library's operator module.
export PYTHONSAFEPATH=1
cd "$(dirname "$0")/.."
scripts/bootstrap.sh

needs_jar=1
previous=""
for arg in "$@"; do
  if [[ "$arg" == "--writer=fsspec" || ( "$previous" == "--writer" && "$arg" == "fsspec" ) ]]; then
    needs_jar=0
  fi
  previous="$arg"
done
if [[ $needs_jar -eq 1 ]]; then
  set +e
  scripts/build-jvm.sh >/dev/null
  rc=$?
  set -e
  if [[ $rc -eq 2 ]]; then
    # A missing tool (JDK, Maven), reported above: the demo falls back to the Python writer
    # when there is no jar, and says so.
    echo "demo.sh: could not build the JVM layer's jar (see above); continuing" >&2
  elif [[ $rc -ne 0 ]]; then
    exit "$rc"
  fi
fi
exec .venv/bin/sparkguard demo "$@"
