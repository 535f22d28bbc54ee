// moe family: CudaOps::moe against CpuOps::moe (the oracle) on fresh random weights in every checkpoint
// format (FP4 e2m1 + E8M0, FP8 e4m3 + E8M0 or F32 block scales, BF16, F32), hash and scored routing, odd
// sizes and the real V4-Flash sizes, outputs poisoned before every call.
//
// Tolerance: both sides compute in fp32 with the same roundings except the order of the dot-product sums
// (and the FP8/FP4 block scale applied per chunk instead of per element, exact for powers of two) and 1-2
// ulp in expf/log1pf. A K-term fp32 dot in two summation orders differs by about u·sqrt(K) (u = 2^-24) of
// the magnitude of its terms, so by ≈ 4e-6 of a typical output for K = 4096; the error of h passes through
// w2 once more. Per element: |got − want| ≤ 5e-5·rms(want) + 1e-5·|want| — a ~5x margin for the worst of up
// to 32k elements, while a wrong expert, weight, scale or clamp moves outputs by O(rms).
// Routing: scores differ by a few ulp, so inputs whose k-th and (k+1)-th biased scores lie within 1e-4 of
// each other are redrawn (a near-tie either backend may break either way); exact ties take the lower
// expert index on both.
//
// Fast numerics (the FastNumerics* tests; fast-numerics.md §7 steps 14–16): both backends round at the same
// points — act_quant of each FP8 / FP4 GEMM's bf16 input, bf16 GEMM outputs, the bf16 hidden row, one bf16
// rounding of the fp32 combine — and x is bf16 (the activations between ops are). The fp32 sums between those
// points still differ by summation order (and expf by an ulp), which reaches an output only where a value sits
// on a rounding boundary: a bf16 rounding that flips moves its value by one bf16 ulp, ≤ 2^-7 of it; an h element
// whose e4m3 act_quant flips (rarer: its bf16 neighbours must straddle an e4m3 midpoint) moves by one e4m3
// step, ≤ 2^-3 of it, and with it all D outputs of its token by w2[:, i]·Δh_i. So most outputs are bit-for-bit
// the CPU's and the rest differ by about an ulp. With M = max|want| of the step:
//   - every output is a bf16 value (the combine's one rounding; the poison fails this too);
//   - max|got − want| ≤ 2^-6·M. One flipped bf16 rounding of an output-sized value is up to 2^-7·M; a flipped
//     e4m3 value of h adds w2[:, i]·Δh_i. A host simulation of both arithmetics (the CPU's dot order against
//     exact 16-element chunks summed in fp32, expf off by an ulp for a third of the elements; in reference
//     numerics it differs from the CPU by ~1e-6 of rms at D 96, as this GPU code does) saw at most 2^-6.2·M over
//     1.5·10^5 one-token steps at D 96 and 256 (the smallest M), and above 2^-7·M in 4 of them: 2^-7 would fail
//     now and then;
//   - at most 5% of the outputs, plus one token's D, differ at all. The simulation: ≤ 60 of 96 in a one-token
//     step (one e4m3 flip), ≤ 164 of 65536 at D 1024, n 64. A missing or extra rounding point changes 60–97% of
//     them, also where its size stays below the bounds (a missing final rounding: < 2^-8·M) — a count of outputs
//     beyond 2^-8·M, the other candidate, would miss that.
// Steps whose grouped GEMMs ran on wgmma (experts_wgmma.cu, experts_wide.cu; told by their launch counts) sum each 128-column
// K block in the FP8 tensor core's ~14-bit accumulator: ≈ 4e-4 relative error per GEMM (test_gemm_tc's FP8
// estimate). That flips ~10–15% of the w1 / w3 outputs' bf16 roundings (4e-4 against a bf16 spacing of
// 2^-8..2^-9 of a value), so h moves by ~1e-3 and ~1–2% of its e4m3 values round to the other neighbour (a step
// of 2^-4..2^-3 of them): an output relative L2 error of ~5e-3, and most outputs differ. Measured over 37 such
// steps (H200, 2026-11-28): ≤ 6.0e-3, max|diff| ≤ 2^-4.6·M (large h values under swiglu_limit 10); a small step
// has few tokens to average its flips over: 1.03e-2 at D 512, I 384, n 36 (seed 5156150320586184229). Bounds:
//   - every output a bf16 value, as above;
//   - ‖got − want‖ ≤ 1.5e-2·‖want‖: a missing act_quant of x or h (e4m3's ~2.4e-2 RMS relative error, on top of
//     the accumulator's) or a wrong scale, row or pair (O(1)) fails it. A step of fewer than 8 tokens averages
//     only its few h flips (each up to 2^-3 of its value): over 860 one-token steps at D 384, I 256 (H200,
//     2026-11-29, seeds 1–86 of ExpertRangesOfRanks) the median was 9.8e-4, the 99th percentile 1.14e-2 and
//     the largest 1.57e-2 (seeds 70 and 84), so such steps take 3e-2 — a wrong scale, row or pair still fails
//     it, and the larger steps of the same tests catch a missing act_quant;
//   - max|got − want| ≤ 2^-3·M: the flips of one token's h add up in its outputs (~30 of them at I 2048).
// Vocabulary sizes differ from D and I: CpuOps::linear takes a matrix with vocab rows for the LM head (fp32).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "core/dtype.h"
#include "core/error.h"
#include "core/random.h"
#include "cuda/gpu.h"

#if DSV4_HAVE_CUDA
#include "cuda/common/check.h"
#include "cuda/moe/moe_grouped.h"
#endif

namespace dsv4::test {
namespace {

#if DSV4_HAVE_CUDA

enum class Fmt { kF32, kBF16, kFP8, kFP8F32Scales, kFP4 };

const char* fmt_name(Fmt f) {
  switch (f) {
    case Fmt::kF32: return "F32";
    case Fmt::kBF16: return "BF16";
    case Fmt::kFP8: return "FP8";
    case Fmt::kFP8F32Scales: return "FP8/f32-scales";
    default: return "FP4";
  }
}


// rms of the values of uniformly random codes, to pick block scales that give weights of a target rms.
double e2m1_code_rms() {
  double s = 0;
  for (int c = 0; c < 16; ++c) s += double(e2m1_to_f32(uint8_t(c))) * e2m1_to_f32(uint8_t(c));
  return std::sqrt(s / 16);
}
double e4m3_code_rms() {
  double s = 0;
  for (int c = 0; c < 256; ++c)
    if ((c & 0x7F) != 0x7F) s += double(e4m3_to_f32(uint8_t(c))) * e4m3_to_f32(uint8_t(c));
  return std::sqrt(s / 254);
}

// One random [rows, cols] matrix in checkpoint storage with weights of about `rms`, and its Weight view.
struct HostMatrix {
  std::vector<uint8_t> data, scale;
  Weight w;

