// Bad input never crashes: every corruption of a checkpoint, config or request gives exit status 1 and a
// one-line error that names the file / tensor / field and what was expected. Plus a small random
// mutation fuzz of the two parsers (safetensors header, config.json) in process.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "harness/files.h"
#include "loader/hf_config.h"
#include "loader/safetensors.h"

namespace dsv4::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string read_bytes(const std::string& path) { return read_text(path); }

// Rewrites the safetensors header of `path` through `edit`, keeping the data section as it is.
void edit_header(const std::string& path, const std::function<void(json&)>& edit) {
  const std::string bytes = read_bytes(path);
  uint64_t len;
  std::memcpy(&len, bytes.data(), 8);
  json header = json::parse(bytes.substr(8, len));
  edit(header);
  const std::string text = header.dump();
  const uint64_t new_len = text.size();
  std::string out(reinterpret_cast<const char*>(&new_len), 8);
  out += text + bytes.substr(8 + len);
  write_text(path, out);
}

void edit_config(const std::string& dir, const std::function<void(json&)>& edit) {
  json config = json::parse(read_text(dir + "/config.json"));
  edit(config);
  write_text(dir + "/config.json", config.dump());
}

class BadInput : public ::testing::Test {
 protected:
  void SetUp() override { copy_dir(ref_small_dir(), model_); }

  // Runs `dsv4 logits` on the (mutated) model and checks the failure is clean and names `expected`.
  void expect_error(const std::string& expected, const std::string& tokens = "1,2,3",
                    std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"logits", "--model", model_, "--tokens", tokens, "--out", tmp_.file("out.f32")};
    args.insert(args.end(), extra.begin(), extra.end());
    expect_clean_failure(run_cli(args, 60), expected);
  }

  static void expect_clean_failure(const CliResult& r, const std::string& expected) {
    EXPECT_EQ(r.signal, 0) << "killed by signal " << r.signal << "\n" << r.err;
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find(expected), std::string::npos) << "stderr: " << r.err << "\nexpected to contain: " << expected;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "error should be one line: " << r.err;
  }

  std::string weights() const { return model_ + "/model.safetensors"; }

  TempDir tmp_;
  std::string model_ = tmp_.file("model");
};

TEST_F(BadInput, MissingModelDirectory) {
  model_ = tmp_.file("does-not-exist");
  expect_error("does-not-exist: model directory does not exist");
}

TEST_F(BadInput, ConfigIsNotJson) {
  write_text(model_ + "/config.json", "{\"hidden_size\": 128,");
  expect_error("config.json: not valid JSON");
}

TEST_F(BadInput, ConfigFieldHasWrongType) {
  edit_config(model_, [](json& c) { c["hidden_size"] = "128"; });
  expect_error("config.json: field 'hidden_size' must be an integer");
}

TEST_F(BadInput, ConfigFieldMissing) {
  edit_config(model_, [](json& c) { c.erase("num_attention_heads"); });
  expect_error("config.json: missing field 'num_attention_heads'");
}

TEST_F(BadInput, ConfigDisagreesWithWeights) {
  edit_config(model_, [](json& c) { c["hidden_size"] = 256; });
  expect_error("tensor 'embed.weight' has shape [512, 128], expected [512, 256]");
}

TEST_F(BadInput, UnsupportedCompressRatio) {
  edit_config(model_, [](json& c) { c["compress_ratios"][1] = 16; });
  expect_error("layer 1 has compress ratio 16");
}

TEST_F(BadInput, TruncatedWeights) {
  const std::string bytes = read_bytes(weights());
  write_text(weights(), bytes.substr(0, bytes.size() / 2));
  expect_error("fall outside the data section");
}

TEST_F(BadInput, FileShorterThanHeaderLength) {
  write_text(weights(), "abc");
  expect_error("truncated safetensors file");
}

TEST_F(BadInput, HeaderLengthBeyondFile) {
  std::string bytes = read_bytes(weights());
  const uint64_t huge = uint64_t(1) << 40;
  std::memcpy(bytes.data(), &huge, 8);
  write_text(weights(), bytes);
  expect_error("header length 1099511627776 exceeds the file size");
}

TEST_F(BadInput, HeaderIsNotJson) {
  std::string bytes = read_bytes(weights());
  bytes[8] = '[';
  bytes[9] = '}';
  write_text(weights(), bytes);
  expect_error("safetensors header is not valid JSON");
}

TEST_F(BadInput, OffsetsOutOfRange) {
  edit_header(weights(), [](json& h) { h["norm.weight"]["data_offsets"] = {1u << 30, (1u << 30) + 256}; });
  expect_error("tensor 'norm.weight': data_offsets [1073741824, 1073742080] fall outside the data section");
}

TEST_F(BadInput, UnknownDtype) {
  edit_header(weights(), [](json& h) { h["norm.weight"]["dtype"] = "F64"; });
  expect_error("tensor 'norm.weight': unsupported dtype 'F64'");
}

TEST_F(BadInput, ByteCountDisagreesWithShape) {
  edit_header(weights(), [](json& h) { h["norm.weight"]["shape"] = {64}; });
  expect_error("tensor 'norm.weight': holds 256 bytes but BF16 [64] needs 128");
}

