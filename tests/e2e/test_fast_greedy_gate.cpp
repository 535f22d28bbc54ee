// The greedy gate of issue 24 on the shipped tiny model, CPU backend: the first 32 greedy tokens under fast
// numerics against those under reference numerics, for 32 prompts of the held-out text (BOS + 24 tokens each,
// evenly spaced over models/tiny/heldout.txt).
//
// Strict equality on a tiny model measures how often its greedy path meets a near-tie, not the numerics: a tenth
// of its positions have a top-2 logit gap ≤ 0.1, and even the two oracle modes (exact, reference) part on about
// one prompt in five. So a prompt passes when the two continuations are equal OR first part at a near-tie: at
// the first differing position, the reference's margin of its own choice over fast's choice, r[ref] − r[fast]
// (the last row of `dsv4 logits` under reference numerics of the prompt + the common prefix), is ≤ kTieGap.
// That margin is the reference's top-2 gap when fast chose the runner-up, and larger otherwise.
//
// kTieGap = 0.2 is the rounding noise of fast numerics on that margin, measured on the CPU with
// `dsv4 perplexity --save-logits` over all of heldout.txt (19,102 positions) under reference and under fast
// (the rows are ln softmax, so a difference of two entries is a logit difference). For the reference's top-2
// tokens a, b at each position, the change of their gap, |(f[a] − f[b]) − (r[a] − r[b])|:
//   --ctx 64 (windows as short as this gate's 25–56-token contexts): p50 0.008, p90 0.026, p99 0.093,
//            p99.5 0.18, p99.9 0.60, max 1.55; fast's argmax differs from the reference's at 133 positions
//            (0.70%), and 89.5% of those have a reference margin ≤ 0.2 (92.5% ≤ 0.25, max 1.02);
//   --ctx 256: p99 0.12, p99.5 0.22, p99.9 0.69; 167 flips (0.87%), 87.4% with margin ≤ 0.2;
//   exact against reference, for scale (ctx 64): p99 0.11, p99.5 0.21, p99.9 0.77; 156 flips, 89.7% ≤ 0.2.
// So 0.2 is the p99.5 of the noise and the margin that nine in ten of fast's own teacher-forced flips stay
// within: a divergence there is a tie that either rounding may break. A higher percentile would not mean much:
// beyond p99.5 the tail is a few positions that jump by up to 1.5–2.4 (in exact vs reference too), and a τ
// that large would call a quarter of all positions ties (23% have a top-2 gap ≤ 0.25, 10% ≤ 0.1).
//
// Asserts: (a) ≥ 90% of the prompts (29 of 32) equal or parting at a near-tie (measured 32/32);
// (b) ≥ 50% (16 of 32) strictly equal (measured 28/32; earlier code 25/32). With a per-position flip rate p
// along the greedy path, about (1 − p)^32 of the prompts stay equal: the measured 0.70–0.87% gives 24–26 of 32,
// and fewer than 16 has a binomial probability below 5e-4; a fast path flipping 2% of positions (top-1 ≈ 98%)
// fails about a third of the time, 3% nine times in ten — so a fast path that diverges nearly everywhere fails
// even if each divergence happened at a small margin; (c) exact against reference, measured the same way and
// printed for context (measured 25/32 equal, 32/32 with near-ties), held only to the same loose 50% strict bound.
// Runtime: 96 `generate` and ~10 `logits` runs (each CLI process is single-threaded), two at a time.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <optional>
#include <sstream>
#include <thread>

#include "harness/files.h"
#include "harness/perplexity.h"
#include "tokenizer/tokenizer.h"

