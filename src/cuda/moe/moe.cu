// moe family (CUDA): CudaOps::moe, the same function as CpuOps::moe (src/cpu/moe.cpp, spec §9) in four
// launches on the stream and no host round-trip: router_logits → route → expert_up → expert_down
// (moe_kernels.h); in fast numerics from shared_grouped_min_tokens(I) tokens the shared expert runs between
// route and expert_up on the grouped path's GEMMs. The per-expert pointer table of a layer is built on its first
// call and kept on the device (the backend's Tables, moe_tables.h); the step's plan, SwiGLU outputs and per-pair
// down projections live in one workspace. Fast numerics round inside the expert kernels, where CpuOps::moe does.
#include <algorithm>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "cuda/cuda_ops.h"
#include "cuda/gemm/gemm.h"
#include "cuda/moe/moe_grouped.h"
#include "cuda/moe/moe_kernels.h"
#include "cuda/moe/moe_tables.h"

namespace dsv4 {

namespace cuda::moe {

// A backend's MoE state (moe_tables.h): what each layer's kernels need from its weights, resolved on the layer's
// first call — 3·E + 4 weight lookups (and the FP4 scale scan) per call would cost more host time than the
// decode kernels take — and the host copy of every layer's device table entries.
struct Tables {
  // The host storage a MoeWeights pointed to when its table was built: a changed struct at the same address
  // gets a new table.
  struct Identity {
    const void* gate = nullptr;
    const void* shared = nullptr;
    const void* first = nullptr;
    const void* last = nullptr;
    size_t experts = 0;
    bool operator==(const Identity& o) const {
      return gate == o.gate && shared == o.shared && first == o.first && last == o.last && experts == o.experts;
    }
  };

  struct Layer {
    Identity identity;
    DeviceWeight gate, shared_w1, shared_w3, shared_w2;  // the shared ones empty where has_shared is false
    MatFormat routed_up, routed_down, shared_up, shared_down;
    size_t first_entry = 0;  // this layer's E entries in the device table
    // The rank's experts under expert parallelism (model/parallel.h: the others are empty weights here);
    // [0, E) and true on one rank.
    int expert_begin = 0, expert_end = 0;
    bool has_shared = true;
  };

