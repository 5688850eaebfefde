package io.sparkguard.spark;

/**
 * {@code sg-file://}: {@link OwnedFileSystem} over the local filesystem, through which the tasks
 * of a local table write their temp files (the rename store's), so that the task's commit takes
 * the written length and Parquet rows from the stream instead of reading the file's size and
 * footer back. A class of its own because Hadoop's service loader registers one scheme per
 * class.
 */
public final class OwnedLocalFileSystem extends OwnedFileSystem {
  @Override
  public String getScheme() {
    return getUri() == null ? LOCAL_SCHEME : getUri().getScheme();
  }
}
