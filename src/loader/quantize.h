// Writes a checkpoint in the official DeepSeek-V4 storage formats (spec §3.3, §12.3) from a
// floating-point one: FP8 e4m3 with E8M0 128×128 block scales for the attention projections, the indexer's
// wq_b, the shared experts and the MTP projections; packed FP4 e2m1 with E8M0 per-32 scales for routed
// experts; every other tensor copied unchanged. Names are written in the official spelling.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dsv4 {

enum class WeightFormat : uint8_t { kKeep, kFp8Block, kFp4 };

// The storage format the official checkpoint uses for a tensor (by official name).
WeightFormat official_format(const std::string& name);

// Block-scaled quantisation of a [rows, cols] fp32 matrix, as DeepSeek's converter does:
// scale = 2^ceil(log2(amax / max_code)) per block (E8M0 byte = exponent + 127), q = round_to_nearest_even(w / scale).
void quantize_fp8_block(const float* w, int64_t rows, int64_t cols, std::vector<uint8_t>* codes,
                        std::vector<uint8_t>* scales);  // codes [rows, cols], scales [⌈rows/128⌉, ⌈cols/128⌉]
void quantize_fp4(const float* w, int64_t rows, int64_t cols, std::vector<uint8_t>* packed,
                  std::vector<uint8_t>* scales);  // packed [rows, cols/2] (low nibble first), scales [rows, cols/32]

// Reads the checkpoint in `in_dir` (official or transformers layout) and writes `out_dir`
// (config.json with quantization_config, model.safetensors). Returns the number of tensors written.
size_t quantize_checkpoint(const std::string& in_dir, const std::string& out_dir);

}  // namespace dsv4