  HostMatrix(Fmt f, int64_t rows, int64_t cols, double rms, uint64_t seed) {
    SplitMix64 rng{seed};  // fast bytes for the ~3 GB of V4-Flash experts
    w.rows = rows;
    w.cols = cols;
    const auto exponent_for = [&](double code_rms) { return int(std::lround(std::log2(rms / code_rms))); };
    switch (f) {
      case Fmt::kF32:
      case Fmt::kBF16: {
        const size_t esize = f == Fmt::kF32 ? 4 : 2;
        w.dtype = f == Fmt::kF32 ? DType::kF32 : DType::kBF16;
        w.row_stride = cols * int64_t(esize);
        data.resize(size_t(rows * cols) * esize);
        const double half_width = rms * std::sqrt(3.0);
        for (int64_t i = 0; i < rows * cols; ++i) {
          const float v = float((double(rng.next() >> 11) * 0x1.0p-53 * 2 - 1) * half_width);
          if (f == Fmt::kF32) {
            std::memcpy(data.data() + 4 * i, &v, 4);
          } else {
            const uint16_t b = f32_to_bf16(v);
            std::memcpy(data.data() + 2 * i, &b, 2);
          }
        }
        break;
      }
      case Fmt::kFP8:
      case Fmt::kFP8F32Scales: {
        w.dtype = DType::kF8E4M3;
        w.row_stride = cols;
        data.resize(size_t(rows * cols));
        rng.fill(data.data(), data.size());
        for (uint8_t& b : data)
          if ((b & 0x7F) == 0x7F) b ^= 1;  // no NaN codes
        const int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
        w.scale_block_rows = w.scale_block_cols = 128;
        w.scale_stride = sc;
        const int e = exponent_for(e4m3_code_rms());
        if (f == Fmt::kFP8) {
          w.scale_dtype = DType::kF8E8M0;
          scale.resize(size_t(sr * sc));
          for (uint8_t& s : scale) s = uint8_t(127 + e + int(rng.next() % 3) - 1);
        } else {  // transformers' F32 multipliers, not powers of two
          w.scale_dtype = DType::kF32;
          scale.resize(size_t(sr * sc) * 4);
          for (int64_t i = 0; i < sr * sc; ++i) {
            const float s = std::ldexp(float(0.75 + 0.5 * double(rng.next() % 1000) / 1000), e);
            std::memcpy(scale.data() + 4 * i, &s, 4);
          }
        }
        break;
      }
      case Fmt::kFP4: {
        w.dtype = DType::kI8;
        w.row_stride = cols / 2;
        data.resize(size_t(rows * cols / 2));
        rng.fill(data.data(), data.size());
        w.scale_dtype = DType::kF8E8M0;
        w.scale_block_rows = 1;
        w.scale_block_cols = 32;
        w.scale_stride = cols / 32;
        scale.resize(size_t(rows * cols / 32));
        const int e = exponent_for(e2m1_code_rms());
        for (uint8_t& s : scale) s = uint8_t(127 + e + int(rng.next() % 3) - 1);
        break;
      }
    }
    w.data = data.data();
    w.scale = scale.empty() ? nullptr : scale.data();
  }
  HostMatrix(const HostMatrix&) = delete;
};

struct Shape {
  int64_t D, I, E, k;
  float swiglu_limit;
  double routed_scaling_factor;
};

struct Formats {
  Fmt gate, routed, shared;
};

// A layer's MoeWeights over host storage owned here (shared by copies: a rank's view, expert_range).
struct HostMoe {
  std::vector<std::shared_ptr<HostMatrix>> storage;
  MoeWeights w;
  ModelConfig config;

  HostMoe(const Shape& s, const Formats& f, bool hash, int64_t vocab, uint64_t seed) {
    config.dim = s.D;
    config.moe_inter_dim = s.I;
    config.n_routed_experts = s.E;
    config.n_experts_per_tok = s.k;
    config.swiglu_limit = s.swiglu_limit;
    config.routed_scaling_factor = s.routed_scaling_factor;
    config.vocab_size = vocab;
    uint64_t next_seed = seed;
    // Activations are U(−1, 1); weights of rms ≈ 2/sqrt(cols) give dots of rms ≈ 1.2 (clamps engage at 1).
    const auto matrix = [&](Fmt fmt, int64_t rows, int64_t cols) {
      storage.push_back(std::make_shared<HostMatrix>(fmt, rows, cols, 2.0 / std::sqrt(double(cols)), ++next_seed));
      return storage.back()->w;
    };
    w.gate = matrix(f.gate, s.E, s.D);
    w.experts.resize(size_t(s.E));
    for (auto& e : w.experts) {
      e.w1 = matrix(f.routed, s.I, s.D);
      e.w3 = matrix(f.routed, s.I, s.D);
      e.w2 = matrix(f.routed, s.D, s.I);
    }
    w.shared.w1 = matrix(f.shared, s.I, s.D);
    w.shared.w3 = matrix(f.shared, s.I, s.D);
    w.shared.w2 = matrix(f.shared, s.D, s.I);
    std::mt19937_64 rng(seed);
    if (hash) {  // k distinct experts per row (the CPU reference sizes its buffers for that)
      w.tid2eid.resize(size_t(vocab * s.k));
      std::vector<int32_t> perm(static_cast<size_t>(s.E));
      for (int64_t v = 0; v < vocab; ++v) {
        std::iota(perm.begin(), perm.end(), 0);
        for (int64_t j = 0; j < s.k; ++j) std::swap(perm[size_t(j)], perm[size_t(j + int64_t(rng() % uint64_t(s.E - j)))]);
        for (int64_t j = 0; j < s.k; ++j) w.tid2eid[size_t(v * s.k + j)] = perm[size_t(j)];
      }
    } else {
      w.gate_bias = random_floats(size_t(s.E), rng, -0.3f, 0.3f);
    }
  }

  // An expert-parallel rank's layer (model/parallel.h): the routed experts [begin, end) and the shared expert
  // where `shared`; the others empty.
  HostMoe expert_range(int64_t begin, int64_t end, bool shared) const {
    HostMoe rank = *this;
    for (int64_t e = 0; e < int64_t(rank.w.experts.size()); ++e)
      if (e < begin || e >= end) rank.w.experts[size_t(e)] = ExpertWeights{};
    if (!shared) rank.w.shared = ExpertWeights{};
    return rank;
  }

