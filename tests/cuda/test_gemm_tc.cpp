// gemm family, tensor-core paths (src/cuda/gemm/gemm_tc.cu: wgmma + TMA on sm_90a; gemv_mma.cu: the FP8 decode
// GEMV, mma.sync e4m3) against the CPU reference.
//
// The kernel rounds the fp32 activations to the weight's format before the tensor cores see them, so each case
// is checked twice, on sampled rows (every row for small n), against CpuOps:
//
// kernel check — reference: CpuOps::linear on the SAME rounded activations (x → bf16 round-to-nearest-even, or
//   CpuOps::sim_fp8(x, block 128), which is DeepSeek's act_quant). Only the summation differs.
//   BF16: bf16 × bf16 products are exact in fp32; the tensor core adds each 16-wide K step (16 products and the
//     accumulator) aligned to the largest and truncated to fp32's 24 bits. Per element that is at most
//     K·2^-23·Σ|x·w| ≤ K·2^-23·‖x_r‖·‖w_c‖ (Cauchy–Schwarz): the per-element bound. Truncation always shrinks
//     the running sum, by half an ulp on average, so the error grows linearly with the K/16 steps: whole-tensor
//     relative error ≈ (K/16)·2^-24·(mean |partial sum| / |sum|) ≤ (K/16)·2^-24 (1.5e-5 at K = 4096): the
//     norm bound. (Split-K CTAs sum shorter runs: smaller still.)
//   FP8: the e4m3 tensor-core accumulator keeps ~14 significant bits; each 128-long K slice is summed there in
//     4 steps of 32 products and then promoted to fp32 with the scales. With RMS ≈ √(33/12)·2^-13·|partial sum|
//     per step the whole-tensor relative error is ≈ 2·1.66·2^-13 ≈ 4e-4; bound 2e-3. Per element, a sanity
//     bound of 2^-10·‖x_r‖·‖w_c‖: far above that noise (≈ 1e-5 in these units at K = 4096), far below a wrong
//     or unwritten element (≈ |y| ≈ ‖x‖‖w‖/√K ≥ 1e-2).
// format check — reference: CpuOps::linear on the fp32 activations (what the reference model computes). The
//   relative norm error is the activation rounding carried through dot products of independent terms:
//   BF16 keeps 8 significant bits: for values spread over a binade the x²-weighted RMS relative error is
//     2^-8/√3/1.53 ≈ 1.5e-3 → bound 5e-3.
//   FP8 e4m3 keeps 4: x uniform in a 128-block whose amax is scaled into [224, 448] has RMS relative error
//     ≈ 2^-4/√3/1.53 ≈ 2.4e-2 → bound 4e-2.
//
// Also: outputs poisoned (NaN) before the call; every output element must be written and finite, and the
// padding columns of y (ldy > N) must stay untouched.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/random.h"
#include "cuda/gpu.h"

#if DSV4_HAVE_CUDA
#include <cuda_runtime.h>

#include "cuda/common/check.h"
#include "cuda/gemm/gemm.h"
#include "cuda/gemm/tc_gemm.h"
#endif

namespace dsv4::test {
namespace {

#if DSV4_HAVE_CUDA

uint64_t splitmix64(uint64_t z) { return splitmix64_mix(z + kSplitMixGamma); }

// Uniform in [-1, 1), element i of stream `seed`: independent of thread count, so big tensors fill in parallel.
float uniform_at(uint64_t seed, uint64_t i) {
  return float(splitmix64(seed ^ splitmix64(i)) >> 40) * 0x1p-23f - 1.0f;
}

std::vector<float> random_matrix(int64_t rows, int64_t cols, uint64_t seed) {
  std::vector<float> v(size_t(rows * cols));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows * cols; ++i) v[size_t(i)] = uniform_at(seed, uint64_t(i));
  return v;
}

// A checkpoint matrix in host memory: BF16, or FP8 e4m3 with f32 128×128 block scales (not powers of two, so
// the weight-scale multiply is exercised).
struct HostWeight {
  std::vector<uint8_t> data, scale;
  Weight w;
};

HostWeight random_weight(DType dtype, int64_t rows, int64_t cols, uint64_t seed) {
  HostWeight h;
  h.w.dtype = dtype;
  h.w.rows = rows;
  h.w.cols = cols;
  if (dtype == DType::kBF16) {
    h.data.resize(size_t(rows * cols * 2));
    auto* bits = reinterpret_cast<uint16_t*>(h.data.data());
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < rows * cols; ++i) bits[i] = f32_to_bf16(uniform_at(seed, uint64_t(i)));
    h.w.row_stride = cols * 2;
  } else if (dtype == DType::kF8E4M3) {
    h.data.resize(size_t(rows * cols));
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < rows * cols; ++i) h.data[size_t(i)] = f32_to_e4m3(448.0f * uniform_at(seed, uint64_t(i)));
    const int64_t srows = (rows + 127) / 128, scols = (cols + 127) / 128;
    std::vector<float> s(size_t(srows * scols));
    for (size_t i = 0; i < s.size(); ++i) s[i] = 1e-3f * (1.5f + uniform_at(seed + 1, i));
    h.scale.resize(s.size() * 4);
    std::memcpy(h.scale.data(), s.data(), h.scale.size());
    h.w.row_stride = cols;
    h.w.scale_dtype = DType::kF32;
    h.w.scale_block_rows = h.w.scale_block_cols = 128;
    h.w.scale_stride = scols;
  } else if (dtype == DType::kF32) {
    h.data.resize(size_t(rows * cols * 4));
    const std::vector<float> v = random_matrix(rows, cols, seed);
    std::memcpy(h.data.data(), v.data(), h.data.size());
    h.w.row_stride = cols * 4;
  } else {  // packed FP4 e2m1 with e8m0 1×32 scales
    h.data.resize(size_t(rows * cols / 2));
    for (size_t i = 0; i < h.data.size(); ++i) h.data[i] = uint8_t(splitmix64(seed + i));
    h.scale.assign(size_t(rows * cols / 32), 124);
    h.w.row_stride = cols / 2;
    h.w.scale_dtype = DType::kF8E8M0;
    h.w.scale_block_rows = 1;
    h.w.scale_block_cols = 32;
    h.w.scale_stride = cols / 32;
  }
  h.w.data = h.data.data();
  h.w.scale = h.scale.empty() ? nullptr : h.scale.data();
  return h;
}

