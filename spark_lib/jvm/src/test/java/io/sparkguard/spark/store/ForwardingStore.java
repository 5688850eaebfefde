package io.sparkguard.spark.store;

import java.io.IOException;
import java.util.List;
import org.apache.hadoop.fs.Path;

/** Test helper: an {@link AtomicStore} forwarding to another, calling {@link #before} first. */
public abstract class ForwardingStore implements AtomicStore {
  private static final long serialVersionUID = 1L;
  public final AtomicStore inner;

  protected ForwardingStore(AtomicStore inner) {
    this.inner = inner;
  }

  protected abstract void before(String op, Path path) throws IOException;

  @Override
  public boolean putIfAbsent(Path path, byte[] data) throws IOException {
    before("putIfAbsent", path);
    return inner.putIfAbsent(path, data);
  }

  @Override
  public void createMarker(Path path) throws IOException {
    before("createMarker", path);
    inner.createMarker(path);
  }

  @Override
  public Path workPath(Path target) {
    return inner.workPath(target);
  }

  @Override
  public boolean publishesOnDriver() {
    return inner.publishesOnDriver();
  }

  @Override
  public boolean pendingUploads() {
    return inner.pendingUploads();
  }

  @Override
  public void completeUpload(Path target, byte[] upload, java.util.List<byte[]> parts, long size)
      throws IOException {
    before("completeUpload", target);
    inner.completeUpload(target, upload, parts, size);
  }

  @Override
  public void persist(Path work) throws IOException {
    inner.persist(work);
  }

  @Override
  public void publish(Path work, Path target) throws IOException {
    before("publish", target);
    inner.publish(work, target);
  }

  @Override
  public void prepareWrite(Path target) throws IOException {
    inner.prepareWrite(target);
  }

  @Override
  public int deleteLeftovers(Path target, java.util.Set<String> keep) throws IOException {
    before("deleteLeftovers", target);
    return inner.deleteLeftovers(target, keep);
  }

  @Override
  public byte[] read(Path path) throws IOException {
    before("read", path);
    return inner.read(path);
  }

  @Override
  public long size(Path path) throws IOException {
    before("size", path);
    return inner.size(path);
  }

  @Override
  public List<String> listFiles(Path dir) throws IOException {
    before("listFiles", dir);
    return inner.listFiles(dir);
  }

  @Override
  public boolean delete(Path path) throws IOException {
    before("delete", path);
    return inner.delete(path);
  }

  @Override
  public void deleteDirectory(Path dir) throws IOException {
    before("deleteDirectory", dir);
    inner.deleteDirectory(dir);
  }

  @Override
  public void overwrite(Path path, byte[] data) throws IOException {
    before("overwrite", path);
    inner.overwrite(path, data);
  }

  /** One file at a time, so a crash can fall between any two deletes. */
  @Override
  public void deleteAll(Path dir, List<Path> paths) throws IOException {
    for (Path path : paths) {
      delete(path);
    }
  }
}