  void upload_to(CudaOps& ops) const {
    ops.upload(w.gate);
    const auto upload = [&](const ExpertWeights& e) {
      if (e.w1.empty()) return;  // another rank's
      ops.upload(e.w1);
      ops.upload(e.w3);
      ops.upload(e.w2);
    };
    for (const auto& e : w.experts) upload(e);
    upload(w.shared);
    if (!w.gate_bias.empty()) ops.upload(w.gate_bias);
    if (!w.tid2eid.empty()) ops.upload(w.tid2eid);
  }
};

// Redraws the rows of x whose k-th and (k+1)-th biased scores are within 1e-4 (see the file comment), rounded to
// bf16 where `bf16`.
void avoid_near_ties(const HostMoe& m, std::vector<float>& x, int64_t n, std::mt19937_64& rng, bool bf16) {
  const int64_t D = m.config.dim, E = m.config.n_routed_experts, k = m.config.n_experts_per_tok;
  if (m.w.gate_bias.empty() || k >= E) return;
  CpuOps cpu(m.config);
  std::vector<float> logits(static_cast<size_t>(E)), biased(static_cast<size_t>(E));
  for (int64_t t = 0; t < n; ++t)
    for (int attempt = 0;; ++attempt) {
      ASSERT_LT(attempt, 100) << "token " << t << " keeps landing on a routing near-tie";
      cpu.linear(x.data() + t * D, D, m.w.gate, 1, logits.data(), E);
      for (int64_t e = 0; e < E; ++e) {
        const float z = logits[size_t(e)];
        biased[size_t(e)] = std::sqrt(z > 20.0f ? z : std::log1p(std::exp(z))) + m.w.gate_bias[size_t(e)];
      }
      std::nth_element(biased.begin(), biased.begin() + k, biased.end(), std::greater<float>());
      const float kth = *std::min_element(biased.begin(), biased.begin() + k);
      if (kth - biased[size_t(k)] > 1e-4f) break;
      auto row = random_floats(size_t(D), rng);
      if (bf16)
        for (float& v : row) v = round_bf16(v);
      std::copy(row.begin(), row.end(), x.begin() + t * D);
    }
}

float* device_copy(CudaOps& ops, const std::vector<float>& host) {
  float* d = ops.alloc(host.size());
  DSV4_CUDA_CHECK(cudaStreamSynchronize(ops.stream()));  // alloc's zero fill runs on the ops stream
  DSV4_CUDA_CHECK(cudaMemcpy(d, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  return d;
}

int32_t* device_copy(CudaOps& ops, const std::vector<int32_t>& host) {
  int32_t* d = ops.alloc_i32(host.size());
  DSV4_CUDA_CHECK(cudaStreamSynchronize(ops.stream()));
  DSV4_CUDA_CHECK(cudaMemcpy(d, host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  return d;
}

void poison_now(CudaOps& ops, float* d, size_t n) {
  DSV4_CUDA_CHECK(cudaStreamSynchronize(ops.stream()));
  poison(d, n);
  DSV4_CUDA_CHECK(cudaDeviceSynchronize());
}

double rms_of(const std::vector<float>& v) {
  double s = 0;
  for (float f : v) s += double(f) * f;
  return std::sqrt(s / double(std::max<size_t>(v.size(), 1)));
}

struct Step {
  std::vector<float> got, want;  // [n, D]: CudaOps::moe, CpuOps::moe
};

// One step of n tokens on both backends in `numerics`: fresh U(−1, 1) activations (bf16 values in fast numerics,
// whose activations between ops are bf16), the GPU output poisoned before the call. exact_ties: the layer has
// exact ties by construction (ExactTiesTakeTheLowerExpert), which redrawing near-ties would never get past.
Step run_step(const HostMoe& m, CudaOps& ops, int64_t n, std::mt19937_64& rng, Numerics numerics, bool exact_ties) {
  const int64_t D = m.config.dim;
  const bool bf16 = numerics == Numerics::kFast;
  std::vector<float> x = random_floats(size_t(n * D), rng);
  if (bf16)
    for (float& v : x) v = round_bf16(v);
  if (!exact_ties) avoid_near_ties(m, x, n, rng, bf16);
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (auto& t : tokens) t = int32_t(rng() % uint64_t(m.config.vocab_size));

  Step step;
  CpuOps cpu(m.config);
  cpu.set_numerics(numerics);
  step.want.resize(static_cast<size_t>(n * D));
  cpu.moe(m.w, x.data(), tokens.data(), n, step.want.data());

  float* dx = device_copy(ops, x);
  int32_t* dtokens = device_copy(ops, tokens);
  float* dout = ops.alloc(size_t(n * D));
  poison_now(ops, dout, size_t(n * D));
  ops.set_numerics(numerics);
  ops.moe(m.w, dx, dtokens, n, dout);
  step.got = to_host(ops, dout, size_t(n * D));
  return step;
}

// Runs one step of n tokens on both backends in reference numerics and compares; returns the GPU output.
std::vector<float> check_step(const HostMoe& m, CudaOps& ops, int64_t n, std::mt19937_64& rng, const std::string& what,
                              bool exact_ties = false) {
  const Step step = run_step(m, ops, n, rng, Numerics::kReference, exact_ties);
  const std::vector<float>& got = step.got;
  const std::vector<float>& want = step.want;
  const double rms = rms_of(want);
  const Diff d = diff(got.data(), want.data(), got.size());
  std::printf("[moe] %-58s n=%-4lld rms %.4g  max|diff| %.3g (%.2e of rms) at %zu  cos %.12f\n", what.c_str(),
              (long long)n, rms, d.max_abs, d.max_abs / rms, d.worst, d.cosine);
  EXPECT_TRUE(compare(got, want, {5e-5 * rms, 1e-5}, what)) << "n = " << n;
  return got;
}

// The bounds of a step on the grouped path's wgmma kernels (file comment): relative L2 error, max|diff| / max|want|.
// Steps of fewer than kWgmmaFewTokens tokens take kWgmmaRelativeFew.
constexpr double kWgmmaRelative = 1.5e-2, kWgmmaRelativeFew = 3e-2, kWgmmaMax = 0x1p-3;
constexpr int64_t kWgmmaFewTokens = 8;

// One step of n tokens on both backends in fast numerics, against the bounds of the file comment: those of
// wgmma's sums where the step launched the grouped path's wgmma kernels.
void check_step_fast(const HostMoe& m, CudaOps& ops, int64_t n, std::mt19937_64& rng, const std::string& what) {
  const int64_t wgmma_before = cuda::moe::grouped_wgmma_launches(), wide_before = cuda::moe::grouped_wide_launches();
  const Step step = run_step(m, ops, n, rng, Numerics::kFast, false);
  const bool wgmma = cuda::moe::grouped_wgmma_launches() != wgmma_before ||
                     cuda::moe::grouped_wide_launches() != wide_before;
  const std::vector<float>& got = step.got;
  const std::vector<float>& want = step.want;
  const int64_t D = m.config.dim;
  double max_want = 0.0;
  for (float v : want) max_want = std::max(max_want, double(std::fabs(v)));
  size_t off_grid = 0, unequal = 0;  // a NaN counts as both
  for (size_t i = 0; i < got.size(); ++i) {
    off_grid += !(round_bf16(got[i]) == got[i]);
    unequal += !(got[i] == want[i]);
  }
  const size_t unequal_allowed = size_t(0.05 * double(got.size())) + size_t(D);
  const Diff d = diff(got.data(), want.data(), got.size());
  double err2 = 0.0, want2 = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    err2 += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    want2 += double(want[i]) * want[i];
  }
  const double relative = std::sqrt(err2 / std::max(want2, 1e-300));
  std::printf("[moe fast] %-53s n=%-4lld max|want| %.4g  max|diff| %.3g (2^%.2f of it) at %zu  unequal %zu of %zu  "
              "rel %.2e%s\n",
              what.c_str(), (long long)n, max_want, d.max_abs, std::log2(d.max_abs / max_want), d.worst, unequal,
              got.size(), relative, wgmma ? "  (wgmma)" : "");
  EXPECT_EQ(off_grid, 0u) << what << ", n = " << n << ": outputs that are not bf16 values";
  EXPECT_LE(d.max_abs, (wgmma ? kWgmmaMax : 0x1p-6) * max_want) << what << ", n = " << n << ": element " << d.worst
                                                               << " got " << got[d.worst] << ", want " << want[d.worst];
  const double relative_bound = n < kWgmmaFewTokens ? kWgmmaRelativeFew : kWgmmaRelative;
  if (wgmma) EXPECT_LE(relative, relative_bound) << what << ", n = " << n << ": relative error of the wgmma sums";
  else EXPECT_LE(unequal, unequal_allowed) << what << ", n = " << n << ": outputs that differ from the CPU's";
}

std::string describe(const Shape& s, const Formats& f, bool hash) {
  return cat(hash ? "hash" : "scored", " D", s.D, " I", s.I, " E", s.E, " k", s.k, " L", s.swiglu_limit, " gate ",
             fmt_name(f.gate), " experts ", fmt_name(f.routed), " shared ", fmt_name(f.shared));
}

// The (gate, routed, shared) formats the odd-size tests cover: every format in every role.
const Formats kOddFormats[] = {
    {Fmt::kBF16, Fmt::kFP4, Fmt::kFP8},
    {Fmt::kFP8, Fmt::kFP8, Fmt::kBF16},
    {Fmt::kF32, Fmt::kFP8F32Scales, Fmt::kF32},
    {Fmt::kBF16, Fmt::kBF16, Fmt::kFP8F32Scales},
    {Fmt::kBF16, Fmt::kF32, Fmt::kBF16},
};

// Sets the grouped path's token threshold for a scope (moe_grouped.h), then the default again.
struct GroupedFrom {
  explicit GroupedFrom(int64_t n) { cuda::moe::set_grouped_min_tokens(n); }
  ~GroupedFrom() { cuda::moe::set_grouped_min_tokens(0); }
};

// The grouped path's small routed tiles (moe_grouped.h) up to `pairs` an expert on average: 0 never, kAlways always.
struct SmallTilesUpTo {
  static constexpr int64_t kAlways = int64_t(1) << 40;
  explicit SmallTilesUpTo(int64_t pairs) { cuda::moe::set_grouped_small_tile_max_pairs(pairs); }
  ~SmallTilesUpTo() { cuda::moe::set_grouped_small_tile_max_pairs(-1); }
};

// The grouped path's decode tiles (moe_grouped.h) up to `pairs` an expert on average: 0 never, kAlways always.
struct DecodeTilesUpTo {
  static constexpr int64_t kAlways = int64_t(1) << 40;
  explicit DecodeTilesUpTo(int64_t pairs) { cuda::moe::set_grouped_decode_tile_max_pairs(pairs); }
  ~DecodeTilesUpTo() { cuda::moe::set_grouped_decode_tile_max_pairs(-1); }
};

// The grouped path's wide tiles (moe_grouped.h) from `pairs` an expert on average: 0 never.
struct WideTilesFrom {
  explicit WideTilesFrom(int64_t pairs) { cuda::moe::set_grouped_wide_tile_min_pairs(pairs); }
  ~WideTilesFrom() { cuda::moe::set_grouped_wide_tile_min_pairs(-1); }
};

// The routed tiles of the grouped path (moe_kernels.h): of 64 pairs, small (24), decode tiles (16) or wide (128).
enum class Tiles { k64, kSmall, kDecode, kWide };

// The grouped path's wgmma kernels (moe_grouped.h) for a scope: on at every step that takes tiles of
// kGroupedTokens, or off; then the default again.
struct Wgmma {
  explicit Wgmma(bool on) {
    cuda::moe::set_grouped_wgmma(on);
    cuda::moe::set_grouped_wgmma_min_pairs(on ? 1 : 0);
  }
  ~Wgmma() {
    cuda::moe::set_grouped_wgmma(true);
    cuda::moe::set_grouped_wgmma_min_pairs(0);
  }
};

// The same for the shared expert alone on the grouped path (the routed ones on the item kernels).
struct SharedGroupedFrom {
  explicit SharedGroupedFrom(int64_t n) { cuda::moe::set_shared_grouped_min_tokens(n); }
  ~SharedGroupedFrom() { cuda::moe::set_shared_grouped_min_tokens(0); }
};

#endif  // DSV4_HAVE_CUDA

// The grouped FP8 GEMM path (experts_grouped.cu) in fast numerics, forced from one token on: D 384 (3 K blocks
// of w1 / w3, a partial 256-row block of w2), I 256 (2 K blocks of w2: a ring stage holds fewer than 4), odd
// token counts; n = 1 leaves 6 of 9 experts with no token and 3 with one, n = 7 and 33 odd counts per expert,
// 130 a tile of 64 and a partial one for several experts. Every format pair the path takes (FP4 or FP8 routed
// and shared), both routings; FP4 routed experts in tiles of 64, in small tiles (of 24: 130 cuts experts into
// several) and in decode tiles on wgmma (of 16: 33 and 130 cut experts into several) at every n, each with the tiles
// of 64 on wgmma and on mma.sync (decode tiles: wgmma only); in wide tiles (of 128, wgmma only) from n = 7 (an
// average of 2 pairs an expert, rounded down), and at n = 700 (~233 pairs an expert: a full tile and a partial one).
// Reference numerics on the same layer stay on the item kernels.
TEST(CudaMoe, FastGroupedOddTokenCounts) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  SCOPED_TRACE(seed());
  std::mt19937_64 rng(seed());
  const Shape shape{384, 256, 9, 3, 1.0f, 1.5};
  const GroupedFrom forced(1);
  for (const Formats& f : {Formats{Fmt::kBF16, Fmt::kFP4, Fmt::kFP8}, Formats{Fmt::kBF16, Fmt::kFP8, Fmt::kFP4}})
    for (bool hash : {false, true}) {
      const HostMoe m(shape, f, hash, 1000, rng());
      CudaOps ops(m.config);
      m.upload_to(ops);
      for (const bool wgmma : {true, false})
        for (const Tiles tile : {Tiles::k64, Tiles::kSmall, Tiles::kDecode, Tiles::kWide}) {
          if ((tile == Tiles::kDecode || tile == Tiles::kWide) && !wgmma) continue;  // wgmma's alone
          if (tile == Tiles::kWide && f.routed != Fmt::kFP4) continue;               // routed FP4 alone
          // Small routed tiles run on mma.sync; with wgmma on, the shared expert's tiles of 64 run on it.
          const Wgmma kernels(wgmma);
          const SmallTilesUpTo small(tile == Tiles::kSmall ? SmallTilesUpTo::kAlways : 0);
          const DecodeTilesUpTo decode(tile == Tiles::kDecode ? DecodeTilesUpTo::kAlways : 0);
          const WideTilesFrom wide(tile == Tiles::kWide ? 1 : 0);
          const std::string path = std::string(tile == Tiles::kSmall    ? " grouped, small tiles"
                                               : tile == Tiles::kDecode ? " grouped, decode tiles"
                                               : tile == Tiles::kWide   ? " grouped, wide tiles"
                                                                        : " grouped") +
                                   (wgmma ? ", wgmma" : "");
          const int64_t wide_before = cuda::moe::grouped_wide_launches();
          for (int64_t n : tile == Tiles::kWide ? std::vector<int64_t>{7, 33, 130, 700}
                                                : std::vector<int64_t>{1, 2, 7, 33, 130})
            check_step_fast(m, ops, n, rng, describe(shape, f, hash) + path);
          EXPECT_EQ(cuda::moe::grouped_wide_launches() > wide_before, tile == Tiles::kWide) << path;
        }
      check_step(m, ops, 33, rng, describe(shape, f, hash));
    }
#endif
}

// The wgmma kernels' cp.async ring (experts_wgmma.cu: kStages buffers of two K blocks) on a shape other than
// V4's where a GEMM runs past its buffers: D = I = 1152 is 9 K blocks for up and for down, 5 stages over 4
// buffers (decode tiles: 5), the last one's second block absent. 33 and 130 pairs: tiles of 64 with 1–3 and 14–15
// pairs an expert, decode tiles with 11 and 43 (several an expert). Wide tiles (experts_wide.cu: rings of 8 and 4
// K blocks) run 9 K blocks an item and their persistent blocks several items each (up: 18 row blocks × 9 tiles),
// the rings running on across items.
TEST(CudaMoe, FastGroupedWgmmaRingWraps) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  SCOPED_TRACE(seed());
  std::mt19937_64 rng(seed());
  const Shape shape{1152, 1152, 9, 3, 1.0f, 1.5};
  const Formats f{Fmt::kBF16, Fmt::kFP4, Fmt::kFP8};
  const GroupedFrom forced(1);
  const Wgmma kernels(true);
  const SmallTilesUpTo tiles(0);  // the routed FP4 experts in tiles of 64 too
  const HostMoe m(shape, f, false, 1000, rng());
  CudaOps ops(m.config);
  m.upload_to(ops);
  for (const Tiles tile : {Tiles::k64, Tiles::kDecode, Tiles::kWide}) {
    const DecodeTilesUpTo decode(tile == Tiles::kDecode ? DecodeTilesUpTo::kAlways : 0);
    const WideTilesFrom wide(tile == Tiles::kWide ? 1 : 0);
    for (int64_t n : {33, 130}) {
      const int64_t before = cuda::moe::grouped_wgmma_launches();
      const int64_t decode_before = cuda::moe::grouped_decode_tile_launches();
      const int64_t wide_before = cuda::moe::grouped_wide_launches();
      const char* path = tile == Tiles::kDecode ? " decode tiles, wgmma"
                         : tile == Tiles::kWide ? " wide tiles"
                                                : " grouped, wgmma";
      check_step_fast(m, ops, n, rng, describe(shape, f, false) + path);
      EXPECT_GT(cuda::moe::grouped_wgmma_launches(), before) << "n = " << n << ": the step did not run on wgmma";
      EXPECT_EQ(cuda::moe::grouped_decode_tile_launches() > decode_before, tile == Tiles::kDecode)
          << "n = " << n << ": decode tiles " << (tile == Tiles::kDecode ? "not taken" : "taken unasked");
      EXPECT_EQ(cuda::moe::grouped_wide_launches() > wide_before, tile == Tiles::kWide)
          << "n = " << n << ": wide tiles " << (tile == Tiles::kWide ? "not taken" : "taken unasked");
    }
  }
#endif
}

// Both sides of the default crossover (moe_grouped.h) on one layer: the item kernels below it, the grouped path
// from it on, against the same oracle.
TEST(CudaMoe, FastAcrossTheCrossover) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  SCOPED_TRACE(seed());
  std::mt19937_64 rng(seed());
  const Shape shape{512, 384, 16, 4, 10.0f, 1.5};
  const Formats f{Fmt::kBF16, Fmt::kFP4, Fmt::kFP8};
  const HostMoe m(shape, f, false, 1000, rng());
  CudaOps ops(m.config);
  m.upload_to(ops);
  const int64_t from = cuda::moe::grouped_min_tokens(shape.I);
  for (int64_t n : {from - 1, from, from + 37, 3 * from + 1})
    if (n > 0) check_step_fast(m, ops, n, rng, describe(shape, f, false) + (n < from ? " items" : " grouped"));
#endif
}

// Odd sizes (D 96, I 64, E 7, k 3) in every format, both routings; n from one token (the decode kernels where
// every matrix takes the tensor cores) to prefill sizes; reference and fast numerics.
TEST(CudaMoe, OddSizesEveryFormat) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  SCOPED_TRACE(seed());
  std::mt19937_64 rng(seed());
  const Shape shape{96, 64, 7, 3, 0.75f, 1.5};
  for (const Formats& f : kOddFormats)
    for (bool hash : {false, true}) {
      const HostMoe m(shape, f, hash, 1000, rng());
      CudaOps ops(m.config);
      m.upload_to(ops);
      for (int64_t n : {1, 5, 16, 17, 200}) {
        check_step(m, ops, n, rng, describe(shape, f, hash));
        check_step_fast(m, ops, n, rng, describe(shape, f, hash) + " fast");
      }
    }
#endif
}

// Widths that are not multiples of 16 bytes (byte-wise loads), no clamp, routed_scaling_factor 1, top-1;
// reference and fast numerics (act_quant in the fp32 staging, bf16 inputs for BF16 weights and none for F32
// ones; a row of 99 columns ends in a partial act_quant block).
TEST(CudaMoe, UnalignedRowsNoClamp) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  SCOPED_TRACE(seed());
  std::mt19937_64 rng(seed());
  for (const Shape& shape : {Shape{99, 48, 5, 2, 0.0f, 1.0}, Shape{37, 19, 3, 1, 0.0f, 2.5}})
    for (const Formats& f : {Formats{Fmt::kF32, Fmt::kBF16, Fmt::kFP8}, Formats{Fmt::kBF16, Fmt::kFP8, Fmt::kF32}})
      for (bool hash : {false, true}) {
        const HostMoe m(shape, f, hash, 50, rng());
        CudaOps ops(m.config);
        m.upload_to(ops);
        for (int64_t n : {1, 3, 16, 33}) {
          check_step(m, ops, n, rng, describe(shape, f, hash));
          check_step_fast(m, ops, n, rng, describe(shape, f, hash) + " fast");
        }
      }
#endif
}