  std::unordered_map<const MoeWeights*, Layer> layers;
  std::vector<ExpertPtrs> host;  // every layer's entries, concatenated
  size_t device_entries = 0;     // entries the device copy has room for
};

void TablesDeleter::operator()(Tables* tables) const { delete tables; }

TablesPtr make_tables() { return TablesPtr(new Tables); }

}  // namespace cuda::moe

namespace {

using cuda::DeviceWeight;
using cuda::WFormat;
using cuda::moe::ExpertPtrs;
using cuda::moe::MatFormat;
using cuda::moe::MatView;

// Workspace slots of the moe family (CudaOps::workspace): the step's buffers, and the expert tables.

// How the kernels read a matrix. tensor_cores: FP8 with 16-byte aligned rows, or FP4 whose scales all lie in
// the window where e2m1 · scale is exact in fp16 (fp4_fits: fp4_scales_fit).
MatFormat format_of(const DeviceWeight& d, bool fp4_fits) {
  const bool aligned = d.row_bytes() % 16 == 0;
  const bool tensor_cores = (d.format == WFormat::kFP8 && aligned) || (d.format == WFormat::kFP4 && fp4_fits);
  return {d.format, d.row_bytes(), d.scale_cols, aligned, tensor_cores};
}

// Whether every E8M0 scale of an FP4 matrix lies in [kFp4ScaleMin, kFp4ScaleMax].
bool fp4_scales_fit(const DeviceWeight& d) {
  return d.format == WFormat::kFP4 && d.scale_lo >= cuda::moe::kFp4ScaleMin && d.scale_hi <= cuda::moe::kFp4ScaleMax;
}

// Whether an FP4 matrix's E8M0 scales suit the grouped FP8 path (experts_grouped.cu, experts_wgmma.cu): in every
// row's 128-column block (four scales) max − min ≤ kGroupedScaleSpan, and every byte in [kGroupedScaleMin, 254]
// (2^(max − 127 − kLift) and 2^(max − 128) normal floats).
bool fp4_spans_fit(const DeviceWeight& d) {
  return d.format == WFormat::kFP4 && d.scale_lo >= cuda::moe::kGroupedScaleMin && d.scale_hi <= 254 &&
         d.scale_span <= cuda::moe::kGroupedScaleSpan;
}

const void* scale_of(const DeviceWeight& d) {
  if (d.format == WFormat::kFP8) return d.scale_f32;
  if (d.format == WFormat::kFP4) return d.scale_e8m0;
  return nullptr;
}

MatView view_of(const DeviceWeight& d) { return {d.data, scale_of(d), d.row_bytes(), d.scale_cols, d.mma_tiles}; }

// One thread per 16-byte unit of the MMA tile order (weight_mma.cuh): unit u of dst (and its FP4 scale byte)
// from its chunk of the row-major src, an FP4 chunk's words in the MMA bit order. src and dst are distinct buffers.
struct TileParams {
  const uint8_t* src = nullptr;
  const uint8_t* src_scale = nullptr;  // FP4: E8M0 [rows, row_bytes / 16]; nullptr for FP8
  uint8_t* dst = nullptr;
  uint8_t* dst_scale = nullptr;
  int64_t units = 0, groups = 0, row_bytes = 0;
};

__global__ void tile_for_mma_kernel(TileParams p) {
  const int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (u >= p.units) return;
  const int lane = int(u % 32), h = int(u / 32 % 2);
  const int64_t group = u / 64 % p.groups, tile = u / 64 / p.groups;
  const int64_t row = tile * cuda::moe::kTileRows + lane / 4 + 8 * h, q = 4 * group + lane % 4;
  uint4 v = *reinterpret_cast<const uint4*>(p.src + row * p.row_bytes + 16 * q);
  if (p.src_scale) {
    v = make_uint4(cuda::moe::fp4_mma_bits(v.x), cuda::moe::fp4_mma_bits(v.y), cuda::moe::fp4_mma_bits(v.z),
                   cuda::moe::fp4_mma_bits(v.w));
    p.dst_scale[u] = p.src_scale[row * (p.row_bytes / 16) + q];
  }
  reinterpret_cast<uint4*>(p.dst)[u] = v;
}

// An FP4 matrix in row order: its words into the MMA bit order, in place.
__global__ void fp4_mma_bits_kernel(uint32_t* words, int64_t count) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) words[i] = cuda::moe::fp4_mma_bits(words[i]);
}

bool same_layout(const DeviceWeight& a, const DeviceWeight& b) {
  return a.format == b.format && a.rows == b.rows && a.cols == b.cols && a.scale_cols == b.scale_cols;
}

using Identity = cuda::moe::Tables::Identity;
using LayerTables = cuda::moe::Tables::Layer;

Identity identify(const MoeWeights& w) {
  return {w.gate.data, w.shared.w1.data, w.experts.front().w1.data, w.experts.back().w2.data, w.experts.size()};
}

// The routed experts this rank holds: one contiguous range [*begin, *end) of non-empty experts (a shard's,
// model/parallel.h, or all of them).
void local_experts(const MoeWeights& w, int* begin, int* end) {
  const int E = int(w.experts.size());
  int b = 0;
  while (b < E && w.experts[size_t(b)].w1.empty()) ++b;
  int e = b;
  while (e < E && !w.experts[size_t(e)].w1.empty()) ++e;
  DSV4_CHECK(b < e, "moe: a layer without any routed expert on this rank");
  for (int i = e; i < E; ++i)
    DSV4_CHECK(w.experts[size_t(i)].w1.empty(), "moe: this rank's routed experts are not one contiguous range (",
               b, " .. ", e - 1, ", then ", i, ")");
  *begin = b;
  *end = e;
}

// A family's matrices go to the tensor-core layout when the tensor cores read them: the MMA tile order where they
// are whole tiles, FP4 words in the MMA bit order. A matrix already in it (it serves another layer too) must be
// read that way here as well.
void mma_layout_family(CudaOps& ops, MatFormat& format, const std::vector<const Weight*>& weights, const char* what) {
  const DeviceWeight& first = ops.dev(*weights.front());
  format.tiled = format.tensor_cores && cuda::moe::mma_tiles_fit(first.rows, first.row_bytes());
  for (const Weight* w : weights) {
    if (format.tensor_cores) ops.to_mma_layout(*w);
    else DSV4_CHECK(!ops.dev(*w).mma_tiles && !ops.dev(*w).mma_bits, "moe: ", what, " is stored in the expert "
                    "kernels' tensor-core layout for another layer whose kernels read it that way, but this layer's cannot");
  }
}

