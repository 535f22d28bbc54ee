#include "loader/quantize.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "core/dtype.h"
#include "core/error.h"
#include "loader/checkpoint.h"
#include "loader/safetensors.h"

namespace dsv4 {

namespace {

// E8M0 exponent of the power-of-two scale that maps amax onto max_code; all-zero blocks get the smallest scale.
int block_exponent(float amax, float max_code) {
  if (!(amax > 0.0f)) return -127;
  return std::clamp(ceil_log2(amax / max_code), -127, 127);
}

}  // namespace

WeightFormat official_format(const std::string& name) {
  static const std::regex kFp8(
      R"((^|\.)(attn\.(wq_a|wq_b|wkv|wo_a|wo_b)|attn\.indexer\.wq_b|ffn\.shared_experts\.w[123]|e_proj|h_proj)\.weight$)");
  static const std::regex kFp4(R"((^|\.)ffn\.experts\.\d+\.w[123]\.weight$)");
  if (std::regex_search(name, kFp4)) return WeightFormat::kFp4;
  if (std::regex_search(name, kFp8)) return WeightFormat::kFp8Block;
  return WeightFormat::kKeep;
}

void quantize_fp8_block(const float* w, int64_t rows, int64_t cols, std::vector<uint8_t>* codes,
                        std::vector<uint8_t>* scales) {
  const int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
  codes->assign(size_t(rows * cols), 0);
  scales->assign(size_t(sr * sc), 0);
  for (int64_t br = 0; br < sr; ++br) {
    for (int64_t bc = 0; bc < sc; ++bc) {
      const int64_t r1 = std::min(rows, (br + 1) * 128), c1 = std::min(cols, (bc + 1) * 128);
      float amax = 0.0f;
      for (int64_t r = br * 128; r < r1; ++r)
        for (int64_t c = bc * 128; c < c1; ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
      const int e = block_exponent(amax, 448.0f);
      (*scales)[size_t(br * sc + bc)] = uint8_t(e + 127);
      for (int64_t r = br * 128; r < r1; ++r)
        for (int64_t c = bc * 128; c < c1; ++c) (*codes)[size_t(r * cols + c)] = f32_to_e4m3(std::ldexp(w[r * cols + c], -e));
    }
  }
}

void quantize_fp4(const float* w, int64_t rows, int64_t cols, std::vector<uint8_t>* packed,
                  std::vector<uint8_t>* scales) {
  DSV4_CHECK(cols % 32 == 0, "FP4 quantisation needs a multiple of 32 columns, got ", cols);
  packed->assign(size_t(rows * cols / 2), 0);
  scales->assign(size_t(rows * cols / 32), 0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < cols / 32; ++b) {
      const float* v = w + r * cols + b * 32;
      float amax = 0.0f;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(v[i]));
      const int e = block_exponent(amax, 6.0f);
      (*scales)[size_t(r * (cols / 32) + b)] = uint8_t(e + 127);
      for (int i = 0; i < 32; i += 2) {
        const uint8_t lo = f32_to_e2m1(std::ldexp(v[i], -e)), hi = f32_to_e2m1(std::ldexp(v[i + 1], -e));
        (*packed)[size_t((r * cols + b * 32 + i) / 2)] = uint8_t(lo | (hi << 4));
      }
    }
  }
}

size_t quantize_checkpoint(const std::string& in_dir, const std::string& out_dir) {
  namespace fs = std::filesystem;
  const auto ckpt = Checkpoint::open(in_dir);
  const fs::path config_path = fs::path(in_dir) / "config.json";
  std::ifstream config_in(config_path);
  DSV4_CHECK(config_in.good(), config_path.string(), ": cannot read");
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(config_in);
  } catch (const nlohmann::json::exception& e) {
    fail(cat(config_path.string(), ": not valid JSON (", e.what(), ")"));
  }
  DSV4_CHECK(config.is_object(), config_path.string(), ": top level must be a JSON object");
  config["quantization_config"] = {{"quant_method", "fp8"},
                                   {"fmt", "e4m3"},
                                   {"scale_fmt", "ue8m0"},
                                   {"activation_scheme", "dynamic"},
                                   {"weight_block_size", {128, 128}}};
  config["expert_dtype"] = "fp4";

  std::vector<TensorToWrite> out;
  for (const auto& [name, t] : ckpt->tensors()) {
    const WeightFormat format = official_format(name);
    if (format == WeightFormat::kKeep) {
      out.push_back({name, t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes)});
      continue;
    }
    DSV4_CHECK(t.shape.size() == 2, t.file, ": tensor '", t.name, "' has shape ", t.shape_str(), ", expected a matrix");
    const std::vector<float> w = tensor_to_floats(t);  // quantize needs a floating-point source
    const int64_t rows = t.shape[0], cols = t.shape[1];
    const std::string base = name.substr(0, name.size() - std::string(".weight").size());
    TensorToWrite codes{name, DType::kF8E4M3, {rows, cols}, {}};
    TensorToWrite scales{base + ".scale", DType::kF8E8M0, {}, {}};
    if (format == WeightFormat::kFp8Block) {
      quantize_fp8_block(w.data(), rows, cols, &codes.bytes, &scales.bytes);
      scales.shape = {(rows + 127) / 128, (cols + 127) / 128};
    } else {
      quantize_fp4(w.data(), rows, cols, &codes.bytes, &scales.bytes);
      codes.dtype = DType::kI8;
      codes.shape = {rows, cols / 2};
      scales.shape = {rows, cols / 32};
    }
    out.push_back(std::move(codes));
    out.push_back(std::move(scales));
  }
  fs::create_directories(out_dir);
  write_safetensors((fs::path(out_dir) / "model.safetensors").string(), out);
  std::ofstream config_out(fs::path(out_dir) / "config.json");
  config_out << config.dump(1) << "\n";
  DSV4_CHECK(config_out.good(), out_dir, ": cannot write config.json");
  return out.size();
}

}  // namespace dsv4
