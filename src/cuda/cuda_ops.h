// The CUDA backend: the Ops seam on one GPU, every operation a kernel of our own (src/cuda/<family>/).
// Weights are uploaded once, in checkpoint precision (common/device_weight.h); activations and per-sequence
// state come from alloc() at load; op workspaces grow on the first step and are reused after, so the decode
// loop never allocates. Everything runs in order on one stream; download() is the only synchronising call. Two
// ops are deferred until the next use of the stream (Stream): hc_post, so that hc_pre_norm can run it fused, and
// a decode-sized all-reduce of the rows hc_post then reads, so that the same fused kernel sums the ranks' shares
// over NVLink (comm/peer_exchange.h) instead of an NCCL call before it.
//
// Each family implements its members in its own folder: elementwise/, gemm/, norm_rope/, quant/, hc/,
// attention/ (compressor, indexer_topk, attention), moe/.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "cuda/comm/nccl_group.h"
#include "cuda/common/device_weight.h"
#include "cuda/moe/moe_tables.h"
#include "loader/synth_fill.h"
#include "model/ops.h"

namespace dsv4 {

namespace cuda {
// CudaOps::workspace slots, one registry for every family: an op may hold its slot while it calls another
// op (the compressor calls linear), so two families must never share a number.
enum WorkspaceSlot : int {
  kWsGemmActivations,       // tensor-core path: activations rounded to bf16 / e4m3
  kWsGemmActivationScales,  // tensor-core path: per-128 activation scales (FP8)
  kWsGemmPartials,          // tensor-core path: split-K partial sums
  kWsHcPartials,            // hc_pre / hc_head: per-slice partial mixes
  kWsHcPre,                 // hc_pre_norm at prefill sizes: pre between its two kernels
  kWsAttentionPartials,     // split-KV partial outputs and softmax statistics
  kWsIndexerScores,         // indexer_topk: per-row score keys
  kWsCompressorProj,        // the chunk's kv and gate projections (held across linear())
  kWsMoeStep,               // moe: routing, grouping and intermediate activations of one call
  kWsMoeTables,             // moe: device tables of expert weight pointers
  kWsCompressorEntries,     // compressor into a compact cache: the chunk's entries in fp32 before packing
  kWsCacheStaging,          // write_cache / read_cache: fp32 rows on the device
  kWsGemvPartials,          // gemv: split-K partial sums
  kWsGemvArrivals,          // gemv: split-K arrival counters (zeroed: every call leaves them zero)
  kWsGreedyPartials,        // greedy_tokens: each slice's winner
  kWsGreedyArrivals,        // greedy_tokens: per-row arrival counters (zeroed: every call leaves them zero)
  kWsIndexerHist,           // indexer_topk: per-row top-bits histograms (zeroed: every call leaves them zero)
  kWsSampleInputs,          // sample_tokens: the rows' draws, edits and masks, one upload
  kWsSampleWork,            // sample_tokens: the edited copies of rows with edits
  kWsLogprobs,              // token_logprobs: the rows in, the normalisers, chosen and top logits out
  kWsGemmWidened,           // bf16 rows as fp32 for the paths that do not take bf16: linear_grouped's x, linear's
                            // y before it is narrowed
};

// The storage of a cache from CudaOps::alloc_cache (layouts in attention/kv_cache.cuh).
struct CacheLayout {
  CacheFormat format = CacheFormat::kF32;
  int64_t rows = 0, dim = 0;
  int32_t nope = 0;    // kFp8Kv: channels [0, nope) in e4m3, the rest (rope) fp32
  int32_t scales = 0;  // byte offset of the E8M0 scales in a row
  int32_t rope = 0;    // kFp8Kv: byte offset of the fp32 rope channels (16-aligned)
  int64_t row_bytes = 0;
};
}  // namespace cuda

class CudaOps final : public Ops {
 public:
  // group: the GPU ranks this backend's shard belongs to (model/parallel.h), nullptr when alone.
  explicit CudaOps(const ModelConfig& config, int device = 0, std::shared_ptr<cuda::NcclGroup> group = nullptr,
                   int rank = 0);
  ~CudaOps() override;
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;

