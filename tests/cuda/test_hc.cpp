// hc family: hc_pre, hc_pre_norm, hc_post and hc_head on the GPU against CpuOps, at V4-Flash sizes (hc 4 × dim 4096,
// fn [24, 16384] F32) and odd ones; and CudaOps' deferred hc_post: fused into the hc_pre_norm that follows it at
// decode, run first by anything else, and never an extra kernel launch.
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>

#include "core/dtype.h"
#include "cuda/gpu.h"
#if DSV4_HAVE_CUDA
#include "cuda/common/check.h"
#endif

namespace dsv4::test {
namespace {

#if DSV4_HAVE_CUDA
ModelConfig hc_config(int64_t hc, int64_t dim) {
  ModelConfig c;
  c.dim = dim;
  c.hc_mult = hc;
  c.hc_sinkhorn_iters = 20;
  c.hc_eps = 1e-6;
  c.norm_eps = 1e-6;
  return c;
}

// A matrix [rows, cols] in host memory, F32 or BF16, entries uniform in ±bound.
struct HostMatrix {
  std::vector<uint8_t> data;
  Weight w;
};

HostMatrix random_matrix(DType dtype, int64_t rows, int64_t cols, float bound, std::mt19937_64& rng) {
  HostMatrix m;
  const auto f = random_floats(size_t(rows * cols), rng, -bound, bound);
  const size_t elem = dtype == DType::kF32 ? 4 : 2;
  m.data.resize(f.size() * elem);
  for (size_t i = 0; i < f.size(); ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(m.data.data() + 4 * i, &f[i], 4);
    } else {
      const uint16_t b = f32_to_bf16(f[i]);
      std::memcpy(m.data.data() + 2 * i, &b, 2);
    }
  }
  m.w.dtype = dtype;
  m.w.rows = rows;
  m.w.cols = cols;
  m.w.row_stride = cols * int64_t(elem);
  m.w.data = m.data.data();
  return m;
}

struct Case {
  int64_t hc, dim, n;
  DType fn_dtype;
  size_t shift;  // 1: X and x shifted off 16-byte alignment (element-wise path)
};

// The cases of both hc_pre and hc_head: V4 decode and prefill, batches crossing the 8-token tile, other hc
// counts (other rows-per-warp splits of fn), a BF16 fn, odd dims and unaligned buffers. From 64 tokens with
// 16-byte packs hc_mix runs its staged kernel (hc.cu): V4 at 64 and 200 tokens (a partial token tile), K = 520
// and 64 (chunks ending inside a 128-column sweep), and K = 387 (no packs: the plain kernel at 66 tokens). With more
// tokens than the GPU has SMs (132 on an H100 or H200) hc_pre_norm runs hc_coeffs + hc_collapse instead of
// hc_finish: V4 at 200 tokens, V4-Pro's width at 140 (hc_collapse's eight slices), and 300 tokens of a partial
// slice (dim 260).
const Case kCases[] = {
    {4, 4096, 1, DType::kF32, 0},   {4, 4096, 19, DType::kF32, 0}, {4, 4096, 64, DType::kF32, 0},
    {4, 4096, 3, DType::kBF16, 0},  {4, 100, 9, DType::kF32, 1},   {4, 37, 5, DType::kF32, 0},
    {2, 260, 3, DType::kF32, 0},    {1, 64, 2, DType::kF32, 0},    {3, 129, 11, DType::kF32, 1},
    {4, 4096, 200, DType::kBF16, 0}, {2, 260, 70, DType::kF32, 0}, {1, 64, 65, DType::kF32, 0},
    {3, 129, 66, DType::kF32, 0},   {2, 260, 300, DType::kF32, 0}, {4, 7168, 140, DType::kBF16, 0},
};

// Tolerances for hc_pre / hc_head. The mixing logits m are fp32 dot products over hc·D = 16384 terms; the CPU
// sums them in 8 strided partial sums, the GPU per lane, by warp trees and across chunks in fp64. With fn
// entries ~1/sqrt(hc·D) and streams in [−1, 1], m is O(1) and each order carries ~sqrt(hc·D)·2^−24·|m| ≈ 1e-5
// relative at worst in practice (typically far less); rinv is fp64 on both sides. pre, post and the Sinkhorn
// projection are Lipschitz ≤ 1 in m·scale here (sigmoid slope ≤ 1/4, the softmax/normalisations contract),
// and expf differs from the host's by ≤ 2 ulp: coefficients in [0, 2] agree to 2e-5 absolute. x = Σ_j pre[j]·X[j]
// then carries hc·2e-5·|X| ≤ 8e-5 absolute: 1e-4 absolute, 1e-5 relative.
const Tolerance kCoefTol{2e-5, 0.0};
const Tolerance kCollapseTol{1e-4, 1e-5};

// hc_pre's weights (uploaded) and streams for a case: fn entries ~ 1/sqrt(hc·D), streams in [−1, 1].
struct PreInputs {
  HostMatrix fn;  // owns w.fn's storage
  HcWeights w;
  std::vector<float> X;
};
PreInputs pre_inputs(const Case& c, std::mt19937_64& rng, CudaOps& ops) {
  const int64_t K = c.hc * c.dim, M = (2 + c.hc) * c.hc;
  PreInputs in;
  in.fn = random_matrix(c.fn_dtype, M, K, std::sqrt(3.0f / float(K)), rng);
  in.w.fn = in.fn.w;
  in.w.base = random_floats(size_t(M), rng);
  in.w.scale = random_floats(3, rng, 0.5f, 2.0f);
  ops.upload(in.w.fn);
  ops.upload(in.w.base);
  ops.upload(in.w.scale);
  settle();
  in.X = random_floats(size_t(c.n * K), rng);
  return in;
}

// hc_head's weights (uploaded), fn entries ~ 1/sqrt(hc·D) as hc_pre's.
struct HeadInputs {
  HostMatrix fn;  // owns w.fn's storage
  HcHeadWeights w;
};
HeadInputs head_inputs(const Case& c, std::mt19937_64& rng, CudaOps& ops) {
  const int64_t K = c.hc * c.dim;
  HeadInputs in;
  in.fn = random_matrix(c.fn_dtype, c.hc, K, std::sqrt(3.0f / float(K)), rng);
  in.w.fn = in.fn.w;
  in.w.base = random_floats(size_t(c.hc), rng);
  in.w.scale = random_floats(1, rng, 0.5f, 2.0f);
  ops.upload(in.w.fn);
  ops.upload(in.w.base);
  ops.upload(in.w.scale);
  settle();
  return in;
}

std::string describe(const Case& c) {
  return cat("hc=", c.hc, " dim=", c.dim, " n=", c.n, " fn ", dtype_name(c.fn_dtype), " shift=", c.shift);
}

// hc_pre's outputs (and hc_pre_norm's xn): the CPU's on the host, the GPU's on the device.
struct PreOutputs {
  std::vector<float> x, xn, post, comb;
  explicit PreOutputs(const Case& c)
      : x(size_t(c.n * c.dim)), xn(x.size()), post(size_t(c.n * c.hc)), comb(size_t(c.n * c.hc * c.hc)) {}
};
struct DevicePreOutputs {
  float *x, *xn, *post, *comb;
};
DevicePreOutputs poisoned_outputs(CudaOps& ops, const Case& c, const PreOutputs& like) {
  return {poisoned(ops, like.x.size(), c.shift), poisoned(ops, like.xn.size(), c.shift),
          poisoned(ops, like.post.size(), 0), poisoned(ops, like.comb.size(), 0)};
}

// A sub-block boundary's inputs (fast numerics): hc_pre_norm's (uploaded) and a gain, then the previous sub-block's
// output f and its coefficients post and comb for a deferred hc_post, on the host.
struct PostStep {
  PreInputs in;
  std::vector<float> gamma, f, post, comb;
};
PostStep post_step(const Case& c, std::mt19937_64& rng, CudaOps& ops) {
  PostStep s;
  s.in = pre_inputs(c, rng, ops);
  s.gamma = random_floats(size_t(c.dim), rng, 0.5f, 1.5f);
  ops.upload(s.gamma);
  settle();
  s.f = random_floats(size_t(c.n * c.dim), rng);
  s.post = random_floats(size_t(c.n * c.hc), rng, 0.0f, 2.0f);
  s.comb = random_floats(size_t(c.n * c.hc * c.hc), rng);
  return s;
}

// post and comb within kCoefTol, x within kCollapseTol; with a gain, xn the RMSNorm of the GPU's own x (the
// CPU's rms_norm of it, to the norm's summation-order tolerance of test_norm_rope: 1e-6 absolute, 1e-5
// relative).
void expect_pre_outputs(CudaOps& ops, CpuOps& cpu, const Case& c, const std::vector<float>* gamma,
                        const DevicePreOutputs& got, const PreOutputs& want) {
  const std::string what = describe(c);
  const auto got_x = to_host(ops, got.x, want.x.size());
  EXPECT_TRUE(compare(to_host(ops, got.post, want.post.size()), want.post, kCoefTol, "post " + what));
  EXPECT_TRUE(compare(to_host(ops, got.comb, want.comb.size()), want.comb, kCoefTol, "comb " + what));
  EXPECT_TRUE(compare(got_x, want.x, kCollapseTol, "x " + what));
  if (!gamma) return;
  std::vector<float> xn_of_got(got_x.size());
  cpu.rms_norm(got_x.data(), gamma, c.n, c.dim, xn_of_got.data());
  EXPECT_TRUE(compare(to_host(ops, got.xn, want.xn.size()), xn_of_got, Tolerance{1e-6, 1e-5}, "xn " + what));
}
#endif

TEST(CudaHc, HcPreMatchesCpu) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  for (const Case& c : kCases) {
    const ModelConfig cfg = hc_config(c.hc, c.dim);
    CudaOps ops(cfg);
    CpuOps cpu(cfg);
    const PreInputs in = pre_inputs(c, rng, ops);
    PreOutputs want(c);
    cpu.hc_pre(in.X.data(), in.w, c.n, want.x.data(), want.post.data(), want.comb.data());
    const DevicePreOutputs got = poisoned_outputs(ops, c, want);
    ops.hc_pre(to_device(ops, in.X, c.shift), in.w, c.n, got.x, got.post, got.comb);
    expect_pre_outputs(ops, cpu, c, nullptr, got, want);
  }
#endif
}