LayerTables build_layer(CudaOps& ops, const MoeWeights& w, int64_t D, int64_t I, size_t first_entry,
                        std::vector<ExpertPtrs>& host) {
  LayerTables t;
  t.identity = identify(w);
  t.first_entry = first_entry;
  t.gate = ops.dev(w.gate);
  local_experts(w, &t.expert_begin, &t.expert_end);
  t.has_shared = !w.shared.w1.empty();
  if (t.has_shared) {
    t.shared_w1 = ops.dev(w.shared.w1);
    t.shared_w3 = ops.dev(w.shared.w3);
    t.shared_w2 = ops.dev(w.shared.w2);
  }
  const auto check_shape = [&](const DeviceWeight& d, int64_t rows, int64_t cols, const std::string& what) {
    DSV4_CHECK(d.rows == rows && d.cols == cols, "moe: ", what, " is [", d.rows, ", ", d.cols, "], expected [", rows,
               ", ", cols, "]");
    DSV4_CHECK(d.format != WFormat::kFP4 || cols % 32 == 0, "moe: FP4 ", what, " with ", cols,
               " columns (must be a multiple of 32)");
  };
  if (t.has_shared) {
    check_shape(t.shared_w1, I, D, "shared expert w1");
    check_shape(t.shared_w3, I, D, "shared expert w3");
    check_shape(t.shared_w2, D, I, "shared expert w2");
    DSV4_CHECK(same_layout(t.shared_w1, t.shared_w3), "moe: shared expert w1 and w3 differ in format");
  }
  const size_t e0 = size_t(t.expert_begin);
  const DeviceWeight& w1 = ops.dev(w.experts[e0].w1);
  const DeviceWeight& w2 = ops.dev(w.experts[e0].w2);
  check_shape(w1, I, D, cat("expert ", e0, " w1"));
  check_shape(w2, D, I, cat("expert ", e0, " w2"));
  bool up_fits = true, down_fits = true;  // FP4 scales in the tensor-core window, over the rank's routed experts
  std::vector<const Weight*> up, down;
  for (size_t e = 0; e < w.experts.size(); ++e) {
    if (int(e) < t.expert_begin || int(e) >= t.expert_end) {  // another rank's: never in this rank's plan
      host.push_back({});
      continue;
    }
    const DeviceWeight& a = ops.dev(w.experts[e].w1);
    const DeviceWeight& b = ops.dev(w.experts[e].w3);
    const DeviceWeight& c = ops.dev(w.experts[e].w2);
    DSV4_CHECK(same_layout(a, w1) && same_layout(b, w1) && same_layout(c, w2), "moe: expert ", e,
               " differs in shape or format from expert ", e0, " (one kernel serves all routed experts of a layer)");
    host.push_back({a.data, b.data, c.data, scale_of(a), scale_of(b), scale_of(c)});
    if (a.format == WFormat::kFP4) up_fits = up_fits && fp4_scales_fit(a) && fp4_scales_fit(b);
    if (c.format == WFormat::kFP4) down_fits = down_fits && fp4_scales_fit(c);
    up.push_back(&w.experts[e].w1);
    up.push_back(&w.experts[e].w3);
    down.push_back(&w.experts[e].w2);
  }
  t.routed_up = format_of(w1, up_fits);
  t.routed_down = format_of(w2, down_fits);
  mma_layout_family(ops, t.routed_up, up, "a routed expert's w1 / w3");
  mma_layout_family(ops, t.routed_down, down, "a routed expert's w2");
  if (t.has_shared) {
    t.shared_up = format_of(t.shared_w1, fp4_scales_fit(t.shared_w1) && fp4_scales_fit(t.shared_w3));
    t.shared_down = format_of(t.shared_w2, fp4_scales_fit(t.shared_w2));
    mma_layout_family(ops, t.shared_up, {&w.shared.w1, &w.shared.w3}, "the shared expert's w1 / w3");
    mma_layout_family(ops, t.shared_down, {&w.shared.w2}, "the shared expert's w2");
  }
  // The grouped FP8 path reads tiled FP8 as it is, tiled FP4 where its scales fit (fp4_spans_fit).
  const auto grouped = [&](const MatFormat& f, const std::vector<const Weight*>& ws) {
    if (!f.tiled || (f.format != WFormat::kFP8 && f.format != WFormat::kFP4)) return false;
    if (f.format == WFormat::kFP8) return true;
    for (const Weight* x : ws)
      if (!fp4_spans_fit(ops.dev(*x))) return false;
    return true;
  };
  t.routed_up.grouped = grouped(t.routed_up, up);
  t.routed_down.grouped = grouped(t.routed_down, down);
  if (!t.has_shared) {
    // No shared chunk runs: the kernels' choices (tensor cores, decode kernels, the grouped path, staging
    // sizes) then follow the routed formats alone.
    t.shared_up = t.routed_up;
    t.shared_down = t.routed_down;
    return t;
  }
  t.shared_up.grouped = grouped(t.shared_up, {&w.shared.w1, &w.shared.w3});
  t.shared_down.grouped = grouped(t.shared_down, {&w.shared.w2});
  t.shared_w1 = ops.dev(w.shared.w1);  // again: tiling updated their flags
  t.shared_w3 = ops.dev(w.shared.w3);
  t.shared_w2 = ops.dev(w.shared.w2);
  return t;
}

