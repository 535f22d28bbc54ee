// dsv4 quantize: the written bytes decode (by an independent implementation of the spec §3.3 formulas) to
// exactly what the loader produces, each value is the round-to-nearest-even quantisation of the source with
// the power-of-two block scale the spec prescribes, and the quantised model's logits stay close to the
// source's.
//
// Source checkpoint: ref-small decoded to F32 (official names), so the test needs nothing but the fixture.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <regex>

#include "cpu/cpu_ops.h"
#include "harness/compare.h"
#include "harness/files.h"
#include "loader/checkpoint.h"
#include "loader/quantize.h"
#include "loader/safetensors.h"
#include "loader/weight_map.h"

namespace dsv4::test {
namespace {

// ---- independent decoders (bit formulas, no tables shared with the engine)
double e4m3(uint8_t b) {
  const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  const double v = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return s ? -v : v;
}
double e2m1(uint8_t c) {
  static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (c & 8) ? -mag[c & 7] : mag[c & 7];
}
double e8m0(uint8_t b) { return std::ldexp(1.0, int(b) - 127); }

// Logical [rows, cols] values of a quantised tensor from its raw bytes.
std::vector<float> decode(const TensorInfo& codes, const TensorInfo& scales, bool fp4) {
  const int64_t rows = codes.shape[0], cols = fp4 ? codes.shape[1] * 2 : codes.shape[1];
  std::vector<float> out(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const double s = fp4 ? e8m0(scales.data[r * scales.shape[1] + c / 32])
                           : e8m0(scales.data[(r / 128) * scales.shape[1] + c / 128]);
      const double q = fp4 ? e2m1(uint8_t((codes.data[(r * cols + c) / 2] >> (4 * (c % 2))) & 15))
                           : e4m3(codes.data[r * cols + c]);
      out[size_t(r * cols + c)] = float(q * s);
    }
  return out;
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// ref-small with every quantised matrix decoded to F32 (the "BF16 checkpoint" of the round trip).
void write_float_source(const std::string& dir) {
  const auto ckpt = Checkpoint::open(ref_small_dir());
  std::vector<TensorToWrite> out;
  for (const auto& [name, t] : ckpt->tensors()) {
    if (name.size() > 6 && name.compare(name.size() - 6, 6, ".scale") == 0) continue;
    if (t.dtype == DType::kF8E4M3 || t.dtype == DType::kI8) {
      const bool fp4 = t.dtype == DType::kI8;
      const std::vector<float> v = decode(t, ckpt->get(name.substr(0, name.size() - 7) + ".scale"), fp4);
      out.push_back({name, DType::kF32, {t.shape[0], fp4 ? t.shape[1] * 2 : t.shape[1]}, f32_bytes(v)});
    } else {
      out.push_back({name, t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes)});
    }
  }
  std::filesystem::create_directories(dir);
  write_safetensors(dir + "/model.safetensors", out);
  std::filesystem::copy_file(ref_small_dir() + "/config.json", dir + "/config.json");
}

class Quantize : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir();
    write_float_source(tmp_->file("source"));
    const CliResult r = run_cli({"quantize", "--model", tmp_->file("source"), "--out", tmp_->file("quantized")});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  static void TearDownTestSuite() { delete tmp_; }
  static TempDir* tmp_;
};
TempDir* Quantize::tmp_ = nullptr;

TEST_F(Quantize, EveryOfficialTensorClassGetsItsFormat) {
  const auto q = Checkpoint::open(tmp_->file("quantized"));
  const auto original = Checkpoint::open(ref_small_dir());
  ASSERT_EQ(q->tensors().size(), original->tensors().size());
  for (const auto& [name, t] : original->tensors()) {
    const TensorInfo* mine = q->find(name);
    ASSERT_NE(mine, nullptr) << name;
    EXPECT_EQ(mine->dtype, t.dtype) << name;  // the official layout of ref-small, class by class
    EXPECT_EQ(mine->shape, t.shape) << name;
  }
}

TEST_F(Quantize, LoaderDequantisesToTheSpecFormulasBitExactly) {
  const auto q = Checkpoint::open(tmp_->file("quantized"));
  const auto model = load_model(tmp_->file("quantized"));
  const auto source = Checkpoint::open(tmp_->file("source"));
  // Matrices of layer 1 (CSA: FP8 projections, FP4 experts) checked against the independent decode.
  const std::pair<const Weight*, std::string> cases[] = {
      {&model->layers[1].attn.wq_b, "layers.1.attn.wq_b"},
      {&model->layers[1].attn.wo_a, "layers.1.attn.wo_a"},
      {&model->layers[1].attn.indexer.wq_b, "layers.1.attn.indexer.wq_b"},
      {&model->layers[1].moe.shared.w2, "layers.1.ffn.shared_experts.w2"},
      {&model->layers[1].moe.experts[5].w1, "layers.1.ffn.experts.5.w1"},
      {&model->layers[1].moe.experts[2].w2, "layers.1.ffn.experts.2.w2"},
      {&model->mtp[0].e_proj, "mtp.0.e_proj"},
  };
  for (const auto& [w, name] : cases) {
    const bool fp4 = w->dtype == DType::kI8;
    const std::vector<float> want = decode(q->get(name + ".weight"), q->get(name + ".scale"), fp4);
    std::vector<float> got(size_t(w->rows * w->cols));
    for (int64_t r = 0; r < w->rows; ++r) dequant_row(*w, r, got.data() + r * w->cols);
    EXPECT_EQ(got, want) << name;

    // Each value is the nearest code (ties to even) of source / scale, scale = 2^ceil(log2(amax / max_code)).
    const TensorInfo& src = source->get(name + ".weight");
    const float* s = reinterpret_cast<const float*>(src.data);
    const int64_t br = fp4 ? 1 : 128, bc = fp4 ? 32 : 128;
    const double max_code = fp4 ? 6.0 : 448.0;
    for (int64_t r0 = 0; r0 < w->rows; r0 += br)
      for (int64_t c0 = 0; c0 < w->cols; c0 += bc) {
        double amax = 0;
        for (int64_t r = r0; r < std::min(w->rows, r0 + br); ++r)
          for (int64_t c = c0; c < std::min(w->cols, c0 + bc); ++c) amax = std::max(amax, std::fabs(double(s[r * w->cols + c])));
        const double scale = std::ldexp(1.0, int(std::ceil(std::log2(amax / max_code))));
        for (int64_t r = r0; r < std::min(w->rows, r0 + br); ++r)
          for (int64_t c = c0; c < std::min(w->cols, c0 + bc); ++c) {
            const double x = s[r * w->cols + c] / scale, y = got[size_t(r * w->cols + c)] / scale;
            // y is a code value; no code value lies strictly closer to x.
            double best = 1e30;
            for (int code = 0; code < (fp4 ? 16 : 256); ++code) {
              const double v = fp4 ? e2m1(uint8_t(code)) : e4m3(uint8_t(code));
              if (!std::isnan(v)) best = std::min(best, std::fabs(v - std::clamp(x, -max_code, max_code)));
            }
            ASSERT_EQ(std::fabs(y - std::clamp(x, -max_code, max_code)), best) << name << " [" << r << ", " << c << "]";
          }
      }
  }
}

TEST_F(Quantize, LogitsStayCloseToTheSource) {
  const std::string tokens = "73,342,89,135,26,22,495,308,149,2,279,436,112,82,142,193,118,204,249,355";
  for (const char* model : {"source", "quantized"}) {
    const CliResult r = run_cli({"logits", "--model", tmp_->file(model), "--tokens", tokens, "--numerics", "exact",
                                 "--out", tmp_->file(std::string(model) + ".f32")});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  const std::vector<float> src = read_f32(tmp_->file("source.f32")), q = read_f32(tmp_->file("quantized.f32"));
  // The source already holds FP8/FP4 values, re-quantised with fresh block scales: close, not equal.
  EXPECT_TRUE(compare(q, src, {0.25, 0.0, 0.995}, "quantized vs source"));
  // And the F32 source holds the original checkpoint's values, so it reproduces the fixture (its prompt
  // starts with the same 20 tokens).
  const std::vector<float> fixture = read_f32(ref_small_dir() + "/logits/exact_300.f32");
  EXPECT_TRUE(compare(src, std::vector<float>(fixture.begin(), fixture.begin() + long(src.size())), {1e-3, 0.0},
                      "F32 source vs fixture"));
}

}  // namespace
}  // namespace dsv4::test
