#!/usr/bin/env bash
# The Spark image's entrypoint on the bench's node (kubebench-cri maps images named *spark* to
# it). It does what the entrypoint of Spark's Kubernetes image does with the arguments that
# Spark's Kubernetes resource manager gives its pods, with SPARK_HOME the PySpark wheel's
# directory:
#   driver ARGS...    spark-submit in client mode inside the driver pod, bound to the pod's
#                     address (SPARK_DRIVER_BIND_ADDRESS, from the pod's status.podIP)
#   executor          the executor backend on the JVM, with the options and identity that the
#                     driver put in the executor pod's environment (SPARK_JAVA_OPT_<n>,
#                     SPARK_DRIVER_URL, SPARK_EXECUTOR_ID, ...)
#   anything else     run as given
# One difference from Spark's image: the conf directory (SPARK_CONF_DIR, the pod's mounted
# ConfigMap) comes after Spark's jars on the JVM's class path, not before them. The tests' JVMs
# use a class-data-sharing archive (tests/support/jvm_options.py, JDK_JAVA_OPTIONS from the
# node's image rules), and the JVM uses one only while the class path it was dumped with (the
# jars, as spark-submit lists them) is a prefix of the class path it runs with: an existing
# directory ahead of the jars makes it load every class from the jars again. The conf directory holds no class; spark-submit reads
# its spark.properties through --properties-file, and a log4j2.properties there is found on
# the class path either way.
set -euo pipefail

case "${1:-}" in
  driver)
    shift
    if [[ -n "${SPARK_CONF_DIR:-}" ]]; then
      # after the jars (SPARK_DIST_CLASSPATH ends spark-submit's class path), see above
      export SPARK_DIST_CLASSPATH="${SPARK_DIST_CLASSPATH:+$SPARK_DIST_CLASSPATH:}$SPARK_CONF_DIR"
      unset SPARK_CONF_DIR
    fi
    exec "$SPARK_HOME/bin/spark-submit" \
      --conf "spark.driver.bindAddress=$SPARK_DRIVER_BIND_ADDRESS" \
      --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=$SPARK_DRIVER_BIND_ADDRESS" \
      --deploy-mode client "$@"
    ;;
  executor)
    shift
    java_opts=()
    for ((i = 0; ; i++)); do
      var="SPARK_JAVA_OPT_$i"
      [[ -n "${!var+set}" ]] || break
      java_opts+=("${!var}")
    done
    # Spark's jars as spark-submit's launcher lists them (Spark 4: the SLF4J API jar first), so
    # that the archive's class path is a prefix of this one; the conf directory after them
    slf4j=("$SPARK_HOME"/jars/slf4j-api-*.jar)
    classpath="${slf4j[0]}:$SPARK_HOME/jars/*"
    [[ -z "${SPARK_CONF_DIR:-}" ]] || classpath="$classpath:$SPARK_CONF_DIR"
    [[ -z "${SPARK_CLASSPATH:-}" ]] || classpath="$SPARK_CLASSPATH:$classpath"
    exec "$JAVA_HOME/bin/java" "${java_opts[@]}" \
      -Xms"$SPARK_EXECUTOR_MEMORY" -Xmx"$SPARK_EXECUTOR_MEMORY" -cp "$classpath" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "$SPARK_DRIVER_URL" --executor-id "$SPARK_EXECUTOR_ID" \
      --cores "$SPARK_EXECUTOR_CORES" --app-id "$SPARK_APPLICATION_ID" \
      --hostname "$SPARK_EXECUTOR_POD_IP" --resourceProfileId "$SPARK_RESOURCE_PROFILE_ID" \
      --podName "$SPARK_EXECUTOR_POD_NAME"
    ;;
  *)
    exec "$@"
    ;;
esac