// An FP4 scale outside the window where the tensor cores are exact (E8M0 bytes 102 .. 126, weight_mma.cuh)
// sends that matrix (w1/w3 of every routed expert) through the fp32 FMA path, while w2 and the FP8 shared
// expert stay on the tensor cores; the window's own edges stay on the tensor cores and must be exact too
// (126: the largest fp16 scale factor; one step further it would be infinite). Reference and fast numerics (the
// fp32 path's act_quant staging).
TEST(CudaMoe, Fp4ScaleWindowEdges) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  SCOPED_TRACE(seed());
  std::mt19937_64 rng(seed());
  const Shape shape{256, 128, 8, 2, 1.0f, 1.5};
  const Formats f{Fmt::kBF16, Fmt::kFP4, Fmt::kFP8};
  for (uint8_t byte : {uint8_t(101), uint8_t(102), uint8_t(126), uint8_t(127)}) {
    HostMoe m(shape, f, false, 100, rng());
    const_cast<uint8_t*>(m.w.experts[3].w3.scale)[5] = byte;  // storage owned by m
    CudaOps ops(m.config);
    m.upload_to(ops);
    for (int64_t n : {1, 6, 40}) {
      const std::string what = cat(describe(shape, f, false), " scale byte ", int(byte));
      check_step(m, ops, n, rng, what);
      check_step_fast(m, ops, n, rng, what + " fast");
    }
  }
