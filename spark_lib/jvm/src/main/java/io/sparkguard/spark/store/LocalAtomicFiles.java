package io.sparkguard.spark.store;

import java.io.BufferedOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.channels.Channels;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.Path;

/**
 * Local disk ({@code file:}). How it meets {@link AtomicFiles}' guarantees:
 *
 * <ul>
 *   <li>the bytes go to {@code .<name>.sg-tmp-<12 hex>} in the target's directory (readers and
 *       Spark's checkpoint listings skip it: leading dot, no batch number);
 *   <li>{@code close()}: fsync the file, then {@code link} it to the final name for
 *       put-if-absent (the kernel refuses atomically when the name exists: exactly one racing
 *       creator wins) or {@code rename} it over the final name for overwrite; remove the temp
 *       name; fsync the directory so the publication survives a power loss;
 *   <li>{@code cancel()} / a failed close: delete the temp file.
 * </ul>
 *
 * <p>Hadoop's local filesystem verifies a {@code .<name>.crc} checksum beside a file when there
 * is one. These files are written without one, so a stale checksum of an older file of the
 * same name is removed before (overwrite) or right after (create) publication.
 */
public final class LocalAtomicFiles implements AtomicFiles {
  private static final int BUFFER = 64 * 1024;

  @Override
  public String mechanism() {
    return "local temp file + fsync + link/rename";
  }

  @Override
  public AtomicOutput create(Path path, boolean overwrite) throws IOException {
    java.nio.file.Path target = LocalAtomicStore.local(path);
    java.nio.file.Path dir = target.getParent();
    Files.createDirectories(dir);
    java.nio.file.Path temp = dir.resolve(LocalAtomicStore.tempName(target.getFileName().toString()));
    FileChannel channel =
        FileChannel.open(temp, StandardOpenOption.CREATE_NEW, StandardOpenOption.WRITE);
    return new Output(path, target, temp, channel, overwrite);
  }

  private static final class Output extends AtomicOutput {
    private final Path path;
    private final java.nio.file.Path target;
    private final java.nio.file.Path temp;
    private final FileChannel channel;
    private final OutputStream out;
    private final boolean overwrite;

    Output(Path path, java.nio.file.Path target, java.nio.file.Path temp, FileChannel channel,
        boolean overwrite) {
      this.path = path;
      this.target = target;
      this.temp = temp;
      this.channel = channel;
      this.out = new BufferedOutputStream(Channels.newOutputStream(channel), BUFFER);
      this.overwrite = overwrite;
    }

    @Override
    protected OutputStream out() {
      return out;
    }

    @Override
    protected void publish() throws IOException {
      java.nio.file.Path checksum = LocalAtomicStore.checksumOf(target);
      try {
        out.flush();
        channel.force(true);
        channel.close();
        if (overwrite) {
          Files.deleteIfExists(checksum);
          Files.move(temp, target, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
        } else {
          try {
            Files.createLink(target, temp);
          } catch (java.nio.file.FileAlreadyExistsException e) {
            FileAlreadyExistsException exists = new FileAlreadyExistsException(
                path + " already exists: another writer created it first (nothing was published)");
            exists.initCause(e);
            throw exists;
          }
          Files.deleteIfExists(checksum);
        }
      } finally {
        closeQuietly();
        Files.deleteIfExists(temp); // after link: the extra name; after a failure: the leftover
      }
      LocalAtomicStore.syncDirectory(target.getParent());
    }

    @Override
    protected void discard() {
      closeQuietly();
      try {
        Files.deleteIfExists(temp);
      } catch (IOException e) {
        // A temp name left behind is invisible to readers; a rollback of its owner removes it.
      }
    }

    private void closeQuietly() {
      try {
        channel.close();
      } catch (IOException e) {
        // Nothing to publish from a channel we are abandoning.
      }
    }
  }
}
