// safetensors reading/writing, sharded checkpoints, and the transformers → official name translation.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "harness/compare.h"
#include "harness/files.h"
#include "loader/checkpoint.h"
#include "loader/safetensors.h"
#include "loader/weight_map.h"

namespace dsv4 {
namespace {

using test::TempDir;

std::vector<uint8_t> bytes_of(const std::vector<uint16_t>& v) {
  std::vector<uint8_t> b(v.size() * 2);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

TEST(Safetensors, WriteThenReadEveryDtype) {
  TempDir tmp;
  const std::vector<TensorToWrite> tensors = {
      {"a.f32", DType::kF32, {2, 3}, std::vector<uint8_t>(24, 7)},
      {"b.bf16", DType::kBF16, {5}, bytes_of({1, 2, 3, 4, 5})},
      {"c.f16", DType::kF16, {1, 1}, bytes_of({0x3C00})},
      {"d.fp8", DType::kF8E4M3, {3, 3}, std::vector<uint8_t>(9, 0x38)},
      {"d.scale", DType::kF8E8M0, {1, 1}, {127}},
      {"e.fp4", DType::kI8, {4, 16}, std::vector<uint8_t>(64, 0x21)},
      {"f.i64", DType::kI64, {2}, std::vector<uint8_t>(16, 0)},
      {"g.i32", DType::kI32, {3}, std::vector<uint8_t>(12, 1)},
      {"h.empty", DType::kF32, {0, 4}, {}},
  };
  write_safetensors(tmp.file("m.safetensors"), tensors);
  const SafetensorsFile file(tmp.file("m.safetensors"));
  ASSERT_EQ(file.tensors().size(), tensors.size());
  for (const auto& t : tensors) {
    const TensorInfo& info = file.tensors().at(t.name);
    EXPECT_EQ(info.dtype, t.dtype) << t.name;
    EXPECT_EQ(info.shape, t.shape) << t.name;
    ASSERT_EQ(info.nbytes, t.bytes.size()) << t.name;
    EXPECT_EQ(0, std::memcmp(info.data, t.bytes.data(), t.bytes.size())) << t.name;
  }
}

TEST(Checkpoint, TranslatesTransformersNames) {
  const std::pair<const char*, const char*> cases[] = {
      {"model.embed_tokens.weight", "embed.weight"},
      {"lm_head.weight", "head.weight"},
      {"model.norm.weight", "norm.weight"},
      {"model.hc_head.hc_fn", "hc_head_fn"},
      {"model.layers.3.input_layernorm.weight", "layers.3.attn_norm.weight"},
      {"model.layers.3.post_attention_layernorm.weight", "layers.3.ffn_norm.weight"},
      {"model.layers.3.attn_hc.fn", "layers.3.hc_attn_fn"},
      {"model.layers.3.ffn_hc.scale", "layers.3.hc_ffn_scale"},
      {"model.layers.3.self_attn.q_a_proj.weight", "layers.3.attn.wq_a.weight"},
      {"model.layers.3.self_attn.q_a_norm.weight", "layers.3.attn.q_norm.weight"},
      {"model.layers.3.self_attn.kv_proj.weight", "layers.3.attn.wkv.weight"},
      {"model.layers.3.self_attn.o_b_proj.weight", "layers.3.attn.wo_b.weight"},
      {"model.layers.3.self_attn.sinks", "layers.3.attn.attn_sink"},
      {"model.layers.3.self_attn.compressor.position_bias", "layers.3.attn.compressor.ape"},
      {"model.layers.3.self_attn.compressor.kv_norm.weight", "layers.3.attn.compressor.norm.weight"},
      {"model.layers.3.self_attn.compressor.indexer.q_b_proj.weight", "layers.3.attn.indexer.wq_b.weight"},
      {"model.layers.3.self_attn.compressor.indexer.kv_proj.weight", "layers.3.attn.indexer.compressor.wkv.weight"},
      {"model.layers.3.self_attn.compressor.indexer.scorer.weights_proj.weight",
       "layers.3.attn.indexer.weights_proj.weight"},
      {"model.layers.3.mlp.gate.e_score_correction_bias", "layers.3.ffn.gate.bias"},
      {"model.layers.3.mlp.gate.tid2eid", "layers.3.ffn.gate.tid2eid"},
      {"model.layers.3.mlp.shared_experts.up_proj.weight", "layers.3.ffn.shared_experts.w3.weight"},
      {"model.layers.3.self_attn.wq_a.weight_scale_inv", "layers.3.attn.wq_a.scale"},
      {"layers.3.attn.wkv.weight", "layers.3.attn.wkv.weight"},  // already official
      {"layers.3.attn.compressor.wkv.weight", "layers.3.attn.compressor.wkv.weight"},
  };
  for (const auto& [from, to] : cases) EXPECT_EQ(official_tensor_name(from), to) << from;
}

TEST(Checkpoint, SplitsFusedExperts) {
  // gate_up_proj [E=2, 2I=4, D=3]: rows 0..1 of each expert are w1 (gate), rows 2..3 are w3 (up).
  TempDir tmp;
  std::vector<uint16_t> gate_up(2 * 4 * 3), down(2 * 3 * 2);
  for (size_t i = 0; i < gate_up.size(); ++i) gate_up[i] = uint16_t(i);
  for (size_t i = 0; i < down.size(); ++i) down[i] = uint16_t(100 + i);
  write_safetensors(tmp.file("model.safetensors"),
                    {{"model.layers.0.mlp.experts.gate_up_proj", DType::kBF16, {2, 4, 3}, bytes_of(gate_up)},
                     {"model.layers.0.mlp.experts.down_proj", DType::kBF16, {2, 3, 2}, bytes_of(down)}});
  const auto ckpt = Checkpoint::open(tmp.path());
  EXPECT_TRUE(ckpt->has_transformers_names());
  const auto check = [&](const std::string& name, std::vector<int64_t> shape, uint16_t first) {
    const TensorInfo& t = ckpt->get(name);
    EXPECT_EQ(t.shape, shape) << name;
    uint16_t v;
    std::memcpy(&v, t.data, 2);
    EXPECT_EQ(v, first) << name;
  };
  check("layers.0.ffn.experts.0.w1.weight", {2, 3}, 0);
  check("layers.0.ffn.experts.0.w3.weight", {2, 3}, 6);
  check("layers.0.ffn.experts.1.w1.weight", {2, 3}, 12);
  check("layers.0.ffn.experts.1.w3.weight", {2, 3}, 18);
  check("layers.0.ffn.experts.1.w2.weight", {3, 2}, 106);
  EXPECT_THROW(ckpt->get("layers.0.ffn.experts.2.w1.weight"), Error);
}

// The same checkpoint split over two shards with an index gives identical logits.
TEST(Checkpoint, ShardedEqualsSingleFile) {
  TempDir tmp;
  const auto single = Checkpoint::open(test::ref_small_dir());
  std::vector<TensorToWrite> shard[2];
  nlohmann::json index = {{"metadata", nlohmann::json::object()}, {"weight_map", nlohmann::json::object()}};
  size_t i = 0;
  for (const auto& [name, t] : single->tensors()) {
    const int s = int(i++ % 2);
    shard[s].push_back({name, t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes)});
    index["weight_map"][name] = "model-0000" + std::to_string(s + 1) + "-of-00002.safetensors";
  }
  const std::string dir = tmp.file("sharded");
  std::filesystem::create_directories(dir);
  write_safetensors(dir + "/model-00001-of-00002.safetensors", shard[0]);
  write_safetensors(dir + "/model-00002-of-00002.safetensors", shard[1]);
  test::write_text(dir + "/model.safetensors.index.json", index.dump());
  std::filesystem::copy_file(test::ref_small_dir() + "/config.json", dir + "/config.json");

  const std::string tokens = "5,17,300,2,9,44,101,7,8,9,10,11,12";
  for (const std::string& model : {test::ref_small_dir(), dir}) {
    const auto r = test::run_cli({"logits", "--model", model, "--tokens", tokens, "--out", model == dir ? tmp.file("b") : tmp.file("a")});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  EXPECT_EQ(test::read_f32(tmp.file("a")), test::read_f32(tmp.file("b")));
}

TEST(Checkpoint, PrefetchReportsProgressUpToTheTotal) {
  const auto ckpt = Checkpoint::open(test::ref_small_dir());
  std::vector<std::pair<size_t, size_t>> calls;
  ckpt->prefetch([&](size_t done, size_t total) { calls.emplace_back(done, total); });
  ASSERT_FALSE(calls.empty());
  EXPECT_EQ(calls.back().first, ckpt->total_bytes());
  EXPECT_EQ(ckpt->total_bytes(), std::filesystem::file_size(test::ref_small_dir() + "/model.safetensors"));
  for (size_t i = 1; i < calls.size(); ++i) EXPECT_GE(calls[i].first, calls[i - 1].first);
}

TEST(WeightMap, LoadsReferenceCheckpoint) {
  const auto model = load_model(test::ref_small_dir());
  const ModelConfig& c = model->config;
  ASSERT_EQ(model->layers.size(), size_t(c.n_layers));
  EXPECT_EQ(model->mtp.size(), 1u);
  EXPECT_EQ(model->layers[0].attn_type, AttnType::kSliding);
  EXPECT_EQ(model->layers[1].attn_type, AttnType::kCsa);
  EXPECT_EQ(model->layers[2].attn_type, AttnType::kHca);
  EXPECT_TRUE(model->layers[0].hash_routed);
  EXPECT_FALSE(model->layers[1].hash_routed);
  EXPECT_EQ(model->layers[1].attn.wq_a.dtype, DType::kF8E4M3);
  EXPECT_EQ(model->layers[1].moe.experts[3].w2.dtype, DType::kI8);
  EXPECT_EQ(model->layers[1].attn.compressor.ape.size(), size_t(4 * 2 * c.head_dim));
  for (size_t id = 0; id < model->matrices.size(); ++id) {
    ASSERT_NE(model->matrices[id], nullptr) << id;
    EXPECT_EQ(model->matrices[id]->id, int(id));
  }
}

}  // namespace
}  // namespace dsv4
