// attention family: the CUDA attention, indexer_topk and compressor against the CPU reference (CpuOps), on
// fresh random inputs with odd sizes and the V4-Flash sizes, outputs poisoned before every call; in reference
// numerics, and in fast numerics (both backends set_numerics(kFast), bf16-valued inputs as the model feeds them).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <tuple>

#include "core/dtype.h"
#include "cuda/gpu.h"

#if DSV4_HAVE_CUDA
#include "cuda/attention/attention.h"
#include "cuda/common/check.h"
#endif

namespace dsv4::test {
namespace {

#if DSV4_HAVE_CUDA
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// A seed per case: fresh each run (DSV4_TEST_SEED replays), different for every case of a run.
uint64_t case_seed(const std::string& name) { return seed() ^ std::hash<std::string>{}(name); }

ModelConfig attention_config(int64_t dim) {
  ModelConfig c;
  c.dim = dim;
  c.rope_dim = 64;
  c.norm_eps = 1e-6;
  c.compress_rope_theta = 160000.0;
  c.yarn = {true, 16.0, 65536, 32.0, 1.0};
  return c;
}

// Fast numerics: the seam's activations are bf16 values (fast-numerics.md §7).
void to_bf16(std::vector<float>& v) { round_bf16(v.data(), v.size()); }

// Fast numerics' precision: bf16 keeps 8 significant bits, so one rounding moves a value by at most 2^-8 of
// it, and two neighbouring bf16 values are at most 2^-7 of either apart (one ulp). When the two backends'
// fp32 values before a rounding differ by summation order, the rounding flips now and then: one ulp, the
// irreducible difference.
constexpr double kBf16Ulp = 0x1p-7;

// Whether v is a bf16 value (fast numerics write bf16 outputs).
bool is_bf16(float v) { return std::isnan(v) || round_bf16(v) == v; }

// Outputs that fast numerics round to bf16 against the CPU's: NaN positions equal, every output a bf16 value,
// max |got − want| ≤ bound · max |want|, and (min_equal > 0) at least that fraction of the outputs
// bit-identical — the rounding points line up, only flips differ. One flip is always allowed: a comparison of a
// few dozen values (a compressor's single entry) cannot hold a 1% share, and a flip is a rare event that any
// seed may meet (CudaCompressor.FastNumericsPoolingMatchesCpuStepByStep failed so once).
::testing::AssertionResult compare_fast(const std::vector<float>& got, const std::vector<float>& want, double bound,
                                        double min_equal, const std::string& what) {
  double big = 0.0;
  size_t equal = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) != std::isnan(want[i]))
      return ::testing::AssertionFailure() << what << ": NaN mismatch at " << i << ": got " << got[i] << ", want "
                                           << want[i];
    if (!is_bf16(got[i])) return ::testing::AssertionFailure() << what << ": output " << i << " = " << got[i]
                                                               << " is not a bf16 value";
    if (!std::isnan(want[i])) big = std::max(big, std::fabs(double(want[i])));
    equal += got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i]));
  }
  const Diff d = diff(got.data(), want.data(), got.size());
  const double frac = got.empty() ? 1.0 : double(equal) / double(got.size());
  std::printf("  %-44s max |diff| %.3g = %.3g of max |want|, %.4f bit-identical\n", what.c_str(), d.max_abs,
              big > 0 ? d.max_abs / big : 0.0, frac);
  const double unequal = double(got.size() - equal);
  if (d.max_abs > bound * big || unequal > std::max(1.0, (1.0 - min_equal) * double(got.size())))
    return ::testing::AssertionFailure() << what << ": max |diff| " << d.max_abs << " (bound " << bound * big
                                         << "), " << frac << " bit-identical (need " << min_equal << "); worst element "
                                         << d.worst << ": got " << got[d.worst] << ", want " << want[d.worst];
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------------------------------------
// attention

enum class Layer { kSliding, kCsa, kHca };

struct AttnCase {
  std::string name;
  Layer layer;
  int64_t heads, head_dim, window, n, pos0;
  int64_t ratio = 4, top_k = 0;
  int64_t extra_ring = 0;  // ring slots beyond window + n − 1 (they hold positions no query sees: NaN)
  bool compact = false;    // window and entries in compact FP8 caches (reference numerics), from simulated rows
  bool derotate = false;   // the output's rope channels turned back at the query position (compressed RoPE)
};

// Tolerance: fp32 against fp32 with another summation order. The CPU's sequential 512-term dot carries
// ≈ ε·√(Σ partial²) ≈ 2e-5 of rounding noise (|q| ≤ 2, |k| ≤ 1), i.e. ≈ 1e-6 per logit after the scale; the
// softmax weights inherit it relatively and the output, a weighted mean of |k| ≤ 1 values accumulated over
// ≤ 1200 keys, differs by a few 1e-6. 1e-5 absolute + 1e-5 relative leaves a margin of ~3×.
constexpr Tolerance kAttnTol{1e-5, 1e-5};

// Fast numerics (bf16 q and keys; P rounded to bf16 for P·V, the output rounded to bf16): both backends round
// P = 2^(u − M) against an integer M, so they round the same values whatever their tiles and splits; they differ
// by fp32 summation order alone (above, ≈ 1e-6 relative: the tensor-core kernel sums q·k in its MMAs' order),
// which flips a bf16 rounding of a P or of an output now and then: one ulp (≤ 2^-7 of the value), two where a
// P's flip adds to an output's. max |diff| ≤ 2 · 2^-7 · max |cpu|. Derotated rope channels rotate two such
// channels (|Δ| ≤ √2 · 2^-6 of max) and round once more (2^-7): 2^-5. And ≥ 95% of the outputs must be
// bit-identical: the rounding points line up (measured, 2026-11-27: ≥ 99% on every case).
constexpr double kFastAttnBound = 2 * kBf16Ulp, kFastDerotatedBound = 4 * kBf16Ulp, kFastAttnEqual = 0.95;

// One sequence's inputs and the CPU's output (check_attention_batch).
struct AttnSequence {
  std::vector<float> q, window, entries, want;
  std::vector<int32_t> selected;
  int64_t n_entries = 0;
};

