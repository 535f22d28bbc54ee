// norm_rope family: rms_norm, rope and the fused norm_rope / kv_finish / query_kv_finish on the GPU against CpuOps,
// at V4-Flash shapes and odd ones.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>

#include "cuda/gpu.h"
#if DSV4_HAVE_CUDA
#include "cuda/common/check.h"
#endif

namespace dsv4::test {
namespace {

#if DSV4_HAVE_CUDA
// V4-Flash's RoPE and norm settings (spec §3.2): rope_dim 64, θ 10000 on sliding layers, 160000 with YaRN
// (factor 16 over 65536 original positions) on compressed layers.
ModelConfig v4_config() {
  ModelConfig c;
  c.dim = 4096;
  c.head_dim = 512;
  c.rope_dim = 64;
  c.n_heads = 64;
  c.rope_theta = 10000.0;
  c.compress_rope_theta = 160000.0;
  c.yarn = YarnConfig{true, 16.0, 65536, 32.0, 1.0};
  c.norm_eps = 1e-6;
  return c;
}

// Rows in [−3, 3] and, when weighted, a gain in [0.5, 1.5], uploaded: gains keeps every gain alive, as
// uploads are keyed by the host address and a later gain must not reuse one.
struct NormInputs {
  std::vector<float> x;
  const std::vector<float>* gamma;
};
NormInputs norm_inputs(int64_t rows, int64_t dim, bool weighted, std::mt19937_64& rng, CudaOps& ops,
                       std::deque<std::vector<float>>& gains) {
  NormInputs in{random_floats(size_t(rows * dim), rng, -3.0f, 3.0f), nullptr};
  const std::vector<float>& gamma = gains.emplace_back(random_floats(size_t(dim), rng, 0.5f, 1.5f));
  if (weighted) {
    in.gamma = &gamma;
    ops.upload(gamma);
  }
  settle();
  return in;
}
#endif

// RMSNorm: fp32 everywhere in the same operation order; only the order of the sum of squares differs
// (the CPU's 8 strided partial sums vs per-thread sums, warp trees and a block step). Each ordering has a
// relative error below ~log2(dim)·2^−24 ≈ 1e-6 on Σx² (all terms positive), which reaches the output
// halved through the square root; 1e-5 relative leaves a 10× margin, and 1e-6 absolute covers outputs
// near zero.
TEST(CudaNormRope, RmsNormMatchesCpu) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  const ModelConfig cfg = v4_config();
  CudaOps ops(cfg);
  CpuOps cpu(cfg);
  const Tolerance tol{1e-6, 1e-5};
  std::deque<std::vector<float>> gains;
  struct Case { int64_t rows, dim; bool weighted, in_place; size_t shift; };
  for (const Case& c : {Case{1, 4096, true, false, 0},       // attn_norm / ffn_norm at decode
                        Case{19, 4096, true, true, 0},       // prefill rows, in place
                        Case{3, 1024, true, true, 0},        // q_norm (q_lora 1024)
                        Case{3 * 64, 512, false, true, 0},   // per-head q normalisation, unweighted
                        Case{7, 7168, true, false, 0},       // the larger V4 dim
                        Case{5, 129, true, false, 0},        // odd dim: element-wise path
                        Case{4, 100, false, false, 1},       // unaligned rows
                        Case{2, 1, true, false, 0}}) {
    const auto [x, g] = norm_inputs(c.rows, c.dim, c.weighted, rng, ops, gains);
    std::vector<float> want(x.size());
    cpu.rms_norm(x.data(), g, c.rows, c.dim, want.data());
    float* dx = to_device(ops, x, c.shift);
    float* y = dx;
    if (!c.in_place) {
      y = settled(ops.alloc(x.size() + c.shift) + c.shift);
      poison(y, x.size());
      settle();
    }
    ops.rms_norm(dx, g, c.rows, c.dim, y);
    EXPECT_TRUE(compare(to_host(ops, y, x.size()), want, tol,
                        cat("rms_norm rows=", c.rows, " dim=", c.dim, c.weighted ? " weighted" : " unweighted",
                            c.in_place ? " in place" : "", " shift=", c.shift)));
  }
#endif
}

// rms_norm asked for its rows act_quant'ed (fast numerics, model/ops.h's E4m3Rows): every code and scale is the
// CPU's act_quant_rows of the y it wrote, which is bit for bit the y of the call without them; the q norm
// (q_lora 1024) and the sub-block norms (4096, V4-Pro's 7168) at decode and prefill row counts, in place too.
TEST(CudaNormRope, RmsNormWritesActQuantRows) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  const ModelConfig cfg = v4_config();
  CudaOps ops(cfg);
  ops.set_numerics(Numerics::kFast);
  std::deque<std::vector<float>> gains;
  struct Case { int64_t rows, dim; bool in_place; };
  for (const Case& c : {Case{1, 1024, true}, Case{64, 1024, true}, Case{1, 4096, false}, Case{19, 4096, false},
                        Case{3, 7168, false}}) {
    const auto [x, g] = norm_inputs(c.rows, c.dim, true, rng, ops, gains);
    float* dx = to_device(ops, x);
    float* y = c.in_place ? dx : poisoned(ops, x.size());
    float* plain = poisoned(ops, x.size());
    ops.rms_norm(dx, g, c.rows, c.dim, plain);  // before an in-place call overwrites x
    E4m3Rows q = poisoned_e4m3(ops, c.rows + 5, c.dim);
    ops.rms_norm(dx, g, c.rows, c.dim, y, &q);
    const std::vector<float> got = to_host(ops, y, x.size());
    const std::string what = cat("rows=", c.rows, " dim=", c.dim, c.in_place ? " in place" : "");
    EXPECT_EQ(std::memcmp(got.data(), to_host(ops, plain, x.size()).data(), got.size() * sizeof(float)), 0) << what;
    EXPECT_TRUE(e4m3_rows_match(ops, q, got, c.rows)) << what;
  }
#endif
}

