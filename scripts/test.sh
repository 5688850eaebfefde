#!/usr/bin/env bash
# The whole test suite: lint, types, architecture contracts, the docs site's strict build, the
# JVM layer's JUnit tests, then pytest (every tier) on two xdist workers.
#
#   scripts/test.sh                 everything (what CI runs)
#   scripts/test.sh --fast          lint, types, contracts, docs, JUnit, and the unit tiers only
#                                   (no PySpark job, no kube-apiserver, no slow fault loop)
#   scripts/test.sh [--fast] ARGS   extra arguments go to pytest, e.g.
#                                   scripts/test.sh tests/spark_lib -k atomic
#
# Environment: SPARKGUARD_TEST_WORKERS (default 2: this machine's cores; 0 runs in one process).
# tests/README.md says how the tiers are split over the workers and what each costs.
set -euo pipefail
# The repo has a top-level operator/ folder: never let `python -m` put the cwd first on
# sys.path, or it would shadow the standard library's operator module.
export PYTHONSAFEPATH=1
cd "$(dirname "$0")/.."

fast=0
if [[ "${1:-}" == "--fast" ]]; then
  fast=1
  shift
fi

# The kube bench's binaries, started first so that a cold build (about 9 minutes of Go on 2
# cores; nothing when cached) overlaps the venv set-up, lint, types and the JVM build: build.sh
# (kube-apiserver, etcd, kube-controller-manager, kube-scheduler), then upstream's
# spark-operator (build-spark-operator.sh), then Prometheus (build-prometheus.sh), one after the
# other so they never compete for the cores. The bench fixtures run each script again, which
# waits on this one's lock, and report its errors. Not for --fast (no bench test) nor for a run
# of chosen test paths.
paths_given=0
for arg in "$@"; do [[ "$arg" == -* ]] || paths_given=1; done
if [[ $fast -eq 0 && $paths_given -eq 0 && -z "${SPARKGUARD_KUBE_BIN_DIR:-}" ]]; then
  mkdir -p .cache
  { tests/kubebench/build.sh && tests/kubebench/build-spark-operator.sh &&
    tests/kubebench/build-prometheus.sh; } \
    > .cache/kubebench-build.log 2>&1 &
fi

scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"

started=$(date +%s)
echo "== ruff"
ruff check .
ruff format --check .
echo "== mypy --strict"
scripts/typecheck.sh
echo "== import contracts"
# import-linter does not walk symlinked folders (src/sparkguard/{spark_lib,sidecar,operator}):
# give it a copy of the installed layout.
layout=.cache/importlint
rm -rf "$layout" && mkdir -p "$layout/sparkguard"
cp src/sparkguard/*.py "$layout/sparkguard/"
for pkg in spark_lib sidecar operator; do
  # Every module, subpackages included (spark_lib/storage/, ...); not the JVM module's tree.
  mkdir -p "$layout/sparkguard/$pkg"
  (cd "$pkg" && find . -name '*.py' -not -path './jvm/*' -not -path '*/__pycache__/*' \
    -exec cp --parents -t "../$layout/sparkguard/$pkg/" {} +)
done
# Run from inside the layout: lint-imports puts the cwd first on sys.path.
(cd "$layout" && PYTHONPATH="$PWD" lint-imports --no-cache --config ../../.importlinter)
echo "== docs: mkdocs build --strict"
# The site (mkdocs.yml) fails on a broken link, anchor or nav entry, and on a link to a
# repository file that does not exist (scripts/mkdocs_hooks.py). Never -q: quiet mode stops
# strict mode from counting warnings. NO_MKDOCS_2_WARNING silences the theme's end-of-life
# banner (docs/decisions.md, "Documentation").
NO_MKDOCS_2_WARNING=1 mkdocs build --strict --site-dir .cache/site
echo "== jvm: maven build + surefire (scripts/build-jvm.sh; a no-op when nothing changed)"
# The JVM layer's jar ships inside the package (spark_lib/jars/) and the pytest tiers use it.
# The stamp covers the sources, the pom, the PySpark jars and the JDK: when it matches, this
# exact jar already passed its JUnit tests.
scripts/build-jvm.sh >/dev/null
echo "== checks took $(( $(date +%s) - started ))s"

workers=${SPARKGUARD_TEST_WORKERS:-2}
xdist=()
if [[ "$workers" != "0" ]]; then
  # loadgroup: the real kube-apiserver tests are grouped by the bench they need (one group per
  # cluster, one per plain-bench module: tests/kubebench/fixtures.py); so is the HDFS minicluster's (one cluster, one worker:
  # tests/conftest.py); each module sharing a SparkSession is one group; every other test goes
  # wherever a worker is free.
  # --no-loadscope-reorder: units go out in the collection's order, which tests/conftest.py
  # sorts longest first from tests/durations.json (tests/support/schedule.py), not xdist's
  # order by the number of tests.
  xdist=(-n "$workers" --dist loadgroup --no-loadscope-reorder)
fi
selection=()
if [[ $fast -eq 1 ]]; then
  selection=(-m "not spark and not kube and not hdfs and not slow")
fi
if [[ $fast -eq 0 ]]; then
  # What the tests fetch from package registries is fetched here, before the network guard:
  # inside it nothing reaches a registry (each is a no-op once cached).
  echo "== registries: jars, wheels and Go modules the tests use (cached under ~/.cache)"
  scripts/fetch-jars.sh s3a >/dev/null
  scripts/fetch-jars.sh s3a --magic-committer >/dev/null
  scripts/fetch-jars.sh hdfs-minicluster >/dev/null
  scripts/fetch-wheels.sh >/dev/null
  # the compatibility tier's PySpark venvs, one per Spark release it runs (tests/compat/)
  scripts/fetch-spark-compat.sh >/dev/null
  if command -v go >/dev/null 2>&1; then
    (cd tests/kubebench/go && GOFLAGS=-mod=readonly go mod download)
    # upstream's spark-operator: its release source and modules (a no-op once it is built)
    tests/kubebench/build-spark-operator.sh --download
    # Prometheus and promtool (the dashboard and alert tests): the release module and its
    # dependencies; the build runs in the background above, or in the test's fixture (offline)
    tests/kubebench/build-prometheus.sh --download >/dev/null
  fi
  # the Apache Spark Kubernetes Operator: a Maven build of its release source, whose
  # libraries come from Maven Central (about 2 minutes once; a no-op when its stamp matches)
  tests/kubebench/build-apache-operator.sh >/dev/null
fi
echo "== pytest${selection:+ ${selection[*]}}"
# Every test runs inside the network guard (tests/support/netguard.py): a network namespace
# where only loopback and a namespace of the guard's own exist, so nothing the tests start can
# reach an address off this machine; the run fails if a packet tried, and prints where the
# tests connected (tests/kubebench/README.md, "Loopback only").
# pytest exits 5 when it collected no tests: that fails this script like any other failure.
exec python tests/support/netguard.py run -- \
  python -m pytest "${xdist[@]}" "${selection[@]}" "$@"
