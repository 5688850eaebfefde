package io.sparkguard.spark.store;

import java.io.IOException;
import java.nio.channels.FileChannel;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.stream.Stream;
import org.apache.hadoop.fs.Path;

/**
 * Local disk (rename store). How it meets {@link AtomicStore}'s guarantees:
 *
 * <ul>
 *   <li>put-if-absent: write {@code .<name>.sg-tmp-<12 hex>} in the target's directory, fsync,
 *       then hard-link it to the final name ({@code link} fails atomically when the name
 *       exists), remove the temp name, fsync the directory;
 *   <li>publish: {@code rename} of the temp file onto the final name (atomic, replaces);
 *   <li>a crash leaves at most a temp file, which readers skip (leading dot) and a rollback of
 *       the instant that marked the name removes.
 * </ul>
 */
public final class LocalAtomicStore implements AtomicStore {
  private static final long serialVersionUID = 1L;
  private static final SecureRandom RANDOM = new SecureRandom();

  public static java.nio.file.Path local(Path path) {
    return java.nio.file.Paths.get(path.toUri().getPath());
  }

  /** {@code .<name>.sg-tmp-<12 lower-case hex>}: the contract's temp name, skipped by readers. */
  static String tempName(String name) {
    byte[] bytes = new byte[6];
    RANDOM.nextBytes(bytes);
    StringBuilder hex = new StringBuilder(12);
    for (byte b : bytes) {
      hex.append(String.format("%02x", b));
    }
    return "." + name + ".sg-tmp-" + hex;
  }

  @Override
  public boolean putIfAbsent(Path path, byte[] data) throws IOException {
    java.nio.file.Path target = local(path);
    java.nio.file.Path dir = target.getParent();
    Files.createDirectories(dir);
    if (Files.exists(target)) {
      return false;
    }
    java.nio.file.Path temp = dir.resolve(tempName(target.getFileName().toString()));
    try {
      writeSynced(temp, data);
      try {
        Files.createLink(target, temp);
      } catch (FileAlreadyExistsException e) {
        return false;
      }
    } finally {
      Files.deleteIfExists(temp);
    }
    syncDirectory(dir);
    return true;
  }

  @Override
  public void createMarker(Path path) throws IOException {
    java.nio.file.Path target = local(path);
    Files.createDirectories(target.getParent());
    try {
      Files.createFile(target);
    } catch (FileAlreadyExistsException e) {
      return; // a retried or duplicate attempt: the marker is already durable
    }
    syncDirectory(target.getParent());
  }

  @Override
  public Path workPath(Path target) {
    return new Path(target.getParent(), tempName(target.getName()));
  }

  @Override
  public void prepareWrite(Path target) {
    // The temp name from workPath is fresh: Spark's create(overwrite=false) succeeds.
  }

  @Override
  public boolean publishesOnDriver() {
    return true;
  }

  @Override
  public void persist(Path work) throws IOException {
    java.nio.file.Path file = local(work);
    sync(file);
    java.nio.file.Path crc = checksumOf(file);
    if (Files.exists(crc)) {
      sync(crc);
    }
  }

