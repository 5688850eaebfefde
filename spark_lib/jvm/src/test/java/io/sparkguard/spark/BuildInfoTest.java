package io.sparkguard.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;

import org.apache.spark.sql.internal.SQLConf;
import org.junit.jupiter.api.Test;

class BuildInfoTest {
  @Test
  void testsRunOnTheSparkThePinnedPySparkShips() {
    // build-jvm.sh passes the version it read from the venv's pyspark/jars.
    assertEquals(System.getProperty("sparkguard.expectSparkVersion", "4.3.0"), BuildInfo.runtimeSparkVersion());
    // SQLConf pulls in catalyst, the sql api and their Scala dependencies: the whole runtime is there.
    assertEquals(false, SQLConf.get().getConfString("spark.sql.caseSensitive", "false").isEmpty());
  }
}
