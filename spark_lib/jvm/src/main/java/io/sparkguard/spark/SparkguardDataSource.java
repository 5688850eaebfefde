package io.sparkguard.spark;

import io.sparkguard.spark.common.ProtocolSettings;
import io.sparkguard.spark.common.SparkguardException.ConfigException;
import java.io.IOException;
import java.util.EnumSet;
import java.util.HashMap;
import java.util.Map;
import java.util.Set;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.UnsupportedFileSystemException;
import org.apache.spark.sql.DataFrameWriter;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SQLContext;
import org.apache.spark.sql.SaveMode;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.execution.streaming.Sink;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.sources.BaseRelation;
import org.apache.spark.sql.sources.CreatableRelationProvider;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.sources.StreamSinkProvider;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import scala.jdk.javaapi.CollectionConverters;

/**
 * {@code df.write.format("sparkguard")} on the JVM: the Python API's name in front of {@link
 * SparkguardCommitProtocol}, with no Python in the data path.
 *
 * <p>Spark resolves a format name through the JVM's {@code DataSourceRegister} service providers
 * before Python data sources (Spark's {@code DataSource.lookupDataSource}: a Python source is
 * tried only when no JVM class answers), so with this jar on the classpath {@code
 * format("sparkguard")} is this class. A batch write ({@link #createRelation}) is Spark's own
 * file writer of the {@code format} option (Parquet by default) run through sparkguard's commit
 * protocol: the same names, markers, timeline, write identity and settings as {@code
 * df.write.parquet} under {@code sparkguard spark-conf}.
 *
 * <p><b>Choosing the protocol for this write only.</b> {@code InsertIntoHadoopFsRelationCommand}
 * instantiates {@code sessionState.conf.fileCommitProtocolClass} of the session that runs the
 * write. The write runs in a clone of the caller's session ({@code cloneSession}: same
 * SparkContext, catalog state and conf, its own conf object) whose {@code
 * spark.sql.sources.commitProtocolClass} is the sparkguard protocol and whose {@code
 * spark.sparkguard.*} keys carry this write's options; the caller's session conf is never
 * changed, so other writes, concurrent ones included, keep their protocol.
 *
 * <p><b>Where the fsspec path applies.</b> A location whose scheme has no Hadoop FileSystem
 * ({@code s3://} without a connector for it, {@code gs://}, {@code memory://}, any store reached
 * only through fsspec) is handed to the Python writer registered as {@value #FSSPEC_NAME} by
 * {@code sparkguard.spark_lib.spark.writer.register(spark)}, with the same options; without it the
 * write is refused naming both fixes. {@code writeStream.format("sparkguard")} is the Python
 * streaming sink too: {@link #getTable} hands Spark that source's table for streaming writes
 * (without {@code BATCH_WRITE}, so batch writes fall back to {@link #createRelation}).
 */
public class SparkguardDataSource
    implements DataSourceRegister, CreatableRelationProvider, TableProvider, StreamSinkProvider {
  private static final Logger LOG = LoggerFactory.getLogger(SparkguardDataSource.class);
  /** The format name users write. */
  public static final String NAME = "sparkguard";
  /** The name of the Python (fsspec) writer, registered by {@code writer.register(spark)}. */
  public static final String FSSPEC_NAME = "sparkguard-fsspec";
  static final String COMMIT_PROTOCOL_KEY = "spark.sql.sources.commitProtocolClass";

  @Override
  public String shortName() {
    return NAME;
  }

  @Override
  public BaseRelation createRelation(
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
    StructType schema = data.schema();
    return new BaseRelation() {
      @Override
      public SQLContext sqlContext() {
        return sqlContext;
      }

      @Override
      public StructType schema() {
        return schema;
      }
    };
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

  // ---- streaming: the Python sink, registered as FSSPEC_NAME --------------------------------

  /** The Python sink, found once per instance (Spark makes one instance per lookup). */
  private PythonDataSourceV2 python;

  private PythonDataSourceV2 pythonSource() {
    if (python == null) {
      python = findPythonSource();
    }
    return python;
  }

  private static PythonDataSourceV2 findPythonSource() {
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

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    PythonDataSourceV2 source = pythonSource();
    return source == null ? new StructType() : source.inferSchema(options);
  }

  @Override
  public boolean supportsExternalMetadata() {
    return true;
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
    PythonDataSourceV2 source = pythonSource();
    Table table = source == null ? null : source.getTable(schema, partitioning, properties);
    return new StreamingTable(schema, table);
  }

  @Override
  public Sink createSink(
      SQLContext sqlContext, scala.collection.immutable.Map<String, String> parameters,
      scala.collection.immutable.Seq<String> partitionColumns, OutputMode outputMode) {
    throw new ConfigException(
        "writeStream.format('sparkguard') is sparkguard's Python streaming sink: call"
            + " sparkguard.spark_lib.spark.writer.register(spark) before starting the query (or write"
            + " with Spark's file sink under 'sparkguard spark-conf', whose streaming protocol is"
            + " the JVM's)");
  }

  /**
   * What Spark's V2 lookup gets: the Python sink's table for streaming writes (its own write
   * builder), never {@code BATCH_WRITE} (Spark then saves batch writes through {@link
   * #createRelation}); with no Python sink registered, a table without capabilities.
   */
  static final class StreamingTable implements Table, SupportsWrite {
    private final StructType schema;
    private final Table python;

    StreamingTable(StructType schema, Table python) {
      this.schema = schema;
      this.python = python;
    }

    @Override
    public String name() {
      return NAME;
    }

    @Override
    @SuppressWarnings("deprecation")
    public StructType schema() {
      return schema;
    }

    @Override
    public Set<TableCapability> capabilities() {
      EnumSet<TableCapability> capabilities = EnumSet.noneOf(TableCapability.class);
      if (python != null) {
        capabilities.addAll(python.capabilities());
      }
      capabilities.remove(TableCapability.BATCH_WRITE);
      capabilities.remove(TableCapability.BATCH_READ);
      return capabilities;
    }

    @Override
    public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
      if (python == null) {
        throw new ConfigException(
            "writeStream.format('sparkguard') needs sparkguard.spark_lib.spark.writer.register(spark)"
                + " first");
      }
      return ((SupportsWrite) python).newWriteBuilder(info);
    }
  }
}