// RoPE: the same fp32 angle, fp64 sin/cos rounded to fp32, and unfused fp32 products and sums as the CPU, so
// results are bit-identical unless CUDA's and the host's fp64 sin/cos round to different fp32 values (their
// errors are ~1 fp64 ulp: rare). Such a flip changes c or s by one fp32 ulp (≤ 6e-8), the output by at most
// (|a| + |b|)·6e-8 ≤ 2.4e-7 for inputs in [−2, 2]: 5e-7 absolute. Channels outside the rotated range must
// come back unchanged (they are compared too).
TEST(CudaNormRope, RopeMatchesCpu) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  const ModelConfig cfg = v4_config();
  CudaOps ops(cfg);
  CpuOps cpu(cfg);
  const Tolerance tol{5e-7, 0.0};
  struct Case {
    const char* what;
    int64_t rows, row_stride, offset, rows_per_pos, pos0, pos_stride;
    RopeKind kind;
    bool inverse;
    size_t shift;
  };
  for (const Case& c : {
           Case{"q decode, 64 heads", 64, 512, 448, 64, 4095, 1, RopeKind::kPlain, false, 0},
           Case{"q prefill, compressed", 19 * 64, 512, 448, 64, 1000, 1, RopeKind::kCompressed, false, 0},
           Case{"attention output, inverse", 5 * 64, 512, 448, 64, 70000, 1, RopeKind::kCompressed, true, 0},
           Case{"kv rows", 19, 512, 448, 1, 0, 1, RopeKind::kPlain, false, 0},
           Case{"indexer q (64 heads × 128)", 3 * 64, 128, 64, 64, 123456, 1, RopeKind::kCompressed, false, 0},
           Case{"compressed entry at w·m", 1, 512, 448, 1, 128 * 511, 0, RopeKind::kCompressed, false, 0},
           Case{"odd layout", 19, 77, 5, 3, 7, 4, RopeKind::kPlain, true, 1},
           Case{"far position", 6, 64, 0, 2, 1000000, 3, RopeKind::kPlain, false, 0},
       }) {
    const auto x = random_floats(size_t(c.rows * c.row_stride), rng, -2.0f, 2.0f);
    std::vector<float> want = x;
    cpu.rope(want.data(), c.rows, c.row_stride, c.offset, c.rows_per_pos, c.pos0, c.pos_stride, c.kind, c.inverse);
    float* dx = to_device(ops, x, c.shift);
    ops.rope(dx, c.rows, c.row_stride, c.offset, c.rows_per_pos, c.pos0, c.pos_stride, c.kind, c.inverse);
    const auto got = to_host(ops, dx, x.size());
    size_t differing = 0;
    for (size_t i = 0; i < got.size(); ++i) differing += got[i] != want[i];
    EXPECT_TRUE(compare(got, want, tol, c.what)) << differing << " elements not bit-identical";
    if (differing) std::printf("rope '%s': %zu of %zu elements differ in the last bits\n", c.what, differing, got.size());
  }
