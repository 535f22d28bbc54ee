#include "loader/hf_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace dsv4 {

using nlohmann::json;

namespace {

// Typed access to config fields; every error names the file, the field and what was expected.
class Fields {
 public:
  Fields(const json& j, std::string origin) : j_(j), origin_(std::move(origin)) {}

  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }

  const json& at(const char* key) const {
    DSV4_CHECK(has(key), origin_, ": missing field '", key, "'");
    return j_[key];
  }

  int64_t integer(const char* key) const {
    const json& v = at(key);
    DSV4_CHECK(v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>()),
               origin_, ": field '", key, "' must be an integer, got ", v.dump());
    return v.is_number_integer() ? v.get<int64_t>() : int64_t(v.get<double>());
  }
  int64_t integer(const char* key, int64_t fallback) const { return has(key) ? integer(key) : fallback; }

  double number(const char* key) const {
    const json& v = at(key);
    DSV4_CHECK(v.is_number(), origin_, ": field '", key, "' must be a number, got ", v.dump());
    return v.get<double>();
  }
  double number(const char* key, double fallback) const { return has(key) ? number(key) : fallback; }

  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_[key];
    DSV4_CHECK(v.is_boolean(), origin_, ": field '", key, "' must be true or false, got ", v.dump());
    return v.get<bool>();
  }

  std::string string(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_[key];
    DSV4_CHECK(v.is_string(), origin_, ": field '", key, "' must be a string, got ", v.dump());
    return v.get<std::string>();
  }

  // A positive integer, e.g. a dimension.
  int64_t positive(const char* key) const {
    const int64_t v = integer(key);
    DSV4_CHECK(v > 0, origin_, ": field '", key, "' must be positive, got ", v);
    return v;
  }

  const std::string& origin() const { return origin_; }

 private:
  const json& j_;
  std::string origin_;
};

YarnConfig parse_yarn(const json& r, const std::string& origin, const char* field) {
  YarnConfig y;
  DSV4_CHECK(r.is_object(), origin, ": field '", field, "' must be an object, got ", r.dump());
  Fields f(r, cat(origin, ": ", field));
  const std::string type = f.has("type") ? f.string("type", "") : f.string("rope_type", "default");
  if (type != "yarn") return y;
  y.enabled = true;
  y.factor = f.number("factor");
  y.original_max_position = f.integer("original_max_position_embeddings");
  y.beta_fast = f.number("beta_fast", 32.0);
  y.beta_slow = f.number("beta_slow", 1.0);
  DSV4_CHECK(y.factor > 0 && y.original_max_position > 0, origin, ": field '", field,
             "' needs a positive factor and original_max_position_embeddings");
  return y;
}

int ratio_of_layer_type(const std::string& type, const std::string& origin) {
  if (type == "sliding_attention") return 0;
  if (type == "compressed_sparse_attention") return 4;
  if (type == "heavily_compressed_attention") return 128;
  fail(cat(origin, ": unknown entry '", type, "' in 'layer_types' (expected sliding_attention, ",
           "compressed_sparse_attention or heavily_compressed_attention)"));
}

// compress_ratios (official) or layer_types (+ compress_rates) (transformers).
void parse_layer_schedule(const json& j, const Fields& f, ModelConfig& c) {
  const std::string& origin = f.origin();
  if (f.has("compress_ratios")) {
    const json& r = f.at("compress_ratios");
    DSV4_CHECK(r.is_array(), origin, ": field 'compress_ratios' must be a list of integers");
    for (const auto& v : r) {
      DSV4_CHECK(v.is_number_integer(), origin, ": 'compress_ratios' entries must be integers, got ", v.dump());
      c.compress_ratios.push_back(v.get<int>());
    }
  } else if (f.has("layer_types")) {
    const json& r = f.at("layer_types");
    DSV4_CHECK(r.is_array(), origin, ": field 'layer_types' must be a list of strings");
    for (const auto& v : r) {
      DSV4_CHECK(v.is_string(), origin, ": 'layer_types' entries must be strings, got ", v.dump());
      c.compress_ratios.push_back(ratio_of_layer_type(v.get<std::string>(), origin));
    }
    if (f.has("compress_rates")) {  // overrides of the default ratios per layer type
      const json& rates = f.at("compress_rates");
      DSV4_CHECK(rates.is_object(), origin, ": field 'compress_rates' must be an object");
      for (size_t i = 0; i < c.compress_ratios.size(); ++i) {
        const std::string type = j["layer_types"][i].get<std::string>();
        if (rates.contains(type)) {
          DSV4_CHECK(rates[type].is_number_integer(), origin, ": 'compress_rates' entry '", type, "' must be an integer");
          c.compress_ratios[i] = rates[type].get<int>();
        }
      }
    }
  } else {
    fail(cat(origin, ": missing field 'compress_ratios' (or 'layer_types')"));
  }
  DSV4_CHECK(int64_t(c.compress_ratios.size()) >= c.n_layers, origin, ": the layer schedule lists ",
             c.compress_ratios.size(), " layers but num_hidden_layers is ", c.n_layers);
  // The MTP layer is sliding-only (spec §2.3) when the schedule does not list it.
  while (int64_t(c.compress_ratios.size()) < c.n_layers + c.n_mtp_layers) c.compress_ratios.push_back(0);
  for (size_t i = 0; i < c.compress_ratios.size(); ++i) {
    const int r = c.compress_ratios[i];
    DSV4_CHECK(r == 0 || r == 4 || r == 128, origin, ": layer ", i, " has compress ratio ", r,
               " (supported: 0 sliding, 4 CSA, 128 HCA)");
  }
}

