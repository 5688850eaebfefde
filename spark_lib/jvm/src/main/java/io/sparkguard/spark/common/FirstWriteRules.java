package io.sparkguard.spark.common;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.util.Locale;

/**
 * The settings refused at a job's first write, with their messages, from {@code
 * first_write_rules.json} (the Python package's {@code spark_lib/spark/}, packed into this jar by
 * the build). The operator's admission reads the same file and refuses an app with the same
 * message before it runs, so the rule and its words live in one place.
 */
public final class FirstWriteRules {
  static final String RESOURCE = "/io/sparkguard/spark/first_write_rules.json";
  private static final JsonNode RULES = load();

  private FirstWriteRules() {}

  private static JsonNode load() {
    try (InputStream in = FirstWriteRules.class.getResourceAsStream(RESOURCE)) {
      if (in == null) {
        throw new IllegalStateException("sparkguard: " + RESOURCE + " is missing from the jar");
      }
      return new ObjectMapper().readTree(in);
    } catch (IOException e) {
      throw new UncheckedIOException("sparkguard: cannot read " + RESOURCE, e);
    }
  }

  private static JsonNode rule(String id) {
    for (JsonNode rule : RULES.get("rules")) {
      if (rule.get("id").asText().equals(id)) {
        return rule;
      }
    }
    throw new IllegalArgumentException("sparkguard: no first-write rule " + id);
  }

  /** Whether rule {@code id} refuses {@code raw} (the conf value; null: unset, its default). */
  public static boolean refuses(String id, String raw) {
    JsonNode rule = rule(id);
    String value = (raw == null ? rule.get("default").asText() : raw).trim().toLowerCase(Locale.ROOT);
    if (rule.has("refused")) {
      for (JsonNode refused : rule.get("refused")) {
        if (refused.asText().equals(value)) {
          return true;
        }
      }
    }
    if (rule.has("allowed")) {
      for (JsonNode allowed : rule.get("allowed")) {
        if (allowed.asText().equals(value)) {
          return false;
        }
      }
      return true;
    }
    return false;
  }

  /** Rule {@code id}'s message about {@code where} (a table) and the refused {@code value}. */
  public static String message(String id, String where, String value) {
    return rule(id).get("message").asText()
        .replace("{where}", where)
        .replace("{value}", value == null ? "" : value.trim().toLowerCase(Locale.ROOT));
  }
}
