package io.sparkguard.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;
import java.util.TreeSet;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;

/**
 * The packages of the JVM layer are layers (spark_lib/jvm/README.md, "Packages"): a class may use
 * its own package and the ones below it, never one above. Checked on the main sources, by their
 * text: every {@code io.sparkguard.spark...} name outside comments and string literals (imports
 * and fully qualified names alike) must be of a layer no higher than the file's own.
 */
class PackageLayersTest {
  /** Lowest first; {@code ""} is {@code io.sparkguard.spark}: what Spark and Hadoop load by name. */
  static final List<String> LAYERS = List.of("common", "store", "timeline", "protocol", "");

  private static final Path SOURCES = Paths.get(
      System.getProperty("basedir", "."), "src", "main", "java", "io", "sparkguard", "spark");
  private static final Pattern REFERENCE =
      Pattern.compile("\\bio\\.sparkguard\\.spark((?:\\.[a-z]\\w*)*)\\.(?:[A-Z]\\w*|\\*)");

  @Test
  void noPackageUsesOneAboveIt() throws IOException {
    List<String> violations = new ArrayList<>();
    for (Path file : sources()) {
      String own = packageOf(file);
      Matcher m = REFERENCE.matcher(code(Files.readString(file, StandardCharsets.UTF_8)));
      while (m.find()) {
        String used = m.group(1).isEmpty() ? "" : m.group(1).substring(1);
        if (LAYERS.indexOf(used) > LAYERS.indexOf(own)) {
          violations.add(SOURCES.relativize(file) + " uses " + m.group());
        }
      }
    }
    assertEquals(List.of(), violations, "a lower package uses a higher one (order, lowest first: "
        + LAYERS + "); move the shared code down instead");
  }

  @Test
  void everyPackageHasALayer() throws IOException {
    TreeSet<String> packages = new TreeSet<>();
    for (Path file : sources()) {
      packages.add(packageOf(file));
    }
    assertTrue(LAYERS.containsAll(packages),
        "packages " + packages + " vs layers " + LAYERS + ": give a new package its place in"
            + " PackageLayersTest.LAYERS and in spark_lib/jvm/README.md, \"Packages\"");
  }

  private static List<Path> sources() throws IOException {
    try (Stream<Path> files = Files.walk(SOURCES)) {
      List<Path> java = files.filter(f -> f.toString().endsWith(".java")).sorted().toList();
      assertTrue(java.size() > 10, "no sources under " + SOURCES.toAbsolutePath());
      return java;
    }
  }

  /** {@code store} for {@code .../spark/store/AtomicStore.java}, {@code ""} for the top. */
  private static String packageOf(Path file) {
    Path dir = SOURCES.relativize(file).getParent();
    return dir == null ? "" : dir.toString().replace(java.io.File.separatorChar, '.');
  }

  /** {@code source} without its comments and the contents of its string and char literals. */
  static String code(String source) {
    StringBuilder out = new StringBuilder(source.length());
    int i = 0;
    while (i < source.length()) {
      char c = source.charAt(i);
      if (source.startsWith("//", i)) {
        i = source.indexOf('\n', i) < 0 ? source.length() : source.indexOf('\n', i);
      } else if (source.startsWith("/*", i)) {
        i = source.indexOf("*/", i + 2) < 0 ? source.length() : source.indexOf("*/", i + 2) + 2;
        out.append(' ');
      } else if (c == '"' || c == '\'') {
        int j = i + 1;
        while (j < source.length() && source.charAt(j) != c) {
          j += source.charAt(j) == '\\' ? 2 : 1;
        }
        out.append(c).append(c);
        i = j + 1;
      } else {
        out.append(c);
        i++;
      }
    }
    return out.toString();
  }

  @Test
  void commentsAndLiteralsAreNotCode() {
    assertEquals("a   b \"\" c '' d\n",
        code("a /* io.sparkguard.spark.X */ b \"io.sparkguard.spark.Y\" c '\"' d// z\n"));
  }
}