// hc_pre_norm: hc_pre's outputs within its tolerances, and xn the RMSNorm of the GPU's own x.
TEST(CudaHc, HcPreNormMatchesCpu) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  for (const Case& c : kCases) {
    const ModelConfig cfg = hc_config(c.hc, c.dim);
    CudaOps ops(cfg);
    CpuOps cpu(cfg);
    const PreInputs in = pre_inputs(c, rng, ops);
    const std::vector<float> gamma = random_floats(size_t(c.dim), rng, 0.5f, 1.5f);
    ops.upload(gamma);
    settle();
    PreOutputs want(c);
    cpu.hc_pre_norm(in.X.data(), in.w, gamma, c.n, c.dim, want.x.data(), want.xn.data(), want.post.data(),
                    want.comb.data());
    const DevicePreOutputs got = poisoned_outputs(ops, c, want);
    ops.hc_pre_norm(to_device(ops, in.X, c.shift), in.w, gamma, c.n, c.dim, got.x, got.xn, got.post, got.comb);
    expect_pre_outputs(ops, cpu, c, &gamma, got, want);
  }
#endif
}

// hc_pre_norm asked for xn act_quant'ed (fast numerics, model/ops.h's E4m3Rows): every code and scale is the CPU's
// act_quant_rows of the xn it wrote, which is bit for bit the xn of the call without them; alone and fused with
// a deferred hc_post (hc_post_mix, hc_post_mix_tiled), at V4 shapes (hc_finish: a warp's slice is one 128-column
// block).
TEST(CudaHc, HcPreNormWritesActQuantRows) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  for (const Case& c : kCases) {
    if (c.dim % 128 != 0 || c.shift != 0) continue;  // act_quant blocks of 128 columns, aligned rows
    for (bool after_post : {false, true}) {
      CudaOps ops(hc_config(c.hc, c.dim));
      ops.set_numerics(Numerics::kFast);
      const PostStep step = post_step(c, rng, ops);
      const PreInputs& in = step.in;
      const std::vector<float>& gamma = step.gamma;
      const PreOutputs like(c);
      const DevicePreOutputs got = poisoned_outputs(ops, c, like), plain = poisoned_outputs(ops, c, like);
      E4m3Rows q = poisoned_e4m3(ops, c.n + 3, c.dim);  // room for more rows than the step has
      // Both calls the same way from the same streams (a fused hc_post_mix sums the mixes in other chunks than
      // hc_mix: its xn may differ in the last bit from an unfused call's).
      const float *df = to_device(ops, step.f), *dpost = to_device(ops, step.post), *dcomb = to_device(ops, step.comb);
      const auto run = [&](const DevicePreOutputs& out, E4m3Rows* xnq) {
        float* dX = to_device(ops, in.X);
        if (after_post) ops.hc_post(df, dpost, dcomb, c.n, dX);
        ops.hc_pre_norm(dX, in.w, gamma, c.n, c.dim, out.x, out.xn, out.post, out.comb, xnq);
      };
      run(got, &q);
      run(plain, nullptr);
      const std::vector<float> xn = to_host(ops, got.xn, like.xn.size());
      const std::string what = describe(c) + (after_post ? " after hc_post" : "");
      EXPECT_EQ(std::memcmp(xn.data(), to_host(ops, plain.xn, like.xn.size()).data(), xn.size() * sizeof(float)), 0)
          << what;
      EXPECT_TRUE(e4m3_rows_match(ops, q, xn, c.n)) << what;
    }
  }
