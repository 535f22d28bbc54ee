// The HTTP transport (cpp-httplib): routes, JSON bodies, Server-Sent Events for streams, and errors for
// everything that goes wrong in the API's shape (Anthropic's on /v1/messages, OpenAI's elsewhere; 405 with Allow
// for a known path's other methods, Retry-After on 429).
// Connections are timed: a request's line and headers must arrive within the header timeout (408 otherwise), an
// idle connection closes after the idle timeout. A client that disconnects cancels its request: a stream notices
// when a write fails (an idle stream sends an SSE comment every second to find out), a request waiting for its
// whole answer watches its socket. Every response is counted by status in the metrics.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "server/completion_service.h"
#include "server/dashboard.h"

namespace dsv4::server {

class Listener;

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port
  int threads = 64;  // connection threads kept; a stream holds one for its whole length
  int max_threads = 1024;  // when all are busy more are started, up to this many (idle ones leave again)
  size_t max_body_bytes = size_t(64) << 20;  // larger request bodies are refused with 413
  // A request's line and headers must arrive within this many seconds of its first byte (of the connection's
  // opening, for its first request), and within 64 KiB: otherwise the connection closes, with 408 (431) once the
  // request line is in.
  int header_timeout_s = 10;
  // A request's body must arrive within this many seconds of its headers, plus one second for every 500 bytes
  // received (a minimum rate, as Apache's mod_reqtimeout): a client trickling its body is cut, a slow link is not.
  int body_timeout_s = 20;
  // A connection with no request in progress closes after this many seconds (its Keep-Alive header says so).
  int idle_timeout_s = 75;
  // Non-empty: the /v1/ routes require `Authorization: Bearer <api_key>` or `x-api-key: <api_key>` (401
  // otherwise); /health, /metrics and /dashboard stay open (probes, scrapers, and a page of the same aggregates).
  std::string api_key;
  // Origins whose browsers may call the API (CORS: preflight answered, Access-Control-Allow-Origin set); "*" is
  // any origin. Empty: no CORS headers.
  std::vector<std::string> allowed_origins;
};

class HttpServer {
 public:
  HttpServer(CompletionService& service, const Dashboard& dashboard, const HttpOptions& options);
  ~HttpServer();

  int bind();   // binds the socket; returns the port (useful with port 0). Throws Error when it cannot.
  void serve();  // blocks until stop()
  void stop();   // from any thread

 private:
  CompletionService& service_;
  const Dashboard& dashboard_;
  HttpOptions options_;
  std::unique_ptr<Listener> http_;
  int listen_socket_ = -1;
};

}  // namespace dsv4::server