// A batch of sequences through one CudaOps::attention call against the CPU's, sequence by sequence. The
// sequences share the layer (type, heads, head_dim, window, ratio, top_k, caches' format, derotation: the first
// case's) and differ in positions, rows and contents; each has its own q, ring, entries, selection and output
// buffers. With more than one sequence the batch at one split must also equal each sequence run alone, bit for
// bit (the same blocks compute the same rows).
// kernel: where set, the kernel the batch must run on (cuda::attention_kernel).
void check_attention_batch(const std::vector<AttnCase>& cases, Numerics numerics = Numerics::kReference,
                           const char* kernel = nullptr) {
  const AttnCase& c0 = cases[0];
  std::string name = c0.name;
  for (size_t i = 1; i < cases.size(); ++i) name += "+" + cases[i].name;
  SCOPED_TRACE(name + " seed " + std::to_string(seed()));
  std::mt19937_64 rng(case_seed(name));
  const bool fast = numerics == Numerics::kFast;
  const int64_t H = c0.heads, d = c0.head_dim;
  int64_t max_n = 0;
  for (const AttnCase& c : cases) max_n = std::max(max_n, c.n);
  const int64_t ring = c0.window + max_n - 1 + c0.extra_ring;
  const bool compressed = c0.layer != Layer::kSliding;
  ModelConfig config = attention_config(64);
  std::vector<float> sinks = random_floats(size_t(H), rng, -1.0f, 2.0f);

  AttentionParams p;
  p.ring_slots = ring;
  p.window_size = c0.window;
  p.top_k = c0.top_k;
  p.ratio = c0.ratio;
  p.heads = H;
  p.head_dim = d;
  p.scale = float(1.0 / std::sqrt(double(d)));
  p.sinks = sinks.data();  // host address: the CUDA backend looks its uploaded copy up
  p.derotate = c0.derotate;
  p.rope = RopeKind::kCompressed;

  CpuOps cpu(config);
  cpu.set_numerics(numerics);
  std::vector<AttnSequence> seqs(cases.size());
  std::vector<AttentionParams> on_cpu;
  for (size_t si = 0; si < cases.size(); ++si) {
    const AttnCase& c = cases[si];
    AttnSequence& sq = seqs[si];
    const int64_t last = c.pos0 + c.n - 1, visible_max = (last + 1) / c0.ratio;
    sq.q = random_floats(size_t(c.n * H * d), rng, -2.0f, 2.0f);
    sq.window = random_floats(size_t(ring * d), rng);
    if (fast) {
      to_bf16(sq.q);
      to_bf16(sq.window);
    }
    // Ring slots of positions no query of the step can see must never be read.
    std::vector<bool> seen(size_t(ring), false);
    for (int64_t pos = std::max<int64_t>(0, c.pos0 - c0.window + 1); pos <= last; ++pos) seen[size_t(pos % ring)] = true;
    for (int64_t s = 0; s < ring; ++s)
      if (!seen[size_t(s)]) std::fill_n(sq.window.begin() + s * d, d, kNaN);
    // Entries past the last visible one must never be read either.
    sq.n_entries = visible_max + 3;
    sq.entries = random_floats(size_t(sq.n_entries * d), rng);
    if (fast) to_bf16(sq.entries);
    std::fill(sq.entries.begin() + visible_max * d, sq.entries.end(), kNaN);
    if (c0.layer == Layer::kCsa) {
      sq.selected.assign(size_t(c.n * c0.top_k), -1);
      std::vector<int32_t> ids;
      for (int64_t i = 0; i < c.n; ++i) {
        const int64_t visible = (c.pos0 + i + 1) / c0.ratio, k = std::min(c0.top_k, visible);
        ids.resize(size_t(visible));
        std::iota(ids.begin(), ids.end(), 0);
        for (int64_t j = 0; j < k; ++j) std::swap(ids[size_t(j)], ids[size_t(j + int64_t(rng() % uint64_t(visible - j)))]);
        for (int64_t j = 0; j < k; ++j)  // ~5% masked slots inside the list too
          sq.selected[size_t(i * c0.top_k + j)] = rng() % 20 == 0 ? -1 : ids[size_t(j)];
      }
    }
    if (c0.compact) {  // what the model stores in reference and fast numerics: e4m3 non-rope channels
      cpu.sim_fp8(sq.window.data(), ring, d, d - config.rope_dim, 64);
      cpu.sim_fp8(sq.entries.data(), sq.n_entries, d, d - config.rope_dim, 64);
    }
    sq.want.assign(size_t(c.n * H * d), kNaN);
    AttentionParams pc = p;
    pc.pos0 = c.pos0;
    pc.n = c.n;
    pc.q = sq.q.data();
    pc.window = sq.window.data();
    pc.entries = compressed ? sq.entries.data() : nullptr;
    pc.selected = c0.layer == Layer::kCsa ? sq.selected.data() : nullptr;
    pc.out = sq.want.data();
    on_cpu.push_back(pc);
  }
  cpu.attention(on_cpu);
  // bf16 bits of bf16-valued rows (fast numerics' query heads).
  const auto bf16_bits = [](const std::vector<float>& x) {
    std::vector<uint16_t> bits(x.size());
    for (size_t i = 0; i < x.size(); ++i) bits[i] = f32_to_bf16(x[i]);
    return bits;
  };
  if (fast) {  // the CPU reading q and writing the output as bf16 (AttentionParams::q_bf16, out_bf16): its fp32
               // output rounded, after the derotation
    std::vector<std::vector<uint16_t>> bits(cases.size()), q_bits(cases.size());
    std::vector<AttentionParams> as_bf16 = on_cpu;
    for (size_t si = 0; si < cases.size(); ++si) {
      bits[si].assign(seqs[si].want.size(), 0xFFFF);
      q_bits[si] = bf16_bits(seqs[si].q);
      as_bf16[si].q = nullptr;
      as_bf16[si].q_bf16 = q_bits[si].data();
      as_bf16[si].out = nullptr;
      as_bf16[si].out_bf16 = bits[si].data();
    }
    cpu.attention(as_bf16);
    for (size_t si = 0; si < cases.size(); ++si) {
      size_t unequal = 0;
      for (size_t i = 0; i < bits[si].size(); ++i) unequal += bits[si][i] != f32_to_bf16(seqs[si].want[i]);
      EXPECT_EQ(unequal, 0u) << cases[si].name << ": the CPU's bf16 outputs are not its fp32 call's values";
    }
  }

  CudaOps gpu(config);
  gpu.set_numerics(numerics);
  gpu.upload(sinks);
  std::vector<AttentionParams> on_gpu;
  for (size_t si = 0; si < cases.size(); ++si) {
    const AttnCase& c = cases[si];
    AttnSequence& sq = seqs[si];
    AttentionParams pg = on_cpu[si];
    pg.q = to_device(gpu, sq.q);
    if (c0.compact) {
      float* compact_window = gpu.alloc_cache(CacheFormat::kFp8Kv, ring, d);
      gpu.write_cache(compact_window, ring, d, sq.window.data());
      pg.window = compact_window;
      if (compressed) {
        float* compact_entries = gpu.alloc_cache(CacheFormat::kFp8Kv, sq.n_entries, d);
        gpu.write_cache(compact_entries, sq.n_entries, d, sq.entries.data());
        pg.entries = compact_entries;
      }
    } else {
      pg.window = to_device(gpu, sq.window);
      pg.entries = compressed ? to_device(gpu, sq.entries) : nullptr;
    }
    pg.selected = c0.layer == Layer::kCsa ? to_device(gpu, sq.selected) : nullptr;
    pg.out = gpu.alloc(size_t(c.n * H * d));
    on_gpu.push_back(pg);
  }
  const auto outputs = [&] {
    std::vector<std::vector<float>> got;
    for (size_t si = 0; si < cases.size(); ++si) got.push_back(to_host(gpu, on_gpu[si].out, seqs[si].want.size()));
    return got;
  };
  // 0 = CudaOps::attention's own choice; 1 = the prefill path (no combine); others force split-KV (the
  // tensor-core kernel's splits hold whole 64-key tiles, so fewer where the keys are few; 64 and 100: the
  // combine's loads in several rounds of kCombineBatch). The warpgroup-MMA kernel merges up to kWgMaxSplits
  // splits in a cluster: 2, 3, 5 and 8 there; 64 goes to the mma.sync kernel's 64-head blocks and the combine.
  std::vector<int> split_counts = {0, 1, 3, 64, 100};
  if (kernel) {
    EXPECT_STREQ(cuda::attention_kernel(gpu, on_gpu), kernel);
    if (std::strcmp(kernel, "wg") == 0) split_counts = {0, 1, 2, 3, 5, 8, 64};
  }
  const int default_splits = cuda::attention_default_splits(gpu, on_gpu);
  for (int splits : split_counts) {
    SCOPED_TRACE("splits " + std::to_string(splits) + " (default " + std::to_string(default_splits) +
                 "; tensor-core kernels: whole 64-key tiles a split, so fewer where the keys are few)");
    for (size_t si = 0; si < cases.size(); ++si) poison(on_gpu[si].out, seqs[si].want.size());
    if (splits == 0) gpu.attention(on_gpu);
    else cuda::attention_split_kv(gpu, on_gpu, splits);
    const std::vector<std::vector<float>> got = outputs();
    for (size_t si = 0; si < cases.size(); ++si) {
      const AttnCase& c = cases[si];
      const std::vector<float>& want = seqs[si].want;
      const std::string what = "[attention] " + c.name + " splits " + std::to_string(splits);
      if (fast) {
        EXPECT_TRUE(compare_fast(got[si], want, c0.derotate ? kFastDerotatedBound : kFastAttnBound, kFastAttnEqual,
                                 what));
        continue;
      }
      const Diff dd = diff(got[si].data(), want.data(), got[si].size());
      std::printf("%-46s: max |diff| %.3g at %zu, cosine %.9f\n", what.c_str(), dd.max_abs, dd.worst, dd.cosine);
      EXPECT_TRUE(compare(got[si], want, kAttnTol, c.name));
    }
    if (fast) {  // the same call reading q and writing the output as bf16 (AttentionParams::q_bf16, out_bf16): the
                 // same values, as bf16 bits
      std::vector<AttentionParams> as_bf16 = on_gpu;
      std::vector<Bf16Rows> rows;
      for (size_t si = 0; si < cases.size(); ++si) {
        const int64_t count = int64_t(seqs[si].want.size());
        rows.push_back(gpu.alloc_bf16(cases[si].n, H * d));
        poison(reinterpret_cast<float*>(rows.back().data), size_t(count / 2));
        as_bf16[si].out = nullptr;
        as_bf16[si].out_bf16 = rows.back().data;
        const std::vector<uint16_t> q_bits = bf16_bits(seqs[si].q);
        std::vector<float> q_words(q_bits.size() / 2);
        std::memcpy(q_words.data(), q_bits.data(), q_bits.size() * sizeof(uint16_t));
        as_bf16[si].q = nullptr;
        as_bf16[si].q_bf16 = reinterpret_cast<const uint16_t*>(to_device(gpu, q_words));
      }
      if (splits == 0) gpu.attention(as_bf16);
      else cuda::attention_split_kv(gpu, as_bf16, splits);
      for (size_t si = 0; si < cases.size(); ++si) {
        const std::vector<float> words = to_host(gpu, reinterpret_cast<float*>(rows[si].data), got[si].size() / 2);
        std::vector<uint16_t> bits(got[si].size());
        std::memcpy(bits.data(), words.data(), bits.size() * sizeof(uint16_t));
        size_t unequal = 0;
        for (size_t i = 0; i < bits.size(); ++i) unequal += bits[i] != f32_to_bf16(got[si][i]);
        EXPECT_EQ(unequal, 0u) << cases[si].name << ": bf16 outputs that are not the fp32 call's values";
      }
    }
    if (splits == 1 && cases.size() > 1) {
      for (size_t si = 0; si < cases.size(); ++si) {
        poison(on_gpu[si].out, seqs[si].want.size());
        cuda::attention_split_kv(gpu, std::span<const AttentionParams>(&on_gpu[si], 1), 1);
      }
      const std::vector<std::vector<float>> alone = outputs();
      for (size_t si = 0; si < cases.size(); ++si)
        EXPECT_TRUE(alone[si] == got[si]) << cases[si].name << ": the batch differs from the sequence alone";
    }
  }
}

void check_attention(const AttnCase& c, Numerics numerics = Numerics::kReference) {
  check_attention_batch({c}, numerics);
}

#endif  // DSV4_HAVE_CUDA

TEST(CudaAttention, OddSizes) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  const std::vector<AttnCase> cases = {
      {"sliding_h3_d64_w5_n1_pos0", Layer::kSliding, 3, 64, 5, 1, 0},
      {"sliding_h3_d64_w5_n7_pos1000", Layer::kSliding, 3, 64, 5, 7, 1000, 4, 0, 3},
      {"sliding_h3_d100_w5_n33_pos2", Layer::kSliding, 3, 100, 5, 33, 2},
      {"csa_h3_d128_w5_n7_pos0", Layer::kCsa, 3, 128, 5, 7, 0, 4, 7},
      {"csa_h3_d512_w5_n33_pos5000", Layer::kCsa, 3, 512, 5, 33, 5000, 4, 19, 2},
      {"csa_h17_d64_w5_n1_pos77", Layer::kCsa, 17, 64, 5, 1, 77, 4, 33},
      {"hca_h19_d192_w5_n33_pos0_ratio4", Layer::kHca, 19, 192, 5, 33, 0, 4},
      {"hca_h19_d68_w5_n7_pos3000_ratio128", Layer::kHca, 19, 68, 5, 7, 3000, 128},
      {"hca_h5_d256_w5_n1_pos100000_ratio128", Layer::kHca, 5, 256, 5, 1, 100000, 128},
  };
  for (const AttnCase& c : cases) check_attention(c);
#endif
}

TEST(CudaAttention, V4FlashDecode) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  const std::vector<AttnCase> cases = {
      {"v4_csa_decode_32k", Layer::kCsa, 64, 512, 128, 1, 32767, 4, 512},
      {"v4_hca_decode_32k", Layer::kHca, 64, 512, 128, 1, 32767, 128},
      {"v4_csa_decode_128k", Layer::kCsa, 64, 512, 128, 1, 131071, 4, 512},
      {"v4_hca_decode_128k", Layer::kHca, 64, 512, 128, 1, 131071, 128},
      {"v4_sliding_decode_n2_mtp", Layer::kSliding, 64, 512, 128, 2, 9000},
  };
  for (const AttnCase& c : cases) check_attention(c);
