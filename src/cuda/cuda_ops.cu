// CudaOps: device, stream, memory and weight upload. The op families live in their own folders.
#include <algorithm>
#include <bit>
#include <cstring>
#include <utility>
#include <vector>

#include "cpu/cpu_ops.h"  // rope_inv_freq: host-side constants shared with the CPU reference
#include "cuda/common/check.h"
#include "cuda/cuda_ops.h"
#include "cuda/loader/synth_fill.h"
#include "cuda/sampling/sampling.h"
#include "loader/checkpoint.h"

namespace dsv4 {

using cuda::DeviceWeight;
using cuda::WFormat;

CudaOps::CudaOps(const ModelConfig& config, int device, std::shared_ptr<cuda::NcclGroup> group, int rank)
    : config_(config), device_(device), group_(std::move(group)), rank_(rank) {
  int count = 0;
  DSV4_CUDA_CHECK(cudaGetDeviceCount(&count));
  DSV4_CHECK(device >= 0 && device < count, "CUDA device ", device, " requested, ", count, " visible");
  DSV4_CUDA_CHECK(cudaSetDevice(device));
  DSV4_CUDA_CHECK(cudaGetDeviceProperties(&props_, device));
  DSV4_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_.handle(), cudaStreamNonBlocking));
  const auto constants = [&](const std::vector<float>& host) {
    auto* d = static_cast<float*>(device_alloc(std::max<size_t>(host.size(), 1) * sizeof(float)));
    DSV4_CUDA_CHECK(cudaMemcpy(d, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
    return d;
  };
  inv_freq_plain_ = constants(rope_inv_freq(config.rope_dim, config.rope_theta, nullptr));
  inv_freq_compressed_ = constants(rope_inv_freq(config.rope_dim, config.compress_rope_theta, &config.yarn));
}

CudaOps::~CudaOps() {
  // Destructors must not throw: errors here are reported by nobody, the process is ending or moving on. A
  // deferred all-reduce or hc_post is dropped: nobody can observe its X any more.
  deferred_reduce_ = {};
  deferred_post_ = {};
  cudaSetDevice(device_);
  cudaStream_t stream = stream_.handle();
  if (stream) cudaStreamSynchronize(stream);
  for (void* p : allocations_) cudaFree(p);
  for (auto& [p, bytes] : workspaces_) cudaFree(p);
  for (auto& [p, bytes] : pinned_) cudaFreeHost(p);
  if (draws_uploaded_) cudaEventDestroy(draws_uploaded_);
  if (stream) cudaStreamDestroy(stream);
}

void CudaOps::bind_thread() { DSV4_CUDA_CHECK(cudaSetDevice(device_)); }

void CudaOps::all_reduce(float* x, size_t count) {
  if (!group_) return;
  group_->check_alive();
  if (!group_->peers()) return group_->all_reduce(rank_, x, count, stream_);
  flush_deferred();  // anything deferred before it (hc/hc.cu)
  if (count > 0) deferred_reduce_ = {x, count};
}

void CudaOps::abort_group() {
  if (group_) group_->abort();
}

void* CudaOps::device_alloc(size_t bytes) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, std::max<size_t>(bytes, 16));
  DSV4_CHECK(err == cudaSuccess, "GPU out of memory: cannot allocate ", bytes, " bytes on device ", device_, " (",
             cudaGetErrorString(err), ")");
  allocations_.push_back(p);
  return p;
}

float* CudaOps::alloc(size_t count) {
  auto* p = static_cast<float*>(device_alloc(count * sizeof(float)));
  DSV4_CUDA_CHECK(cudaMemsetAsync(p, 0, count * sizeof(float), stream_));
  return p;
}

int32_t* CudaOps::alloc_i32(size_t count) {
  auto* p = static_cast<int32_t*>(device_alloc(count * sizeof(int32_t)));
  DSV4_CUDA_CHECK(cudaMemsetAsync(p, 0, count * sizeof(int32_t), stream_));
  return p;
}

