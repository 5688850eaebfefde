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
set -euo pipefail

case "${1:-}" in
  driver)
    shift
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
    classpath="$SPARK_HOME/jars/*"
    [[ -z "${SPARK_CONF_DIR:-}" ]] || classpath="$SPARK_CONF_DIR:$classpath"
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
