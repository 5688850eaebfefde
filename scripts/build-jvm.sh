#!/usr/bin/env bash
# Build sparkguard's JVM layer (spark_lib/jvm, Maven) and ship the jar inside the Python
# package as spark_lib/jars/sparkguard-spark.jar (a git-ignored build output).
#
# Spark, Scala and Hadoop come from the PySpark the venv pins (its pyspark/jars directory), not
# from Maven Central: the versions are read from those jars' names, so the jar is compiled, and
# its JUnit tests run, against exactly the runtime that will load it. Maven's own repository
# (plugins, JUnit) lives outside the checkout:
#
#   ${SPARKGUARD_CACHE:-$HOME/.cache/sparkguard}/m2
#
# Idempotent: a stamp (hash of the pom, the sources, the pyspark version and jar names, and the
# JDK) beside the jar says when nothing changed; then it does nothing. After the first successful
# build Maven runs offline (-o). Maven's full log goes to .cache/jvm/build.log; the
# Surefire summary is printed. Progress goes to stderr; stdout is only the jar's path.
#
# Options:  --force        rebuild even if the stamp matches
#           --skip-tests   build the jar without compiling or running the JUnit tests
#           --tests-only   build no jar: compile the JUnit sources against the built jar
#                          (spark_lib/jars/sparkguard-spark.jar, as it ships) and the Spark of
#                          SPARKGUARD_PYSPARK_JARS, and run SPARKGUARD_JUNIT_TESTS; stdout is
#                          the Surefire reports directory (the compatibility tier, tests/compat/)
# Environment: SPARKGUARD_CACHE (cache root), SPARKGUARD_VENV (default .venv),
#              SPARKGUARD_PYSPARK_JARS (use this pyspark/jars directory instead of the venv's),
#              SPARKGUARD_TEST_JARS (a directory of extra jars for the JUnit tests, e.g. S3A);
#              for --tests-only: SPARKGUARD_JUNIT_TESTS (the test classes, Surefire's -Dtest
#              list, e.g. BuildInfoTest,SparkVersionsTest) and SPARKGUARD_JUNIT_EXCLUDE (test
#              sources left out of the compile, comma-separated paths under src/test/java).
#              Its output is .cache/junit/<spark version>/ (ignored), with a stamp like the
#              jar's: when the jar, the test sources, the pom, the Spark jars, the JDK and the
#              two lists are unchanged since a run that passed, nothing runs.
# Exit status: 0 built or up to date; 2 a missing tool (Java 17+ JDK, Maven, the venv);
#              1 the build or a test failed (the log's tail is printed).
set -euo pipefail
export PYTHONSAFEPATH=1

log() { printf 'build-jvm.sh: %s\n' "$*" >&2; }
missing() { printf 'build-jvm.sh: ERROR: %s\n' "$*" >&2; exit 2; }
die() { printf 'build-jvm.sh: ERROR: %s\n' "$*" >&2; exit 1; }

force=0 skip_tests=0 tests_only=0
for arg in "$@"; do
  case "$arg" in
    --force) force=1 ;;
    --skip-tests) skip_tests=1 ;;
    --tests-only) tests_only=1 ;;
    -h|--help) sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 0 ;;
    *) printf 'build-jvm.sh: ERROR: unknown argument %s; use --force, --skip-tests, --tests-only or --help\n' "$arg" >&2; exit 2 ;;
  esac
done

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
module="$root/spark_lib/jvm"
out_dir="$root/spark_lib/jars"
jar="$out_dir/sparkguard-spark.jar"
stamp="$out_dir/.sparkguard-spark.stamp"

command -v javac >/dev/null 2>&1 ||
  missing "'javac' not found on PATH; the JVM layer needs a Java 17+ JDK (e.g. apt-get install openjdk-17-jdk-headless)"
javac_version="$(javac -version 2>&1 | awk '{print $2}')"
[[ "${javac_version%%.*}" -ge 17 ]] 2>/dev/null ||
  missing "javac $javac_version is too old; the JVM layer needs a Java 17+ JDK (set JAVA_HOME/PATH to one)"
command -v mvn >/dev/null 2>&1 ||
  missing "'mvn' not found on PATH; install Maven 3.8+ (e.g. apt-get install maven)"

if [[ -n "${SPARKGUARD_PYSPARK_JARS:-}" ]]; then
  pyspark_jars="$SPARKGUARD_PYSPARK_JARS"