#endif
}

// Reference numerics store window and compressed KV as e4m3 + E8M0 per 64 (rope channels fp32): attention over
// the compact caches must match the CPU's over the simulated fp32 rows, odd sizes (a partial scale block) and
// V4-Flash sizes.
TEST(CudaAttention, CompactFp8Caches) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  const std::vector<AttnCase> cases = {
      {"compact_sliding_h3_d100_w5_n7_pos1000", Layer::kSliding, 3, 100, 5, 7, 1000, 4, 0, 3, true},
      {"compact_csa_h17_d192_w5_n33_pos77", Layer::kCsa, 17, 192, 5, 33, 77, 4, 19, 0, true},
      {"compact_hca_h5_d68_w5_n1_pos100000", Layer::kHca, 5, 68, 5, 1, 100000, 128, 0, 0, true},
      {"compact_v4_csa_decode_32k", Layer::kCsa, 64, 512, 128, 1, 32767, 4, 512, 0, true},
      {"compact_v4_hca_decode_128k", Layer::kHca, 64, 512, 128, 1, 131071, 128, 0, 0, true},
      {"compact_v4_csa_prefill_n33_pos4000", Layer::kCsa, 64, 512, 128, 33, 4000, 4, 512, 0, true},
  };
  for (const AttnCase& c : cases) check_attention(c);
#endif
}

// The output's de-rotation (AttentionParams::derotate) in the kernels' last write: the prefill path (no
// combine) and split-KV (the combine writes), against the CPU's attention followed by its inverse rope. The
// rotation adds at most the sin/cos last-bit difference of test_norm_rope (≤ 2.4e-7): within kAttnTol.
TEST(CudaAttention, DerotatedOutput) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  const std::vector<AttnCase> cases = {
      {"derotate_sliding_h3_d68_w5_n7_pos1000", Layer::kSliding, 3, 68, 5, 7, 1000, 4, 0, 0, false, true},
      {"derotate_compact_csa_h17_d192_w5_n33_pos77", Layer::kCsa, 17, 192, 5, 33, 77, 4, 19, 0, true, true},
      {"derotate_compact_v4_hca_decode_128k", Layer::kHca, 64, 512, 128, 1, 131071, 128, 0, 0, true, true},
  };
  for (const AttnCase& c : cases) check_attention(c);
#endif
}

TEST(CudaAttention, V4FlashPrefillChunks) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  const std::vector<AttnCase> cases = {
      {"v4_csa_prefill_n33_pos4000", Layer::kCsa, 64, 512, 128, 33, 4000, 4, 512},
      {"v4_hca_prefill_n64_pos0", Layer::kHca, 64, 512, 128, 64, 0, 128},
      {"v4_hca_prefill_n7_pos20000", Layer::kHca, 64, 512, 128, 7, 20000, 128},
  };
  for (const AttnCase& c : cases) check_attention(c);
#endif
}

// Fast numerics (kFastAttnBound above): odd sizes, V4-Flash decode and prefill, the derotated output on both
// write paths; fp32 rows (attn_split_kernel) and compact FP8 caches (the tensor-core kernel where the head_dim
// is a multiple of 64: partial row tiles of heads, d / 64 odd, two head groups, partial key tiles).
TEST(CudaAttention, FastNumerics) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  const std::vector<AttnCase> cases = {
      {"fast_sliding_h3_d64_w5_n7_pos1000", Layer::kSliding, 3, 64, 5, 7, 1000, 4, 0, 3},
      {"fast_csa_h17_d64_w5_n1_pos77", Layer::kCsa, 17, 64, 5, 1, 77, 4, 33},
      {"fast_csa_h3_d512_w5_n33_pos5000", Layer::kCsa, 3, 512, 5, 33, 5000, 4, 19, 2},
      {"fast_hca_h19_d68_w5_n7_pos3000_ratio128", Layer::kHca, 19, 68, 5, 7, 3000, 128},
      {"fast_hca_h19_d192_w5_n33_pos0_ratio4", Layer::kHca, 19, 192, 5, 33, 0, 4},
      {"fast_v4_csa_decode_32k", Layer::kCsa, 64, 512, 128, 1, 32767, 4, 512},
      {"fast_v4_hca_decode_128k", Layer::kHca, 64, 512, 128, 1, 131071, 128},
      {"fast_v4_sliding_decode_n2_mtp", Layer::kSliding, 64, 512, 128, 2, 9000},
      {"fast_v4_csa_prefill_n33_pos4000", Layer::kCsa, 64, 512, 128, 33, 4000, 4, 512},
      {"fast_compact_csa_h17_d192_w5_n33_pos77", Layer::kCsa, 17, 192, 5, 33, 77, 4, 19, 0, true},
      {"fast_compact_v4_csa_decode_32k", Layer::kCsa, 64, 512, 128, 1, 32767, 4, 512, 0, true},
      {"fast_derotate_sliding_h3_d68_w5_n7_pos1000", Layer::kSliding, 3, 68, 5, 7, 1000, 4, 0, 0, false, true},
      {"fast_derotate_compact_csa_h17_d192_w5_n33_pos77", Layer::kCsa, 17, 192, 5, 33, 77, 4, 19, 0, true, true},
      {"fast_derotate_compact_v4_hca_decode_128k", Layer::kHca, 64, 512, 128, 1, 131071, 128, 0, 0, true, true},
      {"fast_compact_v4_csa_prefill_n33_pos4000", Layer::kCsa, 64, 512, 128, 33, 4000, 4, 512, 0, true},
      {"fast_compact_hca_h19_d192_w5_n33_pos0", Layer::kHca, 19, 192, 5, 33, 0, 4, 0, 0, true},
      {"fast_compact_sliding_h4_d128_w37_n70_pos3", Layer::kSliding, 4, 128, 37, 70, 3, 4, 0, 5, true, true},
      {"fast_compact_csa_h3_d512_w5_n1_pos300", Layer::kCsa, 3, 512, 5, 1, 300, 4, 71, 0, true},
      {"fast_compact_pro_sliding_h128_d512_w128_n3_pos700", Layer::kSliding, 128, 512, 128, 3, 700, 4, 0, 0, true, true},
      {"fast_compact_hca_h80_d128_w5_n9_pos9000_ratio128", Layer::kHca, 80, 128, 5, 9, 9000, 128, 0, 0, true},
      {"fast_compact_csa_h33_d256_w9_n5_pos1500", Layer::kCsa, 33, 256, 9, 5, 1500, 4, 40, 0, true, true},
      // 64-head blocks on 100 heads (the second group 36 heads: 3 row tiles, the last partial), d = 512.
      {"fast_compact_csa_h100_d512_w9_n40_pos3000", Layer::kCsa, 100, 512, 9, 40, 3000, 4, 64, 0, true},
      // 16-head blocks over 3 key tiles, split and combined, d = 192 (the odd n-tile's x2 loads).
      {"fast_compact_hca_h17_d192_w5_n1_pos20000_ratio128", Layer::kHca, 17, 192, 5, 1, 20000, 128, 0, 0, true},
  };
  for (const AttnCase& c : cases) check_attention(c, Numerics::kFast);
#endif
}

// The warpgroup-MMA kernel (attention_wg.cu: V4's 64 heads × 512 on Hopper, fast numerics, compact caches),
// checked to be the kernel that runs: a partial first tile (sliding, 1..50 keys), partial last tiles of every
// split, splits merged in a cluster (2..8, some of them empty for the rows with fewer keys), masked selection
// slots, the derotated output, every layer type, 128 heads (two head groups), and the decode rows of many
// sequences at once.
TEST(CudaAttention, WarpgroupKernel) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  {
    ModelConfig config;
    CudaOps ops(config);
    if (ops.props().major != 9)
      GTEST_SKIP() << "the warpgroup-MMA kernel is sm_90a only; this GPU is " << ops.props().name;
  }
  const std::vector<AttnCase> cases = {
      {"wg_sliding_n40_pos10", Layer::kSliding, 64, 512, 128, 40, 10, 4, 0, 3, true, true},
      {"wg_csa_n33_pos4000", Layer::kCsa, 64, 512, 128, 33, 4000, 4, 512, 0, true},
      {"wg_hca_n17_pos9000_ratio128", Layer::kHca, 64, 512, 128, 17, 9000, 128, 0, 0, true, true},
      {"wg_pro_csa_h128_n9_pos1500", Layer::kCsa, 128, 512, 128, 9, 1500, 4, 64, 0, true},
      // 384, 448 and 512 keys: 8 splits asked make clusters of 6, 7 (the merge's largest buffer, heads owned 10 / 9)
      // and 8; 5–6 rows, so that the rows' tiles ask for 64-head blocks (heads_per_block).
      {"wg_csa_topk256_n6_pos9000", Layer::kCsa, 64, 512, 128, 6, 9000, 4, 256, 0, true, true},
      {"wg_csa_topk320_n5_pos9000", Layer::kCsa, 64, 512, 128, 5, 9000, 4, 320, 0, true},
      {"wg_csa_topk384_n5_pos9000", Layer::kCsa, 64, 512, 128, 5, 9000, 4, 384, 0, true},
  };
  for (const AttnCase& c : cases) check_attention_batch({c}, Numerics::kFast, "wg");
  // A cluster of 8 beside a shallow sequence whose rows leave its trailing splits without keys.
  check_attention_batch({{"wg_csa_topk384_deep", Layer::kCsa, 64, 512, 128, 3, 9000, 4, 384, 0, true},
                         {"wg_csa_topk384_shallow", Layer::kCsa, 64, 512, 128, 3, 300, 4, 384, 0, true}},
                        Numerics::kFast, "wg");
  std::vector<AttnCase> decode;  // 12 decode rows of CSA sequences at scattered positions
  for (int i = 0; i < 12; ++i)
    decode.push_back({"wg_csa_decode_" + std::to_string(i), Layer::kCsa, 64, 512, 128, 1, 300 + 2711 * i, 4, 512,
                      0, true, true});
  check_attention_batch(decode, Numerics::kFast, "wg");