#endif
}

TEST(CudaHc, HcHeadMatchesCpu) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  for (const Case& c : kCases) {
    const ModelConfig cfg = hc_config(c.hc, c.dim);
    CudaOps ops(cfg);
    CpuOps cpu(cfg);
    const HeadInputs head = head_inputs(c, rng, ops);
    const auto X = random_floats(size_t(c.n * c.hc * c.dim), rng);
    std::vector<float> y(size_t(c.n * c.dim));
    cpu.hc_head(X.data(), head.w, c.n, y.data());
    float* dy = poisoned(ops, y.size(), c.shift);
    ops.hc_head(to_device(ops, X, c.shift), head.w, c.n, dy);
    EXPECT_TRUE(compare(to_host(ops, dy, y.size()), y, kCollapseTol, "hc_head " + describe(c)));
  }
#endif
}

// hc_post runs the CPU's operations in the CPU's order (unfused fp32 products, sums over j in order), so the
// results are bit-identical unless the host compiler contracts a·b + c into an FMA: one rounding of a sum of
// hc + 1 terms of size ≤ 2, ≤ 2.4e-7 each; 1e-6 absolute. CudaOps defers hc_post: to_host's download runs it.
TEST(CudaHc, HcPostMatchesCpu) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  // Fast numerics too, where f (fp32 here, as the ranks' sum of their unrounded shares: Ops::linear_partial) is
  // rounded to bf16 first and the streams after.
  for (const Numerics numerics : {Numerics::kReference, Numerics::kFast})
    for (const Case& c : kCases) {
      const ModelConfig cfg = hc_config(c.hc, c.dim);
      CudaOps ops(cfg);
      CpuOps cpu(cfg);
      ops.set_numerics(numerics);
      cpu.set_numerics(numerics);
      const auto f = random_floats(size_t(c.n * c.dim), rng);
      const auto post = random_floats(size_t(c.n * c.hc), rng, 0.0f, 2.0f);
      const auto comb = random_floats(size_t(c.n * c.hc * c.hc), rng, 0.0f, 1.0f);
      const auto X = random_floats(size_t(c.n * c.hc * c.dim), rng);
      std::vector<float> want = X;
      cpu.hc_post(f.data(), post.data(), comb.data(), c.n, want.data());
      float* dX = to_device(ops, X, c.shift);
      ops.hc_post(to_device(ops, f, c.shift), to_device(ops, post, 0), to_device(ops, comb, 0), c.n, dX);
      EXPECT_TRUE(compare(to_host(ops, dX, want.size()), want, Tolerance{1e-6, 0.0},
                          cat("hc_post hc=", c.hc, " dim=", c.dim, " n=", c.n, " shift=", c.shift,
                              numerics == Numerics::kFast ? " fast" : "")));
    }