namespace dsv4::test {
namespace {

constexpr int kPrompts = 32;
constexpr size_t kPromptTokens = 24;  // held-out tokens per prompt, after BOS
constexpr size_t kNewTokens = 32;
constexpr double kTieGap = 0.2;        // header: p99.5 of fast's rounding noise on a top-2 gap
constexpr int kMinEqualOrTie = 29;     // ⌈0.9 · 32⌉
constexpr int kMinStrictlyEqual = 16;  // half
constexpr int64_t kVocab = 4096;       // models/tiny
constexpr int kCliSeconds = 60;

// 32 windows of kPromptTokens held-out tokens, evenly spaced over the whole text, each after BOS.
std::vector<std::vector<int32_t>> heldout_prompts() {
  const Tokenizer tok = Tokenizer::from_file(tiny_model_dir());
  const std::vector<int32_t> ids = tok.encode(read_text(tiny_model_dir() + "/heldout.txt"));
  EXPECT_GT(ids.size(), kPrompts * kPromptTokens);
  const size_t stride = (ids.size() - kPromptTokens) / (kPrompts - 1);
  std::vector<std::vector<int32_t>> prompts;
  for (int k = 0; k < kPrompts; ++k) {
    std::vector<int32_t> p = {*tok.bos_id()};
    p.insert(p.end(), ids.begin() + long(size_t(k) * stride), ids.begin() + long(size_t(k) * stride + kPromptTokens));
    prompts.push_back(std::move(p));
  }
  return prompts;
}

// Runs job(i) for i in [0, n) on a few threads: each job is one CLI process (single-threaded on the CPU backend),
// so two workers halve the wall time on a 2-core machine. Results go to per-index slots; assertions stay on the
// calling thread.
template <class Job>
void parallel_for(size_t n, Job job) {
  const size_t workers = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 4);
  std::atomic<size_t> next{0};
  std::vector<std::thread> threads;
  for (size_t w = 0; w < workers; ++w)
    threads.emplace_back([&] {
      for (size_t i; (i = next++) < n;) job(i);
    });
  for (auto& t : threads) t.join();
}

CliResult run_greedy(const std::vector<int32_t>& prompt, const std::string& numerics) {
  return run_cli(
      {"generate", "--prompt-ids", join_ids(prompt, prompt.size()), "--max-tokens", std::to_string(kNewTokens),
       "--temperature", "0", "--ignore-eos", "--print-ids", "--numerics", numerics, "--backend", "cpu"},
      kCliSeconds);
}

std::vector<int32_t> last_line_ids(const std::string& out) {
  std::vector<int32_t> ids;
  if (out.size() < 2) return ids;
  std::istringstream last(out.substr(out.rfind('\n', out.size() - 2) + 1));
  for (int32_t id; last >> id;) ids.push_back(id);
  return ids;
}

// The reference's logits for the token after `tokens`: the last row of `dsv4 logits` ([T x vocab] f32).
std::vector<float> reference_next_logits(const std::vector<int32_t>& tokens, std::string& error) {
  TempDir tmp;
  const std::string out = tmp.file("logits.f32");
  const CliResult r = run_cli({"logits", "--tokens", join_ids(tokens, tokens.size()), "--out", out, "--numerics",
                               "reference", "--backend", "cpu"},
                              kCliSeconds);
  if (r.exit_code != 0) {
    error = "dsv4 logits: exit " + std::to_string(r.exit_code) + ": " + r.err;
    return {};
  }
  const std::vector<float> all = read_f32(out);
  if (all.size() != tokens.size() * kVocab) {
    error = "dsv4 logits: " + std::to_string(all.size()) + " floats for " + std::to_string(tokens.size()) + " tokens";
    return {};
  }
  return std::vector<float>(all.end() - kVocab, all.end());
}

struct Outcome {
  bool equal = false;
  size_t at = 0;                  // first differing position
  double margin = 0;              // reference logit of its choice − that of the other mode's choice, there
  double top2_gap = 0;            // the reference's top-2 gap there
  bool ref_argmax_agrees = true;  // the prefill's argmax is the token greedy decode chose (else margin ≤ 0: a tie)
  bool tie() const { return !equal && margin <= kTieGap; }
};

// The first position where two continuations differ; nullopt when they are equal.
std::optional<size_t> first_difference(const std::vector<int32_t>& ref, const std::vector<int32_t>& other) {
  if (ref == other) return std::nullopt;
  size_t at = 0;
  while (at < ref.size() && at < other.size() && ref[at] == other[at]) ++at;
  return at;
}

std::string describe(const Outcome& o) {
  char buf[96];
  if (o.equal) return "equal";
  std::snprintf(buf, sizeof buf, "@%2zu margin %.4f top2 %.4f %s%s", o.at, o.margin, o.top2_gap,
                o.tie() ? "tie" : "DIVERGES", o.ref_argmax_agrees ? "" : " (prefill argmax differs)");
  return buf;
}

TEST(FastGreedyGate, First32TokensMatchReferenceUpToNearTiesOnTinyHeldout) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<std::vector<int32_t>> prompts = heldout_prompts();
  ASSERT_EQ(prompts.size(), size_t(kPrompts));
  const std::vector<std::string> modes = {"reference", "fast", "exact"};

