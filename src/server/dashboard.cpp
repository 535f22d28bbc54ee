#include "server/dashboard.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

namespace dsv4::server {

namespace {

// The value at nearest rank ⌈p·n⌉ of `values`, which are partially sorted on the way.
double nearest_rank(std::vector<double>& values, double p) {
  const size_t rank = size_t(std::ceil(p * double(values.size())));
  const auto at = values.begin() + std::ptrdiff_t(std::clamp<size_t>(rank, 1, values.size()) - 1);
  std::nth_element(values.begin(), at, values.end());
  return *at;
}

Json percentiles_json(const std::optional<LatencyPercentiles>& p) {
  if (!p) return nullptr;
  return Json{{"p50", p->p50}, {"p90", p->p90}, {"p99", p->p99}, {"count", p->count}};
}

// A ratio, null when the denominator is zero (nothing to divide: a gap in the chart, not a zero).
Json ratio(double num, double den) { return den > 0 ? Json(num / den) : Json(nullptr); }

}  // namespace

std::optional<LatencyPercentiles> latency_percentiles(std::vector<double>& values) {
  if (values.empty()) return std::nullopt;
  LatencyPercentiles p;
  p.count = int64_t(values.size());
  p.p50 = nearest_rank(values, 0.50);
  p.p90 = nearest_rank(values, 0.90);
  p.p99 = nearest_rank(values, 0.99);
  return p;
}

Timeline::Timeline(int64_t slots, int64_t max_context, int64_t capacity, int64_t window)
    : slots_(slots), max_context_(max_context), capacity_(capacity), window_(window) {}

void Timeline::record(double t, const SchedulerStats& stats, MetricsSample metrics) {
  std::lock_guard lock(mutex_);
  DashboardSample s;
  s.t = t;
  s.seconds = t - last_t_;
  s.prompt_tokens = metrics.prompt_tokens - last_metrics_.prompt_tokens;
  s.generation_tokens = metrics.generation_tokens - last_metrics_.generation_tokens;
  s.finished = metrics.finished - last_metrics_.finished;
  s.steps = stats.steps - last_stats_.steps;
  s.step_tokens = stats.step_tokens - last_stats_.step_tokens;
  s.step_seconds = stats.step_seconds - last_stats_.step_seconds;
  s.running = stats.running;
  s.waiting = stats.waiting;
  s.tokens_in_slots = stats.tokens_in_slots;
  ttft_count_ += int64_t(metrics.ttft.size());
  itl_count_ += int64_t(metrics.itl.size());

  // The latencies of the window: this sample's and those of the window_ − 1 before it.
  const auto window_percentiles = [&](std::deque<std::vector<double>>& window, std::vector<double> latest) {
    window.push_back(std::move(latest));
    if (int64_t(window.size()) > window_) window.pop_front();
    std::vector<double> all;
    for (const std::vector<double>& v : window) all.insert(all.end(), v.begin(), v.end());
    return latency_percentiles(all);
  };
  s.ttft = window_percentiles(window_ttft_, std::move(metrics.ttft));
  s.itl = window_percentiles(window_itl_, std::move(metrics.itl));

  samples_.push_back(s);
  if (int64_t(samples_.size()) > capacity_) samples_.pop_front();
  last_metrics_ = std::move(metrics);
  last_stats_ = stats;
  last_t_ = t;
}

Json Timeline::json(double since) const {
  std::lock_guard lock(mutex_);
  Json samples = Json::array();
  for (const DashboardSample& s : samples_) {
    if (s.t <= since) continue;
    samples.push_back({{"t", s.t},
                       {"seconds", s.seconds},
                       {"prompt_tokens", s.prompt_tokens},
                       {"generation_tokens", s.generation_tokens},
                       {"finished", s.finished},
                       {"steps", s.steps},
                       {"step_tokens", s.step_tokens},
                       {"prompt_tokens_per_s", ratio(double(s.prompt_tokens), s.seconds)},
                       {"generation_tokens_per_s", ratio(double(s.generation_tokens), s.seconds)},
                       {"tokens_per_step", ratio(double(s.step_tokens), double(s.steps))},
                       // A step counts when it ends, so an interval may hold part of one begun before it.
                       {"engine_busy", ratio(std::min(s.step_seconds, s.seconds), s.seconds)},
                       {"running", s.running},
                       {"waiting", s.waiting},
                       {"slot_use", ratio(double(s.running), double(slots_))},
                       {"token_use", ratio(double(s.tokens_in_slots), double(slots_ * max_context_))},
                       {"ttft", percentiles_json(s.ttft)},
                       {"itl", percentiles_json(s.itl)}});
  }
  return Json{{"totals",
               {{"prompt_tokens", last_metrics_.prompt_tokens},
                {"generation_tokens", last_metrics_.generation_tokens},
                {"finished", last_metrics_.finished},
                {"steps", last_stats_.steps},
                {"step_tokens", last_stats_.step_tokens},
                {"ttft_count", ttft_count_},
                {"itl_count", itl_count_}}},
              {"samples", std::move(samples)}};
}

Dashboard::Dashboard(const Scheduler& scheduler, Metrics& metrics, DashboardInfo info)
    : scheduler_(scheduler),
      metrics_(metrics),
      info_(std::move(info)),
      start_(std::chrono::steady_clock::now()),
      timeline_(scheduler.options().max_seqs, scheduler.options().max_context, kCapacity, kWindow),
      thread_([this] { sample_every_interval(); }) {}

Dashboard::~Dashboard() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Dashboard::sample_every_interval() {
  using Clock = std::chrono::steady_clock;
  std::unique_lock lock(mutex_);
  // Deadlines on a fixed grid, so that samples stay an interval apart however long each takes; a thread held up
  // past a deadline skips the ones it missed rather than catching up with samples of a few microseconds.
  for (auto next = start_ + kInterval; !wake_.wait_until(lock, next, [&] { return stopping_; });) {
    const SchedulerStats stats = scheduler_.stats();
    MetricsSample metrics = metrics_.take_sample();
    const auto now = Clock::now();
    timeline_.record(std::chrono::duration<double>(now - start_).count(), stats, std::move(metrics));
    next += kInterval;
    if (next <= now) next += (now - next) / kInterval * kInterval + kInterval;
  }
}

Json Dashboard::data(const std::optional<std::string>& since) const {
  double after = -std::numeric_limits<double>::infinity();
  if (since) {
    const char* end = since->data() + since->size();
    const auto [ptr, ec] = std::from_chars(since->data(), end, after);
    if (ec != std::errc() || ptr != end || !std::isfinite(after))
      throw invalid_request("'since' must be a number of seconds, not '" + *since + "'", "since");
  }
  const SchedulerOptions& o = scheduler_.options();
  Json j = {{"model", info_.model_name},
            {"backend", info_.backend},
            {"numerics", info_.numerics},
            {"slots", o.max_seqs},
            {"max_context", o.max_context},
            {"interval_s", std::chrono::duration<double>(kInterval).count()},
            {"window_s", std::chrono::duration<double>(kInterval * kWindow).count()},
            {"capacity", kCapacity}};
  j.update(timeline_.json(after));
  return j;
}

}  // namespace dsv4::server
