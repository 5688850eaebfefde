package io.sparkguard.spark.common;

import static org.junit.jupiter.api.Assertions.assertDoesNotThrow;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.sparkguard.spark.common.SparkVersions.UnsupportedSparkException;
import org.junit.jupiter.api.Test;

class SparkVersionsTest {
  @Test
  void everySupportedLineIsAcceptedWhateverItsPatch() {
    for (String version : new String[] {"4.0.0", "4.0.5", "4.1.4", "4.2.1", "4.3.0", "4.0.0-preview2"}) {
      assertDoesNotThrow(() -> SparkVersions.requireSupported(version), version);
    }
    assertDoesNotThrow(() -> SparkVersions.requireSupported());  // the Spark these tests run on
  }

  @Test
  void anUnsupportedSparkGetsOneLineNamingItTheSupportedOnesAndTheFix() {
    for (String version : new String[] {"3.5.9", "3.4.4", "4.4.0", "5.0.0"}) {
      UnsupportedSparkException e =
          assertThrows(UnsupportedSparkException.class, () -> SparkVersions.requireSupported(version));
      assertFalse(e.getMessage().contains("\n"), e.getMessage());
      assertTrue(e.getMessage().startsWith("sparkguard: Spark " + version + " is not supported"
          + " (supported: Spark 4.0, 4.1, 4.2, 4.3): "), e.getMessage());
      assertTrue(e.getMessage().contains("remove sparkguard's conf"), e.getMessage());
    }
  }

  @Test
  void s3aWithoutConditionalCreateIsRefusedInOneLineNamingTheFixes() {
    UnsupportedSparkException e = assertThrows(UnsupportedSparkException.class,
        () -> SparkVersions.requireConditionalCreate("s3a", "4.0.5", "3.4.1"));
    assertEquals("sparkguard: s3a:// tables need Spark 4.1 or newer (S3A's conditional create,"
        + " Hadoop 3.4.2+); this is Spark 4.0.5 with Hadoop 3.4.1: run the job on Spark 4.1+, or"
        + " write this table with the Python writer (sparkguard.spark_lib) where it fits", e.getMessage());
    assertDoesNotThrow(() -> SparkVersions.requireConditionalCreate("s3a", "4.1.4", "3.4.2"));
    assertDoesNotThrow(() -> SparkVersions.requireConditionalCreate("s3a", "4.3.0", "3.5.0"));
    assertDoesNotThrow(() -> SparkVersions.requireConditionalCreate("hdfs", "4.0.5", "3.4.1"));
    assertDoesNotThrow(() -> SparkVersions.requireConditionalCreate(null, "4.0.5", "3.4.1"));
  }

  @Test
  void versionsCompareNumerically() {
    assertTrue(SparkVersions.compare("3.4.1", "3.4.2") < 0);
    assertTrue(SparkVersions.compare("3.10.0", "3.4.2") > 0);
    assertEquals(0, SparkVersions.compare("3.4.2", "3.4.2"));
    assertTrue(SparkVersions.compare("3.4.2-amzn-1", "3.4.2") >= 0);
  }
}
