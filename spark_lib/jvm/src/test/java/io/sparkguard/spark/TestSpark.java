package io.sparkguard.spark;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.ObjectInputStream;
import java.io.ObjectOutputStream;
import java.io.Serializable;
import org.apache.spark.TaskContext;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.sql.types.DataTypes;

/**
 * The local Spark session of the JUnit tests, the UDFs they inject task failures with, and what
 * Spark does to an object it ships to a task (Java serialization).
 */
public final class TestSpark {
  private TestSpark() {}

  /**
   * A local session builder on 127.0.0.1 without UI, 2 shuffle partitions, with {@code master}
   * (e.g. {@code local[2,4]}: 2 threads, 4 attempts per task, so an injected failure is retried).
   */
  static SparkSession.Builder local(String master, String appName) {
    return SparkSession.builder()
        .master(master)
        .appName(appName)
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2");
  }

  /**
   * Register the UDF {@code name}: the identity on longs, except that the first attempt of the
   * task that meets {@code value} fails (every attempt when {@code always}).
   */
  static void registerFailure(SparkSession spark, String name, long value, boolean always) {
    spark.udf().register(name, (UDF1<Long, Long>) n -> {
      if (n == value && (always || TaskContext.get().attemptNumber() == 0)) {
        throw new IllegalStateException("injected failure of " + (always ? "every attempt" : "the"
            + " first attempt") + " of the task writing " + value);
      }
      return n;
    }, DataTypes.LongType);
  }

  /** {@code value} after a Java-serialization round trip: the copy a task gets. */
  @SuppressWarnings("unchecked")
  public static <T extends Serializable> T shipped(T value)
      throws IOException, ClassNotFoundException {
    ByteArrayOutputStream bytes = new ByteArrayOutputStream();
    try (ObjectOutputStream out = new ObjectOutputStream(bytes)) {
      out.writeObject(value);
    }
    try (ObjectInputStream in = new ObjectInputStream(new ByteArrayInputStream(bytes.toByteArray()))) {
      return (T) in.readObject();
    }
  }
}
