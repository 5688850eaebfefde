#!/usr/bin/env bash
# Fetch the jars that give PySpark's bundled Hadoop the S3A filesystem (s3a://): hadoop-aws of
# that Hadoop version plus the AWS SDK v2 s3 + s3-transfer-manager modules (not the 686 MB SDK
# bundle), minus what Spark already ships. The list is spark_lib/jvm/s3a/pom.xml; Maven's
# dependency:copy-dependencies copies them into
#
#   ${SPARKGUARD_CACHE:-$HOME/.cache/sparkguard}/s3a/<stamp>/
#
# outside the checkout (35 jars, ~12 MB). A stamp of the pom and the Hadoop version names the
# directory; when it exists nothing is fetched (and Maven is not even started). The directory
# is filled under a temporary name and renamed, so it is complete or absent.
#
# --magic-committer: the same jars plus spark-hadoop-cloud (Spark's binding of the S3A
# committers: PathOutputCommitProtocol, BindingParquetOutputCommitter; the pom's profile
# magic-committer), in a directory of its own. benchmarks/commit_protocol.py needs it; the tests
# don't, so their classpath stays as it was.
#
# stdout: only the directory. Progress and errors go to stderr.
# Exit status: 0 ready; 2 a missing tool (Maven, Java, the venv); 1 Maven failed.
# Environment: SPARKGUARD_CACHE, SPARKGUARD_VENV (default .venv), SPARKGUARD_PYSPARK_JARS.
set -euo pipefail
export PYTHONSAFEPATH=1

log() { printf 'fetch-s3a.sh: %s\n' "$*" >&2; }
missing() { printf 'fetch-s3a.sh: ERROR: %s\n' "$*" >&2; exit 2; }

profile=""
case "${1:-}" in
  "") ;;
  --magic-committer) profile="magic-committer" ;;
  -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 0 ;;
  *) printf 'fetch-s3a.sh: ERROR: unknown argument %s; use --magic-committer or --help\n' "$1" >&2; exit 2 ;;
esac

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pom="$root/spark_lib/jvm/s3a/pom.xml"

if [[ -n "${SPARKGUARD_PYSPARK_JARS:-}" ]]; then
  pyspark_jars="$SPARKGUARD_PYSPARK_JARS"
else
  venv="${SPARKGUARD_VENV:-$root/.venv}"
  [[ -x "$venv/bin/python" ]] || missing "no venv at $venv; run scripts/bootstrap.sh first (or set SPARKGUARD_PYSPARK_JARS)"
  pyspark_jars="$("$venv/bin/python" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))' 2>/dev/null)" ||
    missing "pyspark is not installed in $venv; run scripts/bootstrap.sh first"
fi
api="$(cd "$pyspark_jars" 2>/dev/null && ls -1 hadoop-client-api-[0-9]*.jar 2>/dev/null | head -n1)" ||
  missing "no hadoop-client-api-<version>.jar in $pyspark_jars"
[[ -n "$api" ]] || missing "no hadoop-client-api-<version>.jar in $pyspark_jars"
hadoop_version="${api#hadoop-client-api-}"; hadoop_version="${hadoop_version%.jar}"

# Spark ships these (same or newer versions); two copies on one classpath is asking for trouble.
exclude_groups="io.netty,org.apache.httpcomponents,commons-codec,commons-logging,org.slf4j"
stamp="$( { echo "hadoop=$hadoop_version exclude=$exclude_groups"; cat "$pom"; } | sha256sum | cut -c1-16)"
[[ -n "$profile" ]] && stamp="$stamp-$profile"
cache_root="${SPARKGUARD_CACHE:-$HOME/.cache/sparkguard}"
dir="$cache_root/s3a/$stamp"
if [[ -f "$dir/.complete" ]]; then
  log "up to date: $dir"
  echo "$dir"
  exit 0
fi

command -v java >/dev/null 2>&1 || missing "'java' not found on PATH; Maven needs a Java 17+ runtime"
command -v mvn >/dev/null 2>&1 || missing "'mvn' not found on PATH; install Maven 3.8+ (e.g. apt-get install maven)"
mkdir -p "$cache_root/s3a"
tmp="$(mktemp -d "$cache_root/s3a/.fetch.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
log "fetching hadoop-aws $hadoop_version + AWS SDK v2 s3 modules${profile:+ + spark-hadoop-cloud} into $dir"
if ! mvn -B -ntp -q -Dstyle.color=never -f "$pom" "-Dmaven.repo.local=$cache_root/m2" ${profile:+"-P$profile"} \
    "-Dhadoop.version=$hadoop_version" dependency:copy-dependencies -DincludeScope=runtime \
    "-DexcludeGroupIds=$exclude_groups" "-DoutputDirectory=$tmp/jars" >"$tmp/mvn.log" 2>&1; then
  {
    echo "fetch-s3a.sh: ERROR: Maven could not fetch the S3A jars (it needs Maven Central the first time):"
    grep -E '^\[ERROR\]' "$tmp/mvn.log" | head -n 20 | sed 's/^/    /'
  } >&2
  exit 1
fi
[[ -f "$tmp/jars/hadoop-aws-$hadoop_version.jar" ]] || { log "ERROR: hadoop-aws-$hadoop_version.jar was not fetched"; exit 1; }
if [[ -n "$profile" ]] && ! ls "$tmp/jars"/spark-hadoop-cloud_*.jar >/dev/null 2>&1; then
  log "ERROR: spark-hadoop-cloud was not fetched"; exit 1
fi
touch "$tmp/jars/.complete"
# A concurrent run may have published it meanwhile: keep the first (identical) copy.
[[ -f "$dir/.complete" ]] || { rm -rf "$dir" && mv -T "$tmp/jars" "$dir"; }
log "fetched $(ls "$dir" | wc -l) jars ($(du -sh "$dir" | cut -f1))"
echo "$dir"
