// ModelConfig: every hyper-parameter of a DeepSeek-V4 model, normalised from either config.json spelling
// (official or transformers) by loader/hf_config. Names follow the spec's symbols where they exist.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dsv4 {

enum class AttnType : uint8_t { kSliding = 0, kCsa = 4, kHca = 128 };
const char* attn_type_name(AttnType t);

struct YarnConfig {
  bool enabled = false;
  double factor = 1.0;
  int64_t original_max_position = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
};

struct ModelConfig {
  int64_t vocab_size = 0;
  int64_t dim = 0;            // D, hidden_size
  int64_t n_layers = 0;       // main layers, excluding MTP
  int64_t n_heads = 0;        // H
  int64_t head_dim = 0;       // d_h (q and the shared K=V head)
  int64_t rope_dim = 0;       // d_r: the LAST rope_dim channels of a head are rotated
  int64_t q_lora_rank = 0;    // r_q
  int64_t o_groups = 0;       // G
  int64_t o_lora_rank = 0;    // r_o
  int64_t window = 0;         // n_win, sliding window including the current token

  // compress_ratios[i] for i < n_layers + n_mtp_layers: 0 (sliding), 4 (CSA) or 128 (HCA).
  std::vector<int> compress_ratios;
  double rope_theta = 10000.0;           // sliding layers, no YaRN
  double compress_rope_theta = 160000.0;  // compressed layers (and their indexer), with YaRN
  YarnConfig yarn;
  int64_t max_position_embeddings = 0;

  int64_t index_n_heads = 0;   // n_I
  int64_t index_head_dim = 0;  // d_I
  int64_t index_topk = 0;      // k_I

  int64_t hc_mult = 0;  // n_hc, number of residual streams
  int64_t hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  double norm_eps = 1e-6;

  int64_t n_routed_experts = 0;
  int64_t n_experts_per_tok = 0;
  int64_t moe_inter_dim = 0;
  double routed_scaling_factor = 1.0;
  std::vector<uint8_t> hash_layers;  // per main layer: 1 = routed by the tid2eid table (the MTP layer never is)
  double swiglu_limit = 0.0;  // 0 disables the clamp
  int64_t n_mtp_layers = 0;

  int64_t bos_token_id = 0;
  int64_t eos_token_id = 1;

  AttnType attn_type(int64_t layer) const { return AttnType(compress_ratios.at(size_t(layer))); }
  int64_t nope_dim() const { return head_dim - rope_dim; }
  int64_t heads_per_group() const { return n_heads / o_groups; }
  bool is_hash_layer(int64_t layer) const { return layer < int64_t(hash_layers.size()) && hash_layers[size_t(layer)]; }
};

}  // namespace dsv4