#endif
}

// rope_spans (CUDA: one launch for up to 96 spans, each block finding its span) against the CPU's rope of each
// span: 100 spans in one buffer with a gap of untouched rows between them (which must come back unchanged), of
// decode (one position of 64 heads), prefill (13 positions) and empty spans, each at its own position; the
// indexer's layout and an odd one. Tolerance as RopeMatchesCpu.
TEST(CudaNormRope, RopeSpansMatchesCpu) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  const ModelConfig cfg = v4_config();
  CudaOps ops(cfg);
  CpuOps cpu(cfg);
  struct Layout {
    const char* what;
    int64_t row_stride, offset, rows_per_pos;
    RopeKind kind;
  };
  for (const Layout& l : {Layout{"indexer q (64 heads × 128)", 128, 64, 64, RopeKind::kCompressed},
                          Layout{"odd layout", 77, 5, 3, RopeKind::kPlain}}) {
    struct Piece {
      int64_t first_row, rows, pos0;
    };
    std::vector<Piece> pieces;
    int64_t total = 0;
    for (int i = 0; i < 100; ++i) {
      const int64_t positions = i % 7 == 3 ? 13 : i % 11 == 5 ? 0 : 1;
      pieces.push_back({total, positions * l.rows_per_pos, i == 0 ? 0 : 4095 + 977 * i});
      total += positions * l.rows_per_pos + 2;  // two untouched rows after each span
    }
    const auto x = random_floats(size_t(total * l.row_stride), rng, -2.0f, 2.0f);
    std::vector<float> want = x;
    for (const Piece& p : pieces)
      cpu.rope(want.data() + p.first_row * l.row_stride, p.rows, l.row_stride, l.offset, l.rows_per_pos, p.pos0, 1,
               l.kind, false);
    float* dx = to_device(ops, x);
    std::vector<RopeSpan> spans;
    for (const Piece& p : pieces) spans.push_back({dx + p.first_row * l.row_stride, p.rows, p.pos0});
    ops.rope_spans(spans, l.row_stride, l.offset, l.rows_per_pos, l.kind);
    const auto got = to_host(ops, dx, x.size());
    EXPECT_TRUE(compare(got, want, Tolerance{5e-7, 0.0}, l.what));
  }
#endif
}

#if DSV4_HAVE_CUDA
// got against want, rows of dim channels: the first `exact` channels of each row bit for bit (the norm, or the
// FP8 codes), every channel within 1e-6 (the rope channels carry the fp64 sin/cos last bits).
void expect_rows_match(const std::vector<float>& got, const std::vector<float>& want, int64_t rows, int64_t dim,
                       int64_t exact, const std::string& what, Tolerance tol = {1e-6, 0.0}) {
  size_t differing = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < exact; ++i) differing += got[size_t(r * dim + i)] != want[size_t(r * dim + i)];
  EXPECT_EQ(differing, 0u) << what << ": " << differing << " of the first " << exact << " channels of each row differ";
  EXPECT_TRUE(compare(got, want, tol, what));
}

// A window ring on the host (fp32) and on the device (compact FP8).
struct Rings {
  std::vector<float> host;
  float* dev;
};

