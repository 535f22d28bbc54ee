// The dashboard's timeline below HTTP: samples made from cumulative counters and scheduler stats (rates, ratios,
// gaps as null), nearest-rank latency percentiles over a sliding window, the ring's capacity, `since`, and the
// metrics' hand-over of latencies between samples. The page and its data over HTTP are tested in
// test_dashboard.py, in headless Chromium.
#include <gtest/gtest.h>

#include "server/dashboard.h"
#include "server/metrics.h"

namespace dsv4::server {
namespace {

SchedulerStats stats(int64_t running, int64_t waiting, int64_t tokens_in_slots, int64_t steps, int64_t step_tokens,
                     double step_seconds) {
  SchedulerStats s;
  s.running = running;
  s.waiting = waiting;
  s.slots = 4;
  s.tokens_in_slots = tokens_in_slots;
  s.steps = steps;
  s.step_tokens = step_tokens;
  s.step_seconds = step_seconds;
  return s;
}

MetricsSample counters(int64_t prompt, int64_t generation, int64_t finished, std::vector<double> ttft = {},
                       std::vector<double> itl = {}) {
  MetricsSample m;
  m.prompt_tokens = prompt;
  m.generation_tokens = generation;
  m.finished = finished;
  m.ttft = std::move(ttft);
  m.itl = std::move(itl);
  return m;
}

TEST(Dashboard, PercentilesAreNearestRank) {
  std::vector<double> none;
  EXPECT_FALSE(latency_percentiles(none).has_value());
  std::vector<double> one = {0.25};
  const auto p1 = latency_percentiles(one);
  ASSERT_TRUE(p1.has_value());
  EXPECT_EQ(p1->count, 1);
  EXPECT_EQ(p1->p50, 0.25);
  EXPECT_EQ(p1->p99, 0.25);
  // 1..100 shuffled: rank ⌈p·100⌉ is the value p·100 itself.
  std::vector<double> hundred;
  for (int i = 0; i < 100; ++i) hundred.push_back(double((i * 37) % 100 + 1));
  const auto p = latency_percentiles(hundred);
  EXPECT_EQ(p->p50, 50);
  EXPECT_EQ(p->p90, 90);
  EXPECT_EQ(p->p99, 99);
  EXPECT_EQ(p->count, 100);
  // 7 values: ranks ⌈3.5⌉ = 4, ⌈6.3⌉ = 7, ⌈6.93⌉ = 7.
  std::vector<double> seven = {7, 1, 6, 2, 5, 3, 4};
  const auto q = latency_percentiles(seven);
  EXPECT_EQ(q->p50, 4);
  EXPECT_EQ(q->p90, 7);
  EXPECT_EQ(q->p99, 7);
}

TEST(Dashboard, SamplesAreDifferencesOfTheCounters) {
  Timeline timeline(/*slots=*/4, /*max_context=*/100, /*capacity=*/600, /*window=*/10);
  timeline.record(1.0, stats(2, 1, 50, 10, 40, 0.5), counters(30, 10, 0, {0.2, 0.4}, {0.01, 0.03, 0.02}));
  // Two seconds with no step: tokens per step is a gap (null), not zero; the window keeps the latencies above.
  timeline.record(3.0, stats(0, 0, 0, 10, 40, 0.5), counters(30, 16, 2));
  // A step of 0.8 s ends in an interval of 0.5 s: the engine was busy all of it, not 160% of it.
  timeline.record(3.5, stats(1, 0, 9, 11, 41, 1.3), counters(38, 16, 2));
  const Json window = Json::parse(R"({"ttft": {"p50": 0.2, "p90": 0.4, "p99": 0.4, "count": 2},
                                      "itl": {"p50": 0.02, "p90": 0.03, "p99": 0.03, "count": 3}})");
  const Json want = Json::parse(R"({
    "totals": {"prompt_tokens": 38, "generation_tokens": 16, "finished": 2, "steps": 11, "step_tokens": 41,
               "ttft_count": 2, "itl_count": 3},
    "samples": [
      {"t": 1.0, "seconds": 1.0, "prompt_tokens": 30, "generation_tokens": 10, "finished": 0, "steps": 10,
       "step_tokens": 40, "prompt_tokens_per_s": 30.0, "generation_tokens_per_s": 10.0, "tokens_per_step": 4.0,
       "engine_busy": 0.5, "running": 2, "waiting": 1, "slot_use": 0.5, "token_use": 0.125},
      {"t": 3.0, "seconds": 2.0, "prompt_tokens": 0, "generation_tokens": 6, "finished": 2, "steps": 0,
       "step_tokens": 0, "prompt_tokens_per_s": 0.0, "generation_tokens_per_s": 3.0, "tokens_per_step": null,
       "engine_busy": 0.0, "running": 0, "waiting": 0, "slot_use": 0.0, "token_use": 0.0},
      {"t": 3.5, "seconds": 0.5, "prompt_tokens": 8, "generation_tokens": 0, "finished": 0, "steps": 1,
       "step_tokens": 1, "prompt_tokens_per_s": 16.0, "generation_tokens_per_s": 0.0, "tokens_per_step": 1.0,
       "engine_busy": 1.0, "running": 1, "waiting": 0, "slot_use": 0.25, "token_use": 0.0225}]})");
  Json got = timeline.json(-1);
  for (Json& sample : got["samples"]) {
    EXPECT_EQ(sample["ttft"], window["ttft"]) << sample;
    EXPECT_EQ(sample["itl"], window["itl"]) << sample;
    sample.erase("ttft");
    sample.erase("itl");
  }
  EXPECT_EQ(got, want);
}

