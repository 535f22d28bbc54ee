#include "server/metrics.h"

#include <algorithm>
#include <charconv>

namespace dsv4::server {

namespace {

// The shortest text that reads back as v ("0.005", not "0.0050000000000000001").
std::string number(double v) {
  char buf[64];
  const auto end = std::to_chars(buf, buf + sizeof buf, v).ptr;
  return std::string(buf, end);
}

void metric(std::string& out, const std::string& name, const char* type, const std::string& help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

// One sample: name{labels} value; `labels` is the model_name label, then any others ("a=\"b\"").
void sample(std::string& out, const std::string& name, const std::string& labels, const std::string& value) {
  out += name + "{" + labels + "} " + value + "\n";
}

// Latencies kept between two samples of the dashboard (taken every second): a bound on memory should nothing
// take them, far above what an engine generates in a second.
constexpr size_t kRecentLatencies = size_t(1) << 16;

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const size_t bucket = size_t(std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& labels,
                       const std::string& help) const {
  metric(out, name, "histogram", help);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    cumulative += counts_[i];
    const std::string le = i < bounds_.size() ? number(bounds_[i]) : "+Inf";
    sample(out, name + "_bucket", labels + ",le=\"" + le + "\"", std::to_string(cumulative));
  }
  sample(out, name + "_sum", labels, number(sum_));
  sample(out, name + "_count", labels, std::to_string(count_));
}

// Buckets as vLLM's: first token and end-to-end spread over minutes, inter-token latency over milliseconds.
// Request-length buckets as vLLM's: 1, 2, 5 per decade up to the context.
std::vector<double> token_buckets(int64_t max_context) {
  std::vector<double> b;
  for (double decade = 1; decade <= double(max_context); decade *= 10)
    for (double m : {1.0, 2.0, 5.0})
      if (m * decade <= double(max_context)) b.push_back(m * decade);
  return b;
}

// Phase buckets: from milliseconds (a short queue) to an hour.
const std::vector<double> kPhaseBuckets = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0,
                                           40.0, 80.0, 160.0, 640.0, 3600.0};

Metrics::Metrics(std::string model_name, int64_t max_context)
    : label_("model_name=\"" + model_name + "\""),
      max_context_(max_context),
      ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
             80.0, 160.0, 640.0, 2560.0}),
      itl_({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}),
      e2e_({0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
            960.0, 1920.0, 7680.0}),
      queue_(kPhaseBuckets),
      prefill_(kPhaseBuckets),
      decode_(kPhaseBuckets),
      prompt_lengths_(token_buckets(max_context)),
      generation_lengths_(token_buckets(max_context)) {}

void Metrics::add_prompt_tokens(int64_t n) {
  std::lock_guard lock(mutex_);
  prompt_tokens_ += n;
}
void Metrics::add_generation_tokens(int64_t n) {
  std::lock_guard lock(mutex_);
  generation_tokens_ += n;
}
void Metrics::observe_ttft(double s) {
  std::lock_guard lock(mutex_);
  ttft_.observe(s);
  if (recent_ttft_.size() < kRecentLatencies) recent_ttft_.push_back(s);
}
void Metrics::observe_itl(double s) {
  std::lock_guard lock(mutex_);
  itl_.observe(s);
  if (recent_itl_.size() < kRecentLatencies) recent_itl_.push_back(s);
}
void Metrics::observe_e2e(double s) {
  std::lock_guard lock(mutex_);
  e2e_.observe(s);
}
void Metrics::request_phases(double queue, double prefill, double decode, int64_t prompt_tokens,
                             int64_t generation_tokens) {
  std::lock_guard lock(mutex_);
  queue_.observe(queue);
  prefill_.observe(prefill);
  decode_.observe(decode);
  prompt_lengths_.observe(double(prompt_tokens));
  generation_lengths_.observe(double(generation_tokens));
}
void Metrics::finished(const std::string& reason) {
  std::lock_guard lock(mutex_);
  ++finished_[reason];
}
void Metrics::http_response(int status) {
  std::lock_guard lock(mutex_);
  ++http_responses_[status];
}

MetricsSample Metrics::take_sample() {
  std::lock_guard lock(mutex_);
  MetricsSample s;
  s.prompt_tokens = prompt_tokens_;
  s.generation_tokens = generation_tokens_;
  for (const auto& [reason, count] : finished_) s.finished += count;
  s.ttft.swap(recent_ttft_);
  s.itl.swap(recent_itl_);
  return s;
}

std::string Metrics::render(const SchedulerStats& s) const {
  std::lock_guard lock(mutex_);
  std::string out;
  const auto gauge = [&](const std::string& name, const std::string& help, double value) {
    metric(out, name, "gauge", help);
    sample(out, name, label_, number(value));
  };
  const auto counter = [&](const std::string& name, const std::string& help, double value) {
    metric(out, name, "counter", help);
    sample(out, name, label_, number(value));
  };
  gauge("dsv4:num_requests_running", "Sequences in the running batch (prefilling or decoding).", double(s.running));
  gauge("dsv4:num_requests_waiting", "Sequences queued for a free slot.", double(s.waiting));
  gauge("dsv4:kv_cache_usage_perc", "Fraction of the preallocated sequence slots (KV and compressor state) in use, 0 to 1.",
        s.slots ? double(s.running) / double(s.slots) : 0.0);
  gauge("dsv4:kv_cache_tokens_usage_perc", "Fraction of the slots' token capacity filled by running sequences.",
        s.slots ? double(s.tokens_in_slots) / double(s.slots * max_context_) : 0.0);
  counter("dsv4:prompt_tokens_total", "Prompt tokens of admitted requests.", double(prompt_tokens_));
  counter("dsv4:generation_tokens_total", "Generated tokens.", double(generation_tokens_));
  counter("dsv4:engine_steps_total", "Batched forward steps run.", double(s.steps));
  counter("dsv4:engine_step_tokens_total", "Tokens (rows) of those steps: prompt chunks and decodes.",
          double(s.step_tokens));
  counter("dsv4:engine_step_seconds_total", "Time spent in forward steps and sampling (engine busy time).",
          s.step_seconds);
  metric(out, "dsv4:request_success_total", "counter", "Finished sequences by finish reason.");
  for (const auto& [reason, count] : finished_)
    sample(out, "dsv4:request_success_total", label_ + ",finished_reason=\"" + reason + "\"", std::to_string(count));
  metric(out, "dsv4:http_requests_total", "counter", "HTTP responses by status code (errors included).");
  for (const auto& [status, count] : http_responses_)
    sample(out, "dsv4:http_requests_total", label_ + ",status=\"" + std::to_string(status) + "\"", std::to_string(count));
  ttft_.render(out, "dsv4:time_to_first_token_seconds", label_, "Time to first token.");
  itl_.render(out, "dsv4:inter_token_latency_seconds", label_, "Time between consecutive generated tokens.");
  e2e_.render(out, "dsv4:e2e_request_latency_seconds", label_, "End-to-end request latency.");
  queue_.render(out, "dsv4:request_queue_time_seconds", label_, "Time a sequence waited for a slot.");
  prefill_.render(out, "dsv4:request_prefill_time_seconds", label_, "From a slot to the first token.");
  decode_.render(out, "dsv4:request_decode_time_seconds", label_, "From the first token to the last.");
  prompt_lengths_.render(out, "dsv4:request_prompt_tokens", label_, "Prompt tokens per sequence.");
  generation_lengths_.render(out, "dsv4:request_generation_tokens", label_, "Generated tokens per sequence.");
  return out;
}

}  // namespace dsv4::server