TEST_F(BadInput, MissingTensor) {
  edit_header(weights(), [](json& h) { h.erase("layers.1.attn.wq_a.weight"); });
  expect_error("missing tensor 'layers.1.attn.wq_a.weight'");
}

TEST_F(BadInput, MissingBlockScale) {
  edit_header(weights(), [](json& h) { h.erase("layers.2.attn.wkv.scale"); });
  expect_error("missing tensor 'layers.2.attn.wkv.scale'");
}

TEST_F(BadInput, WrongShape) {
  edit_header(weights(), [](json& h) { h["layers.0.attn.attn_sink"]["shape"] = {2, 2}; });
  expect_error("tensor 'layers.0.attn.attn_sink' has shape [2, 2], expected [4]");
}

TEST_F(BadInput, WrongDtype) {
  edit_header(weights(), [](json& h) { h["layers.0.hc_attn_base"]["dtype"] = "I32"; });
  expect_error("tensor 'layers.0.hc_attn_base' has dtype I32, expected F32, BF16 or F16");
}

// Byte offset in a safetensors file's `bytes` of entry `index` of its I64 tensor `name`.
size_t i64_entry_offset(const std::string& bytes, const std::string& name, size_t index) {
  uint64_t len;
  std::memcpy(&len, bytes.data(), 8);
  const json h = json::parse(bytes.substr(8, len));
  return 8 + len + h[name]["data_offsets"][0].get<size_t>() + 8 * index;
}
int64_t table_entry(const std::string& path, const std::string& name, size_t index) {
  const std::string bytes = read_bytes(path);
  int64_t v;
  std::memcpy(&v, bytes.data() + i64_entry_offset(bytes, name, index), 8);
  return v;
}
void set_table_entry(const std::string& path, const std::string& name, size_t index, int64_t value) {
  std::string bytes = read_bytes(path);
  std::memcpy(bytes.data() + i64_entry_offset(bytes, name, index), &value, 8);
  write_text(path, bytes);
}

TEST_F(BadInput, HashTableOutOfRange) {
  set_table_entry(weights(), "layers.0.ffn.gate.tid2eid", 0, 99);
  expect_error("tensor 'layers.0.ffn.gate.tid2eid' entry 0 is expert 99, outside [0, 8)");
}

TEST_F(BadInput, HashTableRepeatsExpert) {
  // Row 0's second expert made equal to its first.
  const int64_t first = table_entry(weights(), "layers.0.ffn.gate.tid2eid", 0);
  set_table_entry(weights(), "layers.0.ffn.gate.tid2eid", 1, first);
  expect_error(cat("tensor 'layers.0.ffn.gate.tid2eid' row 0 names expert ", first, " twice"));
}

TEST_F(BadInput, MissingShard) {
  write_text(model_ + "/model.safetensors.index.json",
             R"({"weight_map": {"embed.weight": "model-00001-of-00002.safetensors"}})");
  expect_error("lists shard 'model-00001-of-00002.safetensors' which does not exist");
}

TEST_F(BadInput, TokenOutsideVocabulary) { expect_error("token id 512 is outside the vocabulary [0, 512)", "1,512"); }

TEST_F(BadInput, TokenListIsNotNumeric) { expect_error("--tokens: 'x' is not an integer", "1,x,3"); }

TEST_F(BadInput, UnknownNumerics) { expect_error("unknown numerics mode 'turbo'", "1,2", {"--numerics", "turbo"}); }

TEST_F(BadInput, PromptLongerThanContext) {
  edit_config(model_, [](json& c) { c["max_position_embeddings"] = 8; });
  expect_clean_failure(run_cli({"generate", "--model", model_, "--prompt-ids", "1,2,3,4,5", "--max-tokens", "10"}, 60),
                       "exceeds the model's context of 8");
}

// ---- random mutation fuzz of the parsers: any outcome but a crash, a hang or a non-dsv4 exception.

TEST(Fuzz, SafetensorsHeaderMutations) {
  TempDir tmp;
  const std::string original = read_bytes(ref_small_dir() + "/model.safetensors");
  uint64_t len;
  std::memcpy(&len, original.data(), 8);
  std::mt19937 rng(2024);
  int rejected = 0;
  for (int iter = 0; iter < 300; ++iter) {
    std::string bytes = original.substr(0, 8 + len + 4096);  // header plus the start of the data
    const int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits; ++e) bytes[rng() % (8 + len)] = char(rng() % 256);
    write_text(tmp.file("m.safetensors"), bytes);
    try {
      SafetensorsFile f(tmp.file("m.safetensors"));
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 250);  // truncated data section: almost every mutation must be refused
}

TEST(Fuzz, ConfigMutations) {
  const std::string original = read_text(ref_small_dir() + "/config.json");
  std::mt19937 rng(7);
  const std::string alphabet = "{}[]\",:0123456789-.eE truefalsnul";
  for (int iter = 0; iter < 2000; ++iter) {
    std::string text = original;
    const int edits = 1 + int(rng() % 3);
    for (int e = 0; e < edits; ++e) text[rng() % text.size()] = alphabet[rng() % alphabet.size()];
    try {
      parse_config_json(text);
    } catch (const Error&) {
    }
  }
  SUCCEED();
}

}  // namespace
}  // namespace dsv4::test