// num_hash_layers (official: the first n layers) or mlp_layer_types (transformers: "hash_moe" | "moe" per layer).
void parse_router_schedule(const Fields& f, ModelConfig& c) {
  if (f.has("mlp_layer_types")) {
    const json& types = f.at("mlp_layer_types");
    DSV4_CHECK(types.is_array() && int64_t(types.size()) == c.n_layers, f.origin(),
               ": field 'mlp_layer_types' must list one entry per layer (", c.n_layers, ")");
    for (const auto& t : types) {
      DSV4_CHECK(t.is_string() && (t == "hash_moe" || t == "moe"), f.origin(),
                 ": 'mlp_layer_types' entries must be \"hash_moe\" or \"moe\", got ", t.dump());
      c.hash_layers.push_back(t == "hash_moe");
    }
    return;
  }
  const int64_t n = f.integer("num_hash_layers", 0);
  DSV4_CHECK(n >= 0 && n <= c.n_layers, f.origin(), ": num_hash_layers ", n, " must be within [0, ", c.n_layers, "]");
  c.hash_layers.assign(size_t(c.n_layers), 0);
  for (int64_t i = 0; i < n; ++i) c.hash_layers[size_t(i)] = 1;
}

// Official: rope_theta, compress_rope_theta, rope_scaling (YaRN of the compressed layers).
// transformers: rope_parameters {"main": {rope_theta, ...}, "compress": {rope_theta, rope_type, factor, ...}},
// or a flat rope_parameters that describes the compressed layers.
void parse_rope(const Fields& f, ModelConfig& c) {
  c.rope_theta = f.number("rope_theta", 10000.0);
  c.compress_rope_theta = f.number("compress_rope_theta", 160000.0);
  if (f.has("rope_parameters")) {
    const json& r = f.at("rope_parameters");
    DSV4_CHECK(r.is_object(), f.origin(), ": field 'rope_parameters' must be an object");
    const bool nested = r.contains("main") || r.contains("compress");
    if (nested && r.contains("main")) {
      DSV4_CHECK(r["main"].is_object(), f.origin(), ": field 'rope_parameters.main' must be an object");
      c.rope_theta = Fields(r["main"], f.origin() + ": rope_parameters.main").number("rope_theta", c.rope_theta);
    }
    const json& compress = nested ? r.value("compress", json::object()) : r;
    DSV4_CHECK(compress.is_object(), f.origin(), ": field 'rope_parameters.compress' must be an object");
    c.compress_rope_theta =
        Fields(compress, f.origin() + ": rope_parameters.compress").number("rope_theta", c.compress_rope_theta);
    c.yarn = parse_yarn(compress, f.origin(), "rope_parameters.compress");
  } else if (f.has("rope_scaling")) {
    c.yarn = parse_yarn(f.at("rope_scaling"), f.origin(), "rope_scaling");
  }
}

}  // namespace

