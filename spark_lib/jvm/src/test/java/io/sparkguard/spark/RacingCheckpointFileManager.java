package io.sparkguard.spark;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;

/**
 * TESTS ONLY (never shipped: it lives in the test sources). A {@link
 * SparkguardCheckpointFileManager} that makes one metadata-log file the object of a race which
 * both queries pass Spark's existence check for, deterministically.
 *
 * <p>Spark's {@code HDFSMetadataLog.add} first asks {@code exists(<log>/<n>)} and returns
 * {@code false} when the batch is written (Spark then fails the query with {@code
 * CONCURRENT_STREAM_LOG_UPDATE}: that check, not sparkguard, stops most second queries). Only
 * then it calls {@code createAtomic(<log>/<n>, overwriteIfPossible=false)}, writes the batch and
 * closes the stream. For the file named by the Hadoop (or SQL) setting {@link #RACE_FILE}
 * ({@code "offsets/1"}, {@code "commits/0"}: the last two path components), this manager lets
 * that stream be written as usual but, at its {@code close()}, first publishes a competitor's
 * version of the same file through a second, plain {@link SparkguardCheckpointFileManager}:
 * the other query's put-if-absent landing between this query's existence check and its own
 * publication. Then it closes the query's own stream, unchanged, so what stops this query is
 * sparkguard's put-if-absent alone (on S3 the conditional PUT's 412), and what Spark makes of
 * it is its "Multiple streaming queries are concurrently using" error.
 *
 * <p>The competitor's version is the query's own bytes with one field of the metadata line set
 * to {@link #COMPETITOR_MARK} ({@code batchTimestampMs} in an offsets file, {@code
 * nextBatchWatermarkMs} in a commits file): a file Spark parses, and that a test can tell from
 * the query's. Each manager instance races once (Spark makes one per log).
 */
public class RacingCheckpointFileManager extends SparkguardCheckpointFileManager {
  /** Hadoop/SQL setting: the file to race for, as {@code <log>/<batch>}, e.g. {@code offsets/1}. */
  public static final String RACE_FILE = "sparkguard.test.race.file";
  /** The value the competitor writes into its version's metadata line. */
  public static final long COMPETITOR_MARK = 1234567890123L;

  private static final Pattern MARKED_FIELD =
      Pattern.compile("\"(batchTimestampMs|nextBatchWatermarkMs)\"\\s*:\\s*-?\\d+");

  private final Configuration conf;
  private final String raceFile;
  private final AtomicBoolean raced = new AtomicBoolean();

  /** The constructor Spark calls ({@code CheckpointFileManager.create}). */
  public RacingCheckpointFileManager(Path path, Configuration hadoopConf) throws IOException {
    super(path, hadoopConf);
    this.conf = new Configuration(hadoopConf);
    this.raceFile = hadoopConf.getTrimmed(RACE_FILE, "");
  }

  @Override
  public CancellableFSDataOutputStream createAtomic(Path path, boolean overwriteIfPossible) {
    CancellableFSDataOutputStream own = super.createAtomic(path, overwriteIfPossible);
    if (overwriteIfPossible || !isRaceFile(path) || !raced.compareAndSet(false, true)) {
      return own;
    }
    return new Racing(path, own, conf);
  }

  private boolean isRaceFile(Path path) {
    Path parent = path.getParent();
    return !raceFile.isEmpty() && parent != null
        && raceFile.equals(parent.getName() + "/" + path.getName());
  }

  /** The query's bytes with the metadata line's mark field set to {@link #COMPETITOR_MARK}. */
  static byte[] competitorVersion(Path path, byte[] own) throws IOException {
    String text = new String(own, StandardCharsets.UTF_8);
    Matcher m = MARKED_FIELD.matcher(text);
    if (!m.find()) {
      throw new IOException("RacingCheckpointFileManager: " + path + " has neither batchTimestampMs"
          + " nor nextBatchWatermarkMs to mark the competitor's version with: " + text);
    }
    String marked = text.substring(0, m.start()) + "\"" + m.group(1) + "\":" + COMPETITOR_MARK
        + text.substring(m.end());
    return marked.getBytes(StandardCharsets.UTF_8);
  }

  /** The query's stream for the raced file: written as usual, the competitor publishes first. */
  private static final class Racing extends CancellableFSDataOutputStream {
    private final Path path;
    private final CancellableFSDataOutputStream own;
    private final ByteArrayOutputStream copy;
    private final Configuration conf;
    private boolean closed;

    Racing(Path path, CancellableFSDataOutputStream own, Configuration conf) {
      this(path, own, new ByteArrayOutputStream(), conf);
    }

    private Racing(Path path, CancellableFSDataOutputStream own, ByteArrayOutputStream copy,
        Configuration conf) {
      super(new Tee(own, copy));
      this.path = path;
      this.own = own;
      this.copy = copy;
      this.conf = conf;
    }

    @Override
    public void close() throws IOException {
      if (closed) {
        return;
      }
      closed = true;
      byte[] theirs = competitorVersion(path, copy.toByteArray());
      SparkguardCheckpointFileManager competitor =
          new SparkguardCheckpointFileManager(path.getParent(), conf);
      try (CancellableFSDataOutputStream out = competitor.createAtomic(path, false)) {
        out.write(theirs);
      }
      System.err.println("RacingCheckpointFileManager: the competitor published " + path
          + " (" + competitor.mechanism() + "); now this query publishes its own");
      own.close(); // sparkguard's put-if-absent: FileAlreadyExistsException expected
    }

    @Override
    public void cancel() {
      closed = true;
      own.cancel();
    }
  }

  /** Writes go to the query's stream and to a copy; closing is {@link Racing}'s business. */
  private static final class Tee extends OutputStream {
    private final OutputStream own;
    private final OutputStream copy;

    Tee(OutputStream own, OutputStream copy) {
      this.own = own;
      this.copy = copy;
    }

    @Override
    public void write(int b) throws IOException {
      own.write(b);
      copy.write(b);
    }

    @Override
    public void write(byte[] b, int off, int len) throws IOException {
      own.write(b, off, len);
      copy.write(b, off, len);
    }

    @Override
    public void flush() throws IOException {
      own.flush();
    }

    @Override
    public void close() {
      // Racing.close() decides.
    }
  }
}
