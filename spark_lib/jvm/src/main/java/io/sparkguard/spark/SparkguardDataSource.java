package io.sparkguard.spark;

import io.sparkguard.spark.common.SparkVersions;
import io.sparkguard.spark.common.SparkguardException.ConfigException;
import java.util.EnumSet;
import java.util.Map;
import java.util.Set;
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
import org.apache.spark.sql.execution.streaming.Sink;
import org.apache.spark.sql.sources.BaseRelation;
import org.apache.spark.sql.sources.CreatableRelationProvider;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.sources.StreamSinkProvider;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

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
 *
 * <p><b>Loadable on every Spark.</b> Spark instantiates every registered {@code
 * DataSourceRegister} for any format lookup, a plain {@code spark.read.parquet} included, and one
 * that fails to link breaks them all. So this class refers only to API types every Spark it can
 * meet has (3.5 and Scala 2.12 included); what needs Spark 4's classes ({@code
 * org.apache.spark.sql.classic}, the Python data source) is in {@link DataSourceWrites}, linked
 * only when a write runs, after the version check.
 */
public class SparkguardDataSource
    implements DataSourceRegister, CreatableRelationProvider, TableProvider, StreamSinkProvider {
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
    SparkVersions.requireSupported();
    DataSourceWrites.write(sqlContext, mode, parameters, data);
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

  // ---- streaming: the Python sink, registered as FSSPEC_NAME --------------------------------

  /**
   * The Python sink (a {@code PythonDataSourceV2}, typed {@code Object} so that this class links
   * on a Spark without it), found once per instance (Spark makes one instance per lookup).
   */
  private Object python;

  private Object pythonSource() {
    SparkVersions.requireSupported();  // Spark's V2 lookup of the name comes here first
    if (python == null) {
      python = DataSourceWrites.findPythonSource();
    }
    return python;
  }

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    return DataSourceWrites.inferSchema(pythonSource(), options);
  }

  @Override
  public boolean supportsExternalMetadata() {
    return true;
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
    return new StreamingTable(schema, DataSourceWrites.getTable(pythonSource(), schema, partitioning, properties));
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
