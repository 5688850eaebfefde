#!/usr/bin/env bash
# Fetch a list of jars for PySpark's bundled Hadoop version with Maven into the shared cache:
#
#   scripts/fetch-jars.sh s3a [--magic-committer]   (what scripts/fetch-s3a.sh runs)
#   scripts/fetch-jars.sh hdfs-minicluster
#
# s3a: the jars that give PySpark's bundled Hadoop the S3A filesystem (s3a://): hadoop-aws of
#   that Hadoop version plus the AWS SDK v2 s3 + s3-transfer-manager modules (not the 686 MB SDK
#   bundle), minus what Spark already ships; the list is spark_lib/jvm/s3a/pom.xml (35 jars,
#   ~12 MB). The SDK's version is the one that Hadoop version is built with (hadoop-project's
#   aws-java-sdk-v2.version: 2.24.6 for 3.4.1, 2.29.52 for 3.4.2, 2.35.4 for 3.5.0), read from
#   its pom (Maven fetches that pom first). --magic-committer: the same jars plus spark-hadoop-cloud (Spark's binding of the
#   S3A committers: PathOutputCommitProtocol, BindingParquetOutputCommitter; the pom's profile
#   magic-committer), in a directory of its own. benchmarks/commit_protocol.py needs it; the
#   tests don't, so their classpath stays as it was.
# hdfs-minicluster: Hadoop's MiniDFSCluster (a real NameNode and DataNodes, in a JVM of its
#   own: tests/support/hdfs.py), the list tests/support/minicluster/pom.xml: the shaded
#   hadoop-client-minicluster of the same Hadoop version and what it needs. Nothing is excluded:
#   that JVM never loads Spark.
#
# Maven's dependency:copy-dependencies copies a list into
#
#   ${SPARKGUARD_CACHE:-$HOME/.cache/sparkguard}/<list>/<stamp>/
#
# outside the checkout. A stamp of the pom and the Hadoop version names the directory; when it
# exists nothing is fetched (and Maven is not even started). The directory is filled under a
# temporary name and renamed, so it is complete or absent.
#
# stdout: only the directory. Progress and errors go to stderr.
# Exit status: 0 ready; 2 a missing tool (Maven, Java, the venv) or a bad argument; 1 Maven failed.
# Environment: SPARKGUARD_CACHE, SPARKGUARD_VENV (default .venv), SPARKGUARD_PYSPARK_JARS.
set -euo pipefail
export PYTHONSAFEPATH=1

me="${SPARKGUARD_FETCH_NAME:-fetch-jars.sh}"
log() { printf '%s: %s\n' "$me" "$*" >&2; }
missing() { printf '%s: ERROR: %s\n' "$me" "$*" >&2; exit 2; }
usage() { sed -n '2,30p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; }

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
list="${1:-}"
[[ "$list" == "-h" || "$list" == "--help" ]] && { usage; exit 0; }
shift || true
profile=""
case "$list" in
  s3a)
    pom="$root/spark_lib/jvm/s3a/pom.xml"
    # Spark ships these (same or newer versions); two copies on one classpath is asking for trouble.
    exclude_groups="io.netty,org.apache.httpcomponents,commons-codec,commons-logging,org.slf4j"
    case "${1:-}" in
      "") ;;
      --magic-committer) profile="magic-committer" ;;
      *) missing "unknown argument $1 for the s3a list; use --magic-committer or --help" ;;
    esac
    ;;
  hdfs-minicluster)
    pom="$root/tests/support/minicluster/pom.xml"
    exclude_groups=""
    [[ -z "${1:-}" ]] || missing "the hdfs-minicluster list takes no argument (got $1)"
    ;;
  "") usage; missing "name a list: s3a or hdfs-minicluster" ;;
  *) missing "unknown list '$list'; use s3a or hdfs-minicluster" ;;
esac

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

# The s3a stamp is computed as it always was, so an existing cache stays valid.
stamp="$( { echo "hadoop=$hadoop_version exclude=$exclude_groups"; cat "$pom"; } | sha256sum | cut -c1-16)"
[[ -n "$profile" ]] && stamp="$stamp-$profile"
cache_root="${SPARKGUARD_CACHE:-$HOME/.cache/sparkguard}"
dir="$cache_root/$list/$stamp"
if [[ -f "$dir/.complete" ]]; then
  log "up to date: $dir"
  echo "$dir"
  exit 0
fi

command -v java >/dev/null 2>&1 || missing "'java' not found on PATH; Maven needs a Java 17+ runtime"
command -v mvn >/dev/null 2>&1 || missing "'mvn' not found on PATH; install Maven 3.8+ (e.g. apt-get install maven)"
mkdir -p "$cache_root/$list"
tmp="$(mktemp -d "$cache_root/$list/.fetch.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
log "fetching the $list jars${profile:+ ($profile)} for Hadoop $hadoop_version into $dir"
maven_failed() {
  {
    echo "$me: ERROR: Maven could not fetch the $list jars (it needs Maven Central the first time):"
    grep -E '^\[ERROR\]' "$tmp/mvn.log" | head -n 20 | sed 's/^/    /'
  } >&2
  exit 1
}
sdk=""
if [[ "$list" == s3a ]]; then
  # The AWS SDK v2 this Hadoop version is built with (an S3A of one version on another SDK's
  # classes can fail at run time), from hadoop-project's pom.
  mvn -B -ntp -q -Dstyle.color=never -f "$pom" "-Dmaven.repo.local=$cache_root/m2" dependency:get \
    "-Dartifact=org.apache.hadoop:hadoop-project:$hadoop_version:pom" -Dtransitive=false \
    >"$tmp/mvn.log" 2>&1 || maven_failed
  project="$cache_root/m2/org/apache/hadoop/hadoop-project/$hadoop_version/hadoop-project-$hadoop_version.pom"
  sdk="$(sed -n 's:.*<aws-java-sdk-v2.version>\([^<]*\)</aws-java-sdk-v2.version>.*:\1:p' "$project" | head -n1)"
  [[ -n "$sdk" ]] || { log "ERROR: no aws-java-sdk-v2.version in $project"; exit 1; }
fi
if ! mvn -B -ntp -q -Dstyle.color=never -f "$pom" "-Dmaven.repo.local=$cache_root/m2" ${profile:+"-P$profile"} \
    "-Dhadoop.version=$hadoop_version" ${sdk:+"-Dawssdk.version=$sdk"} \
    dependency:copy-dependencies -DincludeScope=runtime \
    ${exclude_groups:+"-DexcludeGroupIds=$exclude_groups"} "-DoutputDirectory=$tmp/jars" >"$tmp/mvn.log" 2>&1; then
  maven_failed
fi
case "$list" in
  s3a) required="hadoop-aws-$hadoop_version.jar s3-$sdk.jar" ;;
  hdfs-minicluster) required="hadoop-client-minicluster-$hadoop_version.jar" ;;
esac
for jar in $required; do
  [[ -f "$tmp/jars/$jar" ]] || { log "ERROR: $jar was not fetched"; exit 1; }
done
if [[ -n "$profile" ]] && ! ls "$tmp/jars"/spark-hadoop-cloud_*.jar >/dev/null 2>&1; then
  log "ERROR: spark-hadoop-cloud was not fetched"; exit 1
fi
touch "$tmp/jars/.complete"
# A concurrent run may have published it meanwhile: keep the first (identical) copy.
[[ -f "$dir/.complete" ]] || { rm -rf "$dir" && mv -T "$tmp/jars" "$dir"; }
log "fetched $(ls "$dir" | wc -l) jars ($(du -sh "$dir" | cut -f1))"
echo "$dir"
