import java.io.File;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.HdfsConfiguration;
import org.apache.hadoop.hdfs.MiniDFSCluster;

/**
 * A real HDFS for the tests: Hadoop's MiniDFSCluster (one NameNode, DATANODES DataNodes, every
 * server on 127.0.0.1, ephemeral ports) until its standard input closes.
 *
 * <pre>java -cp &lt;the hdfs-minicluster jars&gt;:&lt;this class&gt; MiniHdfs BASE_DIR READY_FILE [DATANODES]</pre>
 *
 * <p>Compiled once into the cache and started by tests/support/hdfs.py (no Maven build, no
 * JShell).
 * Once the cluster is up (the NameNode out of safe mode, every DataNode registered) it writes
 * READY_FILE, atomically: {@code {"uri": "hdfs://127.0.0.1:<rpc port>", "http": <NameNode HTTP
 * port>, "datanodes": n}}. It shuts the cluster down when its standard input reaches EOF: the
 * parent holds the pipe, so a parent that dies, however it dies, takes the cluster with it.
 */
public final class MiniHdfs {
  private static boolean stopped;

  private MiniHdfs() {}

  public static void main(String[] args) throws Exception {
    if (args.length < 2 || args.length > 3) {
      System.err.println("usage: MiniHdfs BASE_DIR READY_FILE [DATANODES]");
      System.exit(2);
    }
    File base = new File(args[0]);
    Path ready = Path.of(args[1]);
    int datanodes = args.length > 2 ? Integer.parseInt(args[2]) : 1;

    Configuration conf = new HdfsConfiguration();
    conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, base.getAbsolutePath());
    conf.set("hadoop.tmp.dir", new File(base, "tmp").getAbsolutePath());
    conf.setInt("dfs.replication", Math.min(datanodes, 3));
    // Every server on the loopback address only (MiniDFSCluster binds the NameNode's RPC and
    // HTTP and the DataNodes to 127.0.0.1; the bind hosts make sure of it).
    conf.set("dfs.namenode.rpc-bind-host", "127.0.0.1");
    conf.set("dfs.namenode.http-bind-host", "127.0.0.1");
    conf.set("dfs.namenode.servicerpc-bind-host", "127.0.0.1");
    conf.set("dfs.datanode.http.bind-host", "127.0.0.1");
    // WebHDFS (the tests' Python client) on the NameNode's HTTP port.
    conf.setBoolean("dfs.webhdfs.enabled", true);

    MiniDFSCluster cluster =
        new MiniDFSCluster.Builder(conf, base)
            .numDataNodes(datanodes)
            .format(true)
            .manageNameDfsDirs(true)
            .manageDataDfsDirs(true)
            .build();
    Runtime.getRuntime().addShutdownHook(new Thread(() -> shutdown(cluster)));
    cluster.waitActive();
    cluster.waitClusterUp();

    String uri = "hdfs://127.0.0.1:" + cluster.getNameNodePort();
    int http = cluster.getNameNode().getHttpAddress().getPort();
    String json =
        "{\"uri\": \"" + uri + "\", \"http\": " + http + ", \"datanodes\": " + datanodes + "}\n";
    Path partial = ready.resolveSibling(ready.getFileName() + ".partial");
    Files.writeString(partial, json, StandardCharsets.UTF_8);
    Files.move(partial, ready, StandardCopyOption.ATOMIC_MOVE);
    System.err.println("MiniHdfs: up at " + uri + " (WebHDFS on 127.0.0.1:" + http + ")");

    waitForEof(System.in);
    System.err.println("MiniHdfs: standard input closed, shutting down");
    shutdown(cluster);
    System.exit(0);
  }

  private static void waitForEof(InputStream in) {
    byte[] buffer = new byte[256];
    try {
      while (in.read(buffer) >= 0) {
        // a line on stdin means nothing: only EOF stops the cluster
      }
    } catch (IOException e) {
      // a broken pipe is an EOF too
    }
  }

  private static synchronized void shutdown(MiniDFSCluster cluster) {
    if (stopped) {
      return; // the explicit shutdown, then the hook that System.exit runs
    }
    stopped = true;
    try {
      cluster.shutdown(true);
    } catch (RuntimeException e) {
      System.err.println("MiniHdfs: shutdown failed: " + e);
    }
  }
}
