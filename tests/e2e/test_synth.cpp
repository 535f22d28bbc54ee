// dsv4 synth and dsv4 bench: a synthesised checkpoint has the official layout (config, names, dtypes, shapes,
// the full presets' tensor counts and sizes from the spec), values scaled like an initialised model, loads and
// generates finite, deterministic output on the CPU; bench runs on it and writes a well-formed table and JSON.
// Timings are never asserted.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "cpu/cpu_ops.h"
#include "loader/synth.h"
#include "loader/synth_fill.h"
#include "e2e/bench_e2e.h"
#include "harness/files.h"
#include "loader/checkpoint.h"
#include "loader/hf_config.h"
#include "loader/quantize.h"
#include "loader/weight_map.h"

namespace dsv4::test {
namespace {

// V4-Flash's layout (2 sliding, then CSA / HCA; 3 hash layers; MTP) at CPU-test size: 4 layers, small dims.
const std::vector<std::string> kSmall = {"--preset", "v4-flash", "--layers", "4", "--experts", "8", "--vocab", "1000",
                                         "--dim", "256", "--inter", "128",
                                         "--set", "num_attention_heads=4,q_lora_rank=64,o_groups=2,o_lora_rank=64,"
                                                  "index_n_heads=4,index_topk=16,num_experts_per_tok=2"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.begin(), "synth");
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class Synth : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir();
    const CliResult r = run_cli(with(kSmall, {"--out", dir(), "--seed", "7"}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  static void TearDownTestSuite() { delete tmp_; }
  static std::string dir() { return tmp_->file("small"); }
  static TempDir* tmp_;
};
TempDir* Synth::tmp_ = nullptr;

TEST(SynthConfig, PresetsFollowTheOfficialSchedule) {
  SynthOptions o;
  o.preset = "v4-flash";
  nlohmann::json j = synth_config_json(o);
  const ModelConfig flash = parse_config_json(j.dump());
  EXPECT_EQ(flash.n_layers, 43);
  ASSERT_EQ(j["compress_ratios"].size(), 44u);
  int csa = 0, hca = 0;
  for (int64_t i = 0; i < 43; ++i) {
    csa += flash.attn_type(i) == AttnType::kCsa;
    hca += flash.attn_type(i) == AttnType::kHca;
  }
  EXPECT_EQ(flash.attn_type(0), AttnType::kSliding);
  EXPECT_EQ(flash.attn_type(1), AttnType::kSliding);
  EXPECT_EQ(csa, 21);
  EXPECT_EQ(hca, 20);
  EXPECT_EQ(flash.attn_type(43), AttnType::kSliding);  // MTP
  EXPECT_EQ(j["quantization_config"]["weight_block_size"], nlohmann::json({128, 128}));
  EXPECT_EQ(j["expert_dtype"], "fp4");
  EXPECT_EQ(flash.dim, 4096);
  EXPECT_EQ(flash.n_routed_experts, 256);
  EXPECT_EQ(flash.index_topk, 512);
  EXPECT_DOUBLE_EQ(flash.routed_scaling_factor, 1.5);

  o.preset = "v4-pro";
  o.layers = 4;
  j = synth_config_json(o);
  EXPECT_EQ(j["compress_ratios"], nlohmann::json({128, 128, 4, 128, 0}));
  EXPECT_EQ(j["num_hash_layers"], 3);
  EXPECT_EQ(j["hidden_size"], 7168);

  o.preset = "v4-flash";
  o.layers = 2;
  o.mtp = false;
  j = synth_config_json(o);
  EXPECT_EQ(j["compress_ratios"], nlohmann::json({0, 0}));
  EXPECT_EQ(j["num_hash_layers"], 2);
  EXPECT_EQ(j["num_nextn_predict_layers"], 0);
}

// The planned tensors of the full presets reproduce the spec's inventory (§12.1, §12.2): counts and total size.
TEST(SynthConfig, FullPresetsHaveTheOfficialTensorCountAndSize) {
  SynthOptions o;
  o.dry_run = true;
  o.preset = "v4-flash";
  SynthResult r = synth_checkpoint(o, "");
  EXPECT_EQ(r.tensors, 69187u);
  EXPECT_NEAR(double(r.bytes) / double(1ull << 30), 148.7, 0.1);
  o.mtp = false;
  EXPECT_EQ(synth_checkpoint(o, "").tensors, 67612u);
  o.preset = "v4-pro";
  o.mtp = true;
  r = synth_checkpoint(o, "");
  EXPECT_EQ(r.tensors, 145116u);
  EXPECT_NEAR(double(r.bytes) / double(1ull << 30), 805.0, 1.0);
}

TEST_F(Synth, ConfigIsOfficialAndShrunk) {
  const auto j = nlohmann::json::parse(read_text(dir() + "/config.json"));
  EXPECT_EQ(j["compress_ratios"], nlohmann::json({0, 0, 4, 128, 0}));  // N + 1 entries: the MTP layer last
  EXPECT_EQ(j["num_hidden_layers"], 4);
  EXPECT_EQ(j["num_hash_layers"], 3);
  EXPECT_EQ(j["num_nextn_predict_layers"], 1);
  EXPECT_EQ(j["n_routed_experts"], 8);
  EXPECT_EQ(j["vocab_size"], 1000);
  EXPECT_EQ(j["hidden_size"], 256);
  EXPECT_EQ(j["head_dim"], 512);  // not overridden: the preset's
  EXPECT_EQ(j["model_type"], "deepseek_v4");
  EXPECT_TRUE(j.contains("quantization_config"));
}

TEST_F(Synth, TensorsHaveTheOfficialNamesDtypesAndShapes) {
  const auto ckpt = Checkpoint::open(dir());
  struct Want {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
  };
  const int64_t V = 1000, D = 256, I = 128, E = 8;
  const Want wants[] = {
      {"embed.weight", DType::kBF16, {V, D}},
      {"head.weight", DType::kBF16, {V, D}},
      {"norm.weight", DType::kBF16, {D}},
      {"hc_head_fn", DType::kF32, {4, 4 * D}},
      {"layers.0.hc_attn_fn", DType::kF32, {24, 4 * D}},
      {"layers.0.attn.wq_a.weight", DType::kF8E4M3, {64, D}},
      {"layers.0.attn.wq_a.scale", DType::kF8E8M0, {1, 2}},
      {"layers.0.attn.wq_b.weight", DType::kF8E4M3, {4 * 512, 64}},
      {"layers.0.attn.wq_b.scale", DType::kF8E8M0, {16, 1}},
      {"layers.0.attn.wo_a.weight", DType::kF8E4M3, {2 * 64, 2 * 512}},
      {"layers.0.attn.attn_sink", DType::kF32, {4}},
      {"layers.0.ffn.gate.tid2eid", DType::kI64, {V, 2}},
      {"layers.2.attn.compressor.wkv.weight", DType::kBF16, {2 * 512, D}},
      {"layers.2.attn.compressor.ape", DType::kF32, {4, 2 * 512}},
      {"layers.2.attn.indexer.wq_b.weight", DType::kF8E4M3, {4 * 128, 64}},
      {"layers.2.attn.indexer.weights_proj.weight", DType::kBF16, {4, D}},
      {"layers.2.attn.indexer.compressor.ape", DType::kF32, {4, 256}},
      {"layers.3.attn.compressor.ape", DType::kF32, {128, 512}},
      {"layers.3.ffn.gate.bias", DType::kF32, {E}},
      {"layers.3.ffn.shared_experts.w2.weight", DType::kF8E4M3, {D, I}},
      {"layers.3.ffn.experts.5.w1.weight", DType::kI8, {I, D / 2}},
      {"layers.3.ffn.experts.5.w1.scale", DType::kF8E8M0, {I, D / 32}},
      {"layers.3.ffn.experts.7.w2.weight", DType::kI8, {D, I / 2}},
      {"layers.3.ffn.experts.7.w2.scale", DType::kF8E8M0, {D, I / 32}},
      {"mtp.0.e_proj.weight", DType::kF8E4M3, {D, D}},
      {"mtp.0.hnorm.weight", DType::kBF16, {D}},
      {"mtp.0.ffn.gate.bias", DType::kF32, {E}},
      {"mtp.0.hc_head_scale", DType::kF32, {1}},
  };
  for (const Want& w : wants) {
    const TensorInfo* t = ckpt->find(w.name);
    ASSERT_NE(t, nullptr) << w.name;
    EXPECT_EQ(t->dtype, w.dtype) << w.name;
    EXPECT_EQ(t->shape, w.shape) << w.name;
  }
  EXPECT_EQ(ckpt->find("layers.3.ffn.gate.tid2eid"), nullptr);  // layer 3 is scored, not hashed
  EXPECT_EQ(ckpt->find("layers.0.attn.compressor.wkv.weight"), nullptr);  // sliding-only
  // Every matrix is in the format the quantizer would give it (the one rule, loader/quantize.h).
  for (const auto& [name, t] : ckpt->tensors()) {
    if (t.shape.size() != 2 || name.size() < 7 || name.compare(name.size() - 7, 7, ".weight") != 0) continue;
    const WeightFormat f = official_format(name);
    const DType want = f == WeightFormat::kFp8Block ? DType::kF8E4M3 : f == WeightFormat::kFp4 ? DType::kI8 : DType::kBF16;
    EXPECT_EQ(t.dtype, want) << name;
  }
  // The index names every tensor's shard.
  const auto index = nlohmann::json::parse(read_text(dir() + "/model.safetensors.index.json"));
  EXPECT_EQ(index["weight_map"].size(), ckpt->tensors().size());
}

double std_of(const std::vector<float>& v) {
  double s = 0, ss = 0;
  for (float x : v) {
    s += x;
    ss += double(x) * x;
  }
  const double m = s / double(v.size());
  return std::sqrt(ss / double(v.size()) - m * m);
}

std::vector<float> rows(const Weight& w, int64_t n) {
  std::vector<float> out(size_t(n * w.cols));
  for (int64_t r = 0; r < n; ++r) dequant_row(w, r, out.data() + r * w.cols);
  return out;
}

TEST_F(Synth, ValuesAreScaledLikeAnInitialisedModel) {
  const auto m = load_model(dir());  // also validates every dtype and shape against config.json
  const ModelConfig& c = m->config;
  // Linear layers: std ≈ 1/sqrt(fan_in) in real units, whatever the storage format.
  for (const Weight* w : {&m->layers[2].attn.wq_b, &m->layers[2].attn.wo_a, &m->layers[3].moe.experts[3].w1,
                          &m->layers[3].moe.experts[6].w2, &m->layers[1].moe.shared.w3, &m->layers[2].attn.compressor.wkv,
                          &m->mtp[0].h_proj}) {
    const double want = 1.0 / std::sqrt(double(w->cols));
    EXPECT_NEAR(std_of(rows(*w, std::min<int64_t>(w->rows, 64))) / want, 1.0, 0.15) << "matrix id " << w->id;
  }
  // Norm gains ≈ 1.
  double mean = 0;
  for (float g : m->layers[1].attn_norm) mean += g;
  EXPECT_NEAR(mean / double(c.dim), 1.0, 0.05);
  // Hash tables: k distinct experts per row (the loader checked the range).
  for (int64_t t = 0; t < c.vocab_size; ++t) {
    const int32_t* row = m->layers[0].moe.tid2eid.data() + t * c.n_experts_per_tok;
    EXPECT_EQ(std::set<int32_t>(row, row + c.n_experts_per_tok).size(), size_t(c.n_experts_per_tok)) << "token " << t;
  }
  // Scored routing is varied: unit-RMS random inputs select most experts somewhere.
  const LayerWeights& l = m->layers[3];
  const std::vector<float> gate = rows(l.moe.gate, c.n_routed_experts);
  std::set<int> used;
  uint64_t state = 1;
  for (int token = 0; token < 64; ++token) {
    std::vector<float> x(size_t(c.dim));
    for (float& v : x) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      v = float(int64_t(state >> 33) % 2001 - 1000) / 577.0f;  // uniform, RMS ≈ 1
    }
    std::vector<std::pair<float, int>> score;
    for (int e = 0; e < c.n_routed_experts; ++e) {
      double logit = 0;
      for (int64_t i = 0; i < c.dim; ++i) logit += double(gate[size_t(e * c.dim + i)]) * x[size_t(i)];
      score.push_back({float(std::sqrt(std::log1p(std::exp(logit)))) + l.moe.gate_bias[size_t(e)], e});
    }
    std::sort(score.rbegin(), score.rend());
    for (int64_t k = 0; k < c.n_experts_per_tok; ++k) used.insert(score[size_t(k)].second);
  }
  EXPECT_GE(used.size(), 6u);
}

TEST_F(Synth, SameSeedSameBytes) {
  TempDir other;
  ASSERT_EQ(run_cli(with(kSmall, {"--out", other.file("a"), "--seed", "7"})).exit_code, 0);
  ASSERT_EQ(run_cli(with(kSmall, {"--out", other.file("b"), "--seed", "8"})).exit_code, 0);
  for (const auto& entry : std::filesystem::directory_iterator(dir())) {
    if (entry.path().extension() != ".safetensors") continue;
    const std::string name = entry.path().filename().string();
    EXPECT_EQ(read_text(other.file("a/" + name)), read_text(entry.path().string())) << name;
    EXPECT_NE(read_text(other.file("b/" + name)), read_text(entry.path().string())) << name;
  }
}

// synth_model: the same checkpoint, held in memory. On the host every tensor equals the file's bytes; placed for
// the device, each matrix's elements and the FP4 scales are left to be generated (the CUDA test makes them and
// compares) and every other tensor still equals the file's.
SynthOptions small_options(uint64_t seed) {
  SynthOptions o;
  o.preset = "v4-flash";
  o.layers = 4;
  o.seed = seed;
  for (size_t i = 4; i + 1 < kSmall.size(); i += 2) add_synth_override(kSmall[i].substr(2), kSmall[i + 1], &o);
  return o;
}

TEST_F(Synth, InMemoryModelHoldsTheFilesBytes) {
  const auto files = Checkpoint::open(dir());
  for (const SynthPlace place : {SynthPlace::kHost, SynthPlace::kDevice}) {
    SynthResult r;
    const auto m = synth_model(small_options(7), place, &r);
    const Checkpoint& mem = *m->storage;
    ASSERT_EQ(mem.tensors().size(), files->tensors().size());
    size_t generated = 0, generated_bytes = 0;
    for (const auto& [name, t] : files->tensors()) {
      SCOPED_TRACE(name);
      const TensorInfo* u = mem.find(name);
      ASSERT_NE(u, nullptr);
      ASSERT_EQ(u->dtype, t.dtype);
      ASSERT_EQ(u->shape, t.shape);
      ASSERT_EQ(u->nbytes, t.nbytes);
      const GeneratedTensor* g = mem.generated(u->data);
      const bool fp4_scale = name.find("ffn.experts.") != std::string::npos && u->dtype == DType::kF8E8M0;
      const bool matrix = u->shape.size() == 2 && name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0 &&
                          u->dtype != DType::kF32;
      if (place == SynthPlace::kDevice && (matrix || fp4_scale)) {
        ASSERT_NE(g, nullptr);
        EXPECT_EQ(g->data, u->data);
        EXPECT_EQ(mem.generated(u->data + u->nbytes - 1), g);  // its last byte too
        ++generated;
        generated_bytes += u->nbytes;
        // The generator reproduces the file's bytes (the GPU runs the same function: cuda_test_synth_fill).
        for (const uint64_t off : {uint64_t(0), uint64_t(u->nbytes / 2), uint64_t(u->nbytes - 1)})
          ASSERT_EQ(uint8_t(synth_word(g->fill, off / 8) >> (8 * (off % 8))), t.data[off]) << "byte " << off;
      } else {
        ASSERT_EQ(g, nullptr);
        ASSERT_EQ(std::memcmp(u->data, t.data, t.nbytes), 0);
      }
    }
    EXPECT_EQ(r.bytes, r.host_bytes + generated_bytes);
    if (place == SynthPlace::kDevice) {
      EXPECT_GT(generated, 100u);
      EXPECT_LT(double(r.host_bytes), 0.25 * double(r.bytes));
    }
  }
  // A different seed, different bytes.
  const auto other = synth_model(small_options(8), SynthPlace::kHost);
  const TensorInfo& a = other->storage->get("layers.1.attn.wq_a.weight");
  EXPECT_NE(std::memcmp(a.data, files->get("layers.1.attn.wq_a.weight").data, a.nbytes), 0);
}

TEST_F(Synth, GeneratesFiniteDeterministicOutputOnTheCpu) {
  const std::string prompt = "11,22,33,44,55,66,77,88,99";
  const CliResult logits = run_cli({"logits", "--model", dir(), "--backend", "cpu", "--tokens", prompt, "--out",
                                    tmp_->file("logits.f32")});
  ASSERT_EQ(logits.exit_code, 0) << logits.err;
  const std::vector<float> l = read_f32(tmp_->file("logits.f32"));
  ASSERT_EQ(l.size(), 9u * 1000u);
  for (float v : l) ASSERT_TRUE(std::isfinite(v));
  EXPECT_GT(std_of(l), 0.1);
  EXPECT_LT(std_of(l), 10.0);

  for (const char* temperature : {"0", "1"}) {
    const std::vector<std::string> args = {"generate", "--model", dir(), "--backend", "cpu", "--prompt-ids", prompt,
                                           "--max-tokens", "6", "--ignore-eos", "--temperature", temperature, "--seed", "3"};
    const CliResult a = run_cli(args), b = run_cli(args);
    ASSERT_EQ(a.exit_code, 0) << a.err;
    EXPECT_EQ(a.out, b.out) << "temperature " << temperature;
    EXPECT_TRUE(std::regex_search(a.out, std::regex(R"(^(\d+ ){5}\d+\n$)"))) << a.out;
  }

  // --synth on a model command: the same model made in memory gives the same logits, on one rank or two.
  std::vector<std::string> synth = {"logits", "--backend", "cpu", "--tokens", prompt, "--synth-seed", "7", "--synth"};
  synth.insert(synth.end(), kSmall.begin() + 1, kSmall.end());  // v4-flash and its shrinking options
  for (const char* tp : {"1", "2"}) {
    std::vector<std::string> args = synth;
    args.insert(args.end(), {"--tp", tp, "--out", tmp_->file("synth.f32")});
    const CliResult r = run_cli(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::vector<float> m = read_f32(tmp_->file("synth.f32"));
    ASSERT_EQ(m.size(), l.size());
    if (std::string(tp) == "1") {
      EXPECT_EQ(std::memcmp(m.data(), l.data(), l.size() * 4), 0) << "--synth differs from the written checkpoint";
    } else {
      for (size_t i = 0; i < l.size(); ++i) ASSERT_NEAR(m[i], l[i], 1e-3f * (1 + std::fabs(l[i]))) << "--tp 2, " << i;
    }
  }
}

TEST_F(Synth, BadInputGivesClearErrors) {
  TempDir t;
  write_text(t.file("plain"), "x");
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"synth", "--preset", "v4-mini", "--out", t.file("a")}, "unknown preset 'v4-mini'"},
      {{"synth", "--preset", "v4-flash"}, "missing required option --out"},
      {{"synth", "--preset", "v4-flash", "--layers", "44", "--out", t.file("a")}, "v4-flash has 1 to 43 layers"},
      {{"synth", "--preset", "v4-flash", "--layers", "0", "--out", t.file("a")}, "--layers must be at least 1"},
      {{"synth", "--preset", "v4-flash", "--out", t.file("plain/sub")}, "cannot create the output directory"},
      {{"synth", "--preset", "v4-flash", "--out", dir()}, "already holds a checkpoint"},
      {{"synth", "--preset", "v4-flash", "--dim", "100", "--out", t.file("a")}, "multiple of 32"},
      {{"synth", "--preset", "v4-flash", "--set", "nope=3", "--out", t.file("a")}, "'nope' is not a numeric field"},
      {{"synth", "--preset", "v4-flash", "--set", "num_attention_heads", "--out", t.file("a")}, "is not FIELD=VALUE"},
      {{"synth", "--preset", "v4-flash", "--experts", "4", "--out", t.file("a")}, "num_experts_per_tok 6 exceeds"},
      {{"bench", "--synth", "v4-flash", "--model", dir()}, "not both"},
      {{"bench", "--model", dir(), "--layers", "2"}, "only applies with --synth"},
      {{"logits", "--synth", "v4-flash", "--model", dir(), "--tokens", "1", "--out", t.file("l")}, "not both"},
      {{"logits", "--model", dir(), "--experts", "8", "--tokens", "1", "--out", t.file("l")}, "only applies with --synth"},
      {{"logits", "--synth", "v4-nano", "--tokens", "1", "--out", t.file("l")}, "unknown preset 'v4-nano'"},
      {{"generate", "--synth", "v4-flash", "--layers", "1", "-p", "hi"}, "give --tokenizer DIR"},
      // The full V4-Pro (805 GiB) on the cpu backend: refused before any memory is touched.
      {{"logits", "--synth", "v4-pro", "--backend", "cpu", "--tokens", "1", "--out", t.file("l")},
       "holds every tensor in host memory"},
      {{"bench", "--model", dir(), "--batches", "0"}, "--batches: 0 is below 1"},
      {{"bench", "--model", dir(), "--backend", "tpu"}, "unknown backend 'tpu'"},
  };
  for (const auto& [args, message] : cases) {
    const CliResult r = run_cli(args);
    EXPECT_EQ(r.exit_code, 1) << args[1] << " " << args[2];
    EXPECT_NE(r.err.find(message), std::string::npos) << "expected '" << message << "' in: " << r.err;
  }
  EXPECT_FALSE(std::filesystem::exists(t.file("a/config.json")));
}

