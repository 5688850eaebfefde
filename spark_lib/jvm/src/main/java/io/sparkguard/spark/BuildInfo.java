package io.sparkguard.spark;

/**
 * What this jar was built against and what it runs on.
 *
 * <p>The jar is compiled against the Spark that the pinned PySpark ships; {@link #runtimeSparkVersion()}
 * lets a caller (or a test) check that the Spark on the classpath is that one.
 */
public final class BuildInfo {
  private BuildInfo() {}

  /** The Spark version of the classes on the classpath right now. */
  public static String runtimeSparkVersion() {
    return org.apache.spark.package$.MODULE$.SPARK_VERSION();
  }

  /** The version of this jar, from its manifest; {@code "dev"} when run from classes. */
  public static String jarVersion() {
    String version = BuildInfo.class.getPackage().getImplementationVersion();
    return version == null ? "dev" : version;
  }
}