  // Uploads every matrix (checkpoint precision) and every small vector of the model. Call once, before
  // the first step; ops look weights up by their host address.
  void upload_model(const ModelWeights& model);
  // Single objects, for tests and for ops that receive weights the model did not own.
  const cuda::DeviceWeight& upload(const Weight& w);
  const float* upload(const std::vector<float>& v);
  const int32_t* upload(const std::vector<int32_t>& v);
  // Reorders an uploaded FP4 / FP8 matrix in place into the MoE expert kernels' tensor-core layout
  // (moe/weight_mma.cuh), once: the MMA tile order where its rows make whole tiles (rows a multiple of 16, rows of
  // whole 64-byte K groups), and an FP4 matrix's words in the MMA bit order. Afterwards only those kernels may read
  // it. Called by moe on a layer's first call.
  const cuda::DeviceWeight& to_mma_layout(const Weight& w);

  // ---- Ops
  void set_numerics(Numerics numerics) override { numerics_ = numerics; }
  void bind_thread() override;
  // Deferred where the group has a peer exchange: taken by the hc_post that reads x, and summed inside
  // hc_post_mix up to kPostMixMaxTokens rows (hc/hc.cu); else run by NCCL, at the latest at the next use of the
  // stream.
  void all_reduce(float* x, size_t count) override;
  void abort_group() override;
  Numerics numerics() const { return numerics_; }
  // Fast numerics round where DeepSeek's GPU code does (docs/design/fast-numerics.md §7): each family's
  // kernels take it as a flag in their params.
  bool fast() const { return numerics_ == Numerics::kFast; }

  float* alloc(size_t count) override;
  int32_t* alloc_i32(size_t count) override;
  // Compact formats get their own layout (kFp8Kv needs dim − rope_dim and rope_dim multiples of 4, kFp4Keys a
  // dim multiple of 32); kF32 is a plain alloc.
  float* alloc_cache(CacheFormat format, int64_t rows, int64_t dim) override;
  void copy_cache(const float* src, int64_t rows, int64_t dim, float* dst) override;
  void fill(float* x, size_t count, float value) override;
  void upload_i32(int32_t* dst, const int32_t* host, size_t count) override;
  void download(float* host, const float* src, size_t count) override;
  void download_i32(int32_t* host, const int32_t* src, size_t count) override;
  void copy(const float* src, size_t count, float* dst) override;

  void embed(const Weight& table, const int32_t* tokens, int64_t n, float* out) override;
  void broadcast_streams(const float* x, int64_t n, int64_t hc, int64_t dim, float* X) override;
  void add(const float* a, const float* b, size_t count, float* out) override;
  void scale(float* x, size_t count, float factor) override;
  void greedy_tokens(const float* logits, int64_t rows, int64_t vocab, int32_t* tokens, float* values) override;
  void copy_rows(const float* src, int64_t rows, int64_t cols, float* dst, int64_t ld_dst) override;
  void sample_tokens(const float* logits, int64_t vocab, std::span<const RowDraw> draws, int32_t* tokens) override;
  void token_logprobs(const float* logits, int64_t vocab, std::span<const int64_t> rows, const int32_t* tokens,
                      int64_t top, std::span<TokenLogprobs> out) override;
  void ring_store(const float* x, int64_t n, int64_t cols, int64_t pos0, int64_t slots, float* ring) override;

  void linear(const float* x, int64_t ldx, const Weight& w, int64_t n, float* y, int64_t ldy,
              const E4m3Rows* xq = nullptr, Bf16Rows* yb = nullptr) override;
  void linear_partial(const float* x, int64_t ldx, const Weight& w, int64_t n, float* y, int64_t ldy) override;
  void linear_pair(const float* x, int64_t ldx, int64_t n, const Weight& wa, float* ya, int64_t ldya, const Weight& wb,
                   float* yb, int64_t ldyb, const E4m3Rows* xq = nullptr) override;
  void linear_grouped(const float* x, const Weight& w, int64_t groups, int64_t n, float* y,
                      const Bf16Rows* xb = nullptr) override;
  // The tensor-core GEMM (sm_90a, above the GEMV's rows) reads bf16 rows as they are; the GEMVs widen them first,
  // which at decode cost more than the fp32 round trip they save (batch 8: 2.07 → 2.11 ms, H100).
  bool bf16_rows_pay(int64_t n) const override;
  void lm_head(const float* x, const Weight& head, int64_t n, float* logits) override;
  // linear() in fp32 whatever the numerics: the projections DeepSeek keeps in fp32 (the compressor's; fast
  // numerics' LM head).
  void linear_f32(const float* x, int64_t ldx, const Weight& w, int64_t n, float* y, int64_t ldy);
  void linear_pair_f32(const float* x, int64_t ldx, int64_t n, const Weight& wa, float* ya, int64_t ldya,
                       const Weight& wb, float* yb, int64_t ldyb);
  // An uploaded matrix in BF16 (for the tensor cores), made on its first use and kept.
  const cuda::DeviceWeight& bf16_copy(const Weight& w);