#endif
}

// A batch of sequences in one call (the forward's decode and mixed steps): different positions, decode rows and
// prefill chunks side by side, every layer type, compact caches, both numerics; more sequences than one launch
// holds (64) and a batch whose rows fill more than one wave.
TEST(CudaAttention, BatchOfSequences) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  check_attention_batch({{"b_sliding_n1_pos0", Layer::kSliding, 3, 64, 5, 1, 0},
                         {"b_sliding_n7_pos1000", Layer::kSliding, 3, 64, 5, 7, 1000},
                         {"b_sliding_n1_pos3", Layer::kSliding, 3, 64, 5, 1, 3}});
  check_attention_batch({{"b_csa_n1_pos77", Layer::kCsa, 17, 192, 5, 1, 77, 4, 19, 0, true},
                         {"b_csa_n33_pos4000", Layer::kCsa, 17, 192, 5, 33, 4000, 4, 19, 0, true},
                         {"b_csa_n1_pos5", Layer::kCsa, 17, 192, 5, 1, 5, 4, 19, 0, true}});
  check_attention_batch({{"b_hca_n7_pos3000", Layer::kHca, 19, 68, 5, 7, 3000, 128, 0, 0, false, true},
                         {"b_hca_n1_pos100000", Layer::kHca, 19, 68, 5, 1, 100000, 128, 0, 0, false, true}});
  for (const Numerics numerics : {Numerics::kReference, Numerics::kFast}) {
    std::vector<AttnCase> decode;  // V4-Flash CSA decode, 70 sequences at scattered positions
    for (int i = 0; i < 70; ++i)
      decode.push_back({"v4_csa_decode_" + std::to_string(i), Layer::kCsa, 64, 512, 128, 1, 37 + 97 * i, 4, 512,
                        0, true, true});
    check_attention_batch(decode, numerics);
  }
  check_attention_batch({{"fast_b_hca_n1_pos9000", Layer::kHca, 64, 512, 128, 1, 9000, 128, 0, 0, true, true},
                         {"fast_b_hca_n33_pos400", Layer::kHca, 64, 512, 128, 33, 400, 128, 0, 0, true, true}},
                        Numerics::kFast);
#endif
}

#if DSV4_HAVE_CUDA
// ---------------------------------------------------------------------------------------------------------
// indexer_topk: the CUDA scores are bit-identical to the CPU's (same order and roundings), so the selection
// must equal the CPU's exactly, order included, ties and all. That holds in fast numerics too: both round the
// same fp32 values at the same points (each head's dot, each weighted term, the head sum), so the bf16 scores
// are bit-identical and their frequent exact ties (a few hundred distinct values among thousands of entries)
// resolve by the same rule, the lower entry index first. No allowance for near-ties at the k-th boundary is
// needed: a selection that differs anywhere is a rounding point or a tie rule out of line with the CPU's.

enum class Keys { kRandom, kAllZeroScores, kDuplicateRows, kOneBin };

struct IndexerCase {
  std::string name;
  int64_t heads, head_dim, ratio, top_k, n, pos0;
  Keys keys = Keys::kRandom;
  bool compact = false;  // keys in a compact FP4 cache, queries and keys Hadamard-FP4 simulated (as the model)
  bool fast = false;     // fast numerics: bf16 queries, weights and keys, bf16 scores
};

// On `shared` when given (one CudaOps across calls: its workspaces carry over), else on a fresh CudaOps.
void check_indexer(const IndexerCase& c, CudaOps* shared = nullptr) {
  SCOPED_TRACE(c.name + " seed " + std::to_string(seed()));
  std::mt19937_64 rng(case_seed(c.name));
  const int64_t nI = c.heads, dI = c.head_dim, visible_max = (c.pos0 + c.n) / c.ratio;
  const int64_t n_keys = visible_max + 2;
  std::vector<float> q = random_floats(size_t(c.n * nI * dI), rng);
  std::vector<float> weights = random_floats(size_t(c.n * nI), rng, -0.02f, 0.02f);
  std::vector<float> keys = random_floats(size_t(n_keys * dI), rng);
  switch (c.keys) {
    case Keys::kRandom: break;
    case Keys::kAllZeroScores:  // every q·k < 0: relu zeroes every head, all scores tie at 0
      for (float& x : q) x = std::fabs(x) + 0.01f;
      for (float& x : keys) x = -std::fabs(x) - 0.01f;
      break;
    case Keys::kDuplicateRows:  // 37 distinct rows repeated: exact ties at every rank
      for (int64_t e = 37; e < n_keys; ++e)
        std::copy_n(keys.begin() + int64_t(rng() % 37) * dI, dI, keys.begin() + e * dI);
      break;
    case Keys::kOneBin:  // distinct scores that all share their top 11 bits (one radix bin for the whole row)
      for (float& x : q) x = 1.0f;
      for (float& x : weights) x = 0.5f;
      for (float& x : keys) x = 1.0f + 0.001f * std::fabs(x);
      break;
  }
  if (c.fast) {
    to_bf16(q);
    to_bf16(weights);
    to_bf16(keys);
  }
  std::fill(keys.begin() + visible_max * dI, keys.end(), kNaN);  // never visible to any row
  ModelConfig config = attention_config(64);
  const Numerics numerics = c.fast ? Numerics::kFast : Numerics::kReference;
  CpuOps cpu(config);
  cpu.set_numerics(numerics);
  if (c.compact) {  // what the model stores in reference and fast numerics: Hadamard-rotated FP4 queries and keys
    cpu.hadamard_sim_fp4(q.data(), c.n * nI, dI);
    cpu.hadamard_sim_fp4(keys.data(), n_keys, dI);
  }

  IndexerParams p;
  p.pos0 = c.pos0;
  p.n = c.n;
  p.heads = nI;
  p.head_dim = dI;
  p.ratio = c.ratio;
  p.top_k = c.top_k;

  std::vector<int32_t> want(size_t(c.n * c.top_k), 0x7F7F7F7F);
  IndexerParams pc = p;
  pc.q = q.data();
  pc.weights = weights.data();
  pc.keys = keys.data();
  pc.selected = want.data();
  cpu.indexer_topk(std::span<const IndexerParams>(&pc, 1));

  std::unique_ptr<CudaOps> own;
  if (!shared) own = std::make_unique<CudaOps>(config);
  CudaOps& gpu = shared ? *shared : *own;
  gpu.set_numerics(numerics);
  IndexerParams pg = p;
  pg.q = to_device(gpu, q);
  pg.weights = to_device(gpu, weights);
  if (c.compact) {
    float* compact_keys = gpu.alloc_cache(CacheFormat::kFp4Keys, n_keys, dI);
    gpu.write_cache(compact_keys, n_keys, dI, keys.data());
    pg.keys = compact_keys;
  } else {
    pg.keys = to_device(gpu, keys);
  }
  int32_t* sel = gpu.alloc_i32(want.size());
  poison(sel, want.size());
  pg.selected = sel;
  gpu.indexer_topk(std::span<const IndexerParams>(&pg, 1));
  const std::vector<int32_t> got = to_host(gpu, sel, want.size());
  size_t mismatches = 0, first = got.size();
  for (size_t j = 0; j < got.size(); ++j)
    if (got[j] != want[j] && mismatches++ == 0) first = j;
  std::printf("[indexer]   %-34s visible ≤ %lld: %zu of %zu ids differ\n", c.name.c_str(),
              static_cast<long long>(visible_max), mismatches, got.size());
  EXPECT_EQ(mismatches, 0u) << c.name << ": first difference at row " << first / size_t(c.top_k) << " slot "
                            << first % size_t(c.top_k) << ": got " << got[first] << ", want " << want[first];
}

#endif  // DSV4_HAVE_CUDA

TEST(CudaIndexer, OddSizes) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  const std::vector<IndexerCase> cases = {
      {"h3_d64_k7_n1_pos0", 3, 64, 4, 7, 1, 0},
      {"h3_d64_k7_n7_pos0", 3, 64, 4, 7, 7, 0},
      {"h3_d64_k7_n33_pos3000", 3, 64, 4, 7, 33, 3000},
      {"h5_d128_ratio128_k19_n7_pos10000", 5, 128, 128, 19, 7, 10000},
      {"h17_d20_k100_n5_pos390", 17, 20, 4, 100, 5, 390},  // visible 97 .. 98 < top_k: all, sorted
      {"h4_d32_k1500_n2_pos7000", 4, 32, 4, 1500, 2, 7000},  // more winners than select's threads: shared sort
  };
  for (const IndexerCase& c : cases) check_indexer(c);
#endif
}

TEST(CudaIndexer, TiesAndOneBinRows) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  const std::vector<IndexerCase> cases = {
      {"all_zero_scores", 4, 32, 4, 37, 3, 999, Keys::kAllZeroScores},
      {"duplicate_rows", 8, 64, 4, 100, 5, 4000, Keys::kDuplicateRows},
      // 40000 entries in one top-bits bin: more than the shared-memory candidate list holds.
      {"one_bin_40k", 1, 16, 4, 512, 2, 160000, Keys::kOneBin},
      {"all_zero_40k", 2, 16, 4, 512, 2, 160000, Keys::kAllZeroScores},
  };
  for (const IndexerCase& c : cases) check_indexer(c);
#endif
}

// Reference numerics store the indexer keys as FP4 (e2m1 + E8M0 per 32): the selection from the compact cache
// must be the CPU's from the simulated fp32 keys, exactly.
TEST(CudaIndexer, CompactFp4Keys) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  const std::vector<IndexerCase> cases = {
      {"compact_h3_d32_k7_n7_pos0", 3, 32, 4, 7, 7, 0, Keys::kRandom, true},
      {"compact_h5_d64_ratio128_k19_n7_pos10000", 5, 64, 128, 19, 7, 10000, Keys::kRandom, true},
      {"compact_duplicate_rows", 8, 64, 4, 100, 5, 4000, Keys::kDuplicateRows, true},
      {"compact_v4_decode_32k", 64, 128, 4, 512, 1, 32767, Keys::kRandom, true},
      {"compact_v4_prefill_n33_pos2040", 64, 128, 4, 512, 33, 2040, Keys::kRandom, true},
  };
  for (const IndexerCase& c : cases) check_indexer(c);