// ops.alloc clears on ops' stream; wait for that before the (default-stream) copy lands.
float* upload_floats(CudaOps& ops, const std::vector<float>& host) {
  float* d = ops.alloc(host.size());
  DSV4_CUDA_CHECK(cudaStreamSynchronize(ops.stream()));
  DSV4_CUDA_CHECK(cudaMemcpy(d, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  return d;
}

void poison_on_stream(CudaOps& ops, float* d, size_t count) {
  DSV4_CUDA_CHECK(cudaMemsetAsync(d, 0xFF, count * sizeof(float), ops.stream()));
}

struct Case {
  std::string name;
  DType dtype;
  int64_t n, rows, cols;  // tokens, W [rows, cols]
  int64_t groups = 1;
  int64_t ldx_pad = 0, ldy_pad = 0;  // extra row stride beyond the minimum
  bool gemv = false;  // the decode GEMV on the tensor cores (gemv_mma.cu, n ≤ 16) instead of gemm_tensor_core
  // GEMV calls as fast numerics make them. FP8 weights act_quant x unless bf16_x (wo_a: bf16 x, the weight in
  // bf16); BF16 weights take bf16 x. Outputs are bf16 unless f32_out (linear_f32: the LM head, the compressor).
  bool bf16_x = false;
  bool f32_out = false;
};

std::vector<int64_t> sampled_rows(int64_t n, uint64_t seed) {
  std::vector<int64_t> rows;
  if (n <= 48) {
    for (int64_t r = 0; r < n; ++r) rows.push_back(r);
    return rows;
  }
  rows = {0, n - 1, n - 2};  // the last (partial) activation tile
  for (uint64_t i = 0; rows.size() < 48; ++i) {
    const int64_t r = int64_t(splitmix64(seed + 77 + i) % uint64_t(n));
    if (std::find(rows.begin(), rows.end(), r) == rows.end()) rows.push_back(r);
  }
  std::sort(rows.begin(), rows.end());
  return rows;
}

double relative_norm_error(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = double(got[i]) - want[i];
    num += d * d;
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / den);
}

void run_case(const Case& c) {
  SCOPED_TRACE(c.name);
  const uint64_t seed = dsv4::test::seed() ^ splitmix64(std::hash<std::string>{}(c.name));
  const bool fp8 = c.dtype == DType::kF8E4M3;
  const int64_t k_total = c.groups * c.cols, ldx = k_total + c.ldx_pad, ldy = c.rows + c.ldy_pad;
  const int64_t out_g = c.rows / c.groups;

  const HostWeight hw = random_weight(c.dtype, c.rows, c.cols, seed);
  const std::vector<float> x = random_matrix(c.n, ldx, seed + 2);

  ModelConfig config;
  CudaOps ops(config);
  const cuda::DeviceWeight& dw = ops.upload(hw.w);
  float* x_d = upload_floats(ops, x);
  float* y_d = ops.alloc(size_t(c.n * ldy));
  poison_on_stream(ops, y_d, size_t(c.n * ldy));
  cuda::GemmParams p{x_d, ldx, dw, c.n, y_d, ldy, c.groups};
  const bool act_quant = fp8 && !c.bf16_x;
  if (c.gemv) {  // as fast numerics call it (Case::bf16_x, f32_out)
    p.quant_x = act_quant;
    p.bf16_out = !c.f32_out;
    p.x_bf16 = c.f32_out;
    ASSERT_TRUE(cuda::gemv_mma_covers(p)) << "the tensor-core GEMV declined a shape it covers";
    cuda::gemv(p, {}, ops.stream());
  } else {
    ASSERT_TRUE(cuda::gemm_tensor_core(p, ops)) << "the tensor-core path declined a shape it covers";
  }
  const std::vector<float> y = to_host(ops, y_d, size_t(c.n * ldy));

  // Every output written and finite; padding untouched.
  for (int64_t r = 0; r < c.n; ++r)
    for (int64_t col = 0; col < ldy; ++col) {
      const float v = y[size_t(r * ldy + col)];
      if (col < c.rows) ASSERT_TRUE(std::isfinite(v)) << "y[" << r << ", " << col << "] = " << v;
      else ASSERT_TRUE(std::isnan(v)) << "padding y[" << r << ", " << col << "] overwritten with " << v;
    }

  // References on sampled rows: fp32 activations, and the same activations rounded as the kernel rounds them.
  const std::vector<int64_t> rows = sampled_rows(c.n, seed);
  const int64_t S = int64_t(rows.size());
  std::vector<float> xs(size_t(S * k_total)), got(size_t(S * c.rows));
  for (int64_t i = 0; i < S; ++i) {
    std::copy_n(x.begin() + rows[i] * ldx, k_total, xs.begin() + i * k_total);
    std::copy_n(y.begin() + rows[i] * ldy, c.rows, got.begin() + i * c.rows);
  }
  std::vector<float> xr = xs;
  CpuOps cpu(config);
  if (act_quant) cpu.sim_fp8(xr.data(), S, k_total, k_total, 128);
  else
    for (float& v : xr) v = bf16_to_f32(f32_to_bf16(v));
  std::vector<float> want(size_t(S * c.rows)), want_fp32(size_t(S * c.rows));
  if (c.groups == 1) {
    cpu.linear(xr.data(), k_total, hw.w, S, want.data(), c.rows);
    cpu.linear(xs.data(), k_total, hw.w, S, want_fp32.data(), c.rows);
  } else {
    cpu.linear_grouped(xr.data(), hw.w, c.groups, S, want.data());
    cpu.linear_grouped(xs.data(), hw.w, c.groups, S, want_fp32.data());
  }

  // Per-element bound: tolerance · ‖x_r (its group's slice)‖ · ‖w_c‖.
  std::vector<double> w_norm(size_t(c.rows)), x_norm(size_t(S * c.groups));
#pragma omp parallel
  {
    std::vector<float> row(size_t(c.cols));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < c.rows; ++r) {
      dequant_row(hw.w, r, row.data());
      double s = 0.0;
      for (float v : row) s += double(v) * v;
      w_norm[size_t(r)] = std::sqrt(s);
    }
  }
  for (int64_t i = 0; i < S * c.groups; ++i) {
    double s = 0.0;
    for (int64_t k = i * c.cols; k < (i + 1) * c.cols; ++k) s += double(xr[size_t(k)]) * xr[size_t(k)];
    x_norm[size_t(i)] = std::sqrt(s);
  }
  // A bf16 output (fast numerics): half a bf16 ulp more, up to 2^-8 of each element (8 significant bits: the ulp
  // is 2^-7 of the binade's low end), so ≤ 2^-8·‖x‖‖w‖, in the norm too; added to the act_quant bound as well:
  // want multiplies the same quantised x, so at a small K (128) the output's rounding is the whole error and can
  // pass 2^-10·‖x‖‖w‖ (it did, once in a run of every row count; and 2^-9 once in the norm: y = −8.975 → −9).
  const double bf16_out_tol = c.gemv && !c.f32_out ? 0x1p-8 : 0.0;
  const double element_tol = (act_quant ? std::ldexp(1.0, -10) : double(c.cols) * std::ldexp(1.0, -23)) + bf16_out_tol;
  const double kernel_tol = (act_quant ? 2e-3 : double(c.cols / 16) * std::ldexp(1.0, -24)) + bf16_out_tol;
  const double format_tol = act_quant ? 4e-2 : 5e-3;
  double worst_ratio = 0.0;
  int64_t worst = 0;
  for (int64_t i = 0; i < S; ++i)
    for (int64_t col = 0; col < c.rows; ++col) {
      const size_t e = size_t(i * c.rows + col);
      const double scale = x_norm[size_t(i * c.groups + col / out_g)] * w_norm[size_t(col)];
      const double ratio = std::fabs(double(got[e]) - want[e]) / scale;
      if (!(ratio <= worst_ratio)) {
        worst_ratio = ratio;
        worst = int64_t(e);
      }
    }
  const double kernel_err = relative_norm_error(got, want), format_err = relative_norm_error(got, want_fp32);
  std::printf("[ %-34s ] n %5lld  W [%6lld, %5lld] g %lld: kernel rel %.2e (≤ %.1e), worst elem %.2e·‖x‖‖w‖ (≤ %.1e) "
              "at row %lld col %lld got %.6g want %.6g; format rel %.2e (≤ %.0e)\n",
              c.name.c_str(), (long long)c.n, (long long)c.rows, (long long)c.cols, (long long)c.groups, kernel_err,
              kernel_tol, worst_ratio, element_tol, (long long)rows[size_t(worst / c.rows)],
              (long long)(worst % c.rows), got[size_t(worst)], want[size_t(worst)], format_err, format_tol);
  EXPECT_LE(worst_ratio, element_tol) << "element " << worst / c.rows << "/" << worst % c.rows;
  EXPECT_LE(kernel_err, kernel_tol);
  EXPECT_LE(format_err, format_tol);
}

