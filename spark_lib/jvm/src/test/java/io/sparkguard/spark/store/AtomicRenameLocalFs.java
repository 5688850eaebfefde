package io.sparkguard.spark.store;

import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;
import java.nio.file.Files;
import java.nio.file.Paths;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.DelegateToFileSystem;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;

/**
 * Test only: Hadoop's raw local filesystem as a {@code FileContext} filesystem ({@code
 * fs.AbstractFileSystem.file.impl}) whose {@code rename(Rename.NONE)} is atomic, as HDFS's
 * NameNode makes it: {@code link(dst, src)} (refused atomically when {@code dst} exists), then
 * unlink {@code src}. Hadoop's own local {@code FileContext} renames with a check then a rename
 * ({@code AbstractFileSystem.renameInternal}), under which two racing creators can both "win"
 * (and ChecksumFs pairs one racer's data with another's {@code .crc}): observed about once in 50
 * rounds of 8 racers, so the race test of {@link HadoopRenameAtomicStore} runs on this instead.
 */
public class AtomicRenameLocalFs extends DelegateToFileSystem {
  public AtomicRenameLocalFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
    super(uri, new RawLocalFileSystem(), conf, "file", false);
  }

  @Override
  public void renameInternal(Path src, Path dst, boolean overwrite) throws IOException {
    if (overwrite) {
      super.renameInternal(src, dst, true);
      return;
    }
    java.nio.file.Path from = Paths.get(src.toUri().getPath());
    java.nio.file.Path to = Paths.get(dst.toUri().getPath());
    try {
      Files.createLink(to, from);
    } catch (java.nio.file.FileAlreadyExistsException e) {
      throw new FileAlreadyExistsException("rename destination " + dst + " already exists");
    }
    Files.delete(from);
  }
}