#endif
}

// The score kernel counts into histograms that the select kernel zeroes after reading, for the next call (no
// memset between the calls' kernels): a sequence of calls on one CudaOps — prefill, decode, a row that selects
// every visible entry (it reads no histogram but must still clear it), odd shapes, FP4 keys — must each select
// what the CPU does.
TEST(CudaIndexer, RepeatedCallsOnOneOps) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  const std::vector<IndexerCase> cases = {
      {"seq_prefill_n33_pos2040", 64, 128, 4, 512, 33, 2040},
      {"seq_decode_32k", 64, 128, 4, 512, 1, 32767},
      {"seq_decode_all_visible", 64, 128, 4, 512, 1, 2047},
      {"seq_decode_after_all_visible", 64, 128, 4, 512, 1, 8001},
      {"seq_h5_d128_ratio128_n7", 5, 128, 128, 19, 7, 10000},
      {"seq_compact_decode", 64, 128, 4, 512, 1, 4093, Keys::kRandom, true},
      {"seq_h3_d64_n33", 3, 64, 4, 7, 33, 3000},
      {"seq_fast_decode_32k", 64, 128, 4, 512, 1, 32767, Keys::kRandom, false, true},
      {"seq_fast_compact_prefill_n33_pos2040", 64, 128, 4, 512, 33, 2040, Keys::kRandom, true, true},
      {"seq_decode_after_fast", 64, 128, 4, 512, 1, 8001},
  };
  CudaOps gpu(attention_config(64));
  for (const IndexerCase& c : cases) check_indexer(c, &gpu);
#endif
}

TEST(CudaIndexer, V4Flash) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  const std::vector<IndexerCase> cases = {
      {"v4_decode_32k", 64, 128, 4, 512, 1, 32767},
      {"v4_decode_128k_mtp", 64, 128, 4, 512, 2, 131070},
      {"v4_prefill_n33_pos2040", 64, 128, 4, 512, 33, 2040},  // visible 510 .. 518: crosses top_k
  };
  for (const IndexerCase& c : cases) check_indexer(c);
#endif
}

// Fast numerics: bf16 scores tie often; the selection must still be the CPU's exactly (see above; the tensor-core
// scores too, indexer.cu says why they are exact). Odd sizes,
// the all-visible and shared-sort paths, duplicate rows and one-bin rows, FP4 keys, V4-Flash decode and prefill.
TEST(CudaIndexer, FastNumerics) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  const std::vector<IndexerCase> cases = {
      {"fast_h3_d64_k7_n33_pos3000", 3, 64, 4, 7, 33, 3000, Keys::kRandom, false, true},
      {"fast_h5_d128_ratio128_k19_n7_pos10000", 5, 128, 128, 19, 7, 10000, Keys::kRandom, false, true},
      {"fast_h17_d20_k100_n5_pos390", 17, 20, 4, 100, 5, 390, Keys::kRandom, false, true},
      {"fast_h4_d32_k1500_n2_pos7000", 4, 32, 4, 1500, 2, 7000, Keys::kRandom, false, true},
      {"fast_duplicate_rows", 8, 64, 4, 100, 5, 4000, Keys::kDuplicateRows, false, true},
      {"fast_all_zero_40k", 2, 16, 4, 512, 2, 160000, Keys::kAllZeroScores, false, true},
      {"fast_one_bin_40k", 1, 16, 4, 512, 2, 160000, Keys::kOneBin, false, true},
      {"fast_compact_h3_d32_k7_n7_pos0", 3, 32, 4, 7, 7, 0, Keys::kRandom, true, true},
      {"fast_compact_v4_decode_32k", 64, 128, 4, 512, 1, 32767, Keys::kRandom, true, true},
      {"fast_v4_decode_128k_mtp", 64, 128, 4, 512, 2, 131070, Keys::kRandom, false, true},
      {"fast_v4_prefill_n33_pos2040", 64, 128, 4, 512, 33, 2040, Keys::kRandom, false, true},
      {"fast_compact_v4_prefill_n33_pos2040", 64, 128, 4, 512, 33, 2040, Keys::kRandom, true, true},
      // The tensor-core scores (compact keys, head_dim a multiple of 64 and, for the Hadamard, a power of two):
      // 17 heads (two row tiles, the second of one head), 33 heads at d = 256, partial entry tiles, rows from
      // position 0, and 70 rows at 4000 (4 tiles a block on 132 SMs, the last partial).
      {"fast_compact_h17_d64_k40_n5_pos3000", 17, 64, 4, 40, 5, 3000, Keys::kRandom, true, true},
      {"fast_compact_h33_d256_ratio128_k9_n3_pos70000", 33, 256, 128, 9, 3, 70000, Keys::kRandom, true, true},
      {"fast_compact_v4_prefill_n70_pos0", 64, 128, 4, 512, 70, 0, Keys::kRandom, true, true},
      {"fast_compact_v4_prefill_n70_pos4000", 64, 128, 4, 512, 70, 4000, Keys::kRandom, true, true},
  };
  for (const IndexerCase& c : cases) check_indexer(c);
#endif
}

#if DSV4_HAVE_CUDA
// ---------------------------------------------------------------------------------------------------------
// compressor: a token sequence fed in chunks; the emitted entries and the state are compared with the CPU's
// after every chunk.

struct CompressorCase {
  std::string name;
  int64_t dim, ratio, width;
  bool overlap;
  int64_t start;  // position of the first chunk; > 0 starts from a random mid-sequence state
  std::vector<int64_t> chunks;
  EntrySim sim = EntrySim::kNone;  // for the end-to-end test (the pooling test always finishes with kNone)
};

struct HostCompressor {
  CompressorWeights w;
  std::vector<float> wkv, wgate;  // [coff·c, D] f32 storage behind w.wkv / w.wgate
  std::vector<uint16_t> wkv_bf16, wgate_bf16;  // or bf16 storage
};

// wkv / wgate in f32, or (bf16_weights) in bf16: a checkpoint's dtype, which the fast GEMMs would round with.
HostCompressor make_compressor(const CompressorCase& c, std::mt19937_64& rng, bool bf16_weights = false) {
  HostCompressor h;
  const int64_t width = (c.overlap ? 2 : 1) * c.width;
  const float a = 3.0f / std::sqrt(float(c.dim));  // projections of x ∈ [−1, 1] come out with unit spread
  h.wkv = random_floats(size_t(width * c.dim), rng, -a, a);
  h.wgate = random_floats(size_t(width * c.dim), rng, -a, a);
  if (bf16_weights) {
    for (auto [from, to] : {std::pair{&h.wkv, &h.wkv_bf16}, std::pair{&h.wgate, &h.wgate_bf16}})
      for (float v : *from) to->push_back(f32_to_bf16(v));
  }
  for (auto [weight, data, data_bf16] : {std::tuple{&h.w.wkv, &h.wkv, &h.wkv_bf16},
                                         std::tuple{&h.w.wgate, &h.wgate, &h.wgate_bf16}}) {
    weight->dtype = bf16_weights ? DType::kBF16 : DType::kF32;
    weight->rows = width;
    weight->cols = c.dim;
    weight->data = bf16_weights ? reinterpret_cast<const uint8_t*>(data_bf16->data())
                                : reinterpret_cast<const uint8_t*>(data->data());
    weight->row_stride = c.dim * int64_t(bf16_weights ? sizeof(uint16_t) : sizeof(float));
  }
  h.w.ape = random_floats(size_t(c.ratio * width), rng);
  h.w.norm = random_floats(size_t(c.width), rng, 0.5f, 1.5f);
  h.w.ratio = c.ratio;
  h.w.width = c.width;
  h.w.overlap = c.overlap;
  return h;
}

// Steps 2–3 of the CUDA compressor (pooling, state update) on the CPU's own projections: the state must come
// out bit-identical (copies and one fp32 add), the pooled entries differ only by expf's last bit before the
// (CPU) norm and RoPE. Fast numerics (bf16 x; the pool kernel rounds the pooled row, the CPU's norm and RoPE
// round theirs): that last bit flips a bf16 rounding of the pooled row only rarely (≈ 1e-7 against a bf16
// half-ulp ≥ 2^-9 of the value), so ≥ 99% of the entries are bit-identical, and a flip (one ulp, ≤ 2^-7 of the
// value) followed by the norm's and RoPE's own roundings stays within 2^-5 of max |entry| (check_compressor).
void check_compressor_pool(const CompressorCase& c, Numerics numerics = Numerics::kReference) {
  const std::string name = c.name + (numerics == Numerics::kFast ? "_fast" : "");
  SCOPED_TRACE(name + " seed " + std::to_string(seed()));
  std::mt19937_64 rng(case_seed(name));
  const bool fast = numerics == Numerics::kFast;
  const ModelConfig config = attention_config(c.dim);
  const HostCompressor hc = make_compressor(c, rng);
  const CompressorWeights& w = hc.w;
  const int64_t m = c.ratio, cw = c.width, width = (c.overlap ? 2 : 1) * cw, rows = (c.overlap ? 2 : 1) * m;
  const int64_t end = c.start + std::accumulate(c.chunks.begin(), c.chunks.end(), int64_t(0));
  const int64_t max_entries = end / m + 1;

  // Initial state: (0, −inf), or a random one standing for the tokens before `start`.
  std::vector<float> kv(size_t(rows * width), 0.0f), score(size_t(rows * width), -kInf);
  if (c.start > 0) {
    kv = random_floats(kv.size(), rng);
    score = random_floats(score.size(), rng, -2.0f, 2.0f);
  }
  std::vector<float> entries(size_t(max_entries * cw), kNaN);
  CompressorState cs{kv.data(), score.data(), entries.data(), max_entries};

  CpuOps cpu(config);
  cpu.set_numerics(numerics);
  CudaOps gpu(config);
  gpu.set_numerics(numerics);
  gpu.upload(w.ape);
  CompressorState gs{to_device(gpu, kv), to_device(gpu, score), gpu.alloc(entries.size()), max_entries};

  int64_t pos = c.start;
  for (int64_t n : c.chunks) {
    SCOPED_TRACE("chunk at " + std::to_string(pos) + " of " + std::to_string(n));
    std::vector<float> x = random_floats(size_t(n * c.dim), rng);
    if (fast) to_bf16(x);
    std::vector<float> pkv(size_t(n * width)), pgate(size_t(n * width));
    // fp32 weights: CpuOps::linear is the fp32 GEMM the compressor itself runs, in every numerics
    cpu.linear(x.data(), c.dim, w.wkv, n, pkv.data(), width);
    cpu.linear(x.data(), c.dim, w.wgate, n, pgate.data(), width);
    const CompressorParams cp{&w, &cs, x.data(), pos, n, EntrySim::kNone};
    cpu.compressor(std::span<const CompressorParams>(&cp, 1));
    const int64_t first = pos / m, count = (pos + n) / m - first;
    float* pooled = poisoned(gpu, size_t(std::max<int64_t>(count, 1) * cw));
    const CompressorParams gp{&w, &gs, nullptr, pos, n, EntrySim::kNone};
    EXPECT_EQ(cuda::compressor_pool(gpu, std::span<const CompressorParams>(&gp, 1), to_device(gpu, pkv),
                                    to_device(gpu, pgate), pooled),
              count);
    pos += n;

    EXPECT_TRUE(compare(to_host(gpu, gs.kv, kv.size()), kv, {0.0, 0.0}, c.name + " state kv"));
    EXPECT_TRUE(compare(to_host(gpu, gs.score, score.size()), score, {0.0, 0.0}, c.name + " state score"));
    if (count == 0) continue;
    // The chunk's entries, finished on the CPU. Only expf's last bit differs (≈1e-7 relative in the pooled
    // value); RMSNorm keeps it relative.
    std::vector<float> got = to_host(gpu, pooled, size_t(count * cw));
    cpu.rms_norm(got.data(), &w.norm, count, cw, got.data());
    cpu.rope(got.data(), count, cw, cw - config.rope_dim, 1, first * m, m, RopeKind::kCompressed, false);
    const std::vector<float> want(entries.begin() + first * cw, entries.begin() + (first + count) * cw);
    if (pos == end) {
      const Diff dd = diff(got.data(), want.data(), got.size());
      std::printf("[compressor-pool] %-28s pos %6lld: entries %lld, max |diff| %.3g\n", name.c_str(),
                  static_cast<long long>(pos), static_cast<long long>(count), dd.max_abs);
    }
    if (fast)
      EXPECT_TRUE(compare_fast(got, want, 4 * kBf16Ulp, 0.99, "[compressor-pool] " + name + " entries"));
    else
      EXPECT_TRUE(compare(got, want, {1e-5, 1e-5}, c.name + " entries"));
  }
}