bool hopper(std::string* why) {
  ModelConfig config;
  CudaOps ops(config);
  if (ops.props().major == 9) return true;
  *why = std::string("the tensor-core path is sm_90a only; this GPU is ") + ops.props().name;
  return false;
}

#define DSV4_REQUIRE_HOPPER()                              \
  do {                                                     \
    std::string dsv4_why_;                                 \
    if (!hopper(&dsv4_why_)) GTEST_SKIP() << dsv4_why_;    \
  } while (0)

// Odd token counts (partial activation tiles), odd widths (partial weight tiles), padded and unaligned row
// strides (ldx + 3: the scalar activation loads), a K that splits unevenly across CTAs, more tiles than SMs
// (each persistent CTA runs several).
std::vector<Case> odd_cases(DType dtype, const std::string& tag) {
  return {
      {tag + " n17 [200,384]", dtype, 17, 200, 384},
      {tag + " n100 [1000,640] strided", dtype, 100, 1000, 640, 1, 3, 6},
      {tag + " n333 [520,1152]", dtype, 333, 520, 1152},
      {tag + " n4096 [264,256]", dtype, 4096, 264, 256},
      {tag + " n4096 [1000,256] 256 tiles", dtype, 4096, 1000, 256},
      {tag + " n100 [392,2176] split-K", dtype, 100, 392, 2176},
  };
}

