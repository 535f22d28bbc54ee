#include "server/http_server.h"

#include <httplib.h>
#include <malloc.h>
#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <climits>
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

using Clock = std::chrono::steady_clock;

// One client connection as httplib's request parser reads and writes it. dsv4 runs its own connection loop
// (Listener::process_and_close_socket) on this stream instead of httplib's, for what httplib 0.11.4 cannot do:
//  * a deadline for a request's line and headers as a whole: httplib's read timeout restarts with every byte, so a
//    client sending one every few seconds held its thread for ever; and a bound on their size (httplib grows a
//    line until it ends, and takes any number of header lines);
//  * an idle wait in one poll() that also ends when the server stops (httplib's wakes every 10 ms);
//  * the socket of the request being handled, so a handler waiting for generation can tell that its client left.
// Otherwise it behaves as httplib's SocketStream: reads are buffered (here across requests of the connection, so
// pipelined bytes are kept), a body read waits at most the read timeout for its next bytes, a write at most the
// write timeout for room in the socket. docs/design/server-transport.md has the measurements.
class Connection final : public httplib::Stream {
 public:
  static constexpr size_t kMaxHeaderBytes = 64 << 10;  // request line and headers of one request

  // A body's bytes must keep up this rate after its first body_timeout: each byte received moves the deadline
  // by 1 / kMinBodyRate s (Apache's mod_reqtimeout rule), so a slow link finishes and a trickle is cut.
  static constexpr double kMinBodyRate = 500;  // bytes per second

  Connection(int sock, int stop_fd, std::chrono::milliseconds read_timeout, std::chrono::milliseconds write_timeout,
             std::chrono::seconds body_timeout)
      : sock_(sock), stop_fd_(stop_fd), read_timeout_(read_timeout), write_timeout_(write_timeout),
        body_timeout_(body_timeout) {}

  // Waits until the next request's first byte is here (or already read ahead). False when `until` passes, the
  // server stops or the socket fails; a client that closed is seen by the read that follows.
  bool await_request(Clock::time_point until) const { return begin_ < end_ || wait(POLLIN, until, true); }
  // A request starts: its line and headers must be read by `deadline`, within kMaxHeaderBytes.
  void begin_headers(Clock::time_point deadline) {
    in_headers_ = true;
    header_bytes_ = 0;
    header_deadline_ = deadline;
  }
  // Parsed: reads wait the read timeout again, within the body's deadline.
  void end_headers() {
    in_headers_ = false;
    body_deadline_ = Clock::now() + body_timeout_;
  }
  bool timed_out() const { return timed_out_; }  // a started request's headers missed their deadline
  bool too_large() const { return too_large_; }  // ... or passed kMaxHeaderBytes
  bool broken() const { return broken_; }  // a read or write failed, or ended: the connection cannot go on

  // Whether the client closed or reset the connection (a half-close included: it will send nothing more). Bytes it
  // sent ahead (a pipelined request) are not a close.
  bool client_gone() const {
    pollfd p{sock_, POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLERR | POLLHUP | POLLRDHUP)) return true;
    char byte;
    const ssize_t n = ::recv(sock_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }

  bool is_readable() const override { return begin_ < end_ || wait(POLLIN, Clock::now() + read_timeout_, false); }
  bool is_writable() const override { return wait(POLLOUT, Clock::now() + write_timeout_, false) && !client_gone(); }

