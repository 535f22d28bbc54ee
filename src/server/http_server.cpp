#include "server/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>

#include "core/error.h"

namespace dsv4::server {

namespace {

constexpr const char* kJson = "application/json";

void send_error(httplib::Response& res, const ApiError& error) {
  res.status = error.status;
  res.set_content(json_text(error_body(error)), kJson);
}

// A completion request: a JSON response, or an SSE stream whose provider runs on this connection's thread
// after the handler returns, pulling payloads from the job as the engine produces them.
void complete(CompletionService& service, Endpoint endpoint, const httplib::Request& req, httplib::Response& res) {
  std::shared_ptr<CompletionJob> job = service.start(endpoint, req.body);
  if (!job->stream()) {
    res.set_content(json_text(job->wait()), kJson);
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [job](size_t, httplib::DataSink& sink) {
        const std::vector<std::string> payloads = job->poll(std::chrono::seconds(1));
        // Nothing new for a second (a long prefill, a full queue): a comment line, which clients ignore,
        // tells whether the client is still there.
        std::string text = payloads.empty() ? ": keep-alive\n\n" : "";
        for (const std::string& p : payloads) text += "data: " + p + "\n\n";
        if (!sink.write(text.data(), text.size())) {
          job->cancel();
          return false;
        }
        if (job->done()) sink.done();
        return true;
      },
      [job](bool success) {
        if (!success) job->cancel();
      });
}

}  // namespace

HttpServer::HttpServer(CompletionService& service, const HttpOptions& options)
    : service_(service), options_(options), http_(std::make_unique<httplib::Server>()) {
  httplib::Server& http = *http_;
  const int threads = options.threads;
  http.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  http.set_payload_max_length(size_t(64) << 20);
  // Remember the listening socket: Debian's compiled httplib listens with a backlog of 5, and a burst of new
  // clients overflows it (the kernel then answers with SYN cookies and resets), so bind() raises it.
  http.set_socket_options([this](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_socket_ = sock;
  });

  const auto completion = [this](Endpoint endpoint) {
    return [this, endpoint](const httplib::Request& req, httplib::Response& res) {
      try {
        complete(service_, endpoint, req, res);
      } catch (const ApiError& e) {
        send_error(res, e);
      }
    };
  };
  http.Post("/v1/chat/completions", completion(Endpoint::kChatCompletions));
  http.Post("/v1/completions", completion(Endpoint::kCompletions));
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(json_text(service_.models()), kJson);
  });
  http.Get("/health", [](const httplib::Request&, httplib::Response& res) { res.set_content("{}", kJson); });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(service_.metrics(), "text/plain; version=0.0.4");
  });

  // Anything else that escapes a handler is a bug, but the server answers and stays up.
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    std::fprintf(stderr, "dsv4 serve: internal error: %s\n", what.c_str());
    send_error(res, ApiError(500, "internal server error: " + what, "server_error"));
  });
  // Unknown paths, wrong methods and other transport-level failures, in the same error shape.
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;  // a handler already wrote an error
    const std::string message = res.status == 404 ? "no route for " + req.method + " " + req.path
                                                   : "HTTP error " + std::to_string(res.status);
    send_error(res, ApiError(res.status, message, "invalid_request_error", "", res.status == 404 ? "not_found" : ""));
  });
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  int port = options_.port;
  if (port == 0) port = http_->bind_to_any_port(options_.host);
  else if (!http_->bind_to_port(options_.host, port)) port = -1;
  DSV4_CHECK(port > 0, "cannot listen on ", options_.host, ":", options_.port, " (address in use or not available)");
  // listen() again on a listening socket only changes its backlog (SOMAXCONN: capped by net.core.somaxconn).
  DSV4_CHECK(::listen(listen_socket_, SOMAXCONN) == 0, "cannot set the listen backlog: ", std::strerror(errno));
  return port;
}

void HttpServer::serve() { http_->listen_after_bind(); }

void HttpServer::stop() { http_->stop(); }

}  // namespace dsv4::server