// V4-Flash projections at prefill sizes: wq_a, wq_b, wo_b, wkv, shared expert w1 (w3 alike), w2.
std::vector<Case> v4_cases(DType dtype, const std::string& tag) {
  std::vector<Case> cases;
  for (int64_t n : {512, 4096}) {
    const std::string t = tag + " n" + std::to_string(n) + " ";
    cases.push_back({t + "wq_a", dtype, n, 1024, 4096});
    cases.push_back({t + "wq_b", dtype, n, 32768, 1024});
    cases.push_back({t + "wo_b", dtype, n, 4096, 8192});
    cases.push_back({t + "wkv", dtype, n, 512, 4096});
    cases.push_back({t + "shared w1", dtype, n, 2048, 4096});
    cases.push_back({t + "shared w2", dtype, n, 4096, 2048});
  }
  return cases;
}

// Grouped projections: a small one whose group width (384) is not a multiple of the BF16 tile, and V4-Flash's
// wo_a (8 groups × o_lora 1024, in 64·512/8 = 4096 per group).
std::vector<Case> grouped_cases(DType dtype, const std::string& tag) {
  return {
      {tag + " grouped n100 2x[384,256]", dtype, 100, 768, 256, 2},
      {tag + " grouped n512 wo_a 8x[1024,4096]", dtype, 512, 8192, 4096, 8},
  };
}

// The tensor-core GEMV: every activation row count it takes (5 to 16) on odd shapes (one tile; fewer K blocks than
// warps; K blocks not a multiple of the warps; padded strides), and V4-Flash's FP8 decode projections.
std::vector<Case> gemv_cases() {
  std::vector<Case> cases;
  for (int64_t n = 5; n <= 16; ++n) {
    const std::string t = "gemv n" + std::to_string(n) + " ";
    cases.push_back({t + "[16,128]", DType::kF8E4M3, n, 16, 128, 1, 0, 0, true});
    cases.push_back({t + "[272,384] strided", DType::kF8E4M3, n, 272, 384, 1, 4, 3, true});
    cases.push_back({t + "[208,1664]", DType::kF8E4M3, n, 208, 1664, 1, 0, 0, true});
  }
  for (int64_t n : {5, 8, 13, 16}) {
    const std::string t = "gemv n" + std::to_string(n) + " ";
    cases.push_back({t + "wq_a", DType::kF8E4M3, n, 1024, 4096, 1, 0, 0, true});
    cases.push_back({t + "wq_b", DType::kF8E4M3, n, 32768, 1024, 1, 0, 0, true});
    cases.push_back({t + "wo_b", DType::kF8E4M3, n, 4096, 8192, 1, 0, 0, true});
    cases.push_back({t + "wkv", DType::kF8E4M3, n, 512, 4096, 1, 0, 0, true});
  }
  return cases;
}

// The bf16 tensor-core GEMV (gemv_bf16_kernel): BF16 weights with bf16 and fp32 outputs, FP8 ones multiplied in
// bf16 in groups (wo_a) — every row count on odd shapes (one tile; fewer K blocks than warps; padded strides;
// groups of 48 rows, three tiles each) ...
std::vector<Case> bf16_gemv_cases() {
  std::vector<Case> cases;
  for (int64_t n = 5; n <= 16; ++n) {
    const std::string t = "bf16 gemv n" + std::to_string(n) + " ";
    const bool f32 = n % 2 == 1;
    cases.push_back({t + "[16,128]", DType::kBF16, n, 16, 128, 1, 0, 0, true, false, f32});
    cases.push_back({t + "[272,384] strided", DType::kBF16, n, 272, 384, 1, 4, 3, true, false, !f32});
    cases.push_back({t + "[208,1664]", DType::kBF16, n, 208, 1664, 1, 0, 0, true, false, f32});
    cases.push_back({t + "fp8 2x[48,256] strided", DType::kF8E4M3, n, 96, 256, 2, 8, 5, true, true});
  }
  return cases;
}

// ... and V4-Flash's: the LM head, a compressor's projection, wo_a.
std::vector<Case> bf16_gemv_v4_cases() {
  std::vector<Case> cases;
  for (int64_t n : {5, 8, 16}) {
    const std::string t = "bf16 gemv n" + std::to_string(n) + " ";
    cases.push_back({t + "lm head", DType::kBF16, n, 129280, 4096, 1, 0, 0, true, false, true});
    cases.push_back({t + "compressor wkv", DType::kBF16, n, 1024, 4096, 1, 0, 0, true, false, true});
    cases.push_back({t + "fp8 wo_a 8x[1024,4096]", DType::kF8E4M3, n, 8192, 4096, 8, 0, 0, true, true});
  }
  return cases;
}

#endif  // DSV4_HAVE_CUDA

TEST(CudaGemmTc, Fp8GemvEveryRowCount) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  DSV4_REQUIRE_HOPPER();
  for (const Case& c : gemv_cases()) run_case(c);
#endif
}

TEST(CudaGemmTc, Bf16GemvEveryRowCount) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  DSV4_REQUIRE_HOPPER();
  for (const Case& c : bf16_gemv_cases()) run_case(c);
#endif
}

TEST(CudaGemmTc, Bf16GemvV4Flash) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  DSV4_REQUIRE_HOPPER();
  for (const Case& c : bf16_gemv_v4_cases()) run_case(c);
#endif
}

