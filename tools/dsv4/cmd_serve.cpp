// dsv4 serve: an OpenAI- and Anthropic-compatible HTTP server (chat and text completions, messages, streaming,
// tools, thinking mode, logprobs) over the continuous-batching scheduler. The layers: http_server (transport) ->
// completion_service (API <-> queue) -> scheduler (engine thread, batched steps) -> model.
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "args.h"
#include "commands.h"
#include "core/error.h"
#include "engine/backend.h"
#include "engine/scheduler.h"
#include "loader/hf_config.h"
#include "model_options.h"
#include "server/completion_service.h"
#include "server/dashboard.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "tokenizer/tokenizer.h"

namespace dsv4::cli {

namespace {

constexpr const char* kUsage = R"(usage: dsv4 serve [options]

Serves the model over HTTP with OpenAI's API: POST /v1/chat/completions, POST /v1/completions (streaming with
"stream": true), GET /v1/models, GET /health, GET /metrics (Prometheus), POST /tokenize and /detokenize (vLLM's
shapes); and Anthropic's: POST /v1/messages. GET /dashboard is a live page of throughput, latencies, requests
and cache use over the last ten minutes (its data: GET /dashboard/data). Requests are batched continuously:
every forward step decodes one token for each running request and reads prompt chunks of the others.

  --host H             address to listen on (default 127.0.0.1)
  --port P             port (default 8000; 0 = any free port, printed on stderr)
  --max-seqs N         sequences generated at once; their state is allocated at start (default 16, at most --step)
  --max-context N      tokens per sequence, prompt + output (default: the model's context, at most 4096)
  --max-waiting N      requests queued for a free sequence before answering 429 (default 256)
  --served-model-name NAME
                       the model id clients send (default: the model directory's name)
  --http-threads N     connection threads kept; a stream holds one, and when all are busy more start, up to
                       1024 (default: max(64, 2 × (max-seqs + 8)))
  --max-body-mb N      largest request body in MiB; larger ones get 413 (default 64)
  --header-timeout S   seconds a request's line and headers may take to arrive, from its first byte (from the
                       connection's opening for its first request), within 64 KiB; otherwise the connection
                       closes, with 408 (431) once the request line is in (default 10)
  --body-timeout S     seconds a request's body may take after its headers, plus one for every 500 bytes
                       received (a minimum rate: a trickled body is cut, a slow link is not; default 20)
  --idle-timeout S     seconds a connection may stay open with no request in progress (default 75)
  --api-key KEY        require 'Authorization: Bearer KEY' or 'x-api-key: KEY' on the /v1/ routes (default:
                       $DSV4_API_KEY; none if unset); /health, /metrics and /dashboard stay open
  --allowed-origins L  comma-separated origins browsers may call from (CORS), or '*' (default: none)

Sampling defaults for fields a request leaves out come from the model's generation_config.json.
--step is the token budget of one forward step (decodes + prompt chunks).
)";

// temperature / top_p / top_k of generation_config.json, as vLLM uses them for requests that do not say.
SamplingParams generation_defaults(const std::string& dir) {
  SamplingParams s;
  const std::filesystem::path path = std::filesystem::path(dir) / "generation_config.json";
  if (!std::filesystem::exists(path)) return s;
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  DSV4_CHECK(j.is_object(), path.string(), ": not a JSON object");
  if (j.contains("temperature") && j["temperature"].is_number()) s.temperature = j["temperature"].get<float>();
  if (j.contains("top_p") && j["top_p"].is_number()) s.top_p = j["top_p"].get<float>();
  if (j.contains("top_k") && j["top_k"].is_number_integer()) s.top_k = j["top_k"].get<int64_t>();
  validate(s);
  return s;
}

}  // namespace

int cmd_serve(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::printf("%s%s", kUsage, kModelOptionsHelp);
    return 0;
  }
  const Args args(argc, argv, 2,
                  Args::options({{"--host", "--port", "--max-seqs", "--max-context", "--max-waiting",
                                  "--served-model-name", "--http-threads", "--max-body-mb", "--header-timeout", "--body-timeout",
                                  "--idle-timeout", "--api-key", "--allowed-origins"},
                                 model_options()}),
                  {});
  const bool synth = args.has("--synth");
  const std::string dir = synth ? "" : model_dir(args);
  const int64_t model_context = model_config(args).max_position_embeddings;
  SchedulerOptions sched;
  sched.max_context =
      args.get_int("--max-context", model_context > 0 ? std::min<int64_t>(model_context, 4096) : 4096);
  sched.max_seqs = args.get_int("--max-seqs", 16);
  sched.max_waiting = args.get_int("--max-waiting", 256);
  server::HttpOptions http_options;
  http_options.host = args.get("--host", "127.0.0.1");
  http_options.port = int(args.get_int("--port", 8000));
  http_options.threads = int(args.get_int("--http-threads", std::max<int64_t>(64, 2 * (sched.max_seqs + 8))));
  DSV4_CHECK(http_options.port >= 0 && http_options.port < 65536, "--port must be between 0 and 65535");
  DSV4_CHECK(http_options.threads >= 1, "--http-threads must be at least 1");
  const int64_t max_body_mb = args.get_int("--max-body-mb", 64);
  DSV4_CHECK(max_body_mb >= 1 && max_body_mb <= 4096, "--max-body-mb must be between 1 and 4096");
  http_options.max_body_bytes = size_t(max_body_mb) << 20;
  http_options.header_timeout_s = int(args.get_int("--header-timeout", http_options.header_timeout_s));
  http_options.idle_timeout_s = int(args.get_int("--idle-timeout", http_options.idle_timeout_s));
  http_options.body_timeout_s = int(args.get_int("--body-timeout", http_options.body_timeout_s));
  DSV4_CHECK(http_options.header_timeout_s >= 1 && http_options.header_timeout_s <= 3600,
             "--header-timeout must be between 1 and 3600 seconds");
  DSV4_CHECK(http_options.idle_timeout_s >= 1 && http_options.idle_timeout_s <= 3600,
             "--idle-timeout must be between 1 and 3600 seconds");
  DSV4_CHECK(http_options.body_timeout_s >= 1 && http_options.body_timeout_s <= 3600,
             "--body-timeout must be between 1 and 3600 seconds");
  const char* key_from_env = std::getenv("DSV4_API_KEY");
  http_options.api_key = args.get("--api-key", key_from_env ? key_from_env : "");
  for (std::string rest = args.get("--allowed-origins", ""); !rest.empty();) {
    const size_t comma = rest.find(',');
    const std::string origin = rest.substr(0, comma);
    if (!origin.empty()) http_options.allowed_origins.push_back(origin);
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
  }
  server::ServiceOptions service_options;
  service_options.model_name = args.get(
      "--served-model-name",
      synth ? "synth-" + args.get("--synth") : std::filesystem::path(dir).lexically_normal().filename().string());
  if (service_options.model_name.empty())  // a directory given with a trailing slash
    service_options.model_name = std::filesystem::path(dir).lexically_normal().parent_path().filename().string();
  if (!synth) service_options.defaults = generation_defaults(dir);