  void rms_norm(const float* x, const std::vector<float>* gamma, int64_t rows, int64_t dim, float* y,
                E4m3Rows* yq = nullptr) override;
  void rope(float* x, int64_t rows, int64_t row_stride, int64_t offset, int64_t rows_per_pos, int64_t pos0,
            int64_t pos_stride, RopeKind kind, bool inverse) override;
  void rope_spans(std::span<const RopeSpan> spans, int64_t row_stride, int64_t offset, int64_t rows_per_pos,
                  RopeKind kind) override;
  void norm_rope(float* x, const std::vector<float>* gamma, int64_t rows, int64_t dim, int64_t offset,
                 int64_t rows_per_pos, int64_t pos0, RopeKind kind) override;
  void kv_finish(float* kv, const std::vector<float>& gamma, int64_t n, int64_t dim, int64_t nope, int64_t pos0,
                 RopeKind kind, bool simulate, int64_t slots, float* ring) override;
  void query_kv_finish(std::span<const QueryKvParams> batch) override;

  void sim_fp8(float* x, int64_t rows, int64_t row_stride, int64_t cols, int64_t block) override;
  void hadamard_sim_fp4(float* x, int64_t rows, int64_t dim) override;

  void hc_pre(const float* X, const HcWeights& w, int64_t n, float* x, float* post, float* comb) override;
  // Deferred (ops.h): launched fused into the hc_pre_norm that follows on the same X at decode, else by the next
  // use of the stream (flush_deferred). Takes over a deferred all-reduce of f.
  void hc_post(const float* f, const float* post, const float* comb, int64_t n, float* X) override;
  void hc_head(const float* X, const HcHeadWeights& w, int64_t n, float* y) override;
  void hc_pre_norm(const float* X, const HcWeights& w, const std::vector<float>& gamma, int64_t n, int64_t dim,
                   float* x, float* xn, float* post, float* comb, E4m3Rows* xnq = nullptr) override;

  void compressor(std::span<const CompressorParams> batch) override;
  void indexer_topk(std::span<const IndexerParams> batch) override;
  void attention(std::span<const AttentionParams> batch) override;

  void moe(const MoeWeights& w, const float* x, const int32_t* tokens, int64_t n, float* out) override;
  void moe_partial(const MoeWeights& w, const float* x, const int32_t* tokens, int64_t n, float* out) override;

  // ---- for the families
  // The ops' stream; a deferred hc_post is launched first (Stream). A caller that keeps the handle and enqueues
  // on it after a later hc_post must ask again.
  cudaStream_t stream() const { return stream_; }
  // Programmatic dependent launch (sm_90+): decode-step kernels launch while their predecessor drains and
  // wait for it on the device (common/launch.cuh).
  bool pdl() const { return props_.major >= 9; }
  const cudaDeviceProp& props() const { return props_; }
  const ModelConfig& config() const { return config_; }
  const cuda::DeviceWeight& dev(const Weight& w) const;      // uploaded copy; a clear error if missing
  const float* dev(const std::vector<float>& v) const;
  const int32_t* dev(const std::vector<int32_t>& v) const;
  const float* dev_floats(const float* host) const;          // by the host address of an uploaded vector
  // The layout of a compact cache, by the pointer alloc_cache returned; nullptr for every other buffer (fp32 rows).
  const cuda::CacheLayout* compact_cache(const void* p) const;
  // Rows [0, rows) of a cache as fp32 on the host, and fp32 host rows into a cache (quantised as the simulation
  // points do). For tests; synchronous.
  void read_cache(const float* cache, int64_t rows, int64_t dim, float* host);
  void write_cache(float* cache, int64_t rows, int64_t dim, const float* host);
  // Device workspace `slot` of at least `bytes`, grown on first use (the stream synchronised first). A zeroed
  // slot is all zero bytes when (re)allocated; its users must leave it so.
  void* workspace(int slot, size_t bytes, bool zeroed = false);
  // Page-locked host memory of at least `bytes` for slot (PinnedSlot): copies from it are asynchronous, where a
  // pageable copy to the device first waits for the stream. Grown on first use (the stream drains first).
  enum PinnedSlot { kPinnedIds, kPinnedDraws };
  void* pinned(PinnedSlot slot, size_t bytes);
  // Device constants for RoPE: rope_dim/2 inverse frequencies, plain and compressed (YaRN).
  const float* inv_freq(RopeKind kind) const { return kind == RopeKind::kPlain ? inv_freq_plain_ : inv_freq_compressed_; }

