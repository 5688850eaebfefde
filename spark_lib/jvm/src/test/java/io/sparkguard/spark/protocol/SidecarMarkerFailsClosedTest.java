package io.sparkguard.spark.protocol;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.sparkguard.spark.common.SparkguardException;
import io.sparkguard.spark.store.AtomicStore;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.net.SocketException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.time.Duration;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;
import org.apache.hadoop.fs.Path;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * The marker path fails closed (W4/S3): a marker the sidecar did not acknowledge fails the task
 * in {@link ProtocolSteps#markAndPrepare}, which both protocols' {@code newTaskTempFile} call
 * before Spark's writer opens the data file, so the table holds no data file. Each way a sidecar
 * fails is a tiny HTTP server on 127.0.0.1 (answers 500 or 503, resets the connection, accepts
 * and never answers, or nothing listens); a sidecar restarted mid-request is retried through and
 * acknowledges the marker once. The client's deadline and request timeout are short here (the
 * defaults: 120 s and 30 s); the code path is the same.
 */
class SidecarMarkerFailsClosedTest {
  private static final Duration DEADLINE = Duration.ofMillis(600);
  private static final Duration REQUEST_TIMEOUT = Duration.ofMillis(200);
  private static final String NAME = "part-00000-j-w001-c000.parquet";

  @TempDir java.nio.file.Path dir;

  /**
   * A sidecar that answers its n-th request as {@code script[min(n, last)]}: {@code ok} (200, the
   * marker recorded), an HTTP status, {@code reset} (RST after reading the request), {@code
   * silent} (read, never answered) or {@code restart} (the listener closes, and listens again on
   * the same port a moment later: the requests between are refused).
   */
  private static final class Sidecar implements AutoCloseable {
    final List<String> acknowledged = new CopyOnWriteArrayList<>();
    final int port;
    private final String[] script;
    private final List<Socket> held = new CopyOnWriteArrayList<>();
    private volatile ServerSocket listener;
    private volatile boolean closed;
    private int requests;
    private final Thread thread;

    Sidecar(String... script) throws IOException {
      this.script = script;
      listener = new ServerSocket(0, 50, InetAddress.getLoopbackAddress());
      port = listener.getLocalPort();
      thread = new Thread(this::serve, "misbehaving-sidecar");
      thread.setDaemon(true);
      thread.start();
    }

    String endpoint() {
      return "http://127.0.0.1:" + port;
    }

    private void serve() {
      while (!closed) {
        Socket conn = null;
        boolean keep = false;
        try {
          conn = listener.accept();
          String request = readRequest(conn.getInputStream());
          String kind = script[Math.min(requests++, script.length - 1)];
          switch (kind) {
            case "silent" -> {  // kept open, never answered, until the test ends
              held.add(conn);
              keep = true;
            }
            case "reset" -> conn.setSoLinger(true, 0);  // close() sends RST
            case "restart" -> {
              listener.close();
              conn.close();  // the request in flight is lost
              Thread.sleep(250);  // down: the client's next attempt (100 ms later) is refused
              ServerSocket again = new ServerSocket();
              again.setReuseAddress(true);
              again.bind(new InetSocketAddress(InetAddress.getLoopbackAddress(), port));
              listener = again;
            }
            case "ok" -> {
              Matcher name = Pattern.compile("\"markername\":\"([^\"]+)\"").matcher(request);
              String marker = name.find() ? name.group(1) : "?";
              boolean created = !acknowledged.contains(marker);
              acknowledged.add(marker);
              answer(conn, 200, "{\"markername\":\"" + marker + "\",\"created\":" + created + "}");
            }
            default -> answer(conn, Integer.parseInt(kind), "{\"error\":\"flush failed\"}");
          }
        } catch (IOException | InterruptedException e) {
          if (closed) {
            return;
          }
        } finally {
          if (conn != null && !keep) {
            try {
              conn.close();
            } catch (IOException e) {
              // the client went away first
            }
          }
        }
      }
    }

    private static String readRequest(InputStream in) throws IOException {
      StringBuilder head = new StringBuilder();
      while (!head.toString().endsWith("\r\n\r\n")) {
        int b = in.read();
        if (b < 0) {
          throw new SocketException("closed before the request's end");
        }
        head.append((char) b);
      }
      Matcher length = Pattern.compile("(?i)content-length: *(\\d+)").matcher(head);
      byte[] body = in.readNBytes(length.find() ? Integer.parseInt(length.group(1)) : 0);
      return head + new String(body, StandardCharsets.UTF_8);
    }

