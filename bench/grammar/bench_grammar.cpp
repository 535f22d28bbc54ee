// Constrained decoding cost per decode step at batch B (default 16): B sequences each walk an answer of a grammar
// token by token (a draw among the allowed tokens, biased to short ones so the walks reach the structure, as a
// model's answers do), and every step times the B token masks, one after the other and spread over threads, and
// applying one to a logits row (apply_mask, the sampler's first step). Compare the per-step figures with a decode
// step of the model (docs/design/constrained-decoding.md).
//
//   bench_grammar [--tokenizer v4|tiny|PATH] [--batch 16] [--steps 200] [--threads N]
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <omp.h>

#include "grammar/token_mask.h"
#include "sampler/sampler.h"
#include "server/completion_service.h"
#include "tokenizer/fixtures.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace dsv4;

double us_since(Clock::time_point t0) { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count(); }

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(p * double(v.size())))];
}

double mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return sum / double(v.size());
}

struct Scenario {
  const char* name;
  grammar::Spec spec;
};

std::vector<Scenario> scenarios() {
  const auto schema = [](const char* text) {
    grammar::Spec s;
    s.json = grammar::Json::parse(text);
    return s;
  };
  grammar::Spec tools;
  tools.tools.push_back({"get_weather", grammar::Json::parse(R"({"type": "object", "properties": {
      "town": {"type": "string"}, "days": {"type": "integer"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
      "required": ["town"]})")});
  tools.tools.push_back({"search", grammar::Json::parse(R"({"type": "object", "properties": {
      "query": {"type": "string"}, "filters": {"type": "array", "items": {"type": "string"}}}})")});
  return {{"json_schema (object of strings, numbers, enums, arrays)",
           schema(R"({"type": "object", "additionalProperties": false, "properties": {
               "name": {"type": "string"}, "age": {"type": "integer"}, "mood": {"enum": ["happy", "sad"]},
               "friends": {"type": "array", "items": {"type": "string", "maxLength": 40}},
               "address": {"type": "object", "properties": {"street": {"type": "string"},
                                                            "zip": {"type": "string", "maxLength": 10}}}},
               "required": ["name", "age", "mood", "friends"]})")},
          {"json_object (any object)", schema(R"({"type": "object"})")},
          {"tool_choice required (DSML, 2 tools)", tools}};
}

}  // namespace

int main(int argc, char** argv) {
  std::string which = "v4";
  int batch = 16, steps = 200, threads = omp_get_max_threads();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tokenizer" && i + 1 < argc) which = argv[++i];
    else if (a == "--batch" && i + 1 < argc) batch = std::max(1, std::atoi(argv[++i]));
    else if (a == "--steps" && i + 1 < argc) steps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--threads" && i + 1 < argc) threads = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr,
                   "usage: bench_grammar [--tokenizer v4|tiny|PATH] [--batch 16] [--steps 200] [--threads N]\n");
      return 1;
    }
  }
  try {
    const Tokenizer tokenizer = which == "v4"     ? tokfix::load(DSV4_TOKENIZER_DATA_DIR, "deepseek-v4")
                                : which == "tiny" ? Tokenizer::from_file(DSV4_SOURCE_DIR "/models/tiny")
                                                  : Tokenizer::from_file(which);
    const auto t_vocab = Clock::now();
    const auto vocab = server::grammar_vocabulary(tokenizer, tokenizer.vocab_size(), *tokenizer.eos_id());
    std::printf("vocabulary %s: %d tokens, trie built in %.1f ms; batch %d, %d steps, %d threads\n\n", which.c_str(),
                vocab->size(), us_since(t_vocab) / 1000, batch, steps, threads);
    std::printf("| grammar | mask µs/row mean | p50 | p99 | step, rows one by one | step, %d threads | mask applied "
                "to a row, µs |\n|---|---|---|---|---|---|---|\n",
                threads);

    std::vector<float> logits(size_t(vocab->size()));
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    for (float& l : logits) l = normal(rng);
    for (const Scenario& scenario : scenarios()) {
      const auto g = grammar::compile(scenario.spec);
      std::vector<grammar::TokenConstraint> rows(size_t(batch), grammar::TokenConstraint(g, vocab));
      std::vector<std::vector<uint32_t>> masks(size_t(batch), std::vector<uint32_t>(size_t(vocab->words())));
      std::vector<double> row_us, serial_ms, parallel_ms, apply_us;
      std::vector<float> masked_logits(logits.size());
      for (int step = 0; step < steps; ++step) {
        const auto t_serial = Clock::now();
        for (int r = 0; r < batch; ++r) {
          const auto t_row = Clock::now();
          rows[size_t(r)].allowed(masks[size_t(r)]);
          row_us.push_back(us_since(t_row));
        }
        serial_ms.push_back(us_since(t_serial) / 1000);
        const auto t_parallel = Clock::now();
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
        for (int r = 0; r < batch; ++r) rows[size_t(r)].allowed(masks[size_t(r)]);
        parallel_ms.push_back(us_since(t_parallel) / 1000);
        std::copy(logits.begin(), logits.end(), masked_logits.begin());
        const auto t_apply = Clock::now();
        apply_mask(masked_logits.data(), vocab->size(), masks[0].data());
        apply_us.push_back(us_since(t_apply));

        // Each row takes a token: among the allowed ones of at most 1, 2, 4 or 64 bytes; an ended answer starts
        // over.
        for (int r = 0; r < batch; ++r) {
          std::vector<int32_t> pool;
          const size_t limit = std::array<size_t, 4>{1, 2, 4, 64}[rng() % 4];
          for (int32_t id = 0; id < vocab->size(); ++id)
            if ((masks[size_t(r)][size_t(id >> 5)] >> (id & 31)) & 1 &&
                (id == vocab->eos() || vocab->bytes(id).size() <= limit))
              pool.push_back(id);
          const int32_t token = pool.empty() ? vocab->eos() : pool[rng() % pool.size()];
          if (token == vocab->eos() || !rows[size_t(r)].accept(token))
            rows[size_t(r)] = grammar::TokenConstraint(g, vocab);
        }
      }
      std::printf("| %s | %.1f | %.1f | %.1f | %.2f ms | %.2f ms | %.1f |\n", scenario.name, mean(row_us),
                  percentile(row_us, 0.5), percentile(row_us, 0.99), mean(serial_ms), mean(parallel_ms),
                  mean(apply_us));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_grammar: %s\n", e.what());
    return 1;
  }
  return 0;
}