  // Greedy continuations: runs[k * modes.size() + m] for prompt k under modes[m].
  std::vector<CliResult> runs(prompts.size() * modes.size());
  parallel_for(runs.size(),
               [&](size_t i) { runs[i] = run_greedy(prompts[i / modes.size()], modes[i % modes.size()]); });
  std::vector<std::vector<int32_t>> ids(runs.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    ASSERT_EQ(runs[i].exit_code, 0) << "prompt " << i / modes.size() << " " << modes[i % modes.size()] << ": "
                                    << runs[i].err;
    ids[i] = last_line_ids(runs[i].out);
    ASSERT_EQ(ids[i].size(), kNewTokens) << "prompt " << i / modes.size() << " " << modes[i % modes.size()] << ":\n"
                                         << runs[i].out;
  }

  // The reference's next-token logits at each first difference (fast and exact often part at the same place).
  std::vector<std::vector<int32_t>> contexts;
  for (size_t k = 0; k < prompts.size(); ++k)
    for (size_t m = 1; m < modes.size(); ++m)
      if (const auto at = first_difference(ids[k * modes.size()], ids[k * modes.size() + m])) {
        std::vector<int32_t> c = prompts[k];
        c.insert(c.end(), ids[k * modes.size()].begin(), ids[k * modes.size()].begin() + long(*at));
        if (std::find(contexts.begin(), contexts.end(), c) == contexts.end()) contexts.push_back(std::move(c));
      }
  std::vector<std::vector<float>> next(contexts.size());
  std::vector<std::string> errors(contexts.size());
  parallel_for(contexts.size(), [&](size_t i) { next[i] = reference_next_logits(contexts[i], errors[i]); });
  for (size_t i = 0; i < contexts.size(); ++i) ASSERT_TRUE(errors[i].empty()) << errors[i];

  const auto outcome = [&](size_t k, size_t m) {
    Outcome o;
    const std::vector<int32_t>&ref = ids[k * modes.size()], &other = ids[k * modes.size() + m];
    const auto at = first_difference(ref, other);
    o.equal = !at;
    if (o.equal) return o;
    o.at = *at;
    std::vector<int32_t> c = prompts[k];
    c.insert(c.end(), ref.begin(), ref.begin() + long(o.at));
    const std::vector<float>& row = next[size_t(std::find(contexts.begin(), contexts.end(), c) - contexts.begin())];
    o.margin = double(row[size_t(ref[o.at])]) - double(row[size_t(other[o.at])]);
    std::vector<float> top = row;
    std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<float>());
    o.top2_gap = double(top[0]) - double(top[1]);
    o.ref_argmax_agrees = std::max_element(row.begin(), row.end()) - row.begin() == ref[o.at];
    return o;
  };

  int fast_equal = 0, fast_ok = 0, exact_equal = 0, exact_ok = 0;
  std::printf("prompt | fast vs reference                          | exact vs reference\n");
  for (size_t k = 0; k < prompts.size(); ++k) {
    const Outcome f = outcome(k, 1), e = outcome(k, 2);
    fast_equal += f.equal;
    fast_ok += f.equal || f.tie();
    exact_equal += e.equal;
    exact_ok += e.equal || e.tie();
    std::printf("%6zu | %-42s | %s\n", k, describe(f).c_str(), describe(e).c_str());
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("fast  vs reference: %d/%d equal, %d/%d equal or parting at a near-tie (margin <= %.2f)\n", fast_equal,
              kPrompts, fast_ok, kPrompts, kTieGap);
  std::printf("exact vs reference: %d/%d equal, %d/%d equal or parting at a near-tie\n", exact_equal, kPrompts,
              exact_ok, kPrompts);
  std::printf("%zu CLI runs, %.1f s\n", runs.size() + contexts.size(), seconds);
  EXPECT_GE(fast_ok, kMinEqualOrTie);
  EXPECT_GE(fast_equal, kMinStrictlyEqual);
  EXPECT_GE(exact_equal, kMinStrictlyEqual);
}

}  // namespace
}  // namespace dsv4::test