// What the K = V tests share: V4-Flash's head_dim rows (448 FP8 channels, 64 rope), a 37-slot ring, a gain in
// [0.5, 1.5] (uploaded), on both backends.
struct KvRows {
  std::mt19937_64 rng{seed()};
  ModelConfig cfg = v4_config();
  CudaOps ops{cfg};
  CpuOps cpu{cfg};
  int64_t d = 512, nope = d - cfg.rope_dim, slots = 37;
  std::vector<float> gamma = random_floats(size_t(d), rng, 0.5f, 1.5f);
  KvRows() { ops.upload(gamma); }
  // A ring of random stored (so simulated) rows, on the host and in a compact FP8 cache of the same contents.
  Rings random_rings() {
    Rings r{random_floats(size_t(slots * d), rng, -2.0f, 2.0f), ops.alloc_cache(CacheFormat::kFp8Kv, slots, d)};
    cpu.sim_fp8(r.host.data(), slots, d, nope, 64);
    ops.write_cache(r.dev, slots, d, r.host.data());
    return r;
  }
  // The compact ring read back against the CPU's fp32 one: FP8 channels bit for bit, rope channels 1e-6.
  void expect_rings_match(const Rings& r, const std::string& what) {
    std::vector<float> got(r.host.size());
    ops.read_cache(r.dev, slots, d, got.data());
    expect_rows_match(got, r.host, slots, d, nope, what);
  }
};
#endif

// norm_rope: RMSNorm bit-identical to the CPU's (same 8 partial sums, same tree, unfused products), then the
// rotation of RopeMatchesCpu: channels before the rope range must match bit for bit, the rope channels within
// RopeMatchesCpu's sin/cos bound (outputs ≤ ~4 in magnitude here: 1e-6 absolute).
TEST(CudaNormRope, NormRopeMatchesCpu) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  const ModelConfig cfg = v4_config();
  CudaOps ops(cfg);
  CpuOps cpu(cfg);
  std::deque<std::vector<float>> gains;
  struct Case {
    const char* what;
    int64_t rows, dim, rows_per_pos, pos0;
    RopeKind kind;
    bool weighted;
  };
  for (const Case& c : {Case{"q decode, 64 heads", 64, 512, 64, 4095, RopeKind::kPlain, false},
                        Case{"q prefill, compressed", 7 * 64, 512, 64, 1000, RopeKind::kCompressed, false},
                        Case{"kv rows", 19, 512, 1, 70000, RopeKind::kCompressed, true},
                        Case{"narrow rows, 3 per position", 11, 70, 3, 5, RopeKind::kPlain, true},
                        Case{"dim not a multiple of 8", 4, 1030, 1, 0, RopeKind::kPlain, true}}) {
    const auto [x, g] = norm_inputs(c.rows, c.dim, c.weighted, rng, ops, gains);
    const int64_t offset = c.dim - cfg.rope_dim;
    std::vector<float> want = x;
    cpu.norm_rope(want.data(), g, c.rows, c.dim, offset, c.rows_per_pos, c.pos0, c.kind);
    float* dx = to_device(ops, x);
    ops.norm_rope(dx, g, c.rows, c.dim, offset, c.rows_per_pos, c.pos0, c.kind);
    expect_rows_match(to_host(ops, dx, x.size()), want, c.rows, c.dim, offset, c.what);
  }
#endif
}

// kv_finish into a compact ring (CUDA: one kernel, norm_rope's row routine then the store that rounds like
// sim_fp8) against the CPU's four ops into an fp32 ring. Both rings start from the same random simulated
// contents; the step wraps around the ring (n = 40 > 37 slots: its first rows are overwritten within the call).
// The FP8 channels must agree bit for bit (exact norm, the same rounding), the fp32 rope channels as
// NormRopeMatchesCpu, and untouched slots must keep their contents.
TEST(CudaNormRope, KvFinishMatchesCpu) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  SCOPED_TRACE(seed());
  KvRows k;
  for (const auto& [n, pos0] : {std::pair<int64_t, int64_t>{1, 4095}, {13, 30}, {5, 0}, {40, 7}}) {
    Rings rings = k.random_rings();
    const auto kv = random_floats(size_t(n * k.d), k.rng, -3.0f, 3.0f);
    std::vector<float> kv_cpu = kv;
    k.cpu.kv_finish(kv_cpu.data(), k.gamma, n, k.d, k.nope, pos0, RopeKind::kCompressed, true, k.slots,
                    rings.host.data());
    k.ops.kv_finish(to_device(k.ops, kv), k.gamma, n, k.d, k.nope, pos0, RopeKind::kCompressed, true, k.slots,
                    rings.dev);
    k.expect_rings_match(rings, cat("kv_finish n=", n, " pos0=", pos0));
  }