#endif
}

// Exact ties in the biased score go to the lower expert index on both backends (src/cpu/moe.cpp's order): the
// gate rows of experts 2, 5, 7 and 10 are the same bytes and their bias 10 puts them first for every token,
// so top-3 must take 2, 5 and 7 — taking 10 instead moves the output by O(rms). One token (the decode route)
// and larger steps (the general grouping).
TEST(CudaMoe, ExactTiesTakeTheLowerExpert) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  SCOPED_TRACE(seed());
  std::mt19937_64 rng(seed());
  const Shape shape{128, 64, 12, 3, 1.0f, 1.5};
  const Formats f{Fmt::kBF16, Fmt::kFP4, Fmt::kFP8};
  HostMoe m(shape, f, false, 100, rng());
  auto* gate = const_cast<uint8_t*>(m.w.gate.data);  // storage owned by m
  for (int e : {5, 7, 10}) {
    std::memcpy(gate + e * m.w.gate.row_stride, gate + 2 * m.w.gate.row_stride, size_t(m.w.gate.row_stride));
    m.w.gate_bias[size_t(e)] = 10.0f;
  }
  m.w.gate_bias[2] = 10.0f;
  CudaOps ops(m.config);
  m.upload_to(ops);
  for (int64_t n : {1, 7, 40}) check_step(m, ops, n, rng, describe(shape, f, false) + " tied experts 2 5 7 10", true);