// A linear_pair (wq_a and wkv of the same x) runs as one tensor-core GEMV launch: each output as if alone.
TEST(CudaGemmTc, Fp8GemvPairMatchesSingles) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  DSV4_REQUIRE_HOPPER();
  ModelConfig config;
  for (int64_t n : {5, 8, 11}) {
    SCOPED_TRACE("n " + std::to_string(n));
    const HostWeight a = random_weight(DType::kF8E4M3, 1024, 4096, seed() + 11 + uint64_t(n));
    const HostWeight b = random_weight(DType::kF8E4M3, 512, 4096, seed() + 12 + uint64_t(n));
    CudaOps fresh(config);
    const cuda::DeviceWeight &da = fresh.upload(a.w), &db = fresh.upload(b.w);
    float* x_d = upload_floats(fresh, random_matrix(n, 4096, seed() + 13));
    std::vector<float*> outs;
    for (int i = 0; i < 4; ++i) {
      outs.push_back(fresh.alloc(size_t(n * 1024)));
      poison_on_stream(fresh, outs.back(), size_t(n * 1024));
    }
    cuda::GemmParams pa{x_d, 4096, da, n, outs[0], 1024, 1}, pb{x_d, 4096, db, n, outs[1], 512, 1};
    pa.quant_x = pa.bf16_out = pb.quant_x = pb.bf16_out = true;
    ASSERT_TRUE(cuda::gemv_pair_covers(pa, pb));
    cuda::gemv_pair(pa, pb, {}, fresh.stream());
    cuda::GemmParams sa = pa, sb = pb;
    sa.y = outs[2];
    sb.y = outs[3];
    cuda::gemv(sa, {}, fresh.stream());
    cuda::gemv(sb, {}, fresh.stream());
    EXPECT_EQ(to_host(fresh, outs[0], size_t(n * 1024)), to_host(fresh, outs[2], size_t(n * 1024)));
    EXPECT_EQ(to_host(fresh, outs[1], size_t(n * 512)), to_host(fresh, outs[3], size_t(n * 512)));
  }
#endif
}

// An FP8 product on x act_quant'ed already (GemmParams::x_codes: its producer's E4m3Rows, or tc_round_activations'
// codes for wo_b's K and wider) gives bit for bit what it computes quantising x itself: the streaming GEMV (n ≤ 4;
// split K over the 272-row matrix), the tensor-core GEMV (5..16) and GEMM (n > 16), alone and as a linear_pair,
// through CudaOps::linear in fast numerics. A strided odd shape (65 K blocks, padded x and y rows, the padding left
// poisoned) and wo_b's; the codes are the CPU's act_quant_rows of x (the producers' oracle).
TEST(CudaGemmTc, Fp8LinearReadsActQuantRows) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  DSV4_REQUIRE_HOPPER();
  ModelConfig config;
  struct Shape {
    int64_t rows, cols, ldx_pad, ldy_pad;
  };
  for (const Shape& sh : {Shape{4096, 8192, 0, 0}, Shape{272, 8320, 4, 2}})
    for (int64_t n : {1, 2, 4, 5, 8, 13, 16, 40}) {
      SCOPED_TRACE("[" + std::to_string(sh.rows) + ", " + std::to_string(sh.cols) + "] n " + std::to_string(n));
      const int64_t K = sh.cols, ldx = K + sh.ldx_pad, ldy = sh.rows + sh.ldy_pad;
      const HostWeight w = random_weight(DType::kF8E4M3, sh.rows, K, seed() + 31 + uint64_t(n));
      const HostWeight w2 = random_weight(DType::kF8E4M3, 256, K, seed() + 34 + uint64_t(n));
      CudaOps ops(config);
      ops.set_numerics(Numerics::kFast);
      ops.upload(w.w);
      ops.upload(w2.w);
      std::vector<float> x = random_matrix(n, ldx, seed() + 32 + uint64_t(n));
      for (float& v : x) v = round_bf16(v);  // fast numerics hand linear bf16 values
      float* x_d = upload_floats(ops, x);
      // The codes and scales on the CPU, then into device memory as alloc_e4m3 lays them out.
      std::vector<uint8_t> codes(size_t(n * K));
      std::vector<float> scales(size_t(K / 128 * ((n + 3) / 4 * 4)));
      const E4m3Rows host_q{codes.data(), scales.data(), n, K, (n + 3) / 4 * 4};
      act_quant_rows(x.data(), n, K, ldx, host_q);
      std::vector<float> code_words(codes.size() / 4);
      std::memcpy(code_words.data(), codes.data(), codes.size());
      E4m3Rows q = host_q;
      q.codes = reinterpret_cast<uint8_t*>(upload_floats(ops, code_words));
      q.scales = upload_floats(ops, scales);

      float* ys[4];
      for (float*& y : ys) {
        y = ops.alloc(size_t(n * ldy));
        poison_on_stream(ops, y, size_t(n * ldy));
      }
      ops.linear(x_d, ldx, w.w, n, ys[0], ldy, &q);
      ops.linear(x_d, ldx, w.w, n, ys[1], ldy);
      const std::vector<float> got = to_host(ops, ys[0], size_t(n * ldy)), self = to_host(ops, ys[1], size_t(n * ldy));
      for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < ldy; ++c) {
          const float v = got[size_t(r * ldy + c)];
          if (c < sh.rows) ASSERT_TRUE(std::isfinite(v)) << "y[" << r << ", " << c << "] = " << v;
          else ASSERT_TRUE(std::isnan(v)) << "padding y[" << r << ", " << c << "] overwritten with " << v;
        }
      // Bit for bit, the poisoned (NaN) padding too: operator== would call NaN unequal to itself.
      EXPECT_EQ(std::memcmp(got.data(), self.data(), got.size() * sizeof(float)), 0);
      // As a pair (wq_a and wkv's call) against the pair quantising x itself: the streaming pair may split K
      // otherwise than either matrix alone, so its sums are compared with its own.
      ops.linear_pair(x_d, ldx, n, w.w, ys[2], ldy, w2.w, ys[3], 256, &q);
      const std::vector<float> pair_a = to_host(ops, ys[2], size_t(n * ldy)), pair_b = to_host(ops, ys[3], size_t(n * 256));
      ops.linear_pair(x_d, ldx, n, w.w, ys[0], ldy, w2.w, ys[1], 256);
      EXPECT_EQ(std::memcmp(pair_a.data(), to_host(ops, ys[0], size_t(n * ldy)).data(), pair_a.size() * sizeof(float)), 0);
      EXPECT_EQ(pair_b, to_host(ops, ys[1], size_t(n * 256)));
    }
  const HostWeight narrow = random_weight(DType::kF8E4M3, 1024, 4096, seed() + 33);
  CudaOps ops(config);
  cuda::GemmParams p{nullptr, 4096, ops.upload(narrow.w), 8, nullptr, 1024, 1};
  p.quant_x = p.bf16_out = true;
  ASSERT_TRUE(cuda::gemv_mma_covers(p));
  EXPECT_FALSE(cuda::gemv_codes_covers(p)) << "K = 4096 should keep gemv_mma's own staging when x has no codes";
