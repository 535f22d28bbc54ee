// Server metrics in the Prometheus text format (version 0.0.4), named like vLLM's with a dsv4: prefix and a
// model_name label: requests running / waiting, slot (KV state) usage, prompt and generation token counters,
// finished requests by reason, HTTP responses by status, and histograms of time to first token, inter-token
// latency, end-to-end latency, each request's queue, prefill and decode time and its prompt and output lengths.
// Thread-safe: HTTP threads record, /metrics renders, the dashboard's sampler takes samples.
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
  explicit Histogram(std::vector<double> bounds);  // upper bounds, ascending (+Inf is implied)
  void observe(double value);
  // `labels`: the series' labels without braces; `le` is added for the buckets.
  void render(std::string& out, const std::string& name, const std::string& labels, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; the last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

// What the dashboard's sampler reads each time: the counters so far, and the latencies observed since its
// previous read.
struct MetricsSample {
  int64_t prompt_tokens = 0, generation_tokens = 0, finished = 0;
  std::vector<double> ttft, itl;  // seconds
};

class Metrics {
 public:
  // Every series carries model_name (as vLLM's); token-count buckets reach max_context.
  Metrics(std::string model_name, int64_t max_context);
  void add_prompt_tokens(int64_t n);
  void add_generation_tokens(int64_t n);
  void observe_ttft(double seconds);
  void observe_itl(double seconds);
  void observe_e2e(double seconds);
  void finished(const std::string& reason);  // "stop", "length", "tool_calls", "abort", "error"
  void http_response(int status);             // every HTTP response, by status code
  // A finished sequence's phases, seconds: waiting for a slot, slot to first token, first token to last.
  void request_phases(double queue, double prefill, double decode, int64_t prompt_tokens, int64_t generation_tokens);

  std::string render(const SchedulerStats& scheduler) const;
  MetricsSample take_sample();  // takes the latencies observed since the previous call

 private:
  const std::string label_;  // model_name="..."
  const int64_t max_context_;
  mutable std::mutex mutex_;
  int64_t prompt_tokens_ = 0, generation_tokens_ = 0;
  Histogram ttft_, itl_, e2e_, queue_, prefill_, decode_, prompt_lengths_, generation_lengths_;
  std::map<std::string, int64_t> finished_;
  std::map<int, int64_t> http_responses_;
  std::vector<double> recent_ttft_, recent_itl_;  // since the last take_sample(), at most kRecentLatencies each
};

}  // namespace dsv4::server
