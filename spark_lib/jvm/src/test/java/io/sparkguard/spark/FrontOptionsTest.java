package io.sparkguard.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.sparkguard.spark.common.ProtocolSettings;
import io.sparkguard.spark.common.SparkguardException.ConfigException;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

class FrontOptionsTest {
  @Test
  void thePythonWritersOptionsBecomeSettingsAndWriterOptions() {
    FrontOptions options = FrontOptions.parse(Map.of(
        "path", "/t", "JOBID", "j-1", "markerType", "TIMELINE_SERVER_BASED", "rerun", "rewrite",
        "partitionBy", "[\"day\",\"hour\"]", "maxRecordsPerFile", "10", "compression", "zstd"));
    assertEquals("/t", options.path);
    assertEquals("parquet", options.format);
    assertEquals(List.of("day", "hour"), options.partitionBy);
    assertEquals(Map.of(
        ProtocolSettings.JOB_ID_KEY, "j-1",
        ProtocolSettings.MARKER_TYPE_KEY, "TIMELINE_SERVER_BASED",
        ProtocolSettings.RERUN_KEY, "rewrite"), options.settings);
    assertEquals(Map.of("maxRecordsPerFile", "10", "compression", "zstd"), options.writerOptions);
    assertEquals(List.of("day"), FrontOptions.parse(
        Map.of("path", "/t", FrontOptions.SPARK_PARTITION_COLUMNS, "[\"day\"]")).partitionBy);
    assertEquals(List.of("a", "b"), FrontOptions.partitionColumns(" a, b ,", "x"));
  }

  @Test
  void eachBadOptionIsNamedWithItsFix() {
    Map<Map<String, String>, String> cases = Map.of(
        Map.of("jobId", "j"), "needs a table location: .save('<url>')",
        Map.of("path", "/t", "createMode", "conditional"), "option 'createMode' configures the"
            + " fsspec path",
        Map.of("path", "/t", "format", "text"), "option 'format'='text' is not supported",
        Map.of("path", "/t", "maxRecordsPerFile", "many"), "option 'maxRecordsPerFile'='many'",
        Map.of("path", "/t", "partitionBy", "[day]"), "option 'partitionBy' '[day]' is not a"
            + " JSON list of column names",
        Map.of("path", "/t", "partitionBy", "a", FrontOptions.SPARK_PARTITION_COLUMNS, "[\"a\"]"),
        "partition columns twice");
    cases.forEach((options, message) -> {
      ConfigException error = assertThrows(ConfigException.class, () -> FrontOptions.parse(options));
      assertTrue(error.getMessage().contains(message), error.getMessage());
    });
  }

  @Test
  void aSettingsErrorNamesTheOptionItCameFrom() {
    ConfigException fromOption = FrontOptions.namingOptions(
        new ConfigException(ProtocolSettings.ATTEMPT_KEY + " 'x' is not valid: give a"
            + " non-negative integer"),
        Map.of(ProtocolSettings.ATTEMPT_KEY, "x"));
    assertEquals("write option 'attempt' (spark.sparkguard.attempt) 'x' is not valid: give a"
        + " non-negative integer", fromOption.getMessage());
    ConfigException fromConf = new ConfigException(ProtocolSettings.ATTEMPT_KEY + " 'x' bad");
    assertEquals(fromConf, FrontOptions.namingOptions(fromConf, Map.of()));
  }
}