#endif
}

// Prefill-sized step on a mid-sized FP4 layer: many chunks per expert, every expert busy; reference and fast
// numerics. From kRouteManyBlocksMin tokens route runs over blocks of tokens (route.cu): 700 tokens, 11 blocks of
// 64, the last one 60 tokens; 260, the last one 4 tokens (warps without a token); 64 and 200 over blocks of 16,
// the last of 200 with 8; both routings.
TEST(CudaMoe, PrefillFp4) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  SCOPED_TRACE(seed());
  std::mt19937_64 rng(seed());
  const Shape shape{1024, 512, 32, 6, 10.0f, 1.5};
  const Formats f{Fmt::kBF16, Fmt::kFP4, Fmt::kFP8};
  for (bool hash : {false, true}) {
    const HostMoe m(shape, f, hash, 5000, rng());
    CudaOps ops(m.config);
    m.upload_to(ops);
    for (int64_t n : {64, 200, 260, 700}) {
      check_step(m, ops, n, rng, describe(shape, f, hash));
      check_step_fast(m, ops, n, rng, describe(shape, f, hash) + " fast");
    }
  }
#endif
}

// Same inputs twice: bitwise the same output (no order-dependent atomics), in one route block (20 tokens), over
// blocks of 16 tokens (40) and of 64 (300), and n = 0 writes nothing.
TEST(CudaMoe, DeterministicAndEmptyStep) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  SCOPED_TRACE(seed());
  std::mt19937_64 rng(seed());
  const Shape shape{256, 128, 16, 4, 1.0f, 1.5};
  const HostMoe m(shape, {Fmt::kBF16, Fmt::kFP4, Fmt::kFP8}, false, 100, rng());
  CudaOps ops(m.config);
  m.upload_to(ops);
  const int64_t n = 20, few = 40, big = 300;
  static_assert(n < cuda::moe::kRouteManyBlocksMin && few >= cuda::moe::kRouteManyBlocksMin &&
                few < cuda::moe::kRouteBigBlocksMin && big >= cuda::moe::kRouteBigBlocksMin);
  const std::vector<float> x = random_floats(size_t(big * shape.D), rng);
  float* dx = device_copy(ops, x);
  float* dout = ops.alloc(size_t(big * shape.D));
  for (const int64_t rows : {n, few, big}) {
    std::vector<float> runs[2];
    for (auto& run : runs) {
      poison_now(ops, dout, size_t(rows * shape.D));
      ops.moe(m.w, dx, nullptr, rows, dout);
      run = to_host(ops, dout, size_t(rows * shape.D));
    }
    ASSERT_EQ(std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * sizeof(float)), 0) << rows << " tokens";
  }
  poison_now(ops, dout, size_t(n * shape.D));
  ops.moe(m.w, dx, nullptr, 0, dout);
  const std::vector<float> untouched = to_host(ops, dout, size_t(n * shape.D));
  EXPECT_TRUE(std::all_of(untouched.begin(), untouched.end(), [](float v) { return std::isnan(v); }));
  // The first call stored the experts (whole 16-row tiles, FP4 scales in the fp16 window) in the MMA tile
  // order; a linear on one of them is refused with an error that says why, not computed on permuted bytes.
  ASSERT_TRUE(ops.dev(m.w.experts[0].w1).mma_tiles && ops.dev(m.w.shared.w2).mma_tiles);
  try {
    ops.linear(dx, shape.D, m.w.experts[0].w1, 1, dout, shape.I);
    ADD_FAILURE() << "linear accepted an expert matrix in the MMA tile order";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MMA tile order"), std::string::npos) << e.what();
  }