else
  venv="${SPARKGUARD_VENV:-$root/.venv}"
  [[ -x "$venv/bin/python" ]] || missing "no venv at $venv; run scripts/bootstrap.sh first (or set SPARKGUARD_PYSPARK_JARS)"
  pyspark_jars="$("$venv/bin/python" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))' 2>/dev/null)" ||
    missing "pyspark is not installed in $venv; run scripts/bootstrap.sh first"
fi
[[ -d "$pyspark_jars" ]] || missing "no pyspark jars directory at $pyspark_jars"

# The versions the pinned PySpark bundles, read from its jar names.
jar_version() {  # jar_version <name prefix>: the version part of <prefix>-<version>.jar
  local f
  f="$(cd "$pyspark_jars" && ls -1 "$1"-[0-9]*.jar 2>/dev/null | head -n1)"
  [[ -n "$f" ]] || missing "$pyspark_jars has no $1-<version>.jar; is this a PySpark 4.x install?"
  f="${f#"$1"-}"
  echo "${f%.jar}"
}
spark_version="$(jar_version spark-core_2.13)"
scala_version="$(jar_version scala-library)"
hadoop_version="$(jar_version hadoop-client-api)"
jackson_version="$(jar_version jackson-databind)"
slf4j_version="$(jar_version slf4j-api)"
parquet_version="$(jar_version parquet-hadoop)"

cache_root="${SPARKGUARD_CACHE:-$HOME/.cache/sparkguard}"
m2="$cache_root/m2"
# What every Maven run gets: its repository, the Spark jars and the versions read from them.
spark_args=(-B -ntp -Dstyle.color=never -f "$module/pom.xml"
  "-Dmaven.repo.local=$m2"
  "-Dpyspark.jars=$pyspark_jars"
  "-Dspark.version=$spark_version" "-Dscala.version=$scala_version"
  "-Dhadoop.version=$hadoop_version" "-Djackson.version=$jackson_version"
  "-Dslf4j.version=$slf4j_version" "-Dparquet.version=$parquet_version")
# Maven's own JVM compiles a few dozen classes and exits: C2 and G1's threads only cost CPU.
export MAVEN_OPTS="${MAVEN_OPTS:--XX:TieredStopAtLevel=1 -XX:+UseSerialGC}"

if [[ $tests_only -eq 1 ]]; then
  # The shipped jar under another Spark (the compatibility tier): no jar is built, the main
  # sources are not compiled (pom.xml, profile tests-only). Offline always: the jar's own
  # build, run first, resolved the same plugins and JUnit.
  [[ -f "$jar" ]] || missing "no jar at $jar to test; run scripts/build-jvm.sh first"
  tests="${SPARKGUARD_JUNIT_TESTS:-}"
  [[ -n "$tests" ]] || missing "--tests-only needs SPARKGUARD_JUNIT_TESTS (the test classes to run)"
  out="$root/.cache/junit/$spark_version"
  reports="$out/target/surefire-reports"
  mkdir -p "$out"
  if command -v flock >/dev/null 2>&1; then
    exec 9>"$out/build.lock"
    flock 9
  fi
  rm -rf "$out/src"
  cp -r "$module/src/test/java" "$out/src"
  IFS=, read -r -a excluded <<<"${SPARKGUARD_JUNIT_EXCLUDE:-}"
  for f in "${excluded[@]}"; do
    [[ -f "$out/src/$f" ]] || missing "SPARKGUARD_JUNIT_EXCLUDE names $f, not a file under $module/src/test/java"
    rm "$out/src/$f"
  done
  want_stamp="$(
    {
      echo "spark=$spark_version javac=$javac_version tests=$tests"
      ls -1 "$pyspark_jars"
      sha256sum <"$jar"
      cat "$module/pom.xml"
      cd "$out/src" && find . -type f | LC_ALL=C sort | while read -r f; do echo "== $f"; cat "$f"; done
    } | sha256sum | cut -c1-16
  )"
  if [[ $force -eq 0 && -d "$reports" && "$(cat "$out/stamp" 2>/dev/null)" == "$want_stamp" ]]; then
    log "up to date: $tests passed against spark $spark_version (stamp $want_stamp): $reports"
    echo "$reports"
    exit 0
  fi
  rm -f "$out/stamp"
  build_log="$out/build.log"
  log "JUnit $tests against the built jar and pyspark $spark_version (hadoop $hadoop_version), offline"
  start=$(date +%s)
  set +e
  mvn "${spark_args[@]}" -o "-Dsparkguard.tested.jar=$jar" \
    "-Dsparkguard.build.directory=$out/target" "-Dsparkguard.test.sources=$out/src" \
    -Dmaven.main.skip=true -Dmaven.resources.skip=true "-Dtest=$tests" \
    clean test >"$build_log" 2>&1
  rc=$?
  set -e
  awk '/^\[(INFO|ERROR|WARNING)\] Results:/{p=1} p && /Tests run:/{print; p=0}' "$build_log" >&2
  echo "$reports"
  if [[ $rc -ne 0 ]]; then
    {
      echo "build-jvm.sh: ERROR: Maven failed (exit $rc after $(( $(date +%s) - start ))s). Its [ERROR] lines ($build_log):"
      grep -E '^\[ERROR\]' "$build_log" | head -n 40 | sed 's/^/    /'
    } >&2
    exit 1
  fi
  printf '%s\n' "$want_stamp" >"$out/stamp"
  log "tests passed in $(( $(date +%s) - start ))s: $reports"
  exit 0
