package io.sparkguard.spark.protocol;

import com.fasterxml.jackson.databind.ObjectMapper;
import io.sparkguard.spark.common.SparkguardException;
import java.io.IOException;
import java.io.Serializable;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.Map;
import java.util.Set;

/**
 * Markers batched by the driver pod's marker sidecar (docs/sidecar.md), as the Python executors
 * send them: {@code POST <endpoint>/v1/markers/create} with {@code markerdir} and
 * {@code markername}, a bearer token from the token file. A marker is acknowledged only once the
 * sidecar answered 2xx, i.e. once it is durable on storage (a create it already holds answers 2xx
 * too, so a retry of one that landed is one marker); transient answers (408, 429, 502, 503, 504)
 * and connection errors (refused, reset, closed, no answer within the request timeout) are
 * retried with backoff until the deadline (120 s), every other answer (500 included) fails the
 * task at once with the sidecar's message. Each attempt waits at most the request timeout (30 s)
 * clipped to the time left, and no attempt starts past the deadline, so a call never outlives its
 * deadline by more than the connect timeout. Either failure is a {@link SparkguardException}
 * naming the sidecar's address and what to check, thrown before the caller opens its data file
 * (docs/decisions.md, "The JVM marker client fails closed").
 */
public final class SidecarMarkerClient implements Serializable {
  private static final long serialVersionUID = 1L;
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final Set<Integer> RETRYABLE = Set.of(408, 429, 502, 503, 504);
  static final Duration DEADLINE = Duration.ofSeconds(120);
  static final Duration REQUEST_TIMEOUT = Duration.ofSeconds(30);
  static final Duration CONNECT_TIMEOUT = Duration.ofSeconds(10);
  /** What a task's failure says to check, after the sidecar's address. */
  static final String CHECK = "check that the marker sidecar (under the operator: the"
      + " sparkguard-markers container of the driver pod; else `sparkguard sidecar`) is running and"
      + " reachable at that address; its log says why it failed. The task fails before it writes"
      + " its data file, so Spark can retry it";

  private final String endpoint;
  private final String tokenFile;
  private final Duration deadline;
  private final Duration requestTimeout;
  private transient HttpClient http;
  private transient String token;

  SidecarMarkerClient(String endpoint, String tokenFile) {
    this(endpoint, tokenFile, DEADLINE, REQUEST_TIMEOUT);
  }

  /** With another deadline and request timeout than the defaults (the tests: short ones). */
  SidecarMarkerClient(String endpoint, String tokenFile, Duration deadline, Duration requestTimeout) {
    this.endpoint = endpoint.endsWith("/") ? endpoint.substring(0, endpoint.length() - 1) : endpoint;
    this.tokenFile = tokenFile;
    this.deadline = deadline;
    this.requestTimeout = requestTimeout;
  }

  /** Create {@code markerName} in {@code markerDir} (a storage URL or absolute local path). */
  void create(String markerDir, String markerName) {
    post("create", Map.of("markerdir", markerDir, "markername", markerName));
  }

  /** Delete the marker directory through the sidecar (it drops its state for it too). */
  void deleteDir(String markerDir) {
    post("dir/delete", Map.of("markerdir", markerDir));
  }

  /**
   * Seal the marker directory before the commit reads its markers (W8): from then on the
   * sidecar acknowledges no marker of it, so a straggler task fails before it writes its data
   * file. Returns whether the sidecar sealed it: one older than the route answers 404, and the
   * commit goes on as before (a straggler's marker is acknowledged until the outcome exists).
   */
  boolean seal(String markerDir) {
    return post("dir/seal", Map.of("markerdir", markerDir), Set.of(404)) < 300;
  }

  private void post(String route, Map<String, String> params) {
    post(route, params, Set.of());
  }

