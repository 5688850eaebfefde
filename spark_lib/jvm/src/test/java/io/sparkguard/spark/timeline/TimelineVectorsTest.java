package io.sparkguard.spark.timeline;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.SerializationFeature;
import io.sparkguard.spark.store.LocalAtomicStore;
import java.io.IOException;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.stream.Stream;
import org.apache.hadoop.fs.Path;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The shared timeline vectors ({@code tests/vectors/timeline/<case>/}: a table's {@code
 * _sparkguard/} tree and {@code expected.json} = {@code {"visible": {path: {"size", "rows"}},
 * "committedWrites": {job: [n, ...]}}}), written by the Python library ({@code py-*}) and by
 * this module ({@code jvm-*}): the JVM reads every case as expected.
 */
class TimelineVectorsTest {
  static final java.nio.file.Path VECTORS = java.nio.file.Paths.get("../../tests/vectors/timeline");
  private static final ObjectMapper JSON =
      new ObjectMapper().configure(SerializationFeature.ORDER_MAP_ENTRIES_BY_KEYS, true)
          .enable(SerializationFeature.INDENT_OUTPUT);

  @TempDir java.nio.file.Path dir;

  @Test
  void everyVectorReadsAsExpected() throws IOException {
    Assumptions.assumeTrue(Files.isDirectory(VECTORS), "no vectors at " + VECTORS.toAbsolutePath());
    List<java.nio.file.Path> cases = new ArrayList<>();
    try (Stream<java.nio.file.Path> list = Files.list(VECTORS)) {
      list.filter(p -> Files.isRegularFile(p.resolve("expected.json"))).sorted().forEach(cases::add);
    }
    Assumptions.assumeFalse(cases.isEmpty(), "no cases in " + VECTORS.toAbsolutePath());
    List<String> checked = new ArrayList<>();
    for (java.nio.file.Path c : cases) {
      JsonNode expected = JSON.readTree(c.resolve("expected.json").toFile());
      // A copy: reading never writes, but a failing reader must not damage a fixture.
      java.nio.file.Path table = dir.resolve(c.getFileName().toString());
      copy(c, table);
      TableState state = TableState.load(new LocalAtomicStore(), new Path(table.toUri()), false);
      Map<String, Object> visible = new TreeMap<>();
      state.visibleFiles().forEach((path, file) -> visible.put(path,
          Map.of("size", file.size(), "rows", file.rows())));
      assertEquals(normal(expected.path("visible")), normal(visible),
          c.getFileName() + ": visible files");
      assertEquals(normal(expected.path("committedWrites")), normal(state.committedWrites()),
          c.getFileName() + ": committed writes");
      checked.add(c.getFileName().toString());
    }
    assertTrue(checked.size() == cases.size(), checked.toString());
  }

  /** One JSON tree per value, whatever the Java number types. */
  private static JsonNode normal(Object value) throws IOException {
    return JSON.readTree(JSON.writeValueAsString(value));
  }

  private static void copy(java.nio.file.Path from, java.nio.file.Path to) throws IOException {
    try (Stream<java.nio.file.Path> walk = Files.walk(from)) {
      for (java.nio.file.Path p : (Iterable<java.nio.file.Path>) walk::iterator) {
        java.nio.file.Path target = to.resolve(from.relativize(p).toString());
        if (Files.isDirectory(p)) {
          Files.createDirectories(target);
        } else {
          Files.copy(p, target);
        }
      }
    }
  }

  /** Every jvm case, built here, reads back as its ground truth (no fixture needed). */
  @Test
  void jvmCasesReadAsTheirHistory() throws IOException {
    for (Map.Entry<String, VectorCases.Case> c : VectorCases.CASES.entrySet()) {
      TimelineHistory h = new TimelineHistory(new LocalAtomicStore(),
          new Path(dir.resolve("built-" + c.getKey()).toUri()));
      c.getValue().build(h);
      TableState state = TableState.load(h.store, h.table, false);
      assertEquals(h.expectedVisible(), state.visibleFiles(), c.getKey());
      assertEquals(h.expectedWrites(), state.committedWrites(), c.getKey());
    }
  }

  /**
   * Writes the jvm cases into {@code tests/vectors/timeline/} (run on demand: {@code
   * -Dsparkguard.writeVectors=true}; the result is committed as fixtures).
   */
  @Test
  void writeJvmVectors() throws IOException {
    Assumptions.assumeTrue(Boolean.getBoolean("sparkguard.writeVectors"),
        "set -Dsparkguard.writeVectors=true to rewrite the jvm-* fixtures");
    for (Map.Entry<String, VectorCases.Case> c : VectorCases.CASES.entrySet()) {
      java.nio.file.Path table = VECTORS.resolve(c.getKey()).toAbsolutePath().normalize();
      new LocalAtomicStore().deleteDirectory(new Path(table.toUri()));
      Files.createDirectories(table);
      TimelineHistory h = new TimelineHistory(new LocalAtomicStore(), new Path(table.toUri()));
      c.getValue().build(h);
      Files.writeString(table.resolve("expected.json"),
          JSON.writeValueAsString(h.expectedJson()) + "\n");
    }
  }
}