  ssize_t read(char* ptr, size_t size) override {
    if (in_headers_) {
      if (header_bytes_ >= kMaxHeaderBytes) {
        too_large_ = broken_ = true;
        return -1;
      }
      size = std::min(size, kMaxHeaderBytes - header_bytes_);
    }
    if (begin_ == end_) {
      // Headers: until their deadline, and the server's stop ends a wait between requests. A body: the read
      // timeout, within the body's deadline.
      const Clock::time_point until =
          in_headers_ ? header_deadline_ : std::min(Clock::now() + read_timeout_, body_deadline_);
      ssize_t n = -1;
      while (n < 0) {
        if (!wait(POLLIN, until, in_headers_)) {
          timed_out_ = in_headers_ && header_bytes_ > 0 && Clock::now() >= until;
          broken_ = true;
          return -1;
        }
        n = ::recv(sock_, buffer_.data(), buffer_.size(), MSG_DONTWAIT);
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) break;
      }
      if (n <= 0) {
        broken_ = true;
        return n;
      }
      begin_ = 0;
      end_ = size_t(n);
    }
    const size_t n = std::min(size, end_ - begin_);
    std::memcpy(ptr, buffer_.data() + begin_, n);
    begin_ += n;
    if (in_headers_) header_bytes_ += n;
    else body_deadline_ += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(double(n) / kMinBodyRate));
    return ssize_t(n);
  }

  // Writes all of it (httplib writes a response's head and a body in one call each), or fails.
  ssize_t write(const char* ptr, size_t size) override {
    size_t sent = 0;
    while (sent < size) {
      if (!wait(POLLOUT, Clock::now() + write_timeout_, false)) {
        broken_ = true;
        return -1;
      }
      const ssize_t n = ::send(sock_, ptr + sent, size - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n >= 0) sent += size_t(n);
      else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        broken_ = true;
        return -1;
      }
    }
    return ssize_t(size);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override { address(true, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { address(false, ip, port); }
  socket_t socket() const override { return sock_; }

 private:
  // Polls the socket for `events` until `until`: true when ready (or failed: the next call says how); false on
  // timeout, and when `stoppable` and the server stops.
  bool wait(short events, Clock::time_point until, bool stoppable) const {
    for (;;) {
      const int64_t left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()).count();
      if (left <= 0) return false;
      pollfd fds[2] = {{sock_, events, 0}, {stop_fd_, POLLIN, 0}};
      const int n = ::poll(fds, stoppable ? 2 : 1, int(std::min<int64_t>(left, INT_MAX)));
      if (n < 0 && errno != EINTR) return false;
      if (n <= 0) continue;
      return fds[1].revents == 0;
    }
  }

  void address(bool peer, std::string& ip, int& port) const {
    sockaddr_storage addr{};
    socklen_t length = sizeof(addr);
    sockaddr* a = reinterpret_cast<sockaddr*>(&addr);
    if ((peer ? ::getpeername(sock_, a, &length) : ::getsockname(sock_, a, &length)) != 0) return;
    char host[NI_MAXHOST], service[NI_MAXSERV];
    if (::getnameinfo(a, length, host, sizeof(host), service, sizeof(service), NI_NUMERICHOST | NI_NUMERICSERV) != 0)
      return;
    ip = host;
    port = std::atoi(service);
  }

  const int sock_, stop_fd_;
  const std::chrono::milliseconds read_timeout_, write_timeout_;
  const std::chrono::seconds body_timeout_;
  std::array<char, 16384> buffer_;
  size_t begin_ = 0, end_ = 0;  // the bytes of buffer_ read from the socket and not yet taken
  bool in_headers_ = false;
  size_t header_bytes_ = 0;
  Clock::time_point header_deadline_;
  Clock::time_point body_deadline_;  // end_headers' time + body_timeout_, moved on by each body byte read
  bool timed_out_ = false, too_large_ = false, broken_ = false;
};

// The connection this thread serves (its handlers run on it), null outside Listener::process_and_close_socket.
thread_local Connection* t_connection = nullptr;

bool client_gone() { return t_connection && t_connection->client_gone(); }

