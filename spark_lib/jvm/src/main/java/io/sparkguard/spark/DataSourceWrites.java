package io.sparkguard.spark;

import io.sparkguard.spark.common.ProtocolSettings;
import io.sparkguard.spark.common.SparkguardException.ConfigException;
import java.io.IOException;
import java.util.HashMap;
import java.util.Map;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.UnsupportedFileSystemException;
import org.apache.spark.sql.DataFrameWriter;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SQLContext;
import org.apache.spark.sql.SaveMode;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import scala.jdk.javaapi.CollectionConverters;

/**
 * What {@link SparkguardDataSource} does with Spark 4's classes ({@code
 * org.apache.spark.sql.classic}, the Python data source): apart, so that the registered class
 * links on any Spark and this one only when a write runs (after the version check).
 */
final class DataSourceWrites {
  private static final Logger LOG = LoggerFactory.getLogger(DataSourceWrites.class);
  private static final String FSSPEC_NAME = SparkguardDataSource.FSSPEC_NAME;
  private static final String COMMIT_PROTOCOL_KEY = SparkguardDataSource.COMMIT_PROTOCOL_KEY;

  private DataSourceWrites() {}

  /** A batch {@code format("sparkguard")} write: through the JVM protocol, or through fsspec. */
  static void write(
      SQLContext sqlContext, SaveMode mode, scala.collection.immutable.Map<String, String> parameters,
      Dataset<Row> data) {
    Map<String, String> options = new HashMap<>(CollectionConverters.asJava(parameters));
    org.apache.spark.sql.classic.SparkSession session =
        (org.apache.spark.sql.classic.SparkSession) sqlContext.sparkSession();
    String path = FrontOptions.path(options);
    if (!hasHadoopFileSystem(session, path)) {
      writeThroughFsspec(session, mode, options, data, path);
    } else {
      writeThroughProtocol(session, mode, FrontOptions.parse(options), data);
    }
  }

  /** Whether Hadoop has a FileSystem for {@code path}'s scheme in this session. */
  static boolean hasHadoopFileSystem(org.apache.spark.sql.classic.SparkSession session, String path) {
    try {
      new Path(path).getFileSystem(session.sessionState().newHadoopConf());
      return true;
    } catch (UnsupportedFileSystemException e) {
      return false;  // no fs.<scheme>.impl, no service provider for the scheme
    } catch (RuntimeException e) {
      if (e.getCause() instanceof ClassNotFoundException) {
        return false;  // configured, but its connector is not on the classpath
      }
      throw e;
    } catch (IOException e) {
      throw new java.io.UncheckedIOException("sparkguard: cannot open " + path, e);
    }
  }

  /** The JVM path: Spark's file writer in a session clone whose commit protocol is ours. */
  private static void writeThroughProtocol(
      org.apache.spark.sql.classic.SparkSession session, SaveMode mode, FrontOptions options,
      Dataset<Row> data) {
    org.apache.spark.sql.classic.SparkSession clone = session.cloneSession();
    SQLConf conf = clone.sessionState().conf();
    conf.setConfString(COMMIT_PROTOCOL_KEY, SparkguardCommitProtocol.PROTOCOL);
    options.settings.forEach(conf::setConfString);
    try {
      // Refused here, before any job runs, naming the option (the protocol would name the key).
      ProtocolSettings.parse(key -> conf.getConfString(key, null));
    } catch (ConfigException e) {
      throw FrontOptions.namingOptions(e, options.settings);
    }
    org.apache.spark.sql.classic.Dataset<Row> input =
        (org.apache.spark.sql.classic.Dataset<Row>) data;
    scala.Option<org.apache.spark.sql.classic.SparkSession> previous =
        org.apache.spark.sql.classic.SparkSession.getActiveSession();
    // The protocol reads its settings through SQLConf.get: the active session's conf.
    org.apache.spark.sql.classic.SparkSession.setActiveSession(clone);
    try {
      Dataset<Row> rows =
          org.apache.spark.sql.classic.Dataset.ofRows(clone, input.queryExecution().analyzed());
      DataFrameWriter<Row> writer = rows.write().format(options.format).mode(mode);
      if (!options.partitionBy.isEmpty()) {
        writer = writer.partitionBy(options.partitionBy.toArray(new String[0]));
      }
      writer.options(options.writerOptions).save(options.path);
    } finally {
      if (previous.isDefined()) {
        org.apache.spark.sql.classic.SparkSession.setActiveSession(previous.get());
      } else {
        org.apache.spark.sql.classic.SparkSession.clearActiveSession();
      }
    }
  }

  /** The fsspec path: the Python writer, when {@code writer.register(spark)} registered it. */
  private static void writeThroughFsspec(
      org.apache.spark.sql.classic.SparkSession session, SaveMode mode, Map<String, String> options,
      Dataset<Row> data, String path) {
    if (!session.sessionState().dataSourceManager().dataSourceExists(FSSPEC_NAME)) {
      throw new ConfigException(
          "Hadoop has no FileSystem for " + path + ", so format('sparkguard') cannot write it"
              + " through the JVM commit protocol: use a scheme Hadoop serves (file://, hdfs://,"
              + " s3a:// with hadoop-aws on the classpath), or call"
              + " sparkguard.spark_lib.spark.writer.register(spark) first to write it through fsspec"
              + " (format('" + FSSPEC_NAME + "'))");
    }
    LOG.info("sparkguard: {} has no Hadoop FileSystem; writing it through fsspec ({})", path,
        FSSPEC_NAME);
    data.write().format(FSSPEC_NAME).mode(mode).options(options).save();
  }

  static PythonDataSourceV2 findPythonSource() {
    scala.Option<org.apache.spark.sql.classic.SparkSession> active =
        org.apache.spark.sql.classic.SparkSession.getActiveSession();
    if (!active.isDefined()) {
      return null;
    }
    org.apache.spark.sql.classic.SparkSession session = active.get();
    if (!session.sessionState().dataSourceManager().dataSourceExists(FSSPEC_NAME)) {
      return null;
    }
    PythonDataSourceV2 source = new PythonDataSourceV2();
    source.setShortName(FSSPEC_NAME);
    return source;
  }

  /** The Python sink's schema ({@code python}: a PythonDataSourceV2 or null). */
  static StructType inferSchema(Object python, CaseInsensitiveStringMap options) {
    return python == null ? new StructType() : ((PythonDataSourceV2) python).inferSchema(options);
  }

  /** The Python sink's table ({@code python}: a PythonDataSourceV2 or null), or null. */
  static Table getTable(
      Object python, StructType schema, Transform[] partitioning, Map<String, String> properties) {
    return python == null ? null : ((PythonDataSourceV2) python).getTable(schema, partitioning, properties);
  }
}