const std::vector<CompressorCase>& compressor_cases() {
  static const std::vector<CompressorCase> cases = {
      {"csa_odd_c72", 48, 4, 72, true, 0, {1, 2, 1, 4, 3, 7, 1, 1, 13, 5, 9, 2}, EntrySim::kFp8NoPe},
      {"csa_indexer_odd_c64", 40, 4, 64, true, 0, {3, 1, 4, 1, 5, 9, 2, 6}, EntrySim::kHadamardFp4},
      {"hca_odd_ratio8_c96", 40, 8, 96, false, 0, {3, 5, 1, 8, 17, 2, 1, 40}},
      {"csa_mid_sequence_pos1001", 48, 4, 72, true, 1001, {1, 1, 2, 6, 1, 11}},
      {"hca_mid_sequence_pos1000_ratio128", 32, 128, 72, false, 1000, {3, 20, 1, 130, 2}, EntrySim::kFp8NoPe},
      {"hca_ratio128_c72", 64, 128, 72, false, 0, {1, 100, 27, 1, 130, 255, 3, 1, 6}},
      {"v4_csa_main", 4096, 4, 512, true, 0, {5, 1, 1, 1, 1, 16, 3, 33}, EntrySim::kFp8NoPe},
      {"v4_csa_indexer", 4096, 4, 128, true, 0, {5, 1, 1, 1, 1, 16, 3, 33}, EntrySim::kHadamardFp4},
      {"v4_hca", 4096, 128, 512, false, 0, {1, 126, 1, 129, 127, 1, 2}, EntrySim::kFp8NoPe},
  };
  return cases;
}

// End to end: CudaOps::compressor (its own kv / gate projections, norm, RoPE and FP8 / FP4 simulation) against
// CpuOps::compressor, chunk by chunk.
//   State: kv and gate come from two fp32 GEMMs over D in different orders: ≈ 2e-6 apart at D = 4096 (unit-size
//   outputs), worst of ~1e5 values ≲ 1e-5; the state adds ape exactly → 3e-5 abs + 1e-5 rel.
//   Entries: that noise moves the softmax weights by ≈ 2e-6 relatively; RMSNorm divides by the pooled vector's
//   RMS (≳ 0.1 for 128-token windows) and multiplies by γ ≤ 1.5 → 2e-4 abs + 1e-4 rel.
//   With FP8 / FP4 simulation an element sitting on a rounding midpoint may land one code away (an FP8 step is
//   2⁻³ relative, an FP4 step up to 2× a block's scale, a block whose amax crosses a power of two rescales all
//   32): at most 1% of the elements may exceed the tolerance, and the whole must keep cosine ≥ 0.999. Without
//   the simulation (or on the wrong channels) nearly every simulated element would differ.
::testing::AssertionResult compare_simulated(const std::vector<float>& got, const std::vector<float>& want,
                                             const Tolerance& tol, EntrySim sim, const std::string& what) {
  if (sim == EntrySim::kNone) return compare(got, want, tol, what);
  size_t off = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) != std::isnan(want[i]))
      return ::testing::AssertionFailure() << what << ": NaN mismatch at " << i << ": got " << got[i] << ", want "
                                           << want[i];
    if (std::fabs(double(got[i]) - want[i]) > tol.abs + tol.rel * std::fabs(double(want[i]))) ++off;
  }
  const Diff d = diff(got.data(), want.data(), got.size());
  std::printf("[compressor] %-30s %zu of %zu simulated elements a code away, cosine %.9f\n", what.c_str(), off,
              got.size(), d.cosine);
  if (off * 100 > got.size() || d.cosine < 0.999)
    return ::testing::AssertionFailure() << what << ": " << off << " of " << got.size()
                                         << " elements beyond the tolerance, cosine " << d.cosine << "; worst element "
                                         << d.worst << ": got " << got[d.worst] << ", want " << want[d.worst];
  return ::testing::AssertionSuccess();
}

// Fast numerics (bf16 x and weights): the projections, state and pooling stay fp32 (the state tolerance above
// holds; the fast GEMMs' bf16 outputs would move it by ≈ 2^-9 relative), then the pooled row, the norm, the
// RoPE and the simulation round as on the CPU. The GEMMs' order noise (≈ 1e-6) flips a bf16 rounding of the
// pooled row for ≈ 1e-3 of the values: one ulp, ≤ 2^-7 of the value; the norm keeps it relative and may flip
// its own rounding (≤ 2^-6), RoPE rotates two such channels and rounds again (≤ √2 · 2^-6 + 2^-7): without
// simulation every entry is within 2^-5 of max |entry| and ≥ 95% are bit-identical. With simulation a flip may
// land one e4m3 / e2m1 code away, as above: the 1%-beyond-tolerance rule with {2^-6, 2^-6}, and still ≥ 95%
// bit-identical.
constexpr Tolerance kFastEntryTol{2 * kBf16Ulp, 2 * kBf16Ulp};
constexpr double kFastEntryEqual = 0.95;

// Emitted entries against the CPU's, by the rules above.
void expect_entries(const std::vector<float>& got, const std::vector<float>& want, EntrySim sim, bool fast,
                    const std::string& name) {
  if (!fast) {
    EXPECT_TRUE(compare_simulated(got, want, {2e-4, 1e-4}, sim, name + " entries"));
  } else if (sim == EntrySim::kNone) {
    EXPECT_TRUE(compare_fast(got, want, 4 * kBf16Ulp, kFastEntryEqual, "[compressor] " + name + " entries"));
  } else {
    EXPECT_TRUE(compare_simulated(got, want, kFastEntryTol, sim, name + " entries"));
    EXPECT_TRUE(compare_fast(got, want, std::numeric_limits<double>::infinity(), kFastEntryEqual,
                             "[compressor] " + name + " entries"));
  }
}

void check_compressor(const CompressorCase& c, Numerics numerics = Numerics::kReference) {
  const std::string name = c.name + (numerics == Numerics::kFast ? "_fast" : "");
  SCOPED_TRACE(name + " seed " + std::to_string(seed()));
  std::mt19937_64 rng(case_seed(name));
  const bool fast = numerics == Numerics::kFast;
  const ModelConfig config = attention_config(c.dim);
  const HostCompressor hc = make_compressor(c, rng, /*bf16_weights=*/fast);
  const CompressorWeights& w = hc.w;
  const int64_t m = c.ratio, cw = c.width, width = (c.overlap ? 2 : 1) * cw, rows = (c.overlap ? 2 : 1) * m;
  const int64_t end = c.start + std::accumulate(c.chunks.begin(), c.chunks.end(), int64_t(0));
  const int64_t max_entries = end / m + 1;
  std::vector<float> kv(size_t(rows * width), 0.0f), score(size_t(rows * width), -kInf);
  if (c.start > 0) {
    kv = random_floats(kv.size(), rng);
    score = random_floats(score.size(), rng, -2.0f, 2.0f);
  }
  std::vector<float> entries(size_t(max_entries * cw), kNaN);
  CompressorState cs{kv.data(), score.data(), entries.data(), max_entries};

  CpuOps cpu(config);
  cpu.set_numerics(numerics);
  CudaOps gpu(config);
  gpu.set_numerics(numerics);
  gpu.upload(w.wkv);
  gpu.upload(w.wgate);
  gpu.upload(w.ape);
  gpu.upload(w.norm);
  CompressorState gs{to_device(gpu, kv), to_device(gpu, score), gpu.alloc(entries.size()), max_entries};
  poison(gs.entries, entries.size());

  int64_t pos = c.start;
  for (int64_t n : c.chunks) {
    SCOPED_TRACE("chunk at " + std::to_string(pos) + " of " + std::to_string(n));
    std::vector<float> x = random_floats(size_t(n * c.dim), rng);
    if (fast) to_bf16(x);
    const CompressorParams cp{&w, &cs, x.data(), pos, n, c.sim}, gp{&w, &gs, to_device(gpu, x), pos, n, c.sim};
    cpu.compressor(std::span<const CompressorParams>(&cp, 1));
    gpu.compressor(std::span<const CompressorParams>(&gp, 1));
    pos += n;
    EXPECT_TRUE(compare(to_host(gpu, gs.kv, kv.size()), kv, {3e-5, 1e-5}, c.name + " state kv"));
    EXPECT_TRUE(compare(to_host(gpu, gs.score, score.size()), score, {3e-5, 1e-5}, c.name + " state score"));
    // Every entry emitted so far: earlier ones must be left alone. Rows before the case's first window are
    // never written (NaN on both sides).
    const size_t from = size_t(c.start / m * cw), to = size_t(pos / m * cw);
    const std::vector<float> all = to_host(gpu, gs.entries, to);
    const std::vector<float> got(all.begin() + int64_t(from), all.end());
    const std::vector<float> want(entries.begin() + int64_t(from), entries.begin() + int64_t(to));
    if (pos == end) {
      const Diff dd = diff(got.data(), want.data(), got.size());
      std::printf("[compressor] %-30s pos %6lld: entries %lld, max |diff| %.3g\n", name.c_str(),
                  static_cast<long long>(pos), static_cast<long long>(pos / m), dd.max_abs);
    }
    expect_entries(got, want, c.sim, fast, name);
  }
}

