// config.json parsing: the official spelling, the transformers spelling (same model → same ModelConfig),
// and errors that name the field.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "harness/files.h"
#include "loader/hf_config.h"

namespace dsv4 {
namespace {

using nlohmann::json;

json official() { return json::parse(test::read_text(test::ref_small_dir() + "/config.json")); }

TEST(Config, ParsesOfficialSpelling) {
  const ModelConfig c = parse_config_json(official().dump());
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.dim, 128);
  EXPECT_EQ(c.n_layers, 6);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rope_dim, 64);
  EXPECT_EQ(c.window, 8);
  EXPECT_EQ(c.compress_ratios, (std::vector<int>{0, 4, 128, 4, 128, 0, 0}));
  EXPECT_EQ(c.attn_type(1), AttnType::kCsa);
  EXPECT_EQ(c.attn_type(6), AttnType::kSliding);  // the MTP layer
  EXPECT_TRUE(c.yarn.enabled);
  EXPECT_EQ(c.yarn.factor, 4.0);
  EXPECT_EQ(c.yarn.original_max_position, 32);
  EXPECT_EQ(c.compress_rope_theta, 160000.0);
  EXPECT_EQ(c.index_topk, 3);
  EXPECT_EQ(c.hc_mult, 4);
  EXPECT_EQ(c.n_experts_per_tok, 2);
  EXPECT_EQ(c.routed_scaling_factor, 1.5);
  EXPECT_TRUE(c.is_hash_layer(0));
  EXPECT_FALSE(c.is_hash_layer(1));
  EXPECT_EQ(c.swiglu_limit, 10.0);
  EXPECT_EQ(c.n_mtp_layers, 1);
}

TEST(Config, ErrorsNameTheField) {
  const auto expect_error = [](const json& j, const std::string& expected) {
    try {
      parse_config_json(j.dump());
      ADD_FAILURE() << "accepted a bad config, expected: " << expected;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  };
  json j = official();
  j["num_hidden_layers"] = -3;
  expect_error(j, "field 'num_hidden_layers' must be positive");
  j = official();
  j["rope_scaling"] = "yarn";
  expect_error(j, "field 'rope_scaling' must be an object");
  j = official();
  j["compress_ratios"] = {0, 4};
  expect_error(j, "the layer schedule lists 2 layers but num_hidden_layers is 6");
  j = official();
  j["model_type"] = "llama";
  expect_error(j, "model_type is 'llama'");
  j = official();
  j["scoring_func"] = "softmax";
  expect_error(j, "scoring_func 'softmax' is not supported");
  j = official();
  j["num_attention_heads"] = 5;
  expect_error(j, "num_attention_heads 5 is not a multiple of o_groups 2");
  try {
    parse_config_json("[1, 2]");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("top level must be a JSON object"), std::string::npos);
  }
}

}  // namespace
}  // namespace dsv4

namespace dsv4 {
namespace {

// ref-small's config rewritten the way transformers' save_pretrained spells it.
json transformers_spelling() {
  json o = official();
  json t = o;
  for (const char* k : {"compress_ratios", "num_hash_layers", "rope_scaling", "qk_rope_head_dim", "compress_rope_theta",
                        "rope_theta"})
    t.erase(k);
  const char* names[] = {"sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"};
  t["layer_types"] = json::array();
  t["mlp_layer_types"] = json::array();
  for (int i = 0; i < o["num_hidden_layers"].get<int>(); ++i) {
    const int r = o["compress_ratios"][i].get<int>();
    t["layer_types"].push_back(names[r == 0 ? 0 : r == 4 ? 1 : 2]);
    t["mlp_layer_types"].push_back(i < o["num_hash_layers"].get<int>() ? "hash_moe" : "moe");
  }
  t["compress_rates"] = {{"compressed_sparse_attention", 4}, {"heavily_compressed_attention", 128}};
  t["partial_rotary_factor"] = 0.5;
  t["rope_parameters"] = {
      {"main", {{"rope_theta", 10000.0}, {"rope_type", "default"}, {"partial_rotary_factor", 0.5}}},
      {"compress",
       {{"rope_theta", 160000.0}, {"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32},
        {"beta_fast", 32.0}, {"beta_slow", 1.0}, {"attention_factor", 1.0}, {"partial_rotary_factor", 0.5}}}};
  return t;
}

TEST(Config, TransformersSpellingGivesTheSameModel) {
  const ModelConfig a = parse_config_json(official().dump());
  const ModelConfig b = parse_config_json(transformers_spelling().dump());
  EXPECT_EQ(b.rope_dim, a.rope_dim);
  EXPECT_EQ(b.compress_ratios, a.compress_ratios);  // the MTP layer's entry is added as sliding
  EXPECT_EQ(b.hash_layers, a.hash_layers);
  EXPECT_EQ(b.rope_theta, a.rope_theta);
  EXPECT_EQ(b.compress_rope_theta, a.compress_rope_theta);
  EXPECT_EQ(b.yarn.enabled, a.yarn.enabled);
  EXPECT_EQ(b.yarn.factor, a.yarn.factor);
  EXPECT_EQ(b.yarn.original_max_position, a.yarn.original_max_position);
  EXPECT_EQ(b.yarn.beta_fast, a.yarn.beta_fast);
  EXPECT_EQ(b.yarn.beta_slow, a.yarn.beta_slow);
}

TEST(Config, TransformersHashLayersNeedNotBeAPrefix) {
  json t = transformers_spelling();
  t["mlp_layer_types"] = {"moe", "hash_moe", "moe", "moe", "moe", "hash_moe"};
  const ModelConfig c = parse_config_json(t.dump());
  EXPECT_FALSE(c.is_hash_layer(0));
  EXPECT_TRUE(c.is_hash_layer(1));
  EXPECT_TRUE(c.is_hash_layer(5));
  EXPECT_FALSE(c.is_hash_layer(6));  // MTP
  t["mlp_layer_types"] = {"moe"};
  EXPECT_THROW(parse_config_json(t.dump()), Error);
  t = transformers_spelling();
  t["layer_types"][2] = "full_attention";
  EXPECT_THROW(parse_config_json(t.dump()), Error);
}

}  // namespace
}  // namespace dsv4