  @Override
  public void publish(Path work, Path target) throws IOException {
    java.nio.file.Path from = local(work);
    // Hadoop's local filesystem writes a checksum beside each file (.<name>.crc) and verifies
    // it on read: it moves with the file (durable already, as the file is: persist), and a
    // checksum of an older file of the name goes. The tasks' owned streams write none
    // (OwnedFileSystem); a task given plain paths (a setting naming another owned class) does.
    java.nio.file.Path fromCrc = checksumOf(from);
    java.nio.file.Path toCrc = checksumOf(local(target));
    if (Files.exists(fromCrc)) {
      Files.move(fromCrc, toCrc, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
    } else {
      Files.deleteIfExists(toCrc);
    }
    Files.move(from, local(target), StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
    syncDirectory(local(target).getParent());
  }

  /** Hadoop's ChecksumFileSystem checksum of {@code file}: {@code .<name>.crc} beside it. */
  static java.nio.file.Path checksumOf(java.nio.file.Path file) {
    return file.resolveSibling("." + file.getFileName() + ".crc");
  }

  @Override
  public int deleteLeftovers(Path target, java.util.Set<String> keep) throws IOException {
    java.nio.file.Path dir = local(target).getParent();
    if (!Files.isDirectory(dir)) {
      return 0;
    }
    String prefix = "." + target.getName() + ".sg-tmp-";
    int removed = 0;
    try (Stream<java.nio.file.Path> entries = Files.list(dir)) {
      for (java.nio.file.Path p : (Iterable<java.nio.file.Path>) entries::iterator) {
        String name = p.getFileName().toString();
        boolean temp = name.startsWith(prefix) && !keep.contains(name);
        boolean tempChecksum = name.startsWith("." + prefix) && name.endsWith(".crc")
            && !keep.contains(name.substring(1, name.length() - ".crc".length()));
        if ((temp || tempChecksum) && Files.deleteIfExists(p) && temp) {
          removed++;
        }
      }
    }
    return removed;
  }

  @Override
  public byte[] read(Path path) throws IOException {
    return Files.readAllBytes(local(path));
  }

  @Override
  public long size(Path path) throws IOException {
    try {
      return Files.size(local(path));
    } catch (NoSuchFileException e) {
      return -1;
    }
  }

  @Override
  public List<String> listFiles(Path dir) throws IOException {
    java.nio.file.Path root = local(dir);
    if (!Files.isDirectory(root)) {
      return Collections.emptyList();
    }
    List<String> names = new ArrayList<>();
    // Not Files.walk: it fails when a file goes away between the directory read and its
    // attributes, which a temp file being published or discarded by another writer does.
    Files.walkFileTree(root, new java.nio.file.SimpleFileVisitor<>() {
      @Override
      public java.nio.file.FileVisitResult visitFile(
          java.nio.file.Path file, java.nio.file.attribute.BasicFileAttributes attrs) {
        if (attrs.isRegularFile()) {
          names.add(root.relativize(file).toString());
        }
        return java.nio.file.FileVisitResult.CONTINUE;
      }

      @Override
      public java.nio.file.FileVisitResult visitFileFailed(java.nio.file.Path file, IOException e)
          throws IOException {
        if (e instanceof NoSuchFileException) {
          return java.nio.file.FileVisitResult.CONTINUE;  // removed while listing
        }
        throw e;
      }
    });
    Collections.sort(names);
    return names;
  }

  @Override
  public boolean delete(Path path) throws IOException {
    Files.deleteIfExists(checksumOf(local(path)));
    return Files.deleteIfExists(local(path));
  }

  @Override
  public void deleteDirectory(Path dir) throws IOException {
    java.nio.file.Path root = local(dir);
    if (!Files.exists(root)) {
      return;
    }
    // Files first, deepest directories last.
    List<java.nio.file.Path> all = new ArrayList<>();
    try (Stream<java.nio.file.Path> walk = Files.walk(root)) {
      walk.forEach(all::add);
    }
    Collections.reverse(all);
    for (java.nio.file.Path p : all) {
      Files.deleteIfExists(p);
    }
  }

  private static void writeSynced(java.nio.file.Path path, byte[] data) throws IOException {
    try (FileChannel channel =
        FileChannel.open(path, StandardOpenOption.CREATE_NEW, StandardOpenOption.WRITE)) {
      channel.write(java.nio.ByteBuffer.wrap(data));
      channel.force(true);
    }
  }

  /** fsync of an existing file, its data and metadata. */
  private static void sync(java.nio.file.Path file) throws IOException {
    try (FileChannel channel = FileChannel.open(file, StandardOpenOption.WRITE)) {
      channel.force(true);
    }
  }

  static void syncDirectory(java.nio.file.Path dir) {
    try (FileChannel channel = FileChannel.open(dir, StandardOpenOption.READ)) {
      channel.force(true);
    } catch (IOException e) {
      // Some filesystems refuse fsync on a directory; the rename itself is still atomic.
    }
  }

}
