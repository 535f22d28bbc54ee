#include "server/http_server.h"

#include <httplib.h>
#include <malloc.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "core/error.h"

namespace dsv4::server {

namespace {

constexpr const char* kJson = "application/json";

// Anthropic's routes answer errors in Anthropic's shape, the others in OpenAI's.
bool anthropic_path(const std::string& path) { return path.rfind("/v1/messages", 0) == 0; }

void send_error(httplib::Response& res, const ApiError& error, bool anthropic = false) {
  res.status = error.status;
  if (error.status == 429) res.set_header("Retry-After", "1");  // the queue drains at the engine's pace
  res.set_content(json_text(anthropic ? anthropic_error_body(error) : error_body(error)), kJson);
}

// The request body, whatever its content type says: clients such as `curl -d` label JSON as a form, which
// httplib would parse as one (and refuse past 8 KB). Multipart bodies are not JSON: 415.
std::string read_body(const httplib::Request& req, const httplib::ContentReader& reader, const HttpOptions& options) {
  if (req.is_multipart_form_data()) {
    // Read and dropped: bytes left unread would be taken for the connection's next request.
    reader([](const httplib::MultipartFormData&) { return true; }, [](const char*, size_t) { return true; });
    throw ApiError(415, "request bodies are JSON; a multipart/form-data body is not accepted", "invalid_request_error");
  }
  std::string body;
  // Sized once from the announced length (capped by the limit): growing by doubling left freed pieces of every
  // size behind in the thread's arena.
  body.reserve(std::min<size_t>(std::strtoull(req.get_header_value("Content-Length").c_str(), nullptr, 10),
                                options.max_body_bytes));
  const bool read = reader([&](const char* data, size_t size) {
    body.append(data, size);
    return true;
  });
  if (read) return body;
  if (body.size() > options.max_body_bytes ||
      std::strtoull(req.get_header_value("Content-Length").c_str(), nullptr, 10) > options.max_body_bytes)
    throw ApiError(413, "the request body is larger than this server's limit of " +
                            std::to_string(options.max_body_bytes) + " bytes (dsv4 serve --max-body-mb)",
                   "invalid_request_error");
  throw ApiError(400, "the request body could not be read", "invalid_request_error");
}

// Whether `header` is `prefix` + `key` (the key compared in constant time).
bool carries_key(const std::string& header, const std::string& prefix, const std::string& key) {
  if (header.size() != prefix.size() + key.size() || header.compare(0, prefix.size(), prefix) != 0) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < key.size(); ++i) diff |= static_cast<unsigned char>(header[prefix.size() + i] ^ key[i]);
  return diff == 0;
}

// Whether the request carries the key: `Authorization: Bearer <key>` (OpenAI's clients) or `x-api-key: <key>`
// (Anthropic's).
bool authorized(const httplib::Request& req, const std::string& key) {
  return carries_key(req.get_header_value("Authorization"), "Bearer ", key) ||
         carries_key(req.get_header_value("x-api-key"), "", key);
}

// The Access-Control-Allow-Origin value for this request's Origin, empty when it is not allowed.
std::string allow_origin(const httplib::Request& req, const std::vector<std::string>& allowed) {
  const std::string origin = req.get_header_value("Origin");
  if (origin.empty()) return "";
  for (const std::string& a : allowed)
    if (a == "*" || a == origin) return a == "*" ? "*" : origin;
  return "";
}

// Large bodies leave their pages in the HTTP thread's malloc arena, which glibc keeps: with 64 threads a few
// 50 MB requests held gigabytes. Give them back once the request is done.
void release_large_body(size_t size) {
  if (size >= (size_t(1) << 20)) malloc_trim(0);
}

// A completion request: a JSON response, or an SSE stream whose provider runs on this connection's thread
// after the handler returns, pulling events from the job as the engine produces them.
void complete(CompletionService& service, Endpoint endpoint, const std::string& body, httplib::Response& res) {
  std::shared_ptr<CompletionJob> job = service.start(endpoint, body);
  if (!job->stream()) {
    res.set_content(json_text(job->wait()), kJson);
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [job](size_t, httplib::DataSink& sink) {
        const std::vector<SseEvent> events = job->poll(std::chrono::seconds(1));
        // Nothing new for a second (a long prefill, a full queue): a comment line, which clients ignore,
        // tells whether the client is still there.
        std::string text = events.empty() ? ": keep-alive\n\n" : "";
        for (const SseEvent& e : events)
          text += (e.event.empty() ? "" : "event: " + e.event + "\n") + "data: " + e.data + "\n\n";
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

// Connections are served by a pool that grows when every thread is busy: a stream or a slow client holds its
// thread as long as it lasts, and with httplib's fixed pool a health probe then waited behind them. Threads
// beyond `base` leave after kIdleExit without work; past `max` new connections queue.
class ElasticPool final : public httplib::TaskQueue {
 public:
  static constexpr auto kIdleExit = std::chrono::seconds(30);

  ElasticPool(size_t base, size_t max) : base_(base), max_(std::max(base, max)) {
    std::lock_guard lock(mutex_);
    while (live_ < base_) spawn();
  }
  ~ElasticPool() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    std::lock_guard lock(mutex_);
    jobs_.push_back(std::move(fn));
    if (jobs_.size() > idle_ && live_ < max_) spawn();
    work_.notify_one();
  }

  void shutdown() override {
    std::unique_lock lock(mutex_);
    shutdown_ = true;
    work_.notify_all();
    exited_.wait(lock, [&] { return live_ == 0; });
  }

 private:
  void spawn() {  // mutex_ held
    const bool extra = live_ >= base_;
    ++live_;
    std::thread([this, extra] { work(extra); }).detach();
  }

  void work(bool extra) {
    std::unique_lock lock(mutex_);
    for (;;) {
      ++idle_;
      const auto ready = [&] { return !jobs_.empty() || shutdown_; };
      const bool woke = extra ? work_.wait_for(lock, kIdleExit, ready) : (work_.wait(lock, ready), true);
      --idle_;
      if (jobs_.empty()) {
        if (shutdown_ || !woke) break;
        continue;
      }
      std::function<void()> fn = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      fn();
      lock.lock();
    }
    --live_;
    exited_.notify_all();
  }

  const size_t base_, max_;
  std::mutex mutex_;
  std::condition_variable work_, exited_;
  std::deque<std::function<void()>> jobs_;
  size_t live_ = 0, idle_ = 0;
  bool shutdown_ = false;
};

}  // namespace

HttpServer::HttpServer(CompletionService& service, const Dashboard& dashboard, const HttpOptions& options)
    : service_(service), dashboard_(dashboard), options_(options), http_(std::make_unique<httplib::Server>()) {
  // glibc gives threads up to 8 malloc arenas per core, and each keeps what its threads' requests left in it:
  // with connection threads coming and going, large bodies spread over ever more arenas. A few are enough for
  // JSON parsing, and they bound what stays resident.
  mallopt(M_ARENA_MAX, 4);
  httplib::Server& http = *http_;
  const size_t threads = size_t(options.threads), max_threads = std::max(threads, size_t(options.max_threads));
  http.new_task_queue = [threads, max_threads] { return new ElasticPool(threads, max_threads); };
  http.set_payload_max_length(options.max_body_bytes);
  // Remember the listening socket: Debian's compiled httplib listens with a backlog of 5, and a burst of new
  // clients overflows it (the kernel then answers with SYN cookies and resets), so bind() raises it.
  http.set_socket_options([this](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_socket_ = sock;
  });

  const auto completion = [this](Endpoint endpoint) {
    return [this, endpoint](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
      size_t size = 0;
      try {
        std::string body = read_body(req, reader, options_);
        size = body.size();
        complete(service_, endpoint, body, res);
      } catch (const ApiError& e) {
        send_error(res, e, endpoint == Endpoint::kMessages);
      }
      release_large_body(size);
    };
  };
  http.Post("/v1/chat/completions", completion(Endpoint::kChatCompletions));
  http.Post("/v1/completions", completion(Endpoint::kCompletions));
  http.Post("/v1/messages", completion(Endpoint::kMessages));
  const auto tokens = [this](bool encode) {
    return [this, encode](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
      try {
        const std::string body = read_body(req, reader, options_);
        res.set_content(json_text(encode ? service_.tokenize(body) : service_.detokenize(body)), kJson);
      } catch (const ApiError& e) {
        send_error(res, e);
      }
    };
  };
  http.Post("/tokenize", tokens(true));
  http.Post("/detokenize", tokens(false));
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(json_text(service_.models()), kJson);
  });
  http.Get("/health", [](const httplib::Request&, httplib::Response& res) { res.set_content("{}", kJson); });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(service_.metrics(), "text/plain; version=0.0.4");
  });
  http.Get("/dashboard", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(kDashboardPage.data(), kDashboardPage.size(), "text/html; charset=utf-8");
  });
  http.Get("/dashboard/data", [this](const httplib::Request& req, httplib::Response& res) {
    std::optional<std::string> since;
    if (req.has_param("since")) since = req.get_param_value("since");
    try {
      res.set_content(json_text(dashboard_.data(since)), kJson);
      res.set_header("Cache-Control", "no-store");
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  });
  // The other methods of the known paths: 405 with the allowed one.
  const auto not_allowed = [](const char* allowed) {
    return [allowed](const httplib::Request& req, httplib::Response& res) {
      res.set_header("Allow", allowed);
      send_error(res, ApiError(405, req.method + " is not allowed on " + req.path + " (allowed: " + allowed + ")",
                               "invalid_request_error", "", "method_not_allowed"),
                 anthropic_path(req.path));
    };
  };
  for (const char* path : {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/tokenize", "/detokenize"}) {
    http.Get(path, not_allowed("POST"));
    http.Put(path, not_allowed("POST"));
    http.Patch(path, not_allowed("POST"));
    http.Delete(path, not_allowed("POST"));
    http.Options(path, not_allowed("POST"));
  }
  for (const char* path : {"/v1/models", "/health", "/metrics", "/dashboard", "/dashboard/data"}) {
    http.Post(path, not_allowed("GET"));
    http.Put(path, not_allowed("GET"));
    http.Patch(path, not_allowed("GET"));
    http.Delete(path, not_allowed("GET"));
    http.Options(path, not_allowed("GET"));
  }
  http.set_logger([this](const httplib::Request&, const httplib::Response& res) { service_.http_response(res.status); });

  // Before routing: a browser's CORS preflight from an allowed origin, then the API key on the /v1/ routes.
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.method == "OPTIONS" && req.has_header("Access-Control-Request-Method") &&
        !allow_origin(req, options_.allowed_origins).empty()) {
      res.status = 204;
      res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      const std::string asked = req.get_header_value("Access-Control-Request-Headers");
      res.set_header("Access-Control-Allow-Headers",
                     asked.empty() ? "Authorization, X-Api-Key, Anthropic-Version, Content-Type" : asked);
      res.set_header("Access-Control-Max-Age", "600");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!options_.api_key.empty() && req.path.rfind("/v1/", 0) == 0 && !authorized(req, options_.api_key)) {
      send_error(res,
                 ApiError(401, "missing or incorrect API key: send it as 'Authorization: Bearer <key>' or "
                               "'x-api-key: <key>'",
                          "invalid_request_error", "", "invalid_api_key"),
                 anthropic_path(req.path));
      // Refused before its body is read (an unauthenticated client's upload is not worth reading), so the
      // connection cannot serve another request: its unread bytes would be taken for one. The client closes it.
      res.set_header("Connection", "close");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // Every response to an allowed origin, errors and streams included, names it.
  http.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    const std::string origin = allow_origin(req, options_.allowed_origins);
    if (origin.empty()) return;
    res.set_header("Access-Control-Allow-Origin", origin);
    res.set_header("Vary", "Origin");
  });

  // Anything else that escapes a handler is a bug, but the server answers and stays up.
  http.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    std::fprintf(stderr, "dsv4 serve: internal error: %s\n", what.c_str());
    send_error(res, ApiError(500, "internal server error: " + what, "server_error"), anthropic_path(req.path));
  });
  // Unknown paths, wrong methods and other transport-level failures, in the same error shape.
  http.set_error_handler([limit = options.max_body_bytes](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;  // a handler already wrote an error
    const std::string message =
        res.status == 404   ? "no route for " + req.method + " " + req.path
        : res.status == 413 ? "the request body is larger than this server's limit of " + std::to_string(limit) +
                                  " bytes (dsv4 serve --max-body-mb)"
                            : "HTTP error " + std::to_string(res.status);
    send_error(res, ApiError(res.status, message, "invalid_request_error", "", res.status == 404 ? "not_found" : ""),
               anthropic_path(req.path));
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