#endif
}

// linear_grouped reading x as bf16 rows (Bf16Rows: the attention's output into wo_a in fast numerics) gives bit for
// bit what it gives from the same values in fp32: on the tensor cores from the rows as they are (n > 16, wo_a's
// BF16 copy), and widened for the GEMV (n ≤ 16). An FP8 wo_a-like weight of 8 groups, and BF16 groups of 384.
TEST(CudaGemmTc, GroupedLinearReadsBf16Rows) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  DSV4_REQUIRE_HOPPER();
  ModelConfig config;
  struct Shape {
    DType dtype;
    int64_t rows, cols, groups;
  };
  for (const Shape& sh : {Shape{DType::kF8E4M3, 8192, 4096, 8}, Shape{DType::kBF16, 768, 384, 2}})
    for (int64_t n : {1, 5, 16, 17, 100, 512}) {
      SCOPED_TRACE("[" + std::to_string(sh.rows) + ", " + std::to_string(sh.cols) + "] × " + std::to_string(sh.groups) +
                   " groups, n " + std::to_string(n));
      const int64_t K = sh.groups * sh.cols;
      const HostWeight w = random_weight(sh.dtype, sh.rows, sh.cols, seed() + 41 + uint64_t(n));
      CudaOps ops(config);
      ops.set_numerics(Numerics::kFast);
      ops.upload(w.w);
      std::vector<float> x = random_matrix(n, K, seed() + 42 + uint64_t(n));
      std::vector<uint16_t> bits(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        bits[i] = f32_to_bf16(x[i]);
        x[i] = bf16_to_f32(bits[i]);
      }
      std::vector<float> words(bits.size() / 2);
      std::memcpy(words.data(), bits.data(), bits.size() * sizeof(uint16_t));
      const Bf16Rows xb{reinterpret_cast<uint16_t*>(upload_floats(ops, words)), n, K};
      float* x_d = upload_floats(ops, x);
      float *y_bf16 = ops.alloc(size_t(n * sh.rows)), *y_f32 = ops.alloc(size_t(n * sh.rows));
      poison_on_stream(ops, y_bf16, size_t(n * sh.rows));
      poison_on_stream(ops, y_f32, size_t(n * sh.rows));
      ops.linear_grouped(nullptr, w.w, sh.groups, n, y_bf16, &xb);
      ops.linear_grouped(x_d, w.w, sh.groups, n, y_f32);
      const std::vector<float> got = to_host(ops, y_bf16, size_t(n * sh.rows));
      for (float v : got) ASSERT_TRUE(std::isfinite(v));
      EXPECT_EQ(std::memcmp(got.data(), to_host(ops, y_f32, got.size()).data(), got.size() * sizeof(float)), 0);
    }
#endif
}