#endif
}

// hc_post then hc_pre_norm on the same streams, as every sub-block after a step's first: X as hc_post leaves it
// (the same operations: 1e-6 absolute), then hc_pre_norm's outputs on that X within hc_pre_norm's tolerances.
// post and comb are read and written through the same buffers, as the model calls it. Cases with dim % 4 == 0 and
// aligned buffers take a fused kernel (hc_post_mix up to 8 tokens, hc_post_mix_tiled beyond), the others hc_post's
// own.
TEST(CudaHc, HcPostThenPreNormMatchesCpu) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  for (const Case& c : kCases) {
    const ModelConfig cfg = hc_config(c.hc, c.dim);
    CudaOps ops(cfg);
    CpuOps cpu(cfg);
    const PreInputs in = pre_inputs(c, rng, ops);
    const std::vector<float> gamma = random_floats(size_t(c.dim), rng, 0.5f, 1.5f);
    ops.upload(gamma);
    settle();
    const auto f = random_floats(size_t(c.n * c.dim), rng);
    PreOutputs want(c);
    want.post = random_floats(want.post.size(), rng, 0.0f, 2.0f);  // the previous sub-block's coefficients
    want.comb = random_floats(want.comb.size(), rng, 0.0f, 1.0f);
    const std::vector<float> post0 = want.post, comb0 = want.comb;  // hc_pre_norm writes over them
    const DevicePreOutputs got{poisoned(ops, want.x.size(), c.shift), poisoned(ops, want.xn.size(), c.shift),
                               to_device(ops, want.post, 0), to_device(ops, want.comb, 0)};
    const float* df = to_device(ops, f, c.shift);
    float* dX = to_device(ops, in.X, c.shift);
    std::vector<float> X = in.X;
    cpu.hc_post(f.data(), want.post.data(), want.comb.data(), c.n, X.data());
    cpu.hc_pre_norm(X.data(), in.w, gamma, c.n, c.dim, want.x.data(), want.xn.data(), want.post.data(),
                    want.comb.data());
    ops.hc_post(df, got.post, got.comb, c.n, dX);
    ops.hc_pre_norm(dX, in.w, gamma, c.n, c.dim, got.x, got.xn, got.post, got.comb);
    EXPECT_TRUE(compare(to_host(ops, dX, X.size()), X, Tolerance{1e-6, 0.0}, "X " + describe(c)));
    expect_pre_outputs(ops, cpu, c, &gamma, got, want);
    // Fast numerics: the fused kernels' X with an fp32 f (the ranks' sum of unrounded shares), rounded first.
    CpuOps cpu_fast(cfg);
    cpu_fast.set_numerics(Numerics::kFast);
    ops.set_numerics(Numerics::kFast);
    std::vector<float> X_fast = in.X;
    cpu_fast.hc_post(f.data(), post0.data(), comb0.data(), c.n, X_fast.data());
    float* dX_fast = to_device(ops, in.X, c.shift);
    float* dpost = to_device(ops, post0, 0);
    float* dcomb = to_device(ops, comb0, 0);
    ops.hc_post(df, dpost, dcomb, c.n, dX_fast);
    ops.hc_pre_norm(dX_fast, in.w, gamma, c.n, c.dim, got.x, got.xn, dpost, dcomb);
    EXPECT_TRUE(compare(to_host(ops, dX_fast, X_fast.size()), X_fast, Tolerance{1e-6, 0.0}, "X fast " + describe(c)));
    ops.set_numerics(Numerics::kReference);
  }
