package io.sparkguard.spark.common;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.sparkguard.spark.common.SparkguardException.ConfigException;
import java.util.Map;
import org.junit.jupiter.api.Test;

class ProtocolSettingsTest {
  private static ProtocolSettings parse(Map<String, String> conf) {
    return ProtocolSettings.parse(conf::get);
  }

  @Test
  void ownerDefaultsToJobPrefixAndMarkersToDirect() {
    ProtocolSettings settings = parse(Map.of("spark.sparkguard.jobId", "nightly-1"));
    assertEquals("nightly-1", settings.jobId());
    assertEquals("job:nightly-1", settings.owner());
    assertEquals(0, settings.attempt());
    assertEquals("DIRECT", settings.markerType());
  }

  @Test
  void configuredOwnerAndAttemptAreKept() {
    ProtocolSettings settings =
        parse(Map.of(
            "spark.sparkguard.jobId", "j",
            "spark.sparkguard.owner", "k8s:ns/app/4f2a",
            "spark.sparkguard.attempt", "3"));
    assertEquals("k8s:ns/app/4f2a", settings.owner());
    assertEquals(3, settings.attempt());
  }

  @Test
  void missingJobIdNamesTheKeyAndTheFix() {
    ConfigException error = assertThrows(ConfigException.class, () -> parse(Map.of()));
    assertTrue(error.getMessage().startsWith("spark.sparkguard.jobId is not set"), error.getMessage());
    assertTrue(error.getMessage().contains("sparkguard spark-conf --job-id"), error.getMessage());
  }

  @Test
  void invalidValuesNameTheKey() {
    assertTrue(assertThrows(ConfigException.class, () -> parse(Map.of("spark.sparkguard.jobId", "Bad_Id")))
        .getMessage().startsWith("spark.sparkguard.jobId 'Bad_Id' is not valid"));
    assertTrue(assertThrows(ConfigException.class,
            () -> parse(Map.of("spark.sparkguard.jobId", "j", "spark.sparkguard.attempt", "-1")))
        .getMessage().startsWith("spark.sparkguard.attempt '-1' is not valid"));
    assertTrue(assertThrows(ConfigException.class,
            () -> parse(Map.of("spark.sparkguard.jobId", "j", "spark.sparkguard.owner", "a\nb")))
        .getMessage().startsWith("spark.sparkguard.owner"));
  }

  @Test
  void sidecarMarkersNeedAnHttpEndpointAndResolveTheDriverHost() {
    ProtocolSettings settings =
        parse(Map.of(
            "spark.sparkguard.jobId", "j",
            "spark.sparkguard.markers.type", "TIMELINE_SERVER_BASED",
            "spark.sparkguard.markers.endpoint", "http://{driverHost}:8765",
            "spark.sparkguard.markers.tokenFile", "/var/run/token",
            "spark.driver.host", "10.0.0.7"));
    assertTrue(settings.sidecarMarkers());
    assertEquals("http://10.0.0.7:8765", settings.markerEndpoint());
    assertEquals("/var/run/token", settings.tokenFile());
    assertTrue(assertThrows(ConfigException.class,
            () -> parse(Map.of("spark.sparkguard.jobId", "j", "spark.sparkguard.markers.type", "TIMELINE_SERVER_BASED")))
        .getMessage().contains("set spark.sparkguard.markers.endpoint"));
    assertTrue(assertThrows(ConfigException.class,
            () -> parse(Map.of("spark.sparkguard.jobId", "j", "spark.sparkguard.markers.type", "TIMELINE_SERVER_BASED",
                "spark.sparkguard.markers.endpoint", "127.0.0.1:8765")))
        .getMessage().contains("is not an http(s) URL"));
    assertTrue(assertThrows(ConfigException.class,
            () -> parse(Map.of("spark.sparkguard.jobId", "j", "spark.sparkguard.markers.type", "FILES")))
        .getMessage().startsWith("spark.sparkguard.markers.type 'FILES' is not valid"));
  }
}