// A rank that holds one of wo_a's groups (o_groups / tp = 1: models/tiny and models/small at --tp 2, V4-Flash at
// --tp 8) calls linear_grouped with groups = 1, and it is still DeepSeek's bf16 einsum: x is not act_quant'ed as
// a plain FP8 linear's is. Against the CPU backend's fast numerics (bf16 x, fp32 sums, bf16 y), on the GEMV
// (n ≤ 16) and the tensor cores: an fp32 sum in another order may flip y's bf16 rounding, one step (≤ 2^-7 of
// |y|), on few elements (≤ 2%); act_quant's e4m3 x (3 significant bits) moves most of them by several steps.
TEST(CudaGemmTc, GroupedLinearOfOneGroupIsTheBf16Einsum) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  ModelConfig config;
  // An odd-sized one, then V4-Flash's wo_a group at --tp 8 (o_lora_rank 1024 × 64 heads · 512 / 8 groups).
  struct Case {
    int64_t rows, cols, n;
  };
  for (const Case cs : {Case{256, 1024, 1}, Case{256, 1024, 5}, Case{256, 1024, 17}, Case{256, 1024, 100},
                        Case{1024, 4096, 1}, Case{1024, 4096, 24}}) {
    const int64_t rows = cs.rows, cols = cs.cols, n = cs.n;
    SCOPED_TRACE(testing::Message() << "[" << rows << ", " << cols << "], n " << n);
    HostWeight w = random_weight(DType::kF8E4M3, rows, cols, seed() + 61 + uint64_t(n + rows));
    auto* scales = reinterpret_cast<float*>(w.scale.data());  // powers of two, as V4's ue8m0: wo_a is exact in bf16
    for (size_t i = 0; i < w.scale.size() / 4; ++i) scales[i] = std::exp2(std::round(std::log2(scales[i])));
    std::vector<float> x = random_matrix(n, cols, seed() + 62 + uint64_t(n + rows));
    for (float& v : x) v = round_bf16(v);
    CpuOps cpu(config);
    cpu.set_numerics(Numerics::kFast);
    std::vector<float> want(size_t(n * rows));
    cpu.linear_grouped(x.data(), w.w, 1, n, want.data());
    CudaOps ops(config);
    ops.set_numerics(Numerics::kFast);
    ops.upload(w.w);
    float* x_d = upload_floats(ops, x);
    float* y_d = ops.alloc(size_t(n * rows));
    poison_on_stream(ops, y_d, size_t(n * rows));
    ops.linear_grouped(x_d, w.w, 1, n, y_d);
    const std::vector<float> got = to_host(ops, y_d, want.size());
    // Where y cancels to near 0, the sums' order shows as K·2^-24 of ‖x_r‖·‖w_c‖ rather than as a bf16 step.
    std::vector<double> w_norm(static_cast<size_t>(rows)), x_norm(static_cast<size_t>(n));
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t c = 0; c < rows; ++c) {
      dequant_row(w.w, c, row.data());
      for (float v : row) w_norm[size_t(c)] += double(v) * v;
    }
    for (int64_t r = 0; r < n; ++r)
      for (int64_t k = 0; k < cols; ++k) x_norm[size_t(r)] += double(x[size_t(r * cols + k)]) * x[size_t(r * cols + k)];
    int64_t off = 0;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < rows; ++c) {
        const size_t i = size_t(r * rows + c);
        ASSERT_TRUE(std::isfinite(got[i])) << "y[" << r << ", " << c << "] = " << got[i];
        const double sums = double(cols) * 0x1p-24 * std::sqrt(x_norm[size_t(r)] * w_norm[size_t(c)]);
        EXPECT_LE(std::fabs(double(got[i]) - want[i]), std::ldexp(std::fabs(want[i]), -7) + sums)
            << "y[" << r << ", " << c << "]";
        off += got[i] != want[i];
      }
    EXPECT_LE(double(off), 0.02 * double(got.size())) << off << " of " << got.size() << " outputs differ";
  }
#endif
}

// linear writing y as bf16 rows (Bf16Rows: wq_b's query heads in fast numerics) gives the bf16 bits of what it
// writes as fp32: from the tensor-core GEMM's epilogue (n > 16; wq_b's shape in one output tile pass, and an odd
// one whose few tiles split K, so the split reduction writes them), and narrowed after the GEMVs (n ≤ 16). FP8
// weights read x act_quant'ed, BF16 ones bf16; every bf16 written (poisoned before), none past n rows.
TEST(CudaGemmTc, LinearWritesBf16Rows) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  DSV4_REQUIRE_HOPPER();
  ModelConfig config;
  struct Shape {
    DType dtype;
    int64_t rows, cols;
  };
  for (const Shape& sh : {Shape{DType::kF8E4M3, 32768, 1536}, Shape{DType::kF8E4M3, 258, 640}, Shape{DType::kBF16, 130, 384}})
    for (int64_t n : {1, 5, 16, 17, 100, 512}) {
      SCOPED_TRACE("[" + std::to_string(sh.rows) + ", " + std::to_string(sh.cols) + "] n " + std::to_string(n));
      const HostWeight w = random_weight(sh.dtype, sh.rows, sh.cols, seed() + 51 + uint64_t(n));
      CudaOps ops(config);
      ops.set_numerics(Numerics::kFast);
      ops.upload(w.w);
      std::vector<float> x = random_matrix(n, sh.cols, seed() + 52 + uint64_t(n));
      for (float& v : x) v = round_bf16(v);  // fast numerics hand linear bf16 values
      float* x_d = upload_floats(ops, x);
      const int64_t count = n * sh.rows;  // row n (room for it allocated) stays poisoned
      Bf16Rows yb = ops.alloc_bf16(n + 1, sh.rows);
      poison_on_stream(ops, reinterpret_cast<float*>(yb.data), size_t((n + 1) * sh.rows / 2));
      float* y = ops.alloc(size_t(count));
      poison_on_stream(ops, y, size_t(count));
      ops.linear(x_d, sh.cols, w.w, n, nullptr, sh.rows, nullptr, &yb);
      ops.linear(x_d, sh.cols, w.w, n, y, sh.rows);
      const std::vector<float> want = to_host(ops, y, size_t(count));
      const std::vector<float> words = to_host(ops, reinterpret_cast<float*>(yb.data), size_t((n + 1) * sh.rows / 2));
      std::vector<uint16_t> bits(words.size() * 2);
      std::memcpy(bits.data(), words.data(), words.size() * sizeof(float));
      size_t unequal = 0;
      for (int64_t i = 0; i < count; ++i) {
        ASSERT_TRUE(std::isfinite(want[size_t(i)]));
        unequal += bits[size_t(i)] != f32_to_bf16(want[size_t(i)]);
      }
      EXPECT_EQ(unequal, 0u) << "bf16 outputs that are not the fp32 call's values";
      for (int64_t i = count; i < count + sh.rows; ++i) ASSERT_EQ(bits[size_t(i)], 0xFFFF) << "row n written at " << i;
    }
#endif
}