// The layer's tables and its device entries, built and uploaded on the layer's first call.
LayerTables layer_tables(CudaOps& ops, cuda::moe::Tables& tables, const MoeWeights& w, int64_t D, int64_t I,
                         const ExpertPtrs** entries) {
  auto it = tables.layers.find(&w);
  if (it == tables.layers.end() || !(it->second.identity == identify(w))) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    DSV4_CUDA_CHECK(cudaStreamIsCapturing(ops.stream(), &capture));
    // Benchmarks replay calls as CUDA graphs: the first call of a layer must run directly.
    DSV4_CHECK(capture == cudaStreamCaptureStatusNone, "moe: a layer's expert table is built on its first call, "
               "which cannot happen inside a graph recording");
    const size_t first = tables.host.size();
    LayerTables built = build_layer(ops, w, D, I, first, tables.host);
    it = tables.layers.insert_or_assign(&w, built).first;
    const size_t bytes_per = sizeof(ExpertPtrs);
    if (tables.host.size() > tables.device_entries) {
      // Growth replaces the buffer: upload every layer's entries again.
      tables.device_entries = std::max(tables.host.size(), 2 * tables.device_entries);
      void* d = ops.workspace(cuda::kWsMoeTables, tables.device_entries * bytes_per);
      DSV4_CUDA_CHECK(cudaMemcpyAsync(d, tables.host.data(), tables.host.size() * bytes_per, cudaMemcpyHostToDevice,
                                      ops.stream()));
    } else {
      auto* d = static_cast<ExpertPtrs*>(ops.workspace(cuda::kWsMoeTables, tables.device_entries * bytes_per));
      DSV4_CUDA_CHECK(cudaMemcpyAsync(d + first, tables.host.data() + first, (tables.host.size() - first) * bytes_per,
                                      cudaMemcpyHostToDevice, ops.stream()));
    }
  }
  *entries = static_cast<const ExpertPtrs*>(ops.workspace(cuda::kWsMoeTables, tables.device_entries * sizeof(ExpertPtrs))) +
             it->second.first_entry;
  return it->second;
}

// Bump allocator over the step workspace (256-byte aligned regions).
class Carve {
 public:
  template <class T>
  T* take(int64_t count) {
    const size_t at = used_;
    used_ += (size_t(count) * sizeof(T) + 255) / 256 * 256;
    return reinterpret_cast<T*>(base_ + at);  // base_ = 0 on the sizing pass: nothing is dereferenced
  }
  void set_base(void* base) { base_ = reinterpret_cast<uintptr_t>(base); used_ = 0; }
  size_t used() const { return used_; }

 private:
  uintptr_t base_ = 0;
  size_t used_ = 0;
};