#endif
}

// query_kv_finish (CUDA: one launch, the query heads' norm_rope blocks — from kQueryWarpMinTokens tokens a warp
// a row — then kv_finish's) against the CPU's norm_rope and kv_finish: the query heads as NormRopeMatchesCpu
// (normed channels bit-identical, rope channels 1e-6), the ring as KvFinishMatchesCpu; odd head counts, a row, a
// wrap of the ring, position 0, V4's 64 heads at prefill sizes. Also in fast numerics (the query norm in bf16
// arithmetic, every output rounded to bf16): the same bits where the rotation's fp64 sin/cos round alike on both
// sides; where they do not (rare) a rope channel's bf16 rounding may flip: one bf16 step, up to 2^-7 of the value.
TEST(CudaNormRope, QueryKvFinishMatchesCpu) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  SCOPED_TRACE(seed());
  KvRows k;
  struct Case {
    int64_t n, pos0, heads;
  };
  for (const Numerics numerics : {Numerics::kReference, Numerics::kFast})
  for (const Case& c : {Case{1, 4095, 64}, Case{13, 30, 3}, Case{5, 0, 1}, Case{40, 7, 5}, Case{24, 100, 64}}) {
    k.ops.set_numerics(numerics);
    k.cpu.set_numerics(numerics);
    const bool fast = numerics == Numerics::kFast;
    Rings rings = k.random_rings();
    const auto q = random_floats(size_t(c.n * c.heads * k.d), k.rng, -3.0f, 3.0f);
    const auto kv = random_floats(size_t(c.n * k.d), k.rng, -3.0f, 3.0f);
    std::vector<float> q_cpu = q, kv_cpu = kv;
    const QueryKvParams cpu_p{q_cpu.data(), c.heads, kv_cpu.data(), &k.gamma, c.n, k.d, k.nope, c.pos0,
                              RopeKind::kPlain, true, k.slots, rings.host.data()};
    k.cpu.query_kv_finish({&cpu_p, 1});
    float* dq = to_device(k.ops, q);
    const QueryKvParams gpu_p{dq, c.heads, to_device(k.ops, kv), &k.gamma, c.n, k.d, k.nope, c.pos0,
                              RopeKind::kPlain, true, k.slots, rings.dev};
    k.ops.query_kv_finish({&gpu_p, 1});
    const std::string what = cat("query_kv_finish n=", c.n, " pos0=", c.pos0, " heads=", c.heads, fast ? " fast" : "");
    expect_rows_match(to_host(k.ops, dq, q.size()), q_cpu, c.n * c.heads, k.d, k.nope, what + " q",
                      fast ? Tolerance{0.0, 0x1p-7} : Tolerance{1e-6, 0.0});
    k.expect_rings_match(rings, what + " ring");
    if (!fast) continue;
    // The query heads as bf16 rows (QueryKvParams::q_bf16, fast numerics' prefill): the CPU's values from the same
    // bf16 input, within the same bound; the ring as above.
    Rings rings_b = k.random_rings();
    std::vector<uint16_t> bits(q.size());
    std::vector<float> qb_cpu(q.size());
    for (size_t i = 0; i < q.size(); ++i) {
      bits[i] = f32_to_bf16(q[i]);
      qb_cpu[i] = bf16_to_f32(bits[i]);
    }
    std::vector<float> kvb_cpu = kv, words(bits.size() / 2);
    std::memcpy(words.data(), bits.data(), bits.size() * sizeof(uint16_t));
    QueryKvParams cpu_b{qb_cpu.data(), c.heads, kvb_cpu.data(), &k.gamma, c.n, k.d, k.nope, c.pos0,
                        RopeKind::kPlain, true, k.slots, rings_b.host.data()};
    k.cpu.query_kv_finish({&cpu_b, 1});
    QueryKvParams gpu_b{nullptr, c.heads, to_device(k.ops, kv), &k.gamma, c.n, k.d, k.nope, c.pos0,
                        RopeKind::kPlain, true, k.slots, rings_b.dev};
    gpu_b.q_bf16 = reinterpret_cast<uint16_t*>(to_device(k.ops, words));
    k.ops.query_kv_finish({&gpu_b, 1});
    const std::vector<float> got_words = to_host(k.ops, reinterpret_cast<float*>(gpu_b.q_bf16), words.size());
    std::vector<uint16_t> got_bits(bits.size());
    std::memcpy(got_bits.data(), got_words.data(), got_bits.size() * sizeof(uint16_t));
    std::vector<float> got(q.size());
    for (size_t i = 0; i < got.size(); ++i) got[i] = bf16_to_f32(got_bits[i]);
    expect_rows_match(got, qb_cpu, c.n * c.heads, k.d, k.nope, what + " bf16 q", Tolerance{0.0, 0x1p-7});
    k.expect_rings_match(rings_b, what + " bf16 q: ring");
  }