#endif
}

// The fused hc_post + hc_pre_norm of a prefill-sized step (hc_post_mix_tiled: tiles of tokens a block) gives bit for
// bit what the same rows give one token a call (hc_post_mix: a block a token): the same X', the same mixing
// partials in the same order, so the same x, xn, post and comb. Steps of several token tiles and a partial one,
// rows of a partial 128-column slice (dim 260), and a run of tiles a block (200 tokens). Beyond one wave of
// hc_finish (200 and 300 tokens) the step's hc_coeffs + hc_collapse against hc_finish one token a call.
TEST(CudaHc, HcPostMixTiledMatchesPerToken) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  for (const Case& c : kCases) {
    if (c.n <= 8 || c.dim % 4 != 0 || c.shift != 0) continue;  // the tiled kernel's cases
    CudaOps ops(hc_config(c.hc, c.dim));
    ops.set_numerics(Numerics::kFast);
    const PostStep step = post_step(c, rng, ops);
    const PreInputs& in = step.in;
    const std::vector<float>& gamma = step.gamma;
    const PreOutputs like(c);
    const float* df = to_device(ops, step.f);
    // Each run from the same streams and coefficients, post and comb rewritten in place as the model does.
    struct Run {
      float* X;
      DevicePreOutputs out;
    };
    const auto fresh = [&] {
      Run r{to_device(ops, in.X), poisoned_outputs(ops, c, like)};
      r.out.post = to_device(ops, step.post);
      r.out.comb = to_device(ops, step.comb);
      return r;
    };
    const Run tiled = fresh(), single = fresh();
    const int64_t D = c.dim, hc = c.hc;
    ops.hc_post(df, tiled.out.post, tiled.out.comb, c.n, tiled.X);
    ops.hc_pre_norm(tiled.X, in.w, gamma, c.n, D, tiled.out.x, tiled.out.xn, tiled.out.post, tiled.out.comb);
    for (int64_t t = 0; t < c.n; ++t) {
      float* X = single.X + t * hc * D;
      float *p = single.out.post + t * hc, *C = single.out.comb + t * hc * hc;
      ops.hc_post(df + t * D, p, C, 1, X);
      ops.hc_pre_norm(X, in.w, gamma, 1, D, single.out.x + t * D, single.out.xn + t * D, p, C);
    }
    const auto same = [&](const float* a, const float* b, size_t count, const char* what) {
      const std::vector<float> ha = to_host(ops, a, count), hb = to_host(ops, b, count);
      EXPECT_EQ(std::memcmp(ha.data(), hb.data(), count * sizeof(float)), 0) << what << " " << describe(c);
    };
    same(tiled.X, single.X, in.X.size(), "X");
    same(tiled.out.x, single.out.x, like.x.size(), "x");
    same(tiled.out.xn, single.out.xn, like.xn.size(), "xn");
    same(tiled.out.post, single.out.post, like.post.size(), "post");
    same(tiled.out.comb, single.out.comb, like.comb.size(), "comb");
  }