// The floor formulas on the small model: weights = dense + E·(1−(1−k/E)^b) experts + head; cache per the spec.
TEST_F(Synth, DecodeFloorFollowsTheFormula) {
  EXPECT_DOUBLE_EQ(expected_distinct_experts(256, 6, 1), 6.0);
  EXPECT_NEAR(expected_distinct_experts(256, 6, 64), 256.0 * (1 - std::pow(250.0 / 256.0, 64)), 1e-9);
  EXPECT_NEAR(expected_distinct_experts(8, 2, 1000), 8.0, 1e-9);

  const auto m = load_model(dir());
  const ModelConfig& c = m->config;
  const auto bytes = [](const Weight& w) { return double(w.rows * w.cols); };  // 1 byte per element, no scales
  const DecodeFloor f1 = decode_floor(*m, bytes, 1, 0.0, 1e9, false), f4 = decode_floor(*m, bytes, 4, 999.0, 1e9, false);
  EXPECT_DOUBLE_EQ(f4.weight_bytes - f1.weight_bytes,
                   c.n_layers * (f4.experts_per_layer - f1.experts_per_layer) * 3.0 * double(c.dim * c.moe_inter_dim) +
                       3.0 * double(c.dim));  // more experts, and 3 more embedding rows
  // Position 0: one window key per layer. Position 999: 128 window keys everywhere, CSA top-16 of 250 entries and
  // 250 indexer keys, HCA 7 entries; fp32 state.
  EXPECT_DOUBLE_EQ(f1.cache_bytes, 4 * 512 * 4.0);
  EXPECT_DOUBLE_EQ(f4.cache_bytes, 4 * 4.0 * (4 * 128 * 512 + 16 * 512 + 250 * 128 + 7 * 512));
  EXPECT_DOUBLE_EQ(f4.seconds, (f4.weight_bytes + f4.cache_bytes) / 1e9);
  // Compact caches: a KV row is 448 e4m3 bytes + 7 scales + 64 fp32 rope channels, an indexer key 64 + 4 bytes.
  ASSERT_EQ(c.head_dim - c.rope_dim, 448);
  const DecodeFloor compact = decode_floor(*m, bytes, 4, 999.0, 1e9, true);
  EXPECT_DOUBLE_EQ(compact.cache_bytes, 4 * (4 * 128 * 711.0 + 16 * 711.0 + 250 * 68.0 + 7 * 711.0));
}

