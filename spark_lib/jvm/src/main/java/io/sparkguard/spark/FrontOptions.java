package io.sparkguard.spark;

import io.sparkguard.spark.common.ProtocolSettings;
import io.sparkguard.spark.common.SparkguardException.ConfigException;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.TreeMap;

/**
 * The write options of {@code df.write.format("sparkguard")} on the JVM path ({@link
 * SparkguardDataSource}), parsed once into a value: where the table is, which Spark file format
 * writes it, its partition columns, the {@code spark.sparkguard.*} settings the options override
 * (same names as the Python writer's options, docs/writer.md), and the options passed on to
 * Spark's file writer. A purely computational class: every bad option is refused with a {@link
 * ConfigException} naming the option and the fix.
 */
final class FrontOptions {
  /** Write option (lower case) to the {@code spark.sparkguard.*} key it overrides. */
  static final Map<String, String> SETTINGS;
  /** The write options' spelling in messages, by their lower-case form. */
  static final Map<String, String> SPELLING;

  static {
    Map<String, String> settings = new LinkedHashMap<>();
    Map<String, String> spelling = new LinkedHashMap<>();
    String[][] pairs = {
      {"jobId", ProtocolSettings.JOB_ID_KEY},
      {"owner", ProtocolSettings.OWNER_KEY},
      {"attempt", ProtocolSettings.ATTEMPT_KEY},
      {"markerType", ProtocolSettings.MARKER_TYPE_KEY},
      {"markerEndpoint", ProtocolSettings.ENDPOINT_KEY},
      {"tokenFile", ProtocolSettings.TOKEN_FILE_KEY},
      {"journal", ProtocolSettings.JOURNAL_KEY},
      {"snapshotEvery", ProtocolSettings.SNAPSHOT_EVERY_KEY},
      {"archiveRetentionDays", ProtocolSettings.ARCHIVE_RETENTION_KEY},
      {"rerun", ProtocolSettings.RERUN_KEY},
    };
    for (String[] pair : pairs) {
      settings.put(pair[0].toLowerCase(Locale.ROOT), pair[1]);
      spelling.put(pair[0].toLowerCase(Locale.ROOT), pair[0]);
    }
    SETTINGS = Collections.unmodifiableMap(settings);
    SPELLING = Collections.unmodifiableMap(spelling);
  }

  /** Options of the fsspec path only: they configure Python's file managers, which the JVM
   * path does not use. */
  static final List<String> FSSPEC_ONLY =
      List.of("fileManager", "createMode", "storageOptions", "sparkguard.faults");
  /** The Spark file formats the JVM path writes. */
  static final List<String> FORMATS = List.of("parquet", "json", "orc", "csv");
  /** Spark's option carrying {@code df.write.partitionBy(...)} to a V1 source (JSON list). */
  static final String SPARK_PARTITION_COLUMNS = "__partition_columns";

  final String path;
  final String format;
  final List<String> partitionBy;
  /** {@code spark.sparkguard.*} key -> value, from the write options. */
  final Map<String, String> settings;
  /** Options passed on to Spark's writer of {@link #format} (e.g. compression). */
  final Map<String, String> writerOptions;

  private FrontOptions(String path, String format, List<String> partitionBy,
      Map<String, String> settings, Map<String, String> writerOptions) {
    this.path = path;
    this.format = format;
    this.partitionBy = partitionBy;
    this.settings = settings;
    this.writerOptions = writerOptions;
  }

  /** The table location of {@code options} (the {@code path} option), or a ConfigException. */
  static String path(Map<String, String> options) {
    String path = lowerCased(options).get("path");
    if (path == null || path.isBlank()) {
      throw new ConfigException(
          "the sparkguard writer needs a table location: .save('<url>') or"
              + " .option('path', '<url>')");
    }
    return path;
  }