#endif
}

// query_kv_finish over a batch of sequences in one call, as the forward's steps make it: per sequence its own
// q, kv rows and ring, at its own position (decode rows, a prefill chunk, a wrap of the ring, position 0), 70
// sequences (more than one launch's 64); each sequence as in QueryKvFinishMatchesCpu.
TEST(CudaNormRope, QueryKvFinishBatchMatchesCpu) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  SCOPED_TRACE(seed());
  KvRows k;
  for (const int64_t heads : {int64_t(5), int64_t(64)}) {
    struct Sequence {
      Rings rings;
      std::vector<float> q, q_cpu, kv_cpu;
      float* dq;
      int64_t n, pos0;
    };
    std::vector<Sequence> seqs;
    std::vector<QueryKvParams> on_cpu, on_gpu;
    for (int i = 0; i < 70; ++i) {
      const int64_t n = i % 9 == 4 ? 40 : i % 9 == 7 ? 13 : 1, pos0 = i == 0 ? 0 : 4095 + 311 * i;
      Sequence sq{k.random_rings(), random_floats(size_t(n * heads * k.d), k.rng, -3.0f, 3.0f), {}, {}, nullptr, n, pos0};
      const auto kv = random_floats(size_t(n * k.d), k.rng, -3.0f, 3.0f);
      sq.q_cpu = sq.q;
      sq.kv_cpu = kv;
      sq.dq = to_device(k.ops, sq.q);
      on_gpu.push_back({sq.dq, heads, to_device(k.ops, kv), &k.gamma, n, k.d, k.nope, pos0, RopeKind::kPlain, true,
                        k.slots, sq.rings.dev});
      seqs.push_back(std::move(sq));
    }
    for (Sequence& sq : seqs)
      on_cpu.push_back({sq.q_cpu.data(), heads, sq.kv_cpu.data(), &k.gamma, sq.n, k.d, k.nope, sq.pos0,
                        RopeKind::kPlain, true, k.slots, sq.rings.host.data()});
    k.cpu.query_kv_finish(on_cpu);
    k.ops.query_kv_finish(on_gpu);
    for (const Sequence& sq : seqs) {
      const std::string what = cat("batched query_kv_finish n=", sq.n, " pos0=", sq.pos0, " heads=", heads);
      expect_rows_match(to_host(k.ops, sq.dq, sq.q.size()), sq.q_cpu, sq.n * heads, k.d, k.nope, what + " q");
      k.expect_rings_match(sq.rings, what + " ring");
    }
  }
#endif
}

}  // namespace
}  // namespace dsv4::test