TEST(Dashboard, PercentilesCoverTheWindowAndTheRingItsCapacity) {
  Timeline timeline(4, 100, /*capacity=*/5, /*window=*/3);
  // Sample k (1..8) brings one inter-token latency of k ms.
  for (int k = 1; k <= 8; ++k)
    timeline.record(double(k), stats(1, 0, 10, k, k, 0), counters(0, k, 0, {}, {k * 1e-3}));
  const Json j = timeline.json(-1);
  ASSERT_EQ(j["samples"].size(), 5u);  // samples 4..8
  EXPECT_EQ(j["samples"][0]["t"], 4.0);
  for (const Json& s : j["samples"]) {
    const int k = int(s["t"].get<double>());
    EXPECT_EQ(s["itl"]["count"], 3) << k;  // samples k−2, k−1, k
    EXPECT_DOUBLE_EQ(s["itl"]["p50"].get<double>(), (k - 1) * 1e-3) << k;
    EXPECT_DOUBLE_EQ(s["itl"]["p99"].get<double>(), k * 1e-3) << k;
    EXPECT_TRUE(s["ttft"].is_null());
  }
  EXPECT_EQ(j["totals"]["itl_count"], 8);  // the totals count every sample, dropped ones included
  // `since` returns the samples after it.
  const Json later = timeline.json(6.0);
  ASSERT_EQ(later["samples"].size(), 2u);
  EXPECT_EQ(later["samples"][0]["t"], 7.0);
  EXPECT_EQ(timeline.json(8.0)["samples"].size(), 0u);
}

TEST(Dashboard, MetricsHandOverTheLatenciesSinceTheLastSample) {
  Metrics metrics("tiny", 64);
  metrics.add_prompt_tokens(5);
  metrics.add_generation_tokens(3);
  metrics.observe_ttft(0.5);
  metrics.observe_itl(0.01);
  metrics.observe_itl(0.02);
  metrics.finished("stop");
  metrics.finished("length");
  const MetricsSample first = metrics.take_sample();
  EXPECT_EQ(first.prompt_tokens, 5);
  EXPECT_EQ(first.generation_tokens, 3);
  EXPECT_EQ(first.finished, 2);
  EXPECT_EQ(first.ttft, std::vector<double>{0.5});
  EXPECT_EQ(first.itl, (std::vector<double>{0.01, 0.02}));
  metrics.observe_itl(0.03);
  const MetricsSample second = metrics.take_sample();
  EXPECT_EQ(second.generation_tokens, 3);  // counters are cumulative
  EXPECT_TRUE(second.ttft.empty());        // latencies are handed over once
  EXPECT_EQ(second.itl, std::vector<double>{0.03});
}

}  // namespace
}  // namespace dsv4::server