// ---------------------------------------------------------------------------------------------------------
// Batches: several sequences at different positions in one call, as the forward pass hands them (prefill chunks
// and decode rows mixed; some emit entries in a step, some do not). The batched CUDA result must be the CPU's
// per-sequence one within the tolerances above, and — where each sequence's projection runs alone too — the
// CUDA result of calling each sequence alone, bit for bit.

// Each sequence's first position and, step by step, its chunk (0: no tokens this step).
struct BatchPlan {
  std::vector<int64_t> starts;
  std::vector<std::vector<int64_t>> steps;
};

// Five sequences around window boundaries of ratio m, or (sequences > 5) that many decoding at spread positions
// with every third one prefilling a chunk in the middle step (past kMaxSequences: more than one launch).
BatchPlan batch_plan(int64_t m, int64_t sequences) {
  if (sequences == 5)
    return {{0, m - 1, m + 1, 7 * m + m / 2, 1001},
            {{5, 1, 0, 3, 1}, {1, 1, 1, 1, 2 * m + 3}, {m, 1, 2, 1, 1}, {1, 0, 1, m + 2, 1}, {1, 1, 1, 1, 1}}};
  BatchPlan plan;
  const std::vector<int64_t> decode(static_cast<size_t>(sequences), 1);
  std::vector<int64_t> mixed(static_cast<size_t>(sequences));
  for (int64_t i = 0; i < sequences; ++i) {
    plan.starts.push_back(i * 7 % (3 * m) + (i % 2 ? 1000 : 0));
    mixed[size_t(i)] = i % 3 == 0 ? m + 1 : 1;
  }
  plan.steps = {decode, mixed, decode};
  return plan;
}

struct BatchCompressorCase {
  std::string name;
  int64_t dim, ratio, width;
  bool overlap;
  EntrySim sim;
  bool compact;  // entries in compact caches as the model stores them (kFp8Kv for kFp8NoPe, kFp4Keys for FP4)
  int64_t sequences = 5;
};

// One sequence's compressor state on the GPU, its entries cache poisoned (compact rows: all-ones bytes, NaN
// codes and scales).
CompressorState gpu_state(CudaOps& gpu, const std::vector<float>& kv, const std::vector<float>& score,
                          int64_t max_entries, int64_t c, CacheFormat format) {
  CompressorState s{to_device(gpu, kv), to_device(gpu, score), gpu.alloc_cache(format, max_entries, c), max_entries};
  const cuda::CacheLayout* layout = gpu.compact_cache(s.entries);
  settle();
  if (layout) DSV4_CUDA_CHECK(cudaMemset(s.entries, 0xFF, size_t(max_entries * layout->row_bytes)));
  else poison(s.entries, size_t(max_entries * c));
  settle();
  return s;
}

// Every row of a state's entries cache (c channels), as fp32.
std::vector<float> entries_of(CudaOps& gpu, const CompressorState& s, int64_t c) {
  std::vector<float> e(size_t(s.max_entries * c));
  gpu.read_cache(s.entries, s.max_entries, c, e.data());
  return e;
}

void check_compressor_batch(const BatchCompressorCase& c, Numerics numerics) {
  const bool fast = numerics == Numerics::kFast;
  const std::string name = c.name + (fast ? "_fast" : "");
  SCOPED_TRACE(name + " seed " + std::to_string(seed()));
  std::mt19937_64 rng(case_seed(name));
  const ModelConfig config = attention_config(c.dim);
  const HostCompressor hc = make_compressor({c.name, c.dim, c.ratio, c.width, c.overlap, 0, {}}, rng, fast);
  const CompressorWeights& w = hc.w;
  const int64_t m = c.ratio, cw = c.width, width = (c.overlap ? 2 : 1) * cw, rows = (c.overlap ? 2 : 1) * m;
  const BatchPlan plan = batch_plan(m, c.sequences);
  const size_t S = plan.starts.size();
  const CacheFormat format = !c.compact                        ? CacheFormat::kF32
                             : c.sim == EntrySim::kHadamardFp4 ? CacheFormat::kFp4Keys
                                                               : CacheFormat::kFp8Kv;

  CpuOps cpu(config);
  cpu.set_numerics(numerics);
  CudaOps gpu(config);
  gpu.set_numerics(numerics);
  gpu.upload(w.wkv);
  gpu.upload(w.wgate);
  gpu.upload(w.ape);
  gpu.upload(w.norm);

  // Per sequence: the CPU's state, and three GPU states fed the same tokens — batched with the chunks apart
  // (each projected alone), each sequence called alone on the same chunks, batched with the chunks as
  // consecutive rows of one buffer (one projection, as in the forward pass).
  std::vector<std::vector<float>> cpu_kv(S), cpu_score(S), cpu_entries(S);
  std::vector<CompressorState> cpu_state(S), separate(S), alone(S), consecutive(S);
  std::vector<int64_t> pos = plan.starts, max_entries(S);
  for (size_t i = 0; i < S; ++i) {
    int64_t end = plan.starts[i];
    for (const auto& step : plan.steps) end += step[i];
    max_entries[i] = end / m + 1;
    // Initial state: (0, −inf), or a random one standing for the tokens before the start.
    cpu_kv[i].assign(size_t(rows * width), 0.0f);
    cpu_score[i].assign(size_t(rows * width), -kInf);
    if (plan.starts[i] > 0) {
      cpu_kv[i] = random_floats(cpu_kv[i].size(), rng);
      cpu_score[i] = random_floats(cpu_score[i].size(), rng, -2.0f, 2.0f);
    }
    cpu_entries[i].assign(size_t(max_entries[i] * cw), kNaN);
    for (CompressorState* g : {&separate[i], &alone[i], &consecutive[i]})
      *g = gpu_state(gpu, cpu_kv[i], cpu_score[i], max_entries[i], cw, format);
    cpu_state[i] = {cpu_kv[i].data(), cpu_score[i].data(), cpu_entries[i].data(), max_entries[i]};
  }

  for (size_t t = 0; t < plan.steps.size(); ++t) {
    SCOPED_TRACE("step " + std::to_string(t));
    const std::vector<int64_t>& n = plan.steps[t];
    // The chunks as consecutive rows, and apart: each after a gap of kGap floats (separately allocated buffers
    // may lie back to back, which the batched call would take for consecutive rows).
    constexpr int64_t kGap = 4;
    std::vector<std::vector<float>> x(S);
    std::vector<float> all, apart;
    for (size_t i = 0; i < S; ++i) {
      x[i] = random_floats(size_t(n[i] * c.dim), rng);
      if (fast) to_bf16(x[i]);
      all.insert(all.end(), x[i].begin(), x[i].end());
      apart.insert(apart.end(), kGap, kNaN);
      apart.insert(apart.end(), x[i].begin(), x[i].end());
    }
    const float* all_d = to_device(gpu, all);
    const float* apart_d = to_device(gpu, apart);
    std::vector<CompressorParams> cpu_batch, separate_batch, consecutive_batch;
    int64_t row = 0;
    for (size_t i = 0; i < S; ++i) {
      cpu_batch.push_back({&w, &cpu_state[i], x[i].data(), pos[i], n[i], c.sim});
      const float* xi = apart_d + row * c.dim + int64_t(i + 1) * kGap;
      separate_batch.push_back({&w, &separate[i], xi, pos[i], n[i], c.sim});
      consecutive_batch.push_back({&w, &consecutive[i], all_d + row * c.dim, pos[i], n[i], c.sim});
      const CompressorParams one{&w, &alone[i], xi, pos[i], n[i], c.sim};
      gpu.compressor(std::span<const CompressorParams>(&one, 1));
      row += n[i];
    }
    cpu.compressor(cpu_batch);
    gpu.compressor(separate_batch);
    gpu.compressor(consecutive_batch);

    for (size_t i = 0; i < S; ++i) {
      SCOPED_TRACE("sequence " + std::to_string(i) + " at " + std::to_string(pos[i]) + " + " + std::to_string(n[i]));
      pos[i] += n[i];
      const size_t cells = cpu_kv[i].size(), from = size_t(plan.starts[i] / m * cw), to = size_t(pos[i] / m * cw);
      const std::vector<float> separate_entries = entries_of(gpu, separate[i], cw);
      // Batched (each chunk projected alone) = alone, bit for bit: state, and every cache row, unwritten ones
      // (NaN) included.
      EXPECT_TRUE(compare(to_host(gpu, separate[i].kv, cells), to_host(gpu, alone[i].kv, cells), {0.0, 0.0},
                          name + " state kv, batched vs alone"));
      EXPECT_TRUE(compare(to_host(gpu, separate[i].score, cells), to_host(gpu, alone[i].score, cells), {0.0, 0.0},
                          name + " state score, batched vs alone"));
      EXPECT_TRUE(compare(separate_entries, entries_of(gpu, alone[i], cw), {0.0, 0.0},
                          name + " entries, batched vs alone"));
      // Both batched layouts against the CPU: the entries emitted so far (rows before the first window are never
      // written).
      const std::vector<float> want(cpu_entries[i].begin() + int64_t(from), cpu_entries[i].begin() + int64_t(to));
      for (const auto& [g, layout] : {std::pair{&separate[i], "separate"}, std::pair{&consecutive[i], "consecutive"}}) {
        const std::string what = name + " " + layout + " sequence " + std::to_string(i);
        EXPECT_TRUE(compare(to_host(gpu, g->kv, cells), cpu_kv[i], {3e-5, 1e-5}, what + " state kv"));
        EXPECT_TRUE(compare(to_host(gpu, g->score, cells), cpu_score[i], {3e-5, 1e-5}, what + " state score"));
        const std::vector<float> e = g == &separate[i] ? separate_entries : entries_of(gpu, *g, cw);
        if (to > from) expect_entries(std::vector<float>(e.begin() + int64_t(from), e.begin() + int64_t(to)), want,
                                      c.sim, fast, what);
        // Rows past the last emitted entry stay unwritten (poisoned: NaN, or −inf from an FP4 row's NaN scale).
        for (size_t j = to; j < e.size(); ++j) ASSERT_FALSE(std::isfinite(e[j])) << what << ": entry row " << j / cw;
      }
    }
  }
}

