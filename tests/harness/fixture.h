// The golden fixtures (tests/data/reference/ref-small, tests/data/golden/*) and running the dsv4 CLI on them:
// logits of a prompt prefix, greedy continuations. `extra` arguments reach the CLI as given (--tp 2, ...).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace dsv4::test {

struct Fixture {
  std::string dir;
  nlohmann::json index;  // logits/index.json
  std::vector<int32_t> prompt;
  int64_t vocab = 0;
};

Fixture open_fixture(const std::string& dir);
std::vector<std::string> golden_dirs();  // every tests/data/golden/* with logits, sorted

// Logits [len, V] of the fixture prompt's first len tokens, fed `step` tokens at a time (MTP draft logits with
// mtp). Empty, with a test failure, when the CLI fails.
std::vector<float> run_logits(const std::string& backend, const Fixture& f, size_t len, const std::string& numerics,
                              int step, bool mtp = false, const std::vector<std::string>& extra = {});
// The greedy continuation of `prompt`: new_tokens ids, end-of-sequence ignored.
std::vector<int32_t> run_greedy(const std::string& backend, const Fixture& f, const std::vector<int32_t>& prompt,
                                size_t new_tokens, const std::string& numerics,
                                const std::vector<std::string>& extra = {});
// The continuation under `sampling` (CLI options: --temperature, --top-k, --seed, ...).
std::vector<int32_t> run_sampled(const std::string& backend, const Fixture& f, const std::vector<int32_t>& prompt,
                                 size_t new_tokens, const std::string& numerics, const std::vector<std::string>& sampling,
                                 const std::vector<std::string>& extra = {});

}  // namespace dsv4::test
