#!/usr/bin/env bash
# The image's jar stage (Dockerfile, stage "jar"; tests/chart/test_image.py replays it): builds
# the JVM layer's jar from source, against the jars of the PySpark that constraints.txt pins.
#   image-build-jar.sh <pyspark-jars> <src>   ->  <src>/spark_lib/jars/sparkguard-spark.jar
# <pyspark-jars> is the pyspark/jars directory that `image-install.sh pyspark` installs. Always a
# fresh build (--force: a jar already in <src> is never trusted). The JUnit tests are not run
# here (they start Spark in local mode: minutes): scripts/test.sh runs them on the same sources.
# Exit status: 0 built; 2 wrong arguments, or jars of another PySpark; 1 the build failed.
set -euo pipefail
export PYTHONSAFEPATH=1

refuse() { printf 'image-build-jar.sh: %s\n' "$*" >&2; exit 2; }

[[ $# -eq 2 ]] || refuse "usage: image-build-jar.sh <pyspark-jars-dir> <src>"
jars=$1 src=$2
pin="$(sed -n 's/^pyspark==\([^[:space:]#]*\).*/\1/p' "$src/constraints.txt")"
[[ -n "$pin" ]] || refuse "$src/constraints.txt pins no pyspark (a pyspark==<version> line); the jar is built against the pinned PySpark only"
compgen -G "$jars/spark-core_*-$pin.jar" >/dev/null ||
  refuse "$jars holds no spark-core_*-$pin.jar, so it is not the pyspark/jars of pyspark==$pin (constraints.txt); pass the directory that scripts/image-install.sh pyspark installs"

SPARKGUARD_PYSPARK_JARS="$jars" "$src/scripts/build-jvm.sh" --force --skip-tests >/dev/null
jar="$src/spark_lib/jars/sparkguard-spark.jar"
# The entry points Spark is configured with (sparkconf.py) must be in it.
listing="$(jar tf "$jar")"
for class in SparkguardCommitProtocol SparkguardCheckpointFileManager SparkguardStreamingCommitProtocol; do
  grep -qx "io/sparkguard/spark/$class.class" <<<"$listing" ||
    { printf 'image-build-jar.sh: %s has no io.sparkguard.spark.%s; see %s/.cache/jvm/build.log\n' "$jar" "$class" "$src" >&2; exit 1; }
done
echo "$jar"
