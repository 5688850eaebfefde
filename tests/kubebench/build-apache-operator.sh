#!/usr/bin/env bash
# Build the Apache Spark Kubernetes Operator (spark.apache.org/v1) at release 1.0.0 from its
# source, with the bench's own Maven build (apache-operator/*.pom beside this script), for the
# sparkguard kube test bench.
#
# Upstream builds with Gradle, which cannot be fetched here. The poms compile upstream's three
# modules (spark-operator-api, spark-submission-worker, spark-operator) unchanged, with their
# libraries from Maven Central at the versions of upstream's gradle/libs.versions.toml, except
# java-operator-sdk: 5.3.2 (operator-framework-core) instead of 5.5.0, which is not served here
# (docs/decisions.md, "The Apache operator, built"). The source is the shared release tarball
# (<repo>/../shared/upstream/apache-spark-kubernetes-operator-1.0.0.tar.gz, or
# $SPARKGUARD_UPSTREAM_DIR), checked against its pinned hash. Everything lives under
#
#   ${SPARKGUARD_CACHE:-$HOME/.cache/sparkguard}/apache-operator/1.0.0/
#       src/    the release tree (its CRDs: build-tools/helm/spark-kubernetes-operator/crds/)
#       build/  the poms and Maven's target/ folders
#       lib/    the three module jars and their runtime dependencies
#       bin/spark-kubernetes-operator   runs org.apache.spark.k8s.operator.SparkOperator;
#               its arguments are JVM options (upstream's configuration is system properties)
#
# with Maven's repository in ${SPARKGUARD_CACHE:-$HOME/.cache/sparkguard}/m2; upstream's code
# is never copied into the checkout. Upstream compiles with --release 21: a JDK 21+ is needed
# ($SPARKGUARD_OPERATOR_JDK, else $JAVA_HOME, else the newest under /usr/lib/jvm). A stamp
# (source hash, poms, JDK) skips a build that is already there; a flock serialises
# concurrent runs. Maven runs offline first (inside the network guard nothing else works) and
# online only if that fails. About 2.5 minutes cold on 2 cores (downloads included); 140 MiB.
#
# Progress goes to stderr; on success the only line on stdout is the bin dir.
#
# Options:  --force     rebuild even if the stamp matches
#           --stamp     print the stamp a build would be checked against, build nothing
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=tests/kubebench/build-lib.sh
source "$here/build-lib.sh"  # log, die, find_upstream_tarball

version=1.0.0
commit=d8b19438bd96c6c2f52ee58425ec192b6cc825fc
tarball_name="apache-spark-kubernetes-operator-$version.tar.gz"
# sha256 of the uncompressed tar (`git archive --prefix=spark-kubernetes-operator-1.0.0/ 1.0.0`):
# independent of how it was gzipped.
tar_sha256=9ac7e8537b79d27e8b90d5fb63a0836cc49097ffa81677b586431370effe800e
main_class=org.apache.spark.k8s.operator.SparkOperator

force=0
print_stamp=0
for arg in "$@"; do
  case "$arg" in
    --force) force=1 ;;
    --stamp) print_stamp=1 ;;
    -h|--help) sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 0 ;;
    *) die "unknown argument: $arg" ;;
  esac
done

repo="$(cd "$here/../.." && pwd)"
poms="$here/apache-operator"
cache_root="${SPARKGUARD_CACHE:-$HOME/.cache/sparkguard}"
m2="$cache_root/m2"
base="$cache_root/apache-operator/$version"
src="$base/src"
bin_dir="$base/bin"
stamp="$bin_dir/.stamp"

command -v mvn >/dev/null 2>&1 || die "'mvn' not found in PATH; install Maven 3.8+ (e.g. apt-get install maven)"

# A JDK whose javac is 21 or newer: its home on stdout.
jdk_major() { "$1/bin/javac" -version 2>&1 | awk '{split($2, v, "."); print v[1]}'; }
find_jdk() {
  local candidates=() home
  [[ -n "${SPARKGUARD_OPERATOR_JDK:-}" ]] && candidates+=("$SPARKGUARD_OPERATOR_JDK")
  [[ -n "${JAVA_HOME:-}" ]] && candidates+=("$JAVA_HOME")
  # the newest first (sort -V on the folder names: temurin-25-…, java-17-…)
  while IFS= read -r home; do candidates+=("$home"); done < <(
    find /usr/lib/jvm -mindepth 1 -maxdepth 1 -type d 2>/dev/null |
      awk -F/ '{ n = $NF; gsub(/[^0-9]+/, " ", n); split(n, p, " "); print p[1] "\t" $0 }' |
      sort -t$'\t' -k1,1nr | cut -f2
  )
  for home in "${candidates[@]}"; do
    [[ -x "$home/bin/javac" && -x "$home/bin/java" ]] || continue
    if [[ "$(jdk_major "$home")" -ge 21 ]] 2>/dev/null; then
      echo "$home"
      return 0
    fi
  done
  return 1
}
jdk="$(find_jdk)" ||
  die "no JDK 21+ found (\$SPARKGUARD_OPERATOR_JDK, \$JAVA_HOME, /usr/lib/jvm/*): upstream compiles with --release 21"