const std::vector<BatchCompressorCase>& batch_compressor_cases() {
  static const std::vector<BatchCompressorCase> cases = {
      {"batch_csa_c72_fp8_compact", 48, 4, 72, true, EntrySim::kFp8NoPe, true},
      {"batch_csa_c72_fp8_f32", 48, 4, 72, true, EntrySim::kFp8NoPe, false},
      {"batch_indexer_c64_fp4_compact", 40, 4, 64, true, EntrySim::kHadamardFp4, true},
      {"batch_indexer_c64_fp4_f32", 40, 4, 64, true, EntrySim::kHadamardFp4, false},
      {"batch_hca_ratio8_c96_f32", 40, 8, 96, false, EntrySim::kNone, false},
      {"batch_hca_ratio128_c72_fp8_compact", 64, 128, 72, false, EntrySim::kFp8NoPe, true},
      {"batch_csa_70_sequences", 48, 4, 72, true, EntrySim::kFp8NoPe, true, 70},
      {"batch_v4_csa", 4096, 4, 512, true, EntrySim::kFp8NoPe, true},
      {"batch_v4_indexer", 4096, 4, 128, true, EntrySim::kHadamardFp4, true},
      {"batch_v4_hca", 4096, 128, 512, false, EntrySim::kFp8NoPe, true},
  };
  return cases;
}

// indexer_topk of a batch: each sequence's selection must be the CPU's exactly (see check_indexer), and the
// batched call's must be each sequence's alone.
struct BatchIndexerCase {
  std::string name;
  int64_t heads, head_dim, ratio, top_k;
  std::vector<std::pair<int64_t, int64_t>> sequences;  // (n, pos0)
  bool compact = false;
  bool fast = false;
};

void check_indexer_batch(const BatchIndexerCase& c) {
  SCOPED_TRACE(c.name + " seed " + std::to_string(seed()));
  std::mt19937_64 rng(case_seed(c.name));
  const int64_t nI = c.heads, dI = c.head_dim;
  const size_t S = c.sequences.size();
  ModelConfig config = attention_config(64);
  const Numerics numerics = c.fast ? Numerics::kFast : Numerics::kReference;
  CpuOps cpu(config);
  cpu.set_numerics(numerics);
  CudaOps gpu(config);
  gpu.set_numerics(numerics);

  std::vector<IndexerParams> cpu_batch, gpu_batch, gpu_alone;
  std::vector<std::vector<float>> q(S), weights(S), keys(S);
  std::vector<std::vector<int32_t>> want(S);
  std::vector<int32_t*> batched(S), alone(S);
  for (size_t i = 0; i < S; ++i) {
    const auto [n, pos0] = c.sequences[i];
    const int64_t visible_max = (pos0 + n) / c.ratio, n_keys = visible_max + 2;
    q[i] = random_floats(size_t(n * nI * dI), rng);
    weights[i] = random_floats(size_t(n * nI), rng, -0.02f, 0.02f);
    keys[i] = random_floats(size_t(n_keys * dI), rng);
    if (c.fast) {
      to_bf16(q[i]);
      to_bf16(weights[i]);
      to_bf16(keys[i]);
    }
    std::fill(keys[i].begin() + visible_max * dI, keys[i].end(), kNaN);  // never visible to any row
    if (c.compact) {
      cpu.hadamard_sim_fp4(q[i].data(), n * nI, dI);
      cpu.hadamard_sim_fp4(keys[i].data(), n_keys, dI);
    }
    IndexerParams p;
    p.pos0 = pos0;
    p.n = n;
    p.heads = nI;
    p.head_dim = dI;
    p.ratio = c.ratio;
    p.top_k = c.top_k;
    want[i].assign(size_t(n * c.top_k), 0x7F7F7F7F);
    IndexerParams pc = p;
    pc.q = q[i].data();
    pc.weights = weights[i].data();
    pc.keys = keys[i].data();
    pc.selected = want[i].data();
    cpu_batch.push_back(pc);
    IndexerParams pg = p;
    pg.q = to_device(gpu, q[i]);
    pg.weights = to_device(gpu, weights[i]);
    if (c.compact) {
      float* compact_keys = gpu.alloc_cache(CacheFormat::kFp4Keys, n_keys, dI);
      gpu.write_cache(compact_keys, n_keys, dI, keys[i].data());
      pg.keys = compact_keys;
    } else {
      pg.keys = to_device(gpu, keys[i]);
    }
    batched[i] = gpu.alloc_i32(std::max<size_t>(want[i].size(), 1));
    alone[i] = gpu.alloc_i32(std::max<size_t>(want[i].size(), 1));
    poison(batched[i], want[i].size());
    poison(alone[i], want[i].size());
    pg.selected = batched[i];
    gpu_batch.push_back(pg);
    pg.selected = alone[i];
    gpu_alone.push_back(pg);
  }
  cpu.indexer_topk(cpu_batch);
  gpu.indexer_topk(gpu_batch);
  for (const IndexerParams& p : gpu_alone) gpu.indexer_topk(std::span<const IndexerParams>(&p, 1));
  size_t mismatches = 0;
  for (size_t i = 0; i < S; ++i) {
    const std::vector<int32_t> got = to_host(gpu, batched[i], want[i].size());
    EXPECT_EQ(got, to_host(gpu, alone[i], want[i].size())) << c.name << " sequence " << i << ": batched vs alone";
    for (size_t j = 0; j < got.size(); ++j) {
      if (got[j] == want[i][j]) continue;
      if (mismatches++ == 0)
        ADD_FAILURE() << c.name << " sequence " << i << ": first difference at row " << j / size_t(c.top_k)
                      << " slot " << j % size_t(c.top_k) << ": got " << got[j] << ", want " << want[i][j];
    }
  }
  std::printf("[indexer]   %-34s %zu sequences: %zu ids differ\n", c.name.c_str(), S, mismatches);
  EXPECT_EQ(mismatches, 0u);
}

#endif  // DSV4_HAVE_CUDA

TEST(CudaCompressor, MatchesCpuStepByStep) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  for (const CompressorCase& c : compressor_cases()) check_compressor(c);
#endif
}

TEST(CudaCompressor, PoolingAndStateMatchCpuStepByStep) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  for (const CompressorCase& c : compressor_cases()) check_compressor_pool(c);
#endif
}

// Fast numerics, both entry simulations (kFastEntryTol): end to end, and the pool kernel's bf16 rounding alone.
TEST(CudaCompressor, FastNumericsMatchCpuStepByStep) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  for (const CompressorCase& c : compressor_cases()) check_compressor(c, Numerics::kFast);
#endif
}

TEST(CudaCompressor, FastNumericsPoolingMatchesCpuStepByStep) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  for (const CompressorCase& c : compressor_cases()) check_compressor_pool(c, Numerics::kFast);
#endif
}

// Batches of sequences at different positions in one call (check_compressor_batch), reference and fast numerics.
TEST(CudaCompressor, BatchMatchesCpuAndEachAlone) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  for (const BatchCompressorCase& c : batch_compressor_cases()) check_compressor_batch(c, Numerics::kReference);
#endif
}

TEST(CudaCompressor, FastNumericsBatchMatchesCpuAndEachAlone) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  for (const BatchCompressorCase& c : batch_compressor_cases()) check_compressor_batch(c, Numerics::kFast);
#endif
}

// Batches (check_indexer_batch): decode rows and prefill chunks at different positions (rows that see no entry,
// fewer than top_k, all of them), fp32 and FP4 keys, both numerics; more sequences than one launch's table; a
// sequence whose rows span two launches (its score rows exceed the budget of one).
TEST(CudaIndexer, BatchMatchesCpuAndEachAlone) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  const std::vector<std::pair<int64_t, int64_t>> v4 = {{1, 32767}, {1, 2047}, {33, 2040}, {1, 3}, {2, 131070},
                                                       {1, 8001}};
  std::vector<std::pair<int64_t, int64_t>> many;
  for (int64_t i = 0; i < 70; ++i) many.push_back({i % 9 == 0 ? 5 : 1, 37 * i + 3});
  const std::vector<BatchIndexerCase> cases = {
      {"batch_h3_d64_k7", 3, 64, 4, 7, {{1, 0}, {7, 0}, {33, 3000}, {1, 11}, {5, 26}}},
      {"batch_v4", 64, 128, 4, 512, v4},
      {"batch_v4_compact", 64, 128, 4, 512, v4, true},
      {"batch_v4_fast", 64, 128, 4, 512, v4, false, true},
      {"batch_v4_fast_compact", 64, 128, 4, 512, v4, true, true},
      {"batch_70_sequences", 4, 32, 4, 16, many},
      {"batch_rows_span_launches", 2, 16, 4, 512, {{3, 10}, {200, 160000}, {1, 5000}}},
  };
  for (const BatchIndexerCase& c : cases) check_indexer_batch(c);
#endif
}

}  // namespace
}  // namespace dsv4::test