TEST_F(Synth, BenchWritesMarkdownAndJson) {
  const CliResult r = run_cli({"bench", "--model", dir(), "--backend", "cpu", "--prefill", "8,20", "--contexts", "0,130",
                               "--batches", "1,3", "--reps", "2", "--decode-steps", "2", "--step", "16", "--json",
                               tmp_->file("bench.json")},
                              900);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("| prefill tokens | step | ms | tokens/s |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| context | batch | ms/step (latency) |"), std::string::npos) << r.out;
  // One markdown row per prefill length and per (context, batch).
  const std::regex row(R"(\n\| (\d+) \| (\d+) \| [0-9.]+ ± [0-9.]+ \| [0-9.]+ ± [0-9.]+ \|)");
  std::vector<std::pair<int, int>> rows;
  for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), row); it != std::sregex_iterator(); ++it)
    rows.push_back({std::stoi((*it)[1]), std::stoi((*it)[2])});
  const std::vector<std::pair<int, int>> want = {{8, 8}, {20, 16}, {0, 1}, {0, 3}, {130, 1}, {130, 3}};
  EXPECT_EQ(rows, want) << r.out;

  const auto j = nlohmann::json::parse(read_text(tmp_->file("bench.json")));
  EXPECT_EQ(j["backend"], "cpu");
  EXPECT_EQ(j["model"]["layers"], 4);
  EXPECT_GT(j["bandwidth"]["bytes_per_s"].get<double>(), 0);
  EXPECT_EQ(j["memory"]["kind"], "RSS");
  ASSERT_EQ(j["prefill"].size(), 2u);
  EXPECT_EQ(j["prefill"][1]["tokens"], 20);
  EXPECT_GT(j["prefill"][1]["tokens_per_s"]["mean"].get<double>(), 0);
  ASSERT_EQ(j["decode"].size(), 4u);
  for (const auto& d : j["decode"]) {
    EXPECT_GT(d["ms_per_step"]["mean"].get<double>(), 0);
    EXPECT_GE(d["ms_per_step"]["sd"].get<double>(), 0);
    // tokens/s is averaged per repetition, so it lies between batch / slowest and batch / fastest step (a bound
    // that holds however noisy the machine is; mean × mean would not equal the batch size).
    const double b = d["batch"].get<double>(), tps = d["tokens_per_s"]["mean"].get<double>();
    const double fastest_ms = d["ms_per_step"]["min"].get<double>(), slowest_ms = d["ms_per_step"]["max"].get<double>();
    EXPECT_LE(fastest_ms, d["ms_per_step"]["mean"].get<double>());
    EXPECT_GE(slowest_ms, d["ms_per_step"]["mean"].get<double>());
    EXPECT_GE(tps, b / slowest_ms * 1e3 * (1 - 1e-9));
    EXPECT_LE(tps, b / fastest_ms * 1e3 * (1 + 1e-9));
    EXPECT_GT(d["floor"]["weight_bytes"].get<double>(), 0);
    EXPECT_GT(d["floor"]["ms"].get<double>(), 0);
    EXPECT_GT(d["achieved"].get<double>(), 0);
  }
  EXPECT_EQ(j["decode"][3]["context"], 130);
  EXPECT_EQ(j["decode"][3]["batch"], 3);
  EXPECT_GT(j["decode"][3]["floor"]["cache_bytes"].get<double>(), j["decode"][2]["floor"]["cache_bytes"].get<double>());
}