// A completion request: a JSON response, or an SSE stream whose provider runs on this connection's thread
// after the handler returns, pulling events from the job as the engine produces them.
void complete(CompletionService& service, Endpoint endpoint, const std::string& body, httplib::Response& res) {
  std::shared_ptr<CompletionJob> job = service.start(endpoint, body);
  if (!job->stream()) {
    // The client may leave while the engine works: then the choices are cancelled, and nobody reads the
    // answer; 499 (nginx's "client closed request") counts it in the metrics.
    if (const std::optional<Json> answer = job->wait(client_gone)) {
      res.set_content(json_text(*answer), kJson);
    } else {
      send_error(res, ApiError(499, "the client closed the connection", "invalid_request_error"),
                 endpoint == Endpoint::kMessages);
      res.set_header("Connection", "close");
    }
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

// httplib's server with dsv4's connection loop (see Connection): the first request's line and headers must arrive
// within the header timeout of the connection's opening, each later one's within it of its first byte, which
// must come within the idle timeout (httplib's keep-alive timeout) of the previous response.
class Listener final : public httplib::Server {
 public:
  explicit Listener(const HttpOptions& options)
      : header_timeout_(std::chrono::seconds(options.header_timeout_s)),
        body_timeout_(std::chrono::seconds(options.body_timeout_s)),
        stop_fd_(::eventfd(0, EFD_CLOEXEC)) {
    DSV4_CHECK(stop_fd_ >= 0, "eventfd: ", std::strerror(errno));
    set_keep_alive_timeout(options.idle_timeout_s);
  }
  ~Listener() override { ::close(stop_fd_); }

  // Ends the waits of every connection between requests (before httplib's stop(), which waits for the threads).
  void stop_connections() {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(stop_fd_, &one, sizeof(one));
  }

 private:
  bool process_and_close_socket(socket_t sock) override {
    using std::chrono::milliseconds, std::chrono::seconds;
    const auto timeout = [](time_t s, time_t us) { return milliseconds(s * 1000 + us / 1000); };
    Connection connection(sock, stop_fd_, timeout(read_timeout_sec_, read_timeout_usec_),
                          timeout(write_timeout_sec_, write_timeout_usec_), body_timeout_);
    struct Current {  // the handlers' view of the connection, for as long as this thread serves it
      explicit Current(Connection* c) { t_connection = c; }
      ~Current() { t_connection = nullptr; }
    } current(&connection);
    bool ok = false;
    Clock::time_point deadline = Clock::now() + header_timeout_;
    for (size_t left = keep_alive_max_count_; left > 0 && svr_sock_ != INVALID_SOCKET; --left) {
      if (left < keep_alive_max_count_) {
        if (!connection.await_request(Clock::now() + seconds(keep_alive_timeout_sec_))) break;
        deadline = Clock::now() + header_timeout_;
      }
      connection.begin_headers(deadline);
      bool closed = false;
      ok = process_request(connection, left == 1, closed, [&](httplib::Request&) { connection.end_headers(); });
      if (!ok || closed || connection.broken()) break;
    }
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return ok;
  }

  const std::chrono::seconds header_timeout_, body_timeout_;
  const int stop_fd_;  // an eventfd, readable once the server stops
};

HttpServer::HttpServer(CompletionService& service, const Dashboard& dashboard, const HttpOptions& options)
    : service_(service), dashboard_(dashboard), options_(options), http_(std::make_unique<Listener>(options)) {
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
  // Unknown paths, wrong methods and other transport-level failures, in the same error shape. httplib answers
  // headers it could not read with 400; the connection knows when they were late or too large.
  http.set_error_handler([limit = options.max_body_bytes, header_timeout = options.header_timeout_s](
                             const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;  // a handler already wrote an error
    if (t_connection && (t_connection->timed_out() || t_connection->too_large())) {
      res.status = t_connection->timed_out() ? 408 : 431;
      res.set_header("Connection", "close");
    }
    const std::string message =
        res.status == 404   ? "no route for " + req.method + " " + req.path
        : res.status == 413 ? "the request body is larger than this server's limit of " + std::to_string(limit) +
                                  " bytes (dsv4 serve --max-body-mb)"
        : res.status == 408 ? "the request's headers did not arrive within " + std::to_string(header_timeout) +
                                  " s (dsv4 serve --header-timeout)"
        : res.status == 431 ? "the request line and headers are larger than " +
                                  std::to_string(Connection::kMaxHeaderBytes) + " bytes"
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

void HttpServer::stop() {
  http_->stop_connections();
  http_->stop();
}

}  // namespace dsv4::server
