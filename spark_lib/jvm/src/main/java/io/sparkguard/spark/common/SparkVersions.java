package io.sparkguard.spark.common;

import java.util.List;

/**
 * The Spark lines this jar supports, and the checks every entry point makes before anything else
 * (docs/compatibility.md).
 *
 * <p>One jar serves Spark 4.0 to 4.3 (Scala 2.13): it is compiled against the newest line, and
 * what differs on an older one is either never loaded there ({@code spark-conf} and the operator
 * leave the streaming classes out of a 4.0 job's conf) or decided here. Guarantee: on a Spark
 * outside {@link #SUPPORTED} every entry point fails with one line naming the running version,
 * the supported ones and the fix, before it touches a table.
 */
public final class SparkVersions {
  private SparkVersions() {}

  /** The supported lines (major.minor), oldest first. */
  public static final List<String> SUPPORTED = List.of("4.0", "4.1", "4.2", "4.3");

  /** The oldest Hadoop whose S3A has conditional create ({@code fs.s3a.create.conditional.enabled}). */
  public static final String S3A_CONDITIONAL_CREATE_HADOOP = "3.4.2";

  /** An entry point of the jar met a Spark it does not support. */
  public static final class UnsupportedSparkException extends SparkguardException {
    private static final long serialVersionUID = 1L;

    public UnsupportedSparkException(String message) {
      super(message);
    }
  }

  /** The Spark version of the classes on the classpath right now. */
  public static String running() {
    return org.apache.spark.package$.MODULE$.SPARK_VERSION();
  }

  /** The Hadoop version of the classes on the classpath right now. */
  public static String runningHadoop() {
    return org.apache.hadoop.util.VersionInfo.getVersion();
  }

  /** Fails with the one-line refusal unless the running Spark is a supported line. */
  public static void requireSupported() {
    requireSupported(running());
  }

  /** Fails with the one-line refusal unless {@code sparkVersion} is of a supported line. */
  public static void requireSupported(String sparkVersion) {
    if (!SUPPORTED.contains(line(sparkVersion))) {
      throw new UnsupportedSparkException(refusal(sparkVersion));
    }
  }

  /** The one-line refusal for {@code sparkVersion} (the same words spark-conf and the operator use). */
  public static String refusal(String sparkVersion) {
    return "sparkguard: Spark " + sparkVersion + " is not supported (supported: Spark "
        + String.join(", ", SUPPORTED) + "): run the job on a supported Spark, or remove"
        + " sparkguard's conf (spark.sql.sources.commitProtocolClass and the jar in spark.jars)"
        + " from this job";
  }

  /**
   * Fails with one line when {@code scheme} is {@code s3a} and the running Hadoop's S3A has no
   * conditional create (Spark 4.0 ships Hadoop 3.4.1): the timeline's put-if-absent cannot be
   * made safe there.
   */
  public static void requireConditionalCreate(String scheme) {
    requireConditionalCreate(scheme, running(), runningHadoop());
  }

  /** As {@link #requireConditionalCreate(String)}, for the given versions. */
  public static void requireConditionalCreate(String scheme, String sparkVersion, String hadoopVersion) {
    if ("s3a".equals(scheme) && compare(hadoopVersion, S3A_CONDITIONAL_CREATE_HADOOP) < 0) {
      throw new UnsupportedSparkException(
          "sparkguard: s3a:// tables need Spark 4.1 or newer (S3A's conditional create, Hadoop "
              + S3A_CONDITIONAL_CREATE_HADOOP + "+); this is Spark " + sparkVersion + " with Hadoop "
              + hadoopVersion + ": run the job on Spark 4.1+, or write this table with the Python"
              + " writer (sparkguard.spark_lib) where it fits");
    }
  }

  /** {@code "4.0"} for {@code "4.0.5"} (or for {@code "4.0.0-preview2"}). */
  static String line(String version) {
    String[] parts = version.split("[.-]");
    return parts.length < 2 ? version : parts[0] + "." + parts[1];
  }

  /** Compares dotted numeric versions ({@code 3.4.1 < 3.4.2 < 3.5.0}); a suffix is ignored. */
  static int compare(String a, String b) {
    String[] x = a.split("[^0-9]+");
    String[] y = b.split("[^0-9]+");
    for (int i = 0; i < Math.max(x.length, y.length); i++) {
      int xi = i < x.length && !x[i].isEmpty() ? Integer.parseInt(x[i]) : 0;
      int yi = i < y.length && !y[i].isEmpty() ? Integer.parseInt(y[i]) : 0;
      if (xi != yi) {
        return Integer.compare(xi, yi);
      }
    }
    return 0;
  }
}