  /**
   * Parse the options of one write (keys in any case).
   *
   * @throws ConfigException naming the option and the fix
   */
  static FrontOptions parse(Map<String, String> options) {
    Map<String, String> lower = lowerCased(options);
    String path = path(options);
    for (String option : FSSPEC_ONLY) {
      if (lower.containsKey(option.toLowerCase(Locale.ROOT))) {
        throw new ConfigException(
            "option '" + option + "' configures the fsspec path (Python file managers), which"
                + " this write does not use: format('sparkguard') writes " + path
                + " through sparkguard's JVM commit protocol and Hadoop's FileSystem. Configure"
                + " the store with spark.hadoop.* settings (e.g. spark.hadoop.fs.s3a.endpoint)"
                + " and drop the option, or write with format('sparkguard-fsspec')");
      }
    }
    String format = lower.getOrDefault("format", "parquet").trim().toLowerCase(Locale.ROOT);
    if (!FORMATS.contains(format)) {
      throw new ConfigException(
          "option 'format'='" + lower.get("format") + "' is not supported; use one of "
              + String.join(", ", FORMATS) + " (default parquet)");
    }
    List<String> partitionBy = partitionColumns(lower.get("partitionby"), "option 'partitionBy'");
    if (partitionBy.isEmpty()) {
      partitionBy = partitionColumns(lower.get(SPARK_PARTITION_COLUMNS), "partitionBy(...)");
    } else if (lower.containsKey(SPARK_PARTITION_COLUMNS)) {
      throw new ConfigException(
          "the write gives partition columns twice, with option 'partitionBy' and with"
              + " partitionBy(...): keep one of them");
    }
    Map<String, String> writer = new TreeMap<>();
    String maxRecords = lower.get("maxrecordsperfile");
    if (maxRecords != null) {
      long value;
      try {
        value = Long.parseLong(maxRecords.trim());
      } catch (NumberFormatException e) {
        value = -1;
      }
      if (value < 0) {
        throw new ConfigException(
            "option 'maxRecordsPerFile'='" + maxRecords + "' must be an integer >= 0 (0: no"
                + " limit)");
      }
      writer.put("maxRecordsPerFile", Long.toString(value));
    }
    Map<String, String> settings = new TreeMap<>();
    for (Map.Entry<String, String> entry : lower.entrySet()) {
      String key = entry.getKey();
      String conf = SETTINGS.get(key);
      if (conf != null) {
        if (entry.getValue() != null && !entry.getValue().isBlank()) {
          settings.put(conf, entry.getValue().trim());
        }
      } else if (!List.of("path", "format", "partitionby", "maxrecordsperfile",
          SPARK_PARTITION_COLUMNS).contains(key)) {
        writer.put(key, entry.getValue());
      }
    }
    return new FrontOptions(path, format, List.copyOf(partitionBy), settings, writer);
  }

  /**
   * Rewrite a settings error so that it names the write option a value came from: {@link
   * ProtocolSettings} names the conf key.
   */
  static ConfigException namingOptions(ConfigException error, Map<String, String> fromOptions) {
    String message = error.getMessage();
    if (message.startsWith(ProtocolSettings.JOB_ID_KEY + " is not set")) {
      return new ConfigException(message + "; or pass .option('jobId', '<job id>') to this write");
    }
    for (Map.Entry<String, String> entry : SETTINGS.entrySet()) {
      if (fromOptions.containsKey(entry.getValue()) && message.startsWith(entry.getValue())) {
        return new ConfigException(
            "write option '" + SPELLING.get(entry.getKey()) + "' (" + entry.getValue() + ")"
                + message.substring(entry.getValue().length()));
      }
    }
    return error;
  }

  /** Comma-separated names, or a JSON list of strings; empty for null. */
  static List<String> partitionColumns(String raw, String what) {
    List<String> columns = new ArrayList<>();
    if (raw == null || raw.isBlank()) {
      return columns;
    }
    String text = raw.trim();
    if (text.startsWith("[")) {
      if (!text.endsWith("]")) {
        throw new ConfigException(what + " '" + raw + "' is not a JSON list; give e.g."
            + " [\"day\",\"hour\"] or day,hour");
      }
      String inner = text.substring(1, text.length() - 1).trim();
      if (inner.isEmpty()) {
        return columns;
      }
      for (String item : inner.split(",")) {
        String name = item.trim();
        if (name.length() < 2 || !name.startsWith("\"") || !name.endsWith("\"")) {
          throw new ConfigException(what + " '" + raw + "' is not a JSON list of column names;"
              + " give e.g. [\"day\",\"hour\"] or day,hour");
        }
        columns.add(name.substring(1, name.length() - 1));
      }
      return columns;
    }
    for (String item : text.split(",")) {
      if (!item.isBlank()) {
        columns.add(item.trim());
      }
    }
    return columns;
  }

  private static Map<String, String> lowerCased(Map<String, String> options) {
    Map<String, String> lower = new TreeMap<>();
    options.forEach((k, v) -> lower.put(k.toLowerCase(Locale.ROOT), v));
    return lower;
  }
}