#endif
}

// A deferred hc_post runs before whatever follows it that is not its fused partner: an rms_norm reading X, hc_head,
// a second hc_post on X, hc_pre_norm on other streams. Each against the CPU's ops one after the other, at decode
// size (where hc_pre_norm would fuse) and an odd unaligned size. The post-mixed streams are bounded by
// post + Σ_j C[j][k] ≤ 2 + hc = 6. X after one hc_post: 1e-6 absolute (HcPostMatchesCpu); after two, the first's
// error carried through Σ_j C[j][k] (≤ 4e-6) plus the second's rounding over terms ≤ 6 (≤ 2e-6): 1e-5. rms_norm
// of rows within 1e-6 of the CPU's (rms ~1): 1e-5 absolute, 1e-5 relative. hc_head: kCollapseTol's bound, derived
// for streams ≤ 1, times 6: 6e-4 absolute.
TEST(CudaHc, DeferredHcPostRunsBeforeOtherOps) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  for (const Case& c : {kCases[0], kCases[4]}) {
    const ModelConfig cfg = hc_config(c.hc, c.dim);
    const std::string what = describe(c);
    CudaOps ops(cfg);
    CpuOps cpu(cfg);
    const PreInputs in = pre_inputs(c, rng, ops);  // hc_pre_norm's weights, and X
    const HeadInputs head = head_inputs(c, rng, ops);
    const std::vector<float> gamma = random_floats(size_t(c.dim), rng, 0.5f, 1.5f);
    ops.upload(gamma);
    settle();
    const auto f = random_floats(size_t(c.n * c.dim), rng), f2 = random_floats(f.size(), rng);
    const auto post = random_floats(size_t(c.n * c.hc), rng, 0.0f, 2.0f);
    const auto comb = random_floats(size_t(c.n * c.hc * c.hc), rng, 0.0f, 1.0f);
    const auto Y = random_floats(in.X.size(), rng);  // other streams
    const float *df = to_device(ops, f, c.shift), *df2 = to_device(ops, f2, c.shift);
    const float *dpost = to_device(ops, post, 0), *dcomb = to_device(ops, comb, 0);
    std::vector<float> X = in.X;  // X after hc_post
    cpu.hc_post(f.data(), post.data(), comb.data(), c.n, X.data());
    {  // rms_norm of X's rows
      float* dX = to_device(ops, in.X, c.shift);
      float* dy = poisoned(ops, X.size(), c.shift);
      std::vector<float> y(X.size());
      cpu.rms_norm(X.data(), nullptr, c.n * c.hc, c.dim, y.data());
      ops.hc_post(df, dpost, dcomb, c.n, dX);
      ops.rms_norm(dX, nullptr, c.n * c.hc, c.dim, dy);
      EXPECT_TRUE(compare(to_host(ops, dy, y.size()), y, Tolerance{1e-5, 1e-5}, "rms_norm after hc_post " + what));
    }
    {  // hc_head
      float* dX = to_device(ops, in.X, c.shift);
      float* dy = poisoned(ops, size_t(c.n * c.dim), c.shift);
      std::vector<float> y(size_t(c.n * c.dim));
      cpu.hc_head(X.data(), head.w, c.n, y.data());
      ops.hc_post(df, dpost, dcomb, c.n, dX);
      ops.hc_head(dX, head.w, c.n, dy);
      EXPECT_TRUE(compare(to_host(ops, dy, y.size()), y, Tolerance{6e-4, 1e-5}, "hc_head after hc_post " + what));
    }
    {  // a second hc_post on the same streams
      float* dX = to_device(ops, in.X, c.shift);
      std::vector<float> X2 = X;
      cpu.hc_post(f2.data(), post.data(), comb.data(), c.n, X2.data());
      ops.hc_post(df, dpost, dcomb, c.n, dX);
      ops.hc_post(df2, dpost, dcomb, c.n, dX);
      EXPECT_TRUE(compare(to_host(ops, dX, X2.size()), X2, Tolerance{1e-5, 0.0}, "hc_post twice " + what));
    }
    {  // hc_pre_norm on other streams: X still gets its post-mix, Y its pre-mix
      float* dX = to_device(ops, in.X, c.shift);
      float* dY = to_device(ops, Y, c.shift);
      PreOutputs want(c);
      cpu.hc_pre_norm(Y.data(), in.w, gamma, c.n, c.dim, want.x.data(), want.xn.data(), want.post.data(),
                      want.comb.data());
      const DevicePreOutputs got = poisoned_outputs(ops, c, want);
      ops.hc_post(df, dpost, dcomb, c.n, dX);
      ops.hc_pre_norm(dY, in.w, gamma, c.n, c.dim, got.x, got.xn, got.post, got.comb);
      EXPECT_TRUE(compare(to_host(ops, dX, X.size()), X, Tolerance{1e-6, 0.0}, "X beside hc_pre_norm " + what));
      expect_pre_outputs(ops, cpu, c, &gamma, got, want);
    }
  }