// The grouped path's buffers (moe_kernels.h), after the plan.
cuda::moe::GroupedBuffers carve_grouped(Carve& c, int64_t n, int64_t E, int64_t k, int64_t D, int64_t I,
                                        int64_t partial_floats, int routed_tile) {
  const int64_t P = n * k;
  cuda::moe::GroupedBuffers g;
  g.partials = partial_floats > 0 ? c.take<float>(partial_floats) : nullptr;
  g.partial_floats = partial_floats;
  g.routed_tile = routed_tile;
  g.max_tiles = cuda::moe::grouped_max_tiles(n, k, E, routed_tile);
  g.xq_routed = routed_tile == cuda::moe::kGroupedWideTokens ? nullptr : c.take<uint16_t>(n * D);  // else xq_pairs
  g.xq_shared = c.take<uint16_t>(n * D);
  g.xs = c.take<float>(n * (D / 128));
  g.hq = c.take<uint16_t>((P + n) * I);
  g.hs = c.take<float>((P + n) * (I / 128));
  g.tile_expert = c.take<int32_t>(g.max_tiles);
  g.tile_pair0 = c.take<int32_t>(g.max_tiles);
  g.tile_count = c.take<int32_t>(g.max_tiles);
  g.tiles = c.take<int32_t>(1);
  if (routed_tile == cuda::moe::kGroupedWideTokens) {
    g.pairs_ld = (P + 3) / 4 * 4;
    g.xq_pairs = c.take<uint8_t>(P * D);
    g.xs_pairs = c.take<float>(D / 128 * g.pairs_ld);
    g.hs_pairs = c.take<float>(I / 128 * g.pairs_ld);
    g.slot_pair = c.take<int32_t>(P);
  }
  return g;
}

cuda::moe::Plan carve_plan(Carve& c, int64_t n, int64_t E, int64_t k, int64_t D, int64_t I) {
  const int64_t P = n * k;
  const int64_t max_chunks = (n + cuda::moe::kChunk - 1) / cuda::moe::kChunk + (P + cuda::moe::kChunk - 1) / cuda::moe::kChunk +
                             std::min(E, P);
  cuda::moe::Plan plan;
  plan.scores = c.take<float>(n * E);
  plan.topk_expert = c.take<int32_t>(P);
  plan.topk_weight = c.take<float>(P);
  plan.combine_order = c.take<int32_t>(P);
  plan.pair_token = c.take<int32_t>(P + n);
  plan.pair_out = c.take<int32_t>(P + n);
  plan.pair_weight = c.take<float>(P + n);
  plan.chunk_pair = c.take<int32_t>(max_chunks);
  plan.chunk_count = c.take<int32_t>(max_chunks);
  plan.chunk_expert = c.take<int32_t>(max_chunks);
  plan.counters = c.take<int32_t>(1);
  plan.route_counts = cuda::moe::route_blocks(n) > 0 ? c.take<int32_t>(cuda::moe::route_blocks(n) * E) : nullptr;
  plan.h = c.take<float>((P + n) * I);
  plan.y = c.take<float>(n * (k + 1) * D);
  return plan;
}

}  // namespace

const DeviceWeight& CudaOps::to_mma_layout(const Weight& w) {
  auto it = weights_.find(w.data);
  DSV4_CHECK(it != weights_.end(), "internal error: weight [", w.rows, ", ", w.cols, "] was not uploaded");
  DeviceWeight& d = it->second;
  DSV4_CHECK(d.format == WFormat::kFP4 || d.format == WFormat::kFP8, "internal error: weight [", d.rows, ", ", d.cols,
             "] is neither FP4 nor FP8: no tensor-core layout");
  if (d.mma_tiles || d.mma_bits) return d;
  const size_t bytes = size_t(d.rows * d.row_bytes());
  auto* data = const_cast<uint8_t*>(d.data);
  constexpr int kThreads = 256;
  if (!cuda::moe::mma_tiles_fit(d.rows, d.row_bytes())) {
    if (d.format == WFormat::kFP4) {
      const int64_t words = int64_t(bytes / 4);  // row_bytes is a multiple of 16 (cols of 32)
      fp4_mma_bits_kernel<<<unsigned(cuda::ceil_div(words, int64_t(kThreads))), kThreads, 0, stream_>>>(
          reinterpret_cast<uint32_t*>(data), words);
      DSV4_CUDA_CHECK(cudaGetLastError());
      d.mma_bits = true;
    }
    return d;
  }
  const size_t scale_bytes = d.format == WFormat::kFP4 ? size_t(d.rows * d.scale_cols) : 0;
  // The row-major copy the kernel gathers from: stream-ordered, freed once the kernel has read it.
  uint8_t* copy = nullptr;
  DSV4_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&copy), bytes + scale_bytes, stream_));
  auto* scale = const_cast<uint8_t*>(d.scale_e8m0);
  DSV4_CUDA_CHECK(cudaMemcpyAsync(copy, data, bytes, cudaMemcpyDeviceToDevice, stream_));
  if (scale_bytes) DSV4_CUDA_CHECK(cudaMemcpyAsync(copy + bytes, scale, scale_bytes, cudaMemcpyDeviceToDevice, stream_));
  TileParams p;
  p.src = copy;
  p.src_scale = scale_bytes ? copy + bytes : nullptr;
  p.dst = data;
  p.dst_scale = scale;
  p.units = int64_t(bytes / 16);
  p.groups = d.row_bytes() / cuda::moe::kTileGroupBytes;
  p.row_bytes = d.row_bytes();
  tile_for_mma_kernel<<<unsigned(cuda::ceil_div(p.units, int64_t(kThreads))), kThreads, 0, stream_>>>(p);
  DSV4_CUDA_CHECK(cudaGetLastError());
  DSV4_CUDA_CHECK(cudaFreeAsync(copy, stream_));
  d.mma_tiles = true;
  d.mma_bits = d.format == WFormat::kFP4;
  return d;
}

