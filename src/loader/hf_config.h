// config.json → ModelConfig. Accepts the official spelling (compress_ratios, num_hash_layers,
// rope_scaling, qk_rope_head_dim, ...) and the transformers spelling (layer_types, mlp_layer_types,
// compress_rates, rope_parameters, partial_rotary_factor, ...). Errors name the field and the expectation.
#pragma once

#include <string>

#include "model/config.h"

namespace dsv4 {

ModelConfig parse_config_json(const std::string& text, const std::string& origin = "config.json");
ModelConfig load_config(const std::string& model_dir);

}  // namespace dsv4