jdk_version="$("$jdk/bin/javac" -version 2>&1)"

want_stamp="$(
  {
    echo "version=$version tar=$tar_sha256 jdk=$jdk $jdk_version"
    # contents and names relative to the script's folder only: the stamp must not depend on
    # the path the script was called by (scripts/test.sh calls it relative, the bench's
    # fixture absolute; a path in it made every warm run build twice)
    find "$poms" -name pom.xml -printf '%P\n' | LC_ALL=C sort |
      while IFS= read -r f; do echo "$f $(sha256sum <"$poms/$f" | cut -d' ' -f1)"; done
    sha256sum <"${BASH_SOURCE[0]}" | cut -d' ' -f1
  } | sha256sum | cut -d' ' -f1
)"
if [[ $print_stamp -eq 1 ]]; then
  echo "$want_stamp"
  exit 0
fi

source_ok() { [[ -f "$base/src.sha256" && "$(cat "$base/src.sha256")" == "$tar_sha256" && -d "$src/spark-operator" ]]; }
build_ok() {
  [[ $force -eq 0 && -x "$bin_dir/spark-kubernetes-operator" && -f "$stamp" ]] &&
    [[ "$(cat "$stamp")" == "$want_stamp" ]]
}

mkdir -p "$base" || die "cannot create $base"
if source_ok && build_ok; then
  log "up to date: apache spark-kubernetes-operator $version in $bin_dir (stamp ${want_stamp:0:12})"
  echo "$bin_dir"
  exit 0
fi

exec 9>"$base/.lock"
if ! flock -n 9; then
  log "another run holds $base/.lock; waiting for it"
  flock 9
fi

if ! source_ok; then
  tarball="$(find_upstream_tarball "$repo" "$tarball_name")" ||
    die "$tarball_name was found neither in \$SPARKGUARD_UPSTREAM_DIR nor in <repo>/../shared/upstream/"
  got="$(gzip -dc "$tarball" | sha256sum | cut -d' ' -f1)"
  [[ "$got" == "$tar_sha256" ]] ||
    die "$tarball unpacks to a tar with sha256 $got, not $tar_sha256 (release $version, commit $commit); refusing to build it"
  tmp="$(mktemp -d "$base/.src.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  tar -xzf "$tarball" -C "$tmp" || die "cannot extract $tarball"
  [[ -d "$tmp/spark-kubernetes-operator-$version/spark-operator" ]] ||
    die "$tarball has no spark-kubernetes-operator-$version/spark-operator/ folder"
  rm -rf "$src" "$base/src.sha256"
  mv "$tmp/spark-kubernetes-operator-$version" "$src"
  printf '%s\n' "$tar_sha256" >"$base/src.sha256"
  rm -rf "$tmp"
  trap - EXIT
  log "source ready in $src (release $version, commit $commit)"
fi

if build_ok; then
  log "built by a concurrent run: $bin_dir"
  echo "$bin_dir"
  exit 0
fi

# The poms are copied next to Maven's output: no target/ folder in the checkout.
build="$base/build"
rm -rf "$build"
mkdir -p "$build"
(cd "$poms" && find . -name pom.xml -exec cp --parents -t "$build" {} +)
build_log="$base/build.log"
mvn_args=(-B -f "$build/pom.xml" "-Dmaven.repo.local=$m2" "-Dapache.src=$src" package)
log "building with Maven and $jdk_version ($jdk); log: $build_log"
start=$(date +%s)
if ! JAVA_HOME="$jdk" mvn -o "${mvn_args[@]}" >"$build_log" 2>&1; then
  log "offline build failed (a library not yet in $m2?); again with Maven Central"
  if ! JAVA_HOME="$jdk" mvn "${mvn_args[@]}" >>"$build_log" 2>&1; then
    {
      echo "$kubebench_script: ERROR: the Maven build failed after $(( $(date +%s) - start ))s. Errors in $build_log:"
      grep -E '^\[ERROR\]' "$build_log" | head -n 40 | sed 's/^/    /'
    } >&2
    exit 1
  fi
fi

rm -rf "$base/lib" "$bin_dir"
mkdir -p "$base/lib" "$bin_dir"
cp "$build"/operator/target/lib/*.jar "$build"/operator/target/spark-kubernetes-operator-*.jar "$base/lib/"
launcher="$bin_dir/spark-kubernetes-operator"
cat >"$launcher" <<EOF
#!/bin/sh
# Upstream's operator as its chart runs it (java -cp <jar> <options> $main_class), on the
# classpath build-apache-operator.sh assembled. Arguments: JVM options, e.g. -Dkey=value.
exec "$jdk/bin/java" -cp "$base/lib/*" "\$@" $main_class
EOF
chmod +x "$launcher"
printf '%s\n' "$want_stamp" >"$stamp"
log "built in $(( $(date +%s) - start ))s: $(ls "$base/lib" | wc -l) jars ($(du -sh "$base/lib" | cut -f1)) in $base/lib"
echo "$bin_dir"