  /** Send until a 2xx or an answer in {@code tolerated} (returned); fail on any other. */
  private int post(String route, Map<String, String> params, Set<Integer> tolerated) {
    byte[] body;
    try {
      body = JSON.writeValueAsBytes(params);
    } catch (IOException e) {
      throw new SparkguardException("cannot encode a marker request", e);
    }
    long deadlineAt = System.nanoTime() + deadline.toNanos();
    boolean tokenReloaded = false;
    String last = "no answer";
    for (int attempt = 1; ; attempt++) {
      try {
        long left = Math.max(1_000_000L, deadlineAt - System.nanoTime());
        Duration timeout = requestTimeout.compareTo(Duration.ofNanos(left)) < 0
            ? requestTimeout : Duration.ofNanos(left);
        HttpResponse<String> response =
            client().send(request(route, body, timeout), HttpResponse.BodyHandlers.ofString());
        int status = response.statusCode();
        if (status < 300 || tolerated.contains(status)) {
          return status;
        }
        if (status == 401 && tokenFile != null && !tokenReloaded) {
          token = null;  // the secret may have been rotated: read it again, once
          tokenReloaded = true;
          continue;
        }
        last = "HTTP " + status + ": " + response.body().strip();
        if (!RETRYABLE.contains(status)) {
          // A 4xx is the sidecar's verdict on this request (409: the write is already decided),
          // not a sidecar in trouble: its message says why; a 5xx is trouble, so say what to check.
          throw new SparkguardException(
              "sparkguard: the marker sidecar at " + endpoint + " refused " + route + " "
                  + params + ": " + last + (status >= 500 ? "; " + CHECK : ""));
        }
      } catch (IOException e) {
        last = describe(e);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new SparkguardException("interrupted while sending a marker to " + endpoint, e);
      }
      long delay = Math.min(2000L, 50L << Math.min(attempt - 1, 6));
      if (System.nanoTime() + delay * 1_000_000L >= deadlineAt) {
        throw new SparkguardException(
            "sparkguard: the marker sidecar at " + endpoint + " did not acknowledge " + route
                + " " + params + " within " + seconds(deadline) + " s (" + attempt
                + " attempts, last: " + last + "); " + CHECK);
      }
      try {
        Thread.sleep(delay);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new SparkguardException("interrupted while sending a marker to " + endpoint, e);
      }
    }
  }

  /** A failed exchange in words (a refused connection's exception has no message). */
  private static String describe(IOException e) {
    String what = e.getClass().getName();
    if (e instanceof java.net.ConnectException && e.getMessage() == null) {
      return what + ": nothing accepted the connection";
    }
    return e.getMessage() == null ? what : what + ": " + e.getMessage();
  }

  private static String seconds(Duration duration) {
    return duration.toMillis() % 1000 == 0
        ? Long.toString(duration.toSeconds())
        : Double.toString(duration.toMillis() / 1000.0);
  }

  private HttpRequest request(String route, byte[] body, Duration timeout) {
    HttpRequest.Builder builder = HttpRequest.newBuilder(URI.create(endpoint + "/v1/markers/" + route))
        .timeout(timeout)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json")
        .POST(HttpRequest.BodyPublishers.ofByteArray(body));
    String bearer = token();
    if (bearer != null) {
      builder.header("Authorization", "Bearer " + bearer);
    }
    return builder.build();
  }

  private synchronized String token() {
    if (token == null && tokenFile != null) {
      try {
        token = Files.readString(Paths.get(tokenFile), StandardCharsets.UTF_8).strip();
      } catch (IOException e) {
        throw new SparkguardException(
            "cannot read the marker sidecar token file " + tokenFile + " (" + e.getMessage()
                + "); mount the token secret there", e);
      }
    }
    return token;
  }

  private synchronized HttpClient client() {
    if (http == null) {
      http = HttpClient.newBuilder()
          .version(HttpClient.Version.HTTP_1_1)
          .connectTimeout(CONNECT_TIMEOUT.compareTo(requestTimeout) < 0 ? CONNECT_TIMEOUT : requestTimeout)
          .build();
    }
    return http;
  }
}
