#include "harness/fixture.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "harness/files.h"

namespace dsv4::test {

namespace fs = std::filesystem;

Fixture open_fixture(const std::string& dir) {
  Fixture f;
  f.dir = dir;
  f.index = nlohmann::json::parse(read_text(dir + "/logits/index.json"));
  f.prompt = f.index["prompt_ids"].get<std::vector<int32_t>>();
  f.vocab = f.index["vocab_size"].get<int64_t>();
  return f;
}

std::vector<std::string> golden_dirs() {
  std::vector<std::string> dirs;
  const fs::path root = source_path("tests/data/golden");
  if (fs::exists(root))
    for (const auto& e : fs::directory_iterator(root))
      if (fs::exists(e.path() / "logits" / "index.json")) dirs.push_back(e.path().string());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

std::vector<float> run_logits(const std::string& backend, const Fixture& f, size_t len, const std::string& numerics,
                              int step, bool mtp, const std::vector<std::string>& extra) {
  TempDir tmp;
  std::vector<std::string> args = {"logits", "--model", f.dir, "--tokens", join_ids(f.prompt, len), "--out",
                                   tmp.file("logits.f32"), "--numerics", numerics, "--step", std::to_string(step),
                                   "--backend", backend};
  if (mtp) args.push_back("--mtp");
  args.insert(args.end(), extra.begin(), extra.end());
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.exit_code == 0 ? read_f32(tmp.file("logits.f32")) : std::vector<float>{};
}

std::vector<int32_t> run_greedy(const std::string& backend, const Fixture& f, const std::vector<int32_t>& prompt,
                                size_t new_tokens, const std::string& numerics, const std::vector<std::string>& extra) {
  return run_sampled(backend, f, prompt, new_tokens, numerics, {"--temperature", "0"}, extra);
}

std::vector<int32_t> run_sampled(const std::string& backend, const Fixture& f, const std::vector<int32_t>& prompt,
                                 size_t new_tokens, const std::string& numerics, const std::vector<std::string>& sampling,
                                 const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"generate", "--model", f.dir, "--prompt-ids", join_ids(prompt, prompt.size()),
                                   "--max-tokens", std::to_string(new_tokens), "--ignore-eos",
                                   "--print-ids", "--numerics", numerics, "--backend", backend};
  args.insert(args.end(), sampling.begin(), sampling.end());
  args.insert(args.end(), extra.begin(), extra.end());
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::vector<int32_t> ids;
  if (r.exit_code != 0) return ids;
  std::istringstream last(r.out.substr(r.out.rfind('\n', r.out.size() - 2) + 1));
  for (int32_t id; last >> id;) ids.push_back(id);
  return ids;
}

}  // namespace dsv4::test