    private static void answer(Socket conn, int status, String body) throws IOException {
      byte[] bytes = body.getBytes(StandardCharsets.UTF_8);
      OutputStream out = conn.getOutputStream();
      out.write(String.format(Locale.ROOT, "HTTP/1.1 %d X\r\nContent-Type: application/json\r\n"
          + "Content-Length: %d\r\nConnection: close\r\n\r\n", status, bytes.length)
          .getBytes(StandardCharsets.US_ASCII));
      out.write(bytes);
      out.flush();
    }

    @Override
    public void close() throws Exception {
      closed = true;
      listener.close();
      thread.join(2000);
      for (Socket conn : held) {
        conn.close();
      }
    }
  }

  /** W4 of one task against {@code endpoint}: the path its writer would open. */
  private Path markThenPrepare(String endpoint, Duration deadline) throws IOException {
    String table = "sgtest://" + dir.resolve("t").toUri().getPath();
    SidecarMarkerClient client =
        new SidecarMarkerClient(endpoint, null, deadline, REQUEST_TIMEOUT);
    // a direct-write store: there Spark's writer creates the data file under its final name
    AtomicStore store = AtomicStore.forTable(new Path(table), ProtocolStepsTest.directStore());
    return ProtocolSteps.markAndPrepare(store, client,
        new Path(table, "_sparkguard/markers/20260101000000000-j"), new Path(table, NAME), NAME);
  }

  private List<java.nio.file.Path> filesInTable() throws IOException {
    if (!Files.exists(dir.resolve("t"))) {
      return List.of();
    }
    try (Stream<java.nio.file.Path> walk = Files.walk(dir.resolve("t"))) {
      return walk.filter(Files::isRegularFile).toList();
    }
  }

  @ParameterizedTest
  @ValueSource(strings = {"500", "503", "reset", "silent", "unreachable"})
  void aMarkerNotAcknowledgedFailsTheTaskBeforeItsDataFile(String kind) throws Exception {
    String endpoint;
    Sidecar sidecar = null;
    if (kind.equals("unreachable")) {
      try (ServerSocket free = new ServerSocket(0, 1, InetAddress.getLoopbackAddress())) {
        endpoint = "http://127.0.0.1:" + free.getLocalPort();  // closed: nothing listens
      }
    } else {
      sidecar = new Sidecar(kind);
      endpoint = sidecar.endpoint();
    }
    try {
      long start = System.nanoTime();
      SparkguardException e = assertThrows(SparkguardException.class,
          () -> markThenPrepare(endpoint, DEADLINE));
      long tookMs = (System.nanoTime() - start) / 1_000_000L;
      String message = e.getMessage();
      assertTrue(message.startsWith("sparkguard: the marker sidecar at " + endpoint + " "), message);
      assertTrue(message.contains(NAME + ".marker.CREATE"), message);
      assertTrue(message.endsWith(SidecarMarkerClient.CHECK), message);
      if (kind.equals("500")) {  // not transient: refused at once, the sidecar's message kept
        assertTrue(message.contains("refused create") && message.contains("HTTP 500: {\"error\""),
            message);
        assertTrue(tookMs < DEADLINE.toMillis(), tookMs + " ms");
      } else {  // retried until the deadline, then failed; never much past it
        assertTrue(message.contains("did not acknowledge create"), message);
        assertTrue(message.contains("within 0.6 s ("), message);
        assertTrue(message.contains(switch (kind) {
          case "503" -> "last: HTTP 503: {\"error\"";
          case "silent" -> "HttpTimeoutException";
          case "reset" -> "IOException";  // the JDK's words vary: "Connection reset", "no bytes"
          default -> "java.net.ConnectException: nothing accepted the connection";
        }), message);
        assertTrue(tookMs < DEADLINE.toMillis() + 500, tookMs + " ms");
      }
      assertEquals(List.of(), filesInTable(), "no data file, no marker, nothing in the table");
    } finally {
      if (sidecar != null) {
        sidecar.close();
      }
    }
  }

  @Test
  void aSidecarRestartedMidRequestIsRetriedThroughAndAcknowledgesTheMarkerOnce() throws Exception {
    // draining (503), then down and listening again (refused meanwhile), then a reset exchange
    try (Sidecar sidecar = new Sidecar("503", "restart", "reset", "ok")) {
      Path work = markThenPrepare(sidecar.endpoint(), Duration.ofSeconds(5));
      assertEquals(NAME, work.getName());
      assertEquals(List.of(NAME + ".marker.CREATE"), sidecar.acknowledged, "acknowledged once");
      assertEquals(List.of(), filesInTable(), "the data file is the writer's, after this");
    }
  }

  @Test
  void theDefaultsAreTheDocumentedOnes() {
    assertEquals(Duration.ofSeconds(120), SidecarMarkerClient.DEADLINE);
    assertEquals(Duration.ofSeconds(30), SidecarMarkerClient.REQUEST_TIMEOUT);
  }
}