 private:
  // moe and moe_partial: round_sum, the combined sum rounded in fast numerics.
  void moe_rounded(const MoeWeights& w, const float* x, const int32_t* tokens, int64_t n, float* out, bool round_sum);
  void* device_alloc(size_t bytes);  // tracked, freed in the destructor
  // The tensor of upload_model's checkpoint that is generated, not stored (a synthesised one held in memory,
  // loader/synth.h), which `host` lies in; nullptr for stored bytes.
  const GeneratedTensor* generated(const uint8_t* host) const;
  // Makes the slice of g [rows, row_bytes], rows src_stride bytes apart from `host` on, into dst (compact rows).
  void make_generated(const GeneratedTensor& g, const uint8_t* host, uint8_t* dst, int64_t rows, int64_t row_bytes,
                      int64_t src_stride);

  ModelConfig config_;
  int device_ = 0;
  std::shared_ptr<cuda::NcclGroup> group_;
  int rank_ = 0;
  cudaDeviceProp props_{};
  // NOTE: the stream is reachable only through this guard. Converting it to a cudaStream_t — which every kernel
  // launch, copy, memset, synchronisation and capture call on it does, in any family — first launches a
  // deferred all-reduce and hc_post: later work never overtakes them, and no op has a flush to remember.
  class Stream {
   public:
    explicit Stream(CudaOps& ops) : ops_(ops) {}
    operator cudaStream_t() const {
      ops_.flush_deferred();
      return handle_;
    }
    cudaStream_t& handle() { return handle_; }  // unguarded: creation and destruction only
   private:
    CudaOps& ops_;
    cudaStream_t handle_ = nullptr;
  };
  // hc_post's arguments while it is deferred (hc/hc.cu); n = 0: none.
  struct DeferredPost {
    float* f = nullptr;           // [n, D]
    const float* post = nullptr;  // [n, hc]
    const float* comb = nullptr;  // [n, hc, hc]
    float* X = nullptr;           // [n, hc, D]
    int64_t n = 0;
    bool reduce = false;          // f is this rank's share: the ranks' sum is what hc_post adds
  };
  // A deferred all-reduce that no hc_post has taken yet; count = 0: none.
  struct DeferredReduce {
    float* x = nullptr;
    size_t count = 0;
  };
  // Launches what is deferred, in call order: an all-reduce (NCCL), or hc_post (its all-reduce first) (hc/hc.cu).
  void flush_deferred();
  // Whether hc_post_mix sums the ranks' shares of n rows over the peer exchange (hc/hc.cu): decided alike on
  // every rank, from the group's facts and n alone.
  bool exchange_fits(int64_t n) const;

  Stream stream_{*this};
  DeferredReduce deferred_reduce_;
  DeferredPost deferred_post_;
  std::vector<void*> allocations_;
  std::unordered_map<const void*, cuda::DeviceWeight> weights_;   // by host Weight::data
  std::unordered_map<const void*, cuda::DeviceWeight> bf16_copies_;  // bf16_copy's, by host Weight::data
  std::unordered_map<const void*, const void*> vectors_;          // host vector data → device copy
  const Checkpoint* storage_ = nullptr;                           // upload_model's, for its generated tensors
  std::unordered_map<const void*, void*> synth_tables_;           // their value tables: host → device
  std::unordered_map<const void*, cuda::CacheLayout> caches_;     // compact caches by device address
  std::vector<std::pair<void*, size_t>> workspaces_;
  std::vector<std::pair<void*, size_t>> pinned_;  // page-locked host staging by PinnedSlot, grown on first use
  std::vector<uint8_t> logprob_staging_;          // token_logprobs: its results on the host
  cudaEvent_t draws_uploaded_ = nullptr;          // sample_tokens: its staging's last copy to the device
  float* inv_freq_plain_ = nullptr;
  float* inv_freq_compressed_ = nullptr;
  Numerics numerics_ = Numerics::kReference;
  cuda::moe::TablesPtr moe_tables_ = cuda::moe::make_tables();  // moe's per-layer expert tables (moe/moe.cu)
};

}  // namespace dsv4