void CudaOps::moe(const MoeWeights& w, const float* x, const int32_t* tokens, int64_t n, float* out) {
  moe_rounded(w, x, tokens, n, out, true);
}

void CudaOps::moe_partial(const MoeWeights& w, const float* x, const int32_t* tokens, int64_t n, float* out) {
  moe_rounded(w, x, tokens, n, out, false);
}

void CudaOps::moe_rounded(const MoeWeights& w, const float* x, const int32_t* tokens, int64_t n, float* out,
                          bool round_sum) {
  const int64_t D = config_.dim, I = config_.moe_inter_dim, E = config_.n_routed_experts;
  const int64_t k = config_.n_experts_per_tok;
  const bool hash = !w.tid2eid.empty();
  DSV4_CHECK(n >= 0, "moe: negative token count ", n);
  DSV4_CHECK(int64_t(w.experts.size()) == E && E > 0, "moe: ", w.experts.size(), " routed experts, config says ", E);
  DSV4_CHECK(hash || int64_t(w.gate_bias.size()) == E, "moe: gate.bias has ", w.gate_bias.size(),
             " entries, expected ", E);
  DSV4_CHECK(!hash || int64_t(w.tid2eid.size()) % k == 0, "moe: tid2eid size ", w.tid2eid.size(),
             " is not a multiple of k = ", k);
  DSV4_CHECK(!hash || tokens != nullptr, "moe: a hash-routed layer needs the step's tokens");
  if (n == 0) return;

  const ExpertPtrs* experts = nullptr;
  const LayerTables layer = layer_tables(*this, *moe_tables_, w, D, I, &experts);
  DSV4_CHECK(layer.gate.rows == E && layer.gate.cols == D, "moe: gate is [", layer.gate.rows, ", ", layer.gate.cols,
             "], expected [", E, ", ", D, "]");

  // Fast numerics at n ≥ grouped_min_tokens(I): the grouped FP8 GEMMs where every expert matrix suits them.
  const bool grouped = fast() && n >= cuda::moe::grouped_min_tokens(I) && layer.routed_up.grouped &&
                       layer.routed_down.grouped && layer.shared_up.grouped && layer.shared_down.grouped &&
                       D % 128 == 0 && I % 128 == 0 && E <= cuda::moe::kMaxExperts;
  // Below that, the shared expert alone on the grouped GEMMs where the item kernels would read it once per
  // kChunk tokens (moe_kernels.h).
  const bool shared_grouped = fast() && !grouped && layer.has_shared && layer.shared_up.grouped &&
                              layer.shared_down.grouped && n >= cuda::moe::shared_grouped_min_tokens(I) &&
                              D % 128 == 0 && I % 128 == 0;
  Carve carve;
  carve_plan(carve, n, E, k, D, I);  // sizes only
  const int sms = props_.multiProcessorCount;
  const int64_t split_floats = shared_grouped ? cuda::moe::shared_split_floats(n, D, I, sms) : 0;
  const int routed_tile = cuda::moe::grouped_routed_tile(
      n, k, E, grouped && layer.routed_up.format == WFormat::kFP4 && layer.routed_down.format == WFormat::kFP4,
      props_.major);
  if (grouped || shared_grouped) carve_grouped(carve, n, E, k, D, I, split_floats, routed_tile);
  carve.set_base(workspace(cuda::kWsMoeStep, carve.used()));
  const cuda::moe::Plan plan = carve_plan(carve, n, E, k, D, I);
  cuda::moe::GroupedBuffers gbuf = grouped || shared_grouped
                                       ? carve_grouped(carve, n, E, k, D, I, split_floats, routed_tile)
                                       : cuda::moe::GroupedBuffers{};
  gbuf.wgmma = grouped && cuda::moe::grouped_takes_wgmma(n, k, E, routed_tile, props_.major);

  const bool pdl = props_.major >= 9;
  // The gate's logits, fp32 (DeepSeek: an f32 SGEMM of the widened bf16 x and gate). `grouped` implies fast
  // numerics, where x (the FFN norm's output) is bf16-valued, so with a BF16 gate every product is exact in fp32
  // on the bf16 tensor cores too (GemmParams::x_bf16; the GEMM rounds x to bf16, a no-op here): the prefill GEMM
  // computes the logits up to summation order (and the tensor cores' truncating fp32 accumulation, a few ulp).
  // NOTE: its split-K count follows n and the SM count, so a token's logits — and a near-tie's top-k — may differ
  // by a few ulp between prefill chunk sizes; router_logits' did not. router_logits (fp32 FMAs, its warps over K)
  // took 4.8 ms of a 4096-token step, 1.5 ms of a 512-token one (4 layers, H100).
  cuda::GemmParams gate_gemm;
  gate_gemm.x = x;
  gate_gemm.ldx = D;
  gate_gemm.w = layer.gate;
  gate_gemm.n = n;
  gate_gemm.y = plan.scores;
  gate_gemm.ldy = E;
  gate_gemm.x_bf16 = true;
  const bool gate_on_tensor_cores =
      grouped && layer.gate.format == WFormat::kBF16 && cuda::gemm_tensor_core(gate_gemm, *this);
  if (!gate_on_tensor_cores) {
    cuda::moe::RouterLogitsParams logits;
    logits.x = x;
    logits.gate = view_of(layer.gate);
    logits.gate_format = format_of(layer.gate, false);  // the router runs on fp32 FMAs
    logits.n = n;
    logits.D = D;
    logits.E = E;
    logits.logits = plan.scores;
    cuda::moe::launch_router_logits(logits, pdl, stream_);
  }

  cuda::moe::RouteParams route;
  route.plan = plan;
  route.gate_bias = hash ? nullptr : dev(w.gate_bias);
  route.tid2eid = hash ? dev(w.tid2eid) : nullptr;
  route.tokens = hash ? tokens : nullptr;
  route.n = n;
  route.E = E;
  route.k = k;
  route.routed_scaling_factor = float(config_.routed_scaling_factor);
  route.expert_begin = layer.expert_begin;
  route.expert_end = layer.expert_end;
  route.shared_items = layer.has_shared && !shared_grouped;
  cuda::moe::launch_route(route, pdl, stream_);

  cuda::moe::ExpertParams ep;
  ep.plan = plan;
  ep.x = x;
  ep.experts = experts;
  ep.routed_up = layer.routed_up;
  ep.routed_down = layer.routed_down;
  ep.shared_w1 = view_of(layer.shared_w1);
  ep.shared_w3 = view_of(layer.shared_w3);
  ep.shared_w2 = view_of(layer.shared_w2);
  ep.shared_up = layer.shared_up;
  ep.shared_down = layer.shared_down;
  ep.n = n;
  ep.D = D;
  ep.I = I;
  ep.k = k;
  ep.E = E;
  ep.has_shared = layer.has_shared;
  ep.shared_items = layer.has_shared && !shared_grouped;
  ep.swiglu_limit = float(config_.swiglu_limit);
  ep.fast = fast();
  ep.round_sum = round_sum;
  ep.staged_rows = cuda::moe::rows_for(int(std::min<int64_t>(cuda::moe::kChunk, n)));
  ep.out = out;
  ep.row_blocks = cuda::ceil_div(I, cuda::moe::kUpRowsPerItem);
  if (grouped) {
    cuda::moe::launch_experts_grouped(ep, gbuf, stream_);
    return;
  }
  if (shared_grouped) cuda::moe::launch_shared_grouped(ep, gbuf, sms, stream_);
  cuda::moe::launch_expert_up(ep, sms, pdl, stream_);
  ep.row_blocks = cuda::ceil_div(D, cuda::moe::kDownRowsPerItem);
  cuda::moe::launch_expert_down(ep, sms, pdl, stream_);
}

}  // namespace dsv4