#endif
}

#if DSV4_HAVE_CUDA
// The kernels a call sequence enqueues on the ops' stream, counted on a recording of it (stream capture) made
// after one direct run, which grows the workspaces (they cannot grow during a recording).
size_t kernels_enqueued(CudaOps& ops, const std::function<void()>& calls) {
  calls();
  DSV4_CUDA_CHECK(cudaStreamBeginCapture(ops.stream(), cudaStreamCaptureModeThreadLocal));
  calls();
  cudaGraph_t graph = nullptr;
  DSV4_CUDA_CHECK(cudaStreamEndCapture(ops.stream(), &graph));  // a trailing deferred hc_post is recorded first
  size_t count = 0;
  DSV4_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  DSV4_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &count));
  size_t kernels = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    DSV4_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    kernels += type == cudaGraphNodeTypeKernel;
  }
  DSV4_CUDA_CHECK(cudaGraphDestroy(graph));
  settle();
  return kernels;
}
#endif

// Deferring hc_post costs no launch: hc_post then hc_pre_norm is as many kernels as hc_pre_norm alone (hc_post_mix
// or hc_post_mix_tiled takes hc_mix's place); before hc_head, or last, it is its own kernel. So a step launches
// what it did when the seam had a fused hc_post_pre_norm op.
TEST(CudaHc, DeferredHcPostAddsNoLaunch) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  for (const Case& c : {kCases[0], kCases[1]}) {  // V4-Flash sizes, decode (1 token) and prefill (19)
    const ModelConfig cfg = hc_config(c.hc, c.dim);
    const std::string what = describe(c);
    CudaOps ops(cfg);
    const PreInputs in = pre_inputs(c, rng, ops);
    const HeadInputs head = head_inputs(c, rng, ops);
    const std::vector<float> gamma = random_floats(size_t(c.dim), rng, 0.5f, 1.5f);
    ops.upload(gamma);
    settle();
    const float* f = to_device(ops, random_floats(size_t(c.n * c.dim), rng), 0);
    float* post = to_device(ops, random_floats(size_t(c.n * c.hc), rng, 0.0f, 2.0f), 0);
    float* comb = to_device(ops, random_floats(size_t(c.n * c.hc * c.hc), rng, 0.0f, 1.0f), 0);
    float* X = to_device(ops, in.X, 0);
    float *x = ops.alloc(size_t(c.n * c.dim)), *xn = ops.alloc(size_t(c.n * c.dim));
    const auto hc_post = [&] { ops.hc_post(f, post, comb, c.n, X); };
    const auto pre_norm = [&] { ops.hc_pre_norm(X, in.w, gamma, c.n, c.dim, x, xn, post, comb); };
    const auto hc_head = [&] { ops.hc_head(X, head.w, c.n, x); };
    const size_t post_alone = kernels_enqueued(ops, hc_post), pre_norm_alone = kernels_enqueued(ops, pre_norm);
    const size_t head_alone = kernels_enqueued(ops, hc_head);
    EXPECT_EQ(post_alone, 1u) << what;
    const size_t fused = kernels_enqueued(ops, [&] {
      hc_post();
      pre_norm();
    });
    EXPECT_EQ(fused, pre_norm_alone) << what;
    const size_t before_head = kernels_enqueued(ops, [&] {
      hc_post();
      hc_head();
    });
    EXPECT_EQ(before_head, post_alone + head_alone) << what;
  }
#endif
}

}  // namespace
}  // namespace dsv4::test