  // Signals go to one thread that stops the server; every other thread (engine, HTTP) is created after this
  // and inherits the mask. A client that vanishes must not kill the process with SIGPIPE.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  const Tokenizer tokenizer = Tokenizer::from_file(tokenizer_dir(args));
  LoadedModel m = load(args, sched.max_context);
  server::Metrics metrics(service_options.model_name, sched.max_context);
  Scheduler scheduler(*m.forward, sched);
  server::CompletionService service(scheduler, tokenizer, metrics, service_options);
  server::Dashboard dashboard(scheduler, metrics, {service_options.model_name, m.backend, numerics_name(m.numerics)});
  server::HttpServer http(service, dashboard, http_options);
  const int port = http.bind();
  std::fprintf(stderr,
               "dsv4 serve: listening on http://%s:%d (model '%s', backend %s, %s, numerics %s, %lld sequences of "
               "%lld tokens, step %lld)\n",
               http_options.host.c_str(), port, service_options.model_name.c_str(), m.backend.c_str(),
               parallelism_name(m.parallelism).c_str(), numerics_name(m.numerics), (long long)sched.max_seqs,
               (long long)sched.max_context, (long long)m.forward->max_step());
  std::fflush(stderr);

  std::thread watcher([&] {
    int signal_number = 0;
    sigwait(&stop_signals, &signal_number);
    std::fprintf(stderr, "dsv4 serve: stopping (signal %d)\n", signal_number);
    http.stop();
  });
  http.serve();
  pthread_kill(watcher.native_handle(), SIGTERM);  // wakes the watcher if serve() ended on its own
  watcher.join();
  return 0;
}

}  // namespace dsv4::cli