#endif
}

// The FP4 MMA bit order (weight_mma.cuh), spelled out from its definition: magnitudes in place, element i < 4's
// sign at bit 8i + 7, element 4 + i's at bit 8i + 3 (element i's sign is bit 4i + 3 of the checkpoint's word).
uint32_t mma_bit_order(uint32_t w) {
  uint32_t out = w & 0x77777777u;
  for (int i = 0; i < 8; ++i) {
    const uint32_t sign = (w >> (4 * i + 3)) & 1u;
    out |= sign << (i < 4 ? 8 * i + 7 : 8 * (i - 4) + 3);
  }
  return out;
}

// 16 bytes of a checkpoint's chunk as the tensor-core layout stores them: FP4 words in the MMA bit order.
std::vector<uint8_t> stored_chunk(Fmt f, const uint8_t* chunk) {
  std::vector<uint8_t> out(chunk, chunk + 16);
  if (f != Fmt::kFP4) return out;
  for (int q = 0; q < 4; ++q) {
    uint32_t w;
    std::memcpy(&w, chunk + 4 * q, 4);
    w = mma_bit_order(w);
    std::memcpy(out.data() + 4 * q, &w, 4);
  }
  return out;
}

// CudaOps::to_mma_layout against the layout's definition (weight_mma.cuh), spelled out here from rows and
// chunks: unit ((T·groups + G)·2 + h)·32 + 4g + c holds chunk 4G + c of row 16T + g + 8h (FP4 words in the MMA bit
// order), and an FP4 matrix's scale byte of that chunk sits at index unit. Distinct scale bytes per chunk, random
// data; a second call leaves the matrix as it is. A matrix of partial tiles stays in row order, FP4 words in the
// bit order, its scales untouched; FP8 then stays as uploaded.
TEST(CudaMoe, TileOrderPlacesEveryChunk) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  SCOPED_TRACE(seed());
  std::mt19937_64 rng(seed());
  for (Fmt f : {Fmt::kFP4, Fmt::kFP8}) {
    SCOPED_TRACE(fmt_name(f));
    const int64_t rows = 48, row_bytes = 192, chunks = row_bytes / 16, groups = row_bytes / 64;  // 3 × 3 tiles
    HostMatrix m(f, rows, f == Fmt::kFP4 ? 2 * row_bytes : row_bytes, 0.1, rng());
    if (f == Fmt::kFP4)
      for (size_t i = 0; i < m.scale.size(); ++i) m.scale[i] = uint8_t(1 + i % 254);
    ModelConfig config;
    CudaOps ops(config);
    ops.upload(m.w);
    for (int call = 0; call < 2; ++call) {
      const cuda::DeviceWeight& d = ops.to_mma_layout(m.w);
      ASSERT_TRUE(d.mma_tiles);
      ASSERT_EQ(d.mma_bits, f == Fmt::kFP4);
      // The permutation runs on the ops' non-blocking stream, which a plain cudaMemcpy does not wait for.
      ASSERT_EQ(cudaStreamSynchronize(ops.stream()), cudaSuccess);
      std::vector<uint8_t> data(size_t(rows * row_bytes)), scales(size_t(rows * chunks));
      ASSERT_EQ(cudaMemcpy(data.data(), d.data, data.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      if (f == Fmt::kFP4) {
        ASSERT_EQ(cudaMemcpy(scales.data(), d.scale_e8m0, scales.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      }
      for (int64_t T = 0; T < rows / 16; ++T)
        for (int64_t G = 0; G < groups; ++G)
          for (int h = 0; h < 2; ++h)
            for (int lane = 0; lane < 32; ++lane) {
              const int64_t unit = ((T * groups + G) * 2 + h) * 32 + lane;
              const int64_t row = 16 * T + lane / 4 + 8 * h, chunk = 4 * G + lane % 4;
              const std::vector<uint8_t> want = stored_chunk(f, m.data.data() + row * row_bytes + 16 * chunk);
              ASSERT_EQ(std::memcmp(data.data() + 16 * unit, want.data(), 16), 0)
                  << "call " << call << " unit " << unit << " (row " << row << ", chunk " << chunk << ")";
              if (f == Fmt::kFP4) {
                ASSERT_EQ(scales[size_t(unit)], m.scale[size_t(row * chunks + chunk)]) << "unit " << unit;
              }
            }
    }
    // 20 rows of 48 bytes: no whole tiles.
    const int64_t odd_rows = 20, odd_bytes = 48;
    HostMatrix odd(f, odd_rows, f == Fmt::kFP4 ? 2 * odd_bytes : odd_bytes, 0.1, rng());
    ops.upload(odd.w);
    for (int call = 0; call < 2; ++call) {
      const cuda::DeviceWeight& d = ops.to_mma_layout(odd.w);
      ASSERT_FALSE(d.mma_tiles);
      ASSERT_EQ(d.mma_bits, f == Fmt::kFP4);
      ASSERT_EQ(cudaStreamSynchronize(ops.stream()), cudaSuccess);
      std::vector<uint8_t> data(size_t(odd_rows * odd_bytes));
      ASSERT_EQ(cudaMemcpy(data.data(), d.data, data.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      for (int64_t q = 0; q < odd_rows * odd_bytes / 16; ++q) {
        const std::vector<uint8_t> want = stored_chunk(f, odd.data.data() + 16 * q);
        ASSERT_EQ(std::memcmp(data.data() + 16 * q, want.data(), 16), 0) << "call " << call << " chunk " << q;
      }
      if (f == Fmt::kFP4) {
        std::vector<uint8_t> scales(odd.scale.size());
        ASSERT_EQ(cudaMemcpy(scales.data(), d.scale_e8m0, scales.size(), cudaMemcpyDeviceToHost), cudaSuccess);
        ASSERT_EQ(scales, odd.scale);
      }
    }
  }
#endif
}

// Expert parallelism (moe_kernels.h): each rank's layer holds a contiguous range of the routed experts and rank 0
// the shared expert; its output is the CPU's moe over the same experts (CpuOps::moe skips empty ones), by every
// path — the decode kernels (n = 1), the item kernels (with the shared expert on them or, fast numerics, alone on
// the grouped path), the grouped path — in reference and fast numerics, both routings. Top-2 of 9 experts over 3
// ranks: at one token at least one rank has no pair at all and must still write its rows over the poison (zeros,
// or rank 0's shared expert); ranks 1 and 2 have no shared expert.
TEST(CudaMoe, ExpertRangesOfRanks) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  SCOPED_TRACE(seed());
  std::mt19937_64 rng(seed());
  const Shape shape{384, 256, 9, 2, 1.0f, 1.5};
  const std::vector<std::vector<int64_t>> splits = {{0, 3, 6, 9}, {0, 5, 9}};  // range bounds
  // FP4 / FP8 experts take the decode kernels at one token; BF16 ones the item kernels at every size.
  for (const Formats& f : {Formats{Fmt::kBF16, Fmt::kFP4, Fmt::kFP8}, Formats{Fmt::kBF16, Fmt::kFP8, Fmt::kFP4},
                           Formats{Fmt::kF32, Fmt::kBF16, Fmt::kF32}})
    for (bool hash : {false, true}) {
      const HostMoe m(shape, f, hash, 1000, rng());
      for (const std::vector<int64_t>& bounds : splits)
        for (size_t r = 0; r + 1 < bounds.size(); ++r) {
          const HostMoe rank = m.expert_range(bounds[r], bounds[r + 1], r == 0);
          CudaOps ops(rank.config);
          rank.upload_to(ops);
          const std::string what = cat(describe(shape, f, hash), " experts ", bounds[r], "..", bounds[r + 1] - 1,
                                       r == 0 ? " + shared" : "");
          for (int64_t n : {1, 2, 7, 33}) {
            check_step(rank, ops, n, rng, what);
            check_step_fast(rank, ops, n, rng, what + " fast");
          }
          {
            const SharedGroupedFrom shared(1);
            for (int64_t n : {1, 2, 7}) check_step_fast(rank, ops, n, rng, what + " fast, shared grouped");
          }
          const GroupedFrom forced(1);
          // 260 tokens: route over blocks of tokens (moe_grouped.h), its last block of 4 tokens.
          for (int64_t n : {1, 33, 130, 260}) check_step_fast(rank, ops, n, rng, what + " fast grouped");
        }
    }
#endif
}

// A rank's share of the MoE (Ops::moe_partial): the same kernels without the final rounding, so the share rounded
// to bf16 is moe's output bit for bit, and it holds values off the bf16 grid. One token (the decode kernels), 5
// (the item kernels), 64 (the routed experts on the item kernels, the shared expert alone on the grouped GEMMs),
// 130 (the grouped path); the CPU's moe_partial alike.
TEST(CudaMoe, PartialIsTheSumUnrounded) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  SCOPED_TRACE(seed());
  std::mt19937_64 rng(seed());
  const Shape shape{256, 128, 16, 4, 1.0f, 1.5};
  const HostMoe m(shape, {Fmt::kBF16, Fmt::kFP4, Fmt::kFP8}, false, 100, rng());
  CudaOps ops(m.config);
  CpuOps cpu(m.config);
  m.upload_to(ops);
  ops.set_numerics(Numerics::kFast);
  cpu.set_numerics(Numerics::kFast);
  const auto check = [&](const std::vector<float>& full, const std::vector<float>& part, const std::string& what) {
    size_t unequal = 0, off_grid = 0;
    for (size_t i = 0; i < full.size(); ++i) {
      const float r = round_bf16(part[i]);
      unequal += std::memcmp(&r, &full[i], sizeof r) != 0;
      off_grid += round_bf16(part[i]) != part[i];
    }
    EXPECT_EQ(unequal, 0u) << what << ": the share rounded is not moe's output";
    EXPECT_GT(off_grid, full.size() / 4) << what << ": the share looks rounded";
  };
  for (const int64_t n : {1, 5, 64, 130}) {
    const GroupedFrom grouped(n == 130 ? 1 : 1000);
    const SharedGroupedFrom shared(n == 64 ? 1 : 1000);
    std::vector<float> x = random_floats(size_t(n * shape.D), rng);
    for (float& v : x) v = round_bf16(v);
    const size_t count = size_t(n * shape.D);
    float* dx = device_copy(ops, x);
    float* dfull = ops.alloc(count);
    float* dpart = ops.alloc(count);
    poison_now(ops, dfull, count);
    poison_now(ops, dpart, count);
    ops.moe(m.w, dx, nullptr, n, dfull);
    ops.moe_partial(m.w, dx, nullptr, n, dpart);
    check(to_host(ops, dfull, count), to_host(ops, dpart, count), cat("cuda n=", n));
    std::vector<float> full(count), part(count);
    cpu.moe(m.w, x.data(), nullptr, n, full.data());
    cpu.moe_partial(m.w, x.data(), nullptr, n, part.data());
    check(full, part, cat("cpu n=", n));
  }
#endif
}

// The real V4-Flash layer: D 4096, 256 FP4 experts of width 2048, top-6, FP8 shared expert, BF16 gate,
// swiglu_limit 10, routed_scaling_factor 1.5; decode steps of 1 token (expert_down's row-tile kernel), 2 and 8
// (its item kernel), scored and hash routing.
TEST(CudaMoe, V4FlashDecode) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  SCOPED_TRACE(seed());
  std::mt19937_64 rng(seed());
  const Shape shape{4096, 2048, 256, 6, 10.0f, 1.5};
  const Formats f{Fmt::kBF16, Fmt::kFP4, Fmt::kFP8};
  for (bool hash : {false, true}) {
    const HostMoe m(shape, f, hash, 129280, rng());
    CudaOps ops(m.config);
    m.upload_to(ops);
    for (int64_t n : {1, 2, 8}) check_step(m, ops, n, rng, describe(shape, f, hash));
    // Fast numerics: one token (the decode kernels: act_quant in the block's and in each warp's staging, the
    // row-tile combine), 2 and 8 (the item kernels); then reference again, as before (a per-call switch).
    for (int64_t n : {1, 2, 8}) check_step_fast(m, ops, n, rng, describe(shape, f, hash) + " fast");
    for (int64_t n : {1, 8}) check_step(m, ops, n, rng, describe(shape, f, hash));
    // 64 tokens by default: the routed experts on the item kernels, the shared expert alone on the grouped GEMMs
    // with their K split over 8 blocks (one tile × 16 row blocks each on 132 SMs) and the finish launches.
    check_step_fast(m, ops, 64, rng, describe(shape, f, hash) + " fast, shared grouped");
    // The grouped FP8 path on the real shape, forced: 33 tokens (most experts 0 or 1 token) and, scored, 100,
    // in small routed tiles as by default at these sizes; 100 in tiles of 64 too.
    const GroupedFrom forced(1);
    check_step_fast(m, ops, 33, rng, describe(shape, f, hash) + " fast grouped");
    if (!hash) {
      check_step_fast(m, ops, 100, rng, describe(shape, f, hash) + " fast grouped");
      const SmallTilesUpTo never(0);
      for (const bool wgmma : {false, true}) {
        const Wgmma kernels(wgmma);
        check_step_fast(m, ops, 100, rng, describe(shape, f, hash) + " fast grouped, tiles of 64" + (wgmma ? ", wgmma" : ""));
      }
    }
  }
#endif
}

}  // namespace
}  // namespace dsv4::test
