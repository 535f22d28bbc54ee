// The live dashboard of dsv4 serve. A sampler thread reads the metrics and the scheduler once a second into a
// timeline of the last ten minutes: tokens per second (prompt and generated), time to first token and
// inter-token latency percentiles over a sliding window, running and waiting requests, slot and token use of
// the KV state, tokens per step and the engine's busy fraction. GET /dashboard/data returns it as JSON;
// GET /dashboard is the page (dashboard.html, compiled into the binary by embed_page.cmake), which polls it and
// draws the charts with no library and nothing fetched from elsewhere.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "engine/scheduler.h"
#include "server/metrics.h"
#include "server/openai_api.h"

namespace dsv4::server {

extern const std::string_view kDashboardPage;  // dashboard.html, generated into the build

// Nearest-rank percentiles of a window's latencies, seconds.
struct LatencyPercentiles {
  double p50 = 0, p90 = 0, p99 = 0;
  int64_t count = 0;
};
// Of `values` (reordered); std::nullopt when it is empty.
std::optional<LatencyPercentiles> latency_percentiles(std::vector<double>& values);

struct DashboardSample {
  double t = 0;        // seconds since the server started, at the end of the interval
  double seconds = 0;  // the interval's length
  // During the interval:
  int64_t prompt_tokens = 0, generation_tokens = 0, finished = 0, steps = 0, step_tokens = 0;
  double step_seconds = 0;  // the engine's busy time
  // At its end:
  int64_t running = 0, waiting = 0, tokens_in_slots = 0;
  // Over the window of samples ending with this one; none when no token came in it.
  std::optional<LatencyPercentiles> ttft, itl;
};

// The last `capacity` samples, each made from the cumulative counters and the latencies seen since the one
// before. Thread-safe.
class Timeline {
 public:
  // slots × max_context is the token capacity the token use is a fraction of; `window`: samples whose latencies
  // make each sample's percentiles.
  Timeline(int64_t slots, int64_t max_context, int64_t capacity, int64_t window);
  // The sample ending at `t` (seconds, after the previous one's).
  void record(double t, const SchedulerStats& stats, MetricsSample metrics);
  // {"totals": the counters at the last sample, "samples": those after `since` (seconds), oldest first}.
  Json json(double since) const;

 private:
  const int64_t slots_, max_context_, capacity_, window_;
  mutable std::mutex mutex_;
  std::deque<DashboardSample> samples_;
  std::deque<std::vector<double>> window_ttft_, window_itl_;  // the latencies of the last `window_` samples
  MetricsSample last_metrics_;  // cumulative counters at the last sample (latencies unused)
  SchedulerStats last_stats_;
  double last_t_ = 0;
  int64_t ttft_count_ = 0, itl_count_ = 0;
};

// What the page shows of the server besides the samples.
struct DashboardInfo {
  std::string model_name, backend, numerics;
};

class Dashboard {
 public:
  static constexpr auto kInterval = std::chrono::seconds(1);
  static constexpr int64_t kCapacity = 600;  // ten minutes of samples
  static constexpr int64_t kWindow = 10;     // latency percentiles over the last ten seconds

  // Starts the sampler thread.
  Dashboard(const Scheduler& scheduler, Metrics& metrics, DashboardInfo info);
  ~Dashboard();  // stops it
  Dashboard(const Dashboard&) = delete;
  Dashboard& operator=(const Dashboard&) = delete;

  // GET /dashboard/data[?since=T]: the server's description, the totals and the samples after T seconds (every
  // sample kept without it). Throws ApiError (400) when `since` is not a number.
  Json data(const std::optional<std::string>& since) const;

 private:
  void sample_every_interval();

  const Scheduler& scheduler_;
  Metrics& metrics_;
  const DashboardInfo info_;
  const std::chrono::steady_clock::time_point start_;
  Timeline timeline_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace dsv4::server