void CudaOps::upload_i32(int32_t* dst, const int32_t* host, size_t count) {
  DSV4_CUDA_CHECK(cudaMemcpyAsync(dst, host, count * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
}

void CudaOps::download(float* host, const float* src, size_t count) {
  DSV4_CUDA_CHECK(cudaMemcpyAsync(host, src, count * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  DSV4_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaOps::download_i32(int32_t* host, const int32_t* src, size_t count) {
  if (count == 0) return;
  // Through page-locked staging: a pageable copy of a few ids costs a staging round of its own.
  auto* staging = static_cast<int32_t*>(pinned(kPinnedIds, count * sizeof(int32_t)));
  DSV4_CUDA_CHECK(cudaMemcpyAsync(staging, src, count * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
  DSV4_CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::copy(staging, staging + count, host);
}

void* CudaOps::pinned(PinnedSlot slot, size_t bytes) {
  if (pinned_.size() <= size_t(slot)) pinned_.resize(size_t(slot) + 1, {nullptr, 0});
  auto& [p, size] = pinned_[size_t(slot)];
  if (size < bytes) {  // the first calls only, like the workspaces
    DSV4_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (p) DSV4_CUDA_CHECK(cudaFreeHost(p));
    p = nullptr;
    size = 0;
    DSV4_CUDA_CHECK(cudaMallocHost(&p, bytes));
    size = bytes;
  }
  return p;
}

void CudaOps::greedy_tokens(const float* logits, int64_t rows, int64_t vocab, int32_t* tokens, float* values) {
  if (rows == 0) return;
  // The arrival counters have a slot of their own: a slot shared with the partials would put them at an
  // offset that moves with rows × slices, over bytes an earlier call left non-zero.
  const int64_t slices = cuda::greedy_slices(vocab);
  cuda::GreedyParams p;
  p.logits = logits;
  p.rows = rows;
  p.vocab = p.ld = vocab;
  p.tokens = tokens;
  p.values = values;
  p.partials = static_cast<int2*>(workspace(cuda::kWsGreedyPartials, size_t(rows * slices) * sizeof(int2)));
  p.arrivals = static_cast<unsigned*>(workspace(cuda::kWsGreedyArrivals, size_t(rows) * sizeof(unsigned), /*zeroed=*/true));
  cuda::greedy_tokens(p, stream_, pdl());
}

void CudaOps::copy_rows(const float* src, int64_t rows, int64_t cols, float* dst, int64_t ld_dst) {
  if (rows == 0) return;
  DSV4_CUDA_CHECK(cudaMemcpy2DAsync(dst, size_t(ld_dst) * sizeof(float), src, size_t(cols) * sizeof(float),
                                    size_t(cols) * sizeof(float), size_t(rows), cudaMemcpyDeviceToDevice, stream_));
}

void CudaOps::sample_tokens(const float* logits, int64_t vocab, std::span<const RowDraw> draws, int32_t* tokens) {
  const int64_t rows = int64_t(draws.size());
  if (rows == 0) return;
  // One upload: [rows] DrawRow, then every row's edits, then every row's mask (each block keeps the next's
  // alignment: DrawRow is 8-byte, LogitEdit 4-byte aligned).
  const int64_t words = (vocab + 31) / 32;
  int64_t edits = 0, masks = 0;
  for (const RowDraw& d : draws) edits += int64_t(d.edits.size()), masks += d.allowed ? 1 : 0;
  const size_t draw_bytes = size_t(rows) * sizeof(cuda::DrawRow), edit_bytes = size_t(edits) * sizeof(LogitEdit);
  const size_t bytes = draw_bytes + edit_bytes + size_t(masks * words) * sizeof(uint32_t);
  // The staging is written only once the last call's copy from it is done.
  if (draws_uploaded_) DSV4_CUDA_CHECK(cudaEventSynchronize(draws_uploaded_));
  else DSV4_CUDA_CHECK(cudaEventCreateWithFlags(&draws_uploaded_, cudaEventDisableTiming));
  auto* staging = static_cast<uint8_t*>(pinned(kPinnedDraws, bytes));
  auto* draw_h = reinterpret_cast<cuda::DrawRow*>(staging);
  auto* edit_h = reinterpret_cast<LogitEdit*>(staging + draw_bytes);
  auto* mask_h = reinterpret_cast<uint32_t*>(staging + draw_bytes + edit_bytes);
  int64_t edit = 0, mask = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const RowDraw& d = draws[size_t(r)];
    cuda::DrawRow& row = draw_h[r];
    row = {d.temperature, d.top_p, d.min_p, d.repetition_penalty, d.top_k, d.seed, d.step};
    if (d.allowed) {
      std::copy_n(d.allowed, words, mask_h + mask * words);
      row.mask = mask++ * words;
    }
    row.edit_begin = edit;
    std::copy(d.edits.begin(), d.edits.end(), edit_h + edit);
    row.edit_end = edit += int64_t(d.edits.size());
  }
  auto* inputs = static_cast<uint8_t*>(workspace(cuda::kWsSampleInputs, bytes));
  DSV4_CUDA_CHECK(cudaMemcpyAsync(inputs, staging, bytes, cudaMemcpyHostToDevice, stream_));
  DSV4_CUDA_CHECK(cudaEventRecord(draws_uploaded_, stream_));
  cuda::SampleParams p;
  p.logits = logits;
  p.rows = rows;
  p.vocab = vocab;
  p.draws = reinterpret_cast<const cuda::DrawRow*>(inputs);
  p.edits = reinterpret_cast<const LogitEdit*>(inputs + draw_bytes);
  p.masks = reinterpret_cast<const uint32_t*>(inputs + draw_bytes + edit_bytes);
  if (edits > 0) p.work = static_cast<float*>(workspace(cuda::kWsSampleWork, size_t(rows * vocab) * sizeof(float)));
  p.tokens = tokens;
  cuda::sample_tokens(p, stream_);
}

void CudaOps::token_logprobs(const float* logits, int64_t vocab, std::span<const int64_t> rows, const int32_t* tokens,
                             int64_t top, std::span<TokenLogprobs> out) {
  const int64_t n = int64_t(rows.size());
  if (n == 0) return;
  // One buffer: rows in; the normalisers, top (id, logit) pairs and chosen logits out, in that order so that
  // every section is 8-byte aligned whatever n.
  const size_t rows_bytes = size_t(n) * 8, z_bytes = size_t(n) * 8, best_bytes = size_t(n * top) * sizeof(int2);
  const size_t out_bytes = z_bytes + best_bytes + size_t(n) * 4;
  auto* buffer = static_cast<uint8_t*>(workspace(cuda::kWsLogprobs, rows_bytes + out_bytes));
  DSV4_CUDA_CHECK(cudaMemcpyAsync(buffer, rows.data(), rows_bytes, cudaMemcpyHostToDevice, stream_));
  cuda::LogprobParams p;
  p.logits = logits;
  p.vocab = vocab;
  p.rows = reinterpret_cast<const int64_t*>(buffer);
  p.count = n;
  p.tokens = tokens;
  p.top = top;
  p.log_z = reinterpret_cast<double*>(buffer + rows_bytes);
  p.best = reinterpret_cast<int2*>(buffer + rows_bytes + z_bytes);
  p.chosen = reinterpret_cast<float*>(buffer + rows_bytes + z_bytes + best_bytes);
  cuda::token_logprobs(p, stream_);
  logprob_staging_.resize(out_bytes);
  DSV4_CUDA_CHECK(
      cudaMemcpyAsync(logprob_staging_.data(), buffer + rows_bytes, out_bytes, cudaMemcpyDeviceToHost, stream_));
  DSV4_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const auto* log_z = reinterpret_cast<const double*>(logprob_staging_.data());
  const auto* best = reinterpret_cast<const int2*>(logprob_staging_.data() + z_bytes);
  const auto* chosen = reinterpret_cast<const float*>(logprob_staging_.data() + z_bytes + best_bytes);
  // As the CPU's token_logprobs: logit − log Z in double, the top ones most likely first, lower id first on ties.
  for (int64_t i = 0; i < n; ++i) {
    const auto logprob = [&](float l) { return float(double(l) - log_z[i]); };
    std::vector<std::pair<int32_t, float>> ranked;
    for (int64_t j = 0; j < top; ++j) {
      const int2 b = best[i * top + j];
      ranked.emplace_back(b.x, std::bit_cast<float>(b.y));
    }
    std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
      return a.second > b.second || (a.second == b.second && a.first < b.first);
    });
    TokenLogprobs& o = out[size_t(i)];
    o.logprob = logprob(chosen[i]);
    o.top.clear();
    for (const auto& [id, l] : ranked) o.top.emplace_back(id, logprob(l));
  }
}

void CudaOps::copy(const float* src, size_t count, float* dst) {
  DSV4_CUDA_CHECK(cudaMemcpyAsync(dst, src, count * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
}

void* CudaOps::workspace(int slot, size_t bytes, bool zeroed) {
  if (workspaces_.size() <= size_t(slot)) workspaces_.resize(size_t(slot) + 1, {nullptr, 0});
  auto& [p, size] = workspaces_[size_t(slot)];
  if (size < bytes) {
    // Growth happens on the first steps only; the stream must be idle before the old buffer goes.
    DSV4_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (p) DSV4_CUDA_CHECK(cudaFree(p));
    p = nullptr;
    const cudaError_t err = cudaMalloc(&p, bytes);
    DSV4_CHECK(err == cudaSuccess, "GPU out of memory: cannot allocate a workspace of ", bytes, " bytes");
    if (zeroed) DSV4_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
    size = bytes;
  }
  return p;
}

// ---- upload

namespace {

// Host copy of a checkpoint scale grid as floats (E8M0 or F32 storage).
std::vector<float> scales_f32(const Weight& w, int64_t srows, int64_t scols) {
  std::vector<float> out(size_t(srows * scols));
  for (int64_t r = 0; r < srows; ++r)
    for (int64_t c = 0; c < scols; ++c) {
      const int64_t i = r * w.scale_stride + c;
      float s;
      if (w.scale_dtype == DType::kF32) std::memcpy(&s, w.scale + 4 * i, 4);
      else s = e8m0_to_f32(w.scale[i]);
      out[size_t(r * scols + c)] = s;
    }
  return out;
}

}  // namespace

const DeviceWeight& CudaOps::upload(const Weight& w) {
  DSV4_ASSERT(!w.empty());
  if (auto it = weights_.find(w.data); it != weights_.end()) return it->second;
  DeviceWeight d;
  d.rows = w.rows;
  d.cols = w.cols;
  std::vector<uint8_t> packed;  // compact host rows, only when the checkpoint's need converting
  const uint8_t* src = w.data;
  int64_t src_stride = w.row_stride;
  switch (w.dtype) {
    case DType::kF32: d.format = WFormat::kF32; break;
    case DType::kBF16: d.format = WFormat::kBF16; break;
    case DType::kF8E4M3: d.format = WFormat::kFP8; break;
    case DType::kI8: d.format = WFormat::kFP4; break;
    case DType::kF16: {  // rare in checkpoints: widen to F32 once
      d.format = WFormat::kF32;
      packed.resize(size_t(w.rows * w.cols * 4));
      for (int64_t r = 0; r < w.rows; ++r)
        for (int64_t c = 0; c < w.cols; ++c) {
          uint16_t h;
          std::memcpy(&h, w.data + r * w.row_stride + 2 * c, 2);
          const float f = f16_to_f32(h);
          std::memcpy(packed.data() + 4 * (r * w.cols + c), &f, 4);
        }
      src = packed.data();
      src_stride = w.cols * 4;
      break;
    }
    default: fail(cat("CUDA backend: weight dtype ", dtype_name(w.dtype), " is not supported"));
  }
  const int64_t row_bytes = d.row_bytes();
  auto* data = static_cast<uint8_t*>(device_alloc(size_t(w.rows * row_bytes)));
  if (const GeneratedTensor* g = generated(w.data)) {
    make_generated(*g, w.data, data, w.rows, row_bytes, w.row_stride);
  } else {
    DSV4_CUDA_CHECK(cudaMemcpy2D(data, size_t(row_bytes), src, size_t(src_stride), size_t(row_bytes), size_t(w.rows),
                                 cudaMemcpyHostToDevice));
  }
  d.data = data;
  if (d.format == WFormat::kFP8) {
    DSV4_CHECK(w.scale_block_rows == 128 && w.scale_block_cols == 128, "CUDA backend: FP8 weight with ",
               w.scale_block_rows, "x", w.scale_block_cols, " scale blocks (expected 128x128)");
    const int64_t srows = cuda::ceil_div(w.rows, 128);
    d.scale_cols = cuda::ceil_div(w.cols, 128);
    const std::vector<float> s = scales_f32(w, srows, d.scale_cols);
    auto* ds = static_cast<float*>(device_alloc(s.size() * sizeof(float)));
    DSV4_CUDA_CHECK(cudaMemcpy(ds, s.data(), s.size() * sizeof(float), cudaMemcpyHostToDevice));
    d.scale_f32 = ds;
  } else if (d.format == WFormat::kFP4) {
    DSV4_CHECK(w.scale_block_rows == 1 && w.scale_block_cols == 32, "CUDA backend: FP4 weight with ",
               w.scale_block_rows, "x", w.scale_block_cols, " scale blocks (expected 1x32)");
    d.scale_cols = w.cols / 32;
    auto* ds = static_cast<uint8_t*>(device_alloc(size_t(w.rows * d.scale_cols)));
    d.scale_e8m0 = ds;
    if (const GeneratedTensor* g = w.scale_dtype == DType::kF8E8M0 ? generated(w.scale) : nullptr) {
      make_generated(*g, w.scale, ds, w.rows, d.scale_cols, w.scale_stride);
      // Every byte is one of the value table's: its range bounds the scales' (exactly, for a constant table).
      const auto* table = static_cast<const uint8_t*>(g->fill.table);
      const auto [lo, hi] = std::minmax_element(table, table + kSynthTableEntries);
      d.scale_lo = *lo;
      d.scale_hi = *hi;
      d.scale_span = w.cols % 128 == 0 ? uint8_t(*hi - *lo) : 255;
      return weights_.emplace(w.data, d).first->second;
    }
    std::vector<uint8_t> s(size_t(w.rows * d.scale_cols));
    for (int64_t r = 0; r < w.rows; ++r)
      for (int64_t c = 0; c < d.scale_cols; ++c) {
        const int64_t i = r * w.scale_stride + c;
        uint8_t e;
        if (w.scale_dtype == DType::kF32) {  // F32 multipliers must be powers of two to stay E8M0 on the device
          float f;
          std::memcpy(&f, w.scale + 4 * i, 4);
          uint32_t bits;
          std::memcpy(&bits, &f, 4);
          DSV4_CHECK((bits & 0x807FFFFFu) == 0 && bits != 0, "CUDA backend: FP4 scale ", f,
                     " is not a power of two (row ", r, ")");
          e = uint8_t(bits >> 23);
        } else {
          e = w.scale[i];
        }
        s[size_t(r * d.scale_cols + c)] = e;
      }
    const auto [lo, hi] = std::minmax_element(s.begin(), s.end());
    d.scale_lo = *lo;
    d.scale_hi = *hi;
    if (w.cols % 128 == 0) {
      d.scale_span = 0;
      for (size_t b = 0; b < s.size(); b += 4) {
        const auto [blo, bhi] = std::minmax_element(s.begin() + b, s.begin() + b + 4);
        d.scale_span = std::max(d.scale_span, uint8_t(*bhi - *blo));
      }
    }
    DSV4_CUDA_CHECK(cudaMemcpy(ds, s.data(), s.size(), cudaMemcpyHostToDevice));
  }
  return weights_.emplace(w.data, d).first->second;
}

const GeneratedTensor* CudaOps::generated(const uint8_t* host) const {
  return storage_ ? storage_->generated(host) : nullptr;
}

void CudaOps::make_generated(const GeneratedTensor& g, const uint8_t* host, uint8_t* dst, int64_t rows,
                             int64_t row_bytes, int64_t src_stride) {
  auto& table = synth_tables_[g.fill.table];
  if (!table) {
    const size_t bytes = size_t(kSynthTableEntries) * size_t(g.fill.entry_bytes);
    table = device_alloc(bytes);
    DSV4_CUDA_CHECK(cudaMemcpy(table, g.fill.table, bytes, cudaMemcpyHostToDevice));
  }
  cuda::SynthFillParams p;
  p.dst = dst;
  p.rows = rows;
  p.row_bytes = row_bytes;
  p.dst_pitch = row_bytes;
  p.first = uint64_t(host - g.data);
  p.src_stride = src_stride;
  p.fill = g.fill;
  p.fill.table = table;
  DSV4_CHECK(p.first + uint64_t(std::max<int64_t>(rows - 1, 0) * src_stride + row_bytes) <= g.nbytes,
             "internal error: a generated weight's slice runs past its tensor");
  cuda::synth_fill(p, stream_);
  DSV4_CUDA_CHECK(cudaStreamSynchronize(stream_));  // done on return, as the copies of stored weights are
}

const float* CudaOps::upload(const std::vector<float>& v) {
  if (auto it = vectors_.find(v.data()); it != vectors_.end()) return static_cast<const float*>(it->second);
  auto* d = static_cast<float*>(device_alloc(std::max<size_t>(v.size(), 1) * sizeof(float)));
  DSV4_CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
  vectors_.emplace(v.data(), d);
  return d;
}

const int32_t* CudaOps::upload(const std::vector<int32_t>& v) {
  if (auto it = vectors_.find(v.data()); it != vectors_.end()) return static_cast<const int32_t*>(it->second);
  auto* d = static_cast<int32_t*>(device_alloc(std::max<size_t>(v.size(), 1) * sizeof(int32_t)));
  DSV4_CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  vectors_.emplace(v.data(), d);
  return d;
}

void CudaOps::upload_model(const ModelWeights& m) {
  storage_ = m.storage.get();
  for (const Weight* w : m.matrices)
    if (w && !w->empty()) upload(*w);
  const auto vec = [&](const auto& v) {
    if (!v.empty()) upload(v);
  };
  const auto hc = [&](const auto& h) {
    vec(h.base);
    vec(h.scale);
  };
  const auto compressor = [&](const CompressorWeights& c) {
    vec(c.ape);
    vec(c.norm);
  };
  const auto layer = [&](const LayerWeights& l) {
    vec(l.attn_norm);
    vec(l.ffn_norm);
    hc(l.hc_attn);
    hc(l.hc_ffn);
    vec(l.attn.q_norm);
    vec(l.attn.kv_norm);
    vec(l.attn.sinks);
    compressor(l.attn.compressor);
    compressor(l.attn.indexer.compressor);
    vec(l.moe.gate_bias);
    vec(l.moe.tid2eid);
  };
  vec(m.norm);
  hc(m.hc_head);
  for (const auto& l : m.layers) layer(l);
  for (const auto& t : m.mtp) {
    vec(t.enorm);
    vec(t.hnorm);
    vec(t.norm);
    hc(t.hc_head);
    layer(t.block);
  }
  DSV4_CUDA_CHECK(cudaDeviceSynchronize());
}

const DeviceWeight& CudaOps::dev(const Weight& w) const {
  auto it = weights_.find(w.data);
  DSV4_CHECK(it != weights_.end(), "internal error: weight [", w.rows, ", ", w.cols, "] was not uploaded");
  return it->second;
}

const float* CudaOps::dev_floats(const float* host) const {
  auto it = vectors_.find(host);
  DSV4_CHECK(it != vectors_.end(), "internal error: vector at ", static_cast<const void*>(host),
             " was not uploaded");
  return static_cast<const float*>(it->second);
}

const float* CudaOps::dev(const std::vector<float>& v) const { return dev_floats(v.data()); }

const int32_t* CudaOps::dev(const std::vector<int32_t>& v) const {
  auto it = vectors_.find(v.data());
  DSV4_CHECK(it != vectors_.end(), "internal error: int vector was not uploaded");
  return static_cast<const int32_t*>(it->second);
}

}  // namespace dsv4
