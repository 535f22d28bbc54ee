// Loading of the tokenizer fixtures in tests/data/tokenizer/ (gzip'd JSON lines made by
// tools/tokenizer/make_parity_fixture.py from Hugging Face `tokenizers`), shared by the tests and the benchmark.
#pragma once

#include <zlib.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace dsv4::tokfix {

inline std::string read_gz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  DSV4_CHECK(f, "cannot open ", path, " (see tests/data/tokenizer/README.md)");
  std::string out;
  char buffer[1 << 16];
  int n = 0;
  while ((n = gzread(f, buffer, sizeof(buffer))) > 0) out.append(buffer, size_t(n));
  const bool ok = n == 0;
  gzclose(f);
  DSV4_CHECK(ok, "cannot decompress ", path);
  return out;
}

inline std::vector<nlohmann::json> read_jsonl_gz(const std::string& path) {
  const std::string text = read_gz(path);
  std::vector<nlohmann::json> rows;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) rows.push_back(nlohmann::json::parse(text.begin() + std::ptrdiff_t(start),
                                                          text.begin() + std::ptrdiff_t(end)));
    start = end + 1;
  }
  return rows;
}

struct Sample {
  std::string source, text;
};

inline std::vector<Sample> read_samples(const std::string& data_dir) {
  std::vector<Sample> samples;
  for (const auto& row : read_jsonl_gz(data_dir + "/samples.jsonl.gz"))
    samples.push_back({row.at("source").get<std::string>(), row.at("text").get<std::string>()});
  return samples;
}

// The two tokenizers covered, each stored gzip'd with its licence in data_dir/<name>/tokenizer.json.gz:
// "deepseek-v3" and "deepseek-v4".
inline std::string read_tokenizer_json(const std::string& data_dir, const std::string& name) {
  return read_gz(data_dir + "/" + name + "/tokenizer.json.gz");
}
inline Tokenizer load(const std::string& data_dir, const std::string& name) {
  return Tokenizer::from_json(read_tokenizer_json(data_dir, name), data_dir + "/" + name + "/tokenizer.json.gz");
}
inline Tokenizer load_v3(const std::string& data_dir) { return load(data_dir, "deepseek-v3"); }
inline Tokenizer load_v4(const std::string& data_dir) { return load(data_dir, "deepseek-v4"); }

}  // namespace dsv4::tokfix
