package io.sparkguard.spark;

/**
 * {@code sg-hdfs://}: {@link OwnedFileSystem} over HDFS ({@code DistributedFileSystem}), through
 * which the tasks of an {@code hdfs://} table write their temp files (the rename store's), so
 * that the task's commit takes the written length and Parquet rows from the stream instead of a
 * {@code getFileInfo} RPC to the NameNode and a footer read (a {@code getBlockLocations} RPC and
 * a read from a DataNode) per file, and Spark's {@code BasicWriteTaskStatsTracker} gets the
 * closed file's length without one more {@code getFileInfo}. A class of its own because
 * Hadoop's service loader registers one scheme per class.
 */
public final class OwnedHdfsFileSystem extends OwnedFileSystem {
  @Override
  public String getScheme() {
    return getUri() == null ? HDFS_SCHEME : getUri().getScheme();
  }
}