TEST(SynthBench, SynthesisesInMemoryOrIntoADirectory) {
  TempDir t;
  std::vector<std::string> args = {"bench", "--synth", "v4-flash", "--layers", "3", "--backend", "cpu", "--prefill", "4",
                                   "--contexts", "0", "--batches", "2", "--reps", "1", "--decode-steps", "1", "--json",
                                   t.file("b.json")};
  for (size_t i = 4; i < kSmall.size(); ++i) args.push_back(kSmall[i]);  // the small dims after --layers 4
  CliResult r = run_cli(args, 900);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(read_text(t.file("b.json")));
  EXPECT_EQ(j["synth"]["layers"], 3);
  EXPECT_EQ(j["synth"]["in_memory"], true);
  EXPECT_GT(j["synth"]["bytes"].get<double>(), 0);
  EXPECT_EQ(j["synth"]["host_bytes"], j["synth"]["bytes"]);  // the cpu backend reads every tensor on the host
  EXPECT_EQ(j["model"]["dir"], "synth v4-flash (in memory)");
  EXPECT_EQ(j["decode"].size(), 1u);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(t.path()), std::filesystem::directory_iterator()), 1)
      << "only the JSON was written";

  args.insert(args.end(), {"--synth-dir", t.file("kept")});
  r = run_cli(args, 900);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  j = nlohmann::json::parse(read_text(t.file("b.json")));
  EXPECT_EQ(j["synth"]["in_memory"], false);
  EXPECT_EQ(j["model"]["dir"], t.file("kept"));
  EXPECT_TRUE(std::filesystem::exists(t.file("kept/model.safetensors.index.json")));
}

}  // namespace
}  // namespace dsv4::test
