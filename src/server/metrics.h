// Server metrics in the Prometheus text format (version 0.0.4), named like vLLM's with a dsv4: prefix:
// requests running / waiting, slot (KV state) usage, prompt and generation token counters, finished requests
// by reason, HTTP responses by status, and histograms of time to first token, inter-token latency and end-to-end
// latency.
// Thread-safe: HTTP threads record, /metrics renders.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/scheduler.h"

namespace dsv4::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);  // upper bounds in seconds, ascending (+Inf is implied)
  void observe(double seconds);
  void render(std::string& out, const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; the last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  void add_prompt_tokens(int64_t n);
  void add_generation_tokens(int64_t n);
  void observe_ttft(double seconds);
  void observe_itl(double seconds);
  void observe_e2e(double seconds);
  void finished(const std::string& reason);  // "stop", "length", "tool_calls", "abort", "error"
  void http_response(int status);             // every HTTP response, by status code

  std::string render(const SchedulerStats& scheduler, int64_t max_context) const;

 private:
  mutable std::mutex mutex_;
  int64_t prompt_tokens_ = 0, generation_tokens_ = 0;
  Histogram ttft_, itl_, e2e_;
  std::map<std::string, int64_t> finished_;
  std::map<int, int64_t> http_responses_;
};

}  // namespace dsv4::server