ModelConfig parse_config_json(const std::string& text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(cat(origin, ": not valid JSON (", e.what(), ")"));
  }
  DSV4_CHECK(j.is_object(), origin, ": top level must be a JSON object");
  const Fields f(j, origin);
  const std::string model_type = f.string("model_type", "deepseek_v4");
  DSV4_CHECK(model_type == "deepseek_v4", origin, ": model_type is '", model_type, "', expected 'deepseek_v4'");

  ModelConfig c;
  c.vocab_size = f.positive("vocab_size");
  c.dim = f.positive("hidden_size");
  c.n_layers = f.positive("num_hidden_layers");
  c.n_heads = f.positive("num_attention_heads");
  c.head_dim = f.positive("head_dim");
  if (f.has("qk_rope_head_dim")) {
    c.rope_dim = f.positive("qk_rope_head_dim");
  } else {
    const double factor = f.number("partial_rotary_factor");
    c.rope_dim = int64_t(std::llround(factor * double(c.head_dim)));
  }
  c.q_lora_rank = f.positive("q_lora_rank");
  c.o_groups = f.positive("o_groups");
  c.o_lora_rank = f.positive("o_lora_rank");
  c.window = f.positive("sliding_window");
  c.n_mtp_layers = f.integer("num_nextn_predict_layers", 0);
  c.max_position_embeddings = f.integer("max_position_embeddings", 0);

  c.index_n_heads = f.integer("index_n_heads", 0);
  c.index_head_dim = f.integer("index_head_dim", 0);
  c.index_topk = f.integer("index_topk", 0);

  c.hc_mult = f.positive("hc_mult");
  c.hc_sinkhorn_iters = f.integer("hc_sinkhorn_iters", 20);
  c.hc_eps = f.number("hc_eps", 1e-6);
  c.norm_eps = f.number("rms_norm_eps", 1e-6);

  c.n_routed_experts = f.positive("n_routed_experts");
  c.n_experts_per_tok = f.positive("num_experts_per_tok");
  c.moe_inter_dim = f.positive("moe_intermediate_size");
  c.routed_scaling_factor = f.number("routed_scaling_factor", 1.0);
  c.swiglu_limit = f.number("swiglu_limit", 0.0);
  const std::string scoring = f.string("scoring_func", "sqrtsoftplus");
  DSV4_CHECK(scoring == "sqrtsoftplus", origin, ": scoring_func '", scoring, "' is not supported (expected sqrtsoftplus)");
  c.bos_token_id = f.integer("bos_token_id", 0);
  c.eos_token_id = f.integer("eos_token_id", 1);

  parse_layer_schedule(j, f, c);
  parse_router_schedule(f, c);
  parse_rope(f, c);

  // Invariants the forward pass relies on.
  DSV4_CHECK(c.rope_dim > 0 && c.rope_dim % 2 == 0 && c.rope_dim <= c.head_dim, origin,
             ": rotary dimension ", c.rope_dim, " must be even and at most head_dim ", c.head_dim);
  DSV4_CHECK(c.n_heads % c.o_groups == 0, origin, ": num_attention_heads ", c.n_heads,
             " is not a multiple of o_groups ", c.o_groups);
  DSV4_CHECK(c.hc_mult <= 16, origin, ": hc_mult ", c.hc_mult, " is larger than 16");
  DSV4_CHECK(c.n_experts_per_tok <= c.n_routed_experts, origin, ": num_experts_per_tok ", c.n_experts_per_tok,
             " exceeds n_routed_experts ", c.n_routed_experts);
  const bool has_csa = std::find(c.compress_ratios.begin(), c.compress_ratios.end(), 4) != c.compress_ratios.end();
  if (has_csa) {
    DSV4_CHECK(c.index_n_heads > 0 && c.index_topk > 0, origin,
               ": CSA layers need positive index_n_heads and index_topk");
    DSV4_CHECK(c.index_head_dim >= c.rope_dim && (c.index_head_dim & (c.index_head_dim - 1)) == 0 &&
                   c.index_head_dim % 32 == 0,
               origin, ": index_head_dim ", c.index_head_dim,
               " must be a power of two, a multiple of 32 and at least the rotary dimension");
  }
  return c;
}

ModelConfig load_config(const std::string& model_dir) {
  namespace fs = std::filesystem;
  DSV4_CHECK(fs::is_directory(model_dir), model_dir, ": model directory does not exist");
  const fs::path path = fs::path(model_dir) / "config.json";
  std::ifstream in(path);
  DSV4_CHECK(in.good(), path.string(), ": cannot read config.json");
  std::stringstream text;
  text << in.rdbuf();
  return parse_config_json(text.str(), path.string());
}

}  // namespace dsv4