fi

want_stamp="$(
  {
    echo "spark=$spark_version scala=$scala_version hadoop=$hadoop_version parquet=$parquet_version javac=$javac_version tests=$((1 - skip_tests))"
    ls -1 "$pyspark_jars"
    cat "$module/../spark/first_write_rules.json"  # packed into the jar (the pom's resources)
    cd "$module" && find pom.xml src -type f | LC_ALL=C sort | while read -r f; do echo "== $f"; cat "$f"; done
  } | sha256sum | cut -c1-16
)"

up_to_date() {
  [[ $force -eq 0 && -f "$jar" && -f "$stamp" && "$(cat "$stamp")" == "$want_stamp" ]]
}
if up_to_date; then
  log "up to date: $jar (spark $spark_version, stamp $want_stamp)"
  echo "$jar"
  exit 0
fi

work="$root/.cache/jvm"  # lock and log: outside target/, which "mvn clean" deletes
mkdir -p "$m2" "$out_dir" "$work"

# One build at a time per checkout (target/ and the jar are shared).
if command -v flock >/dev/null 2>&1; then
  exec 9>"$work/build.lock"
  if ! flock -n 9; then
    log "another build holds $work/build.lock; waiting for it"
    flock 9
  fi
  if up_to_date; then
    log "built by a concurrent run: $jar"
    echo "$jar"
    exit 0
  fi
fi

# Everything Maven needs for this pom is in $m2 once one build succeeded: stay offline then.
pom_hash="$(sha256sum "$module/pom.xml" | cut -c1-16)"
resolved="$m2/.sparkguard-resolved-$pom_hash-tests$((1 - skip_tests))"
mvn_args=("${spark_args[@]}")
[[ -f "$resolved" ]] && mvn_args+=(-o)
# maven.test.skip: neither compile the JUnit sources nor run them (they may use APIs of
# the newest Spark line only, while the main code compiles against every supported one).
[[ $skip_tests -eq 1 ]] && mvn_args+=(-Dmaven.test.skip=true)
if [[ -n "${SPARKGUARD_TEST_JARS:-}" ]]; then
  mvn_args+=("-Dsparkguard.test.jars=$SPARKGUARD_TEST_JARS")
fi

build_log="$work/build.log"
log "building $jar against pyspark $spark_version (scala $scala_version, hadoop $hadoop_version)$([[ -f "$resolved" ]] && echo ', offline')"
start=$(date +%s)
set +e
mvn "${mvn_args[@]}" clean package >"$build_log" 2>&1
rc=$?
set -e
elapsed=$(( $(date +%s) - start ))
# Surefire's summary (the "Results:" block), whatever the outcome.
awk '/^\[(INFO|ERROR|WARNING)\] Results:/{p=1} p && /Tests run:/{print; p=0}' "$build_log" >&2
if [[ $rc -ne 0 ]]; then
  {
    echo "build-jvm.sh: ERROR: Maven failed (exit $rc after ${elapsed}s). Last lines of $build_log:"
    grep -E '^\[ERROR\]' "$build_log" | head -n 40 | sed 's/^/    /'
    [[ -f "$resolved" ]] || echo "    (first build: Maven needs Maven Central for its plugins and JUnit)"
  } >&2
  exit 1
fi
built="$module/target/sparkguard-spark.jar"
[[ -f "$built" ]] || die "Maven succeeded but $built was not produced (see $build_log)"
touch "$resolved"
tmp="$(mktemp "$out_dir/.sparkguard-spark.jar.XXXXXX")"
cp "$built" "$tmp" && chmod 644 "$tmp" && mv -f "$tmp" "$jar"
printf '%s\n' "$want_stamp" >"$stamp"
log "built in ${elapsed}s: $jar ($(du -h "$jar" | cut -f1))"
echo "$jar"