// The same for the bf16 tensor-core GEMV: a compressor's wkv and wgate (BF16, fp32 outputs: linear_pair_f32).
TEST(CudaGemmTc, Bf16GemvPairMatchesSingles) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  DSV4_REQUIRE_HOPPER();
  ModelConfig config;
  for (int64_t n : {5, 8, 11, 16}) {
    SCOPED_TRACE("n " + std::to_string(n));
    const HostWeight a = random_weight(DType::kBF16, 1024, 4096, seed() + 21 + uint64_t(n));
    const HostWeight b = random_weight(DType::kBF16, 512, 4096, seed() + 22 + uint64_t(n));
    CudaOps fresh(config);
    const cuda::DeviceWeight &da = fresh.upload(a.w), &db = fresh.upload(b.w);
    float* x_d = upload_floats(fresh, random_matrix(n, 4096, seed() + 23));
    std::vector<float*> outs;
    for (int i = 0; i < 4; ++i) {
      outs.push_back(fresh.alloc(size_t(n * 1024)));
      poison_on_stream(fresh, outs.back(), size_t(n * 1024));
    }
    cuda::GemmParams pa{x_d, 4096, da, n, outs[0], 1024, 1}, pb{x_d, 4096, db, n, outs[1], 512, 1};
    pa.x_bf16 = pb.x_bf16 = true;
    ASSERT_TRUE(cuda::gemv_pair_covers(pa, pb));
    ASSERT_TRUE(cuda::gemv_mma_covers(pa) && cuda::gemv_mma_covers(pb));
    cuda::gemv_pair(pa, pb, {}, fresh.stream());
    cuda::GemmParams sa = pa, sb = pb;
    sa.y = outs[2];
    sb.y = outs[3];
    cuda::gemv(sa, {}, fresh.stream());
    cuda::gemv(sb, {}, fresh.stream());
    const std::vector<float> ya = to_host(fresh, outs[0], size_t(n * 1024));
    const std::vector<float> yb = to_host(fresh, outs[1], size_t(n * 512));
    EXPECT_TRUE(std::all_of(ya.begin(), ya.end(), [](float v) { return std::isfinite(v); })) << "a row not written";
    EXPECT_TRUE(std::all_of(yb.begin(), yb.end(), [](float v) { return std::isfinite(v); })) << "a row not written";
    EXPECT_EQ(ya, to_host(fresh, outs[2], size_t(n * 1024)));
    EXPECT_EQ(yb, to_host(fresh, outs[3], size_t(n * 512)));
  }
#endif
}

TEST(CudaGemmTc, Bf16OddShapes) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  DSV4_REQUIRE_HOPPER();
  for (const Case& c : odd_cases(DType::kBF16, "bf16")) run_case(c);
#endif
}

TEST(CudaGemmTc, Fp8OddShapes) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  DSV4_REQUIRE_HOPPER();
  for (const Case& c : odd_cases(DType::kF8E4M3, "fp8")) run_case(c);
#endif
}

TEST(CudaGemmTc, Bf16Grouped) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  DSV4_REQUIRE_HOPPER();
  for (const Case& c : grouped_cases(DType::kBF16, "bf16")) run_case(c);
#endif
}

TEST(CudaGemmTc, Fp8Grouped) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  DSV4_REQUIRE_HOPPER();
  for (const Case& c : grouped_cases(DType::kF8E4M3, "fp8")) run_case(c);
#endif
}

TEST(CudaGemmTc, Bf16V4FlashPrefill) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  DSV4_REQUIRE_HOPPER();
  for (const Case& c : v4_cases(DType::kBF16, "bf16")) run_case(c);
#endif
}

TEST(CudaGemmTc, Fp8V4FlashPrefill) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  DSV4_REQUIRE_HOPPER();
  for (const Case& c : v4_cases(DType::kF8E4M3, "fp8")) run_case(c);
#endif
}

TEST(CudaGemmTc, Bf16LmHead) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  DSV4_REQUIRE_HOPPER();
  for (int64_t n : {512, 4096}) run_case({"bf16 n" + std::to_string(n) + " lm head", DType::kBF16, n, 129280, 4096});
#endif
}

// F32 and FP4 weights, and K not a multiple of 128, are gemm_generic's: the call returns false and leaves y alone.
TEST(CudaGemmTc, DeclinesWhatItDoesNotCover) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  DSV4_REQUIRE_HOPPER();
  ModelConfig config;
  const int64_t n = 40, rows = 256;
  for (const auto& [dtype, cols] : std::vector<std::pair<DType, int64_t>>{
           {DType::kF32, 256}, {DType::kI8, 256}, {DType::kBF16, 200}, {DType::kF8E4M3, 320}}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)) + " cols " + std::to_string(cols));
    CudaOps ops(config);  // fresh: uploads are keyed by host address, which the previous weight may have had
    const HostWeight hw = random_weight(dtype, rows, cols, seed() + uint64_t(cols));
    const cuda::DeviceWeight& dw = ops.upload(hw.w);
    float* x_d = upload_floats(ops, random_matrix(n, cols, seed() + 5));
    float* y_d = ops.alloc(size_t(n * rows));
    poison_on_stream(ops, y_d, size_t(n * rows));
    EXPECT_FALSE(cuda::gemm_tensor_core({x_d, cols, dw, n, y_d, rows, 1}, ops));
    const std::vector<float> y = to_host(ops, y_d, size_t(n * rows));
    EXPECT_TRUE(std::all_of(y.begin(), y.end(), [](float v) { return std::isnan(v); })) << "y was written";
  }
#endif
}

}  // namespace
}  // namespace dsv4::test
