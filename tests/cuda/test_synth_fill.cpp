// A synthesised checkpoint made on the GPU (cuda/loader/synth_fill.h): any slice of a generated tensor equals the
// host writer's bytes (loader/synth_fill.h), and a whole device-made model — every rank's shard of it — uploads
// to exactly the weights of the same model made on the host, which the CPU tests compare with the files
// dsv4 synth writes.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cuda/gpu.h"
#include "loader/checkpoint.h"
#include "engine/backend.h"
#include "loader/synth.h"
#include "model/deepseek_v4.h"
#include "model/parallel.h"

#if DSV4_HAVE_CUDA
#include "cuda/loader/synth_fill.h"
#endif

namespace dsv4::test {
namespace {

#if DSV4_HAVE_CUDA
std::vector<uint8_t> fetch(const uint8_t* device, size_t n) {
  std::vector<uint8_t> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), device, n, cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

uint8_t host_byte(const SynthFill& f, uint64_t offset) { return uint8_t(synth_word(f, offset / 8) >> (8 * (offset % 8))); }
#endif

TEST(CudaSynthFill, SlicesMatchTheHostWriter) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  std::mt19937_64 rng(seed());
  SCOPED_TRACE(seed());
  struct Slice {
    int64_t rows, row_bytes, src_stride;
    uint64_t first;
  };
  const Slice slices[] = {
      {1, 1, 0, 0},            // one byte
      {7, 13, 29, 3},          // odd everything: starts and ends mid-word
      {33, 64, 64, 0},         // whole aligned rows
      {5, 100, 257, 255},      // stride not a multiple of 8
      {512, 512, 1024, 512},   // V4-Flash w2 [4096, 2048] FP4 (1024 bytes a row): a TP-2 column half, 512 rows
      {64, 2048, 2048, 1024 * 2048},  // V4-Flash w1 [2048, 4096] FP4: rank 1's TP-2 row half, its first 64 rows
  };
  for (const int entry_bytes : {1, 2, 4}) {
    std::vector<uint8_t> table(size_t(kSynthTableEntries) * size_t(entry_bytes));
    for (auto& b : table) b = uint8_t(rng());
    void* dtable = nullptr;
    ASSERT_EQ(cudaMalloc(&dtable, table.size()), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dtable, table.data(), table.size(), cudaMemcpyHostToDevice), cudaSuccess);
    SynthFill host_fill{rng(), table.data(), entry_bytes};
    for (const Slice& s : slices) {
      SCOPED_TRACE(testing::Message() << "entry_bytes " << entry_bytes << ", slice " << s.rows << "x" << s.row_bytes
                                      << " stride " << s.src_stride << " from " << s.first);
      const int64_t pitch = s.row_bytes + 5;  // padding the kernel must not touch
      uint8_t* dst = nullptr;
      ASSERT_EQ(cudaMalloc(&dst, size_t(s.rows * pitch)), cudaSuccess);
      ASSERT_EQ(cudaMemset(dst, 0xA5, size_t(s.rows * pitch)), cudaSuccess);  // poison
      cuda::SynthFillParams p;
      p.dst = dst;
      p.rows = s.rows;
      p.row_bytes = s.row_bytes;
      p.dst_pitch = pitch;
      p.first = s.first;
      p.src_stride = s.src_stride;
      p.fill = host_fill;
      p.fill.table = dtable;
      cuda::synth_fill(p, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto got = fetch(dst, size_t(s.rows * pitch));
      for (int64_t r = 0; r < s.rows; ++r) {
        for (int64_t c = 0; c < s.row_bytes; ++c)
          ASSERT_EQ(got[size_t(r * pitch + c)], host_byte(host_fill, s.first + uint64_t(r * s.src_stride + c)))
              << "row " << r << " byte " << c;
        for (int64_t c = s.row_bytes; c < pitch; ++c) ASSERT_EQ(got[size_t(r * pitch + c)], 0xA5) << "padding " << r;
      }
      cudaFree(dst);
    }
    cudaFree(dtable);
  }
#endif
}

// The layout of V4-Flash (sliding, CSA, HCA layers, hash routing, MTP) at test size.
SynthOptions small_synth() {
  SynthOptions o;
  o.preset = "v4-flash";
  o.layers = 4;
  o.seed = 11;
  for (const auto& [name, value] : std::vector<std::pair<std::string, std::string>>{
           {"experts", "8"}, {"vocab", "1000"}, {"dim", "256"}, {"inter", "128"},
           {"set", "num_attention_heads=4,q_lora_rank=64,o_groups=2,o_lora_rank=64,index_n_heads=4,index_topk=16,"
                   "num_experts_per_tok=2"}})
    add_synth_override(name, value, &o);
  return o;
}

TEST(CudaSynthFill, EveryRankOfADeviceMadeModelUploadsTheHostModelsBytes) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  const auto host = synth_model(small_synth(), SynthPlace::kHost);
  const auto device = synth_model(small_synth(), SynthPlace::kDevice);
  size_t generated = 0;
  for (const Weight* w : device->matrices) generated += w && device->storage->generated(w->data) != nullptr;
  EXPECT_GT(generated, device->matrices.size() / 2);  // the experts, projections, embedding and head
  for (const Parallelism par : {Parallelism{1, 1}, Parallelism{2, 1}, Parallelism{2, 2}}) {
    for (int rank = 0; rank < par.ranks(); ++rank) {
      SCOPED_TRACE(testing::Message() << parallelism_name(par) << ", rank " << rank);
      const auto h = shard_model(*host, par, rank);
      const auto d = shard_model(*device, par, rank);
      CudaOps ops(d->config);
      ops.upload_model(*d);
      ASSERT_EQ(h->matrices.size(), d->matrices.size());
      for (size_t i = 0; i < d->matrices.size(); ++i) {
        const Weight* hw = h->matrices[i];
        const Weight* dw = d->matrices[i];
        ASSERT_EQ(hw == nullptr || hw->empty(), dw == nullptr || dw->empty()) << "matrix " << i;
        if (!dw || dw->empty()) continue;
        const cuda::DeviceWeight& up = ops.dev(*dw);
        const int64_t row_bytes = up.row_bytes();
        const auto bytes = fetch(up.data, size_t(dw->rows * row_bytes));
        for (int64_t r = 0; r < dw->rows; ++r)
          ASSERT_EQ(std::memcmp(bytes.data() + r * row_bytes, hw->data + r * hw->row_stride, size_t(row_bytes)), 0)
              << "matrix " << i << " [" << dw->rows << ", " << dw->cols << "] row " << r;
        if (up.format != cuda::WFormat::kFP4) continue;
        const auto scales = fetch(up.scale_e8m0, size_t(dw->rows * up.scale_cols));
        uint8_t lo = 255, hi = 0;
        for (int64_t r = 0; r < dw->rows; ++r) {
          ASSERT_EQ(std::memcmp(scales.data() + r * up.scale_cols, hw->scale + r * hw->scale_stride,
                                size_t(up.scale_cols)),
                    0)
              << "FP4 scales of matrix " << i << " row " << r;
          for (int64_t c = 0; c < up.scale_cols; ++c) {
            lo = std::min(lo, hw->scale[r * hw->scale_stride + c]);
            hi = std::max(hi, hw->scale[r * hw->scale_stride + c]);
          }
        }
        // The range the MoE kernels pick their path by (moe.cu), taken at upload without reading the host scales:
        // the stored scales' range (synth's FP4 scales are one constant a matrix, so every block spans 0).
        EXPECT_EQ(up.scale_lo, lo) << "matrix " << i;
        EXPECT_EQ(up.scale_hi, hi) << "matrix " << i;
        EXPECT_EQ(up.scale_span, dw->cols % 128 == 0 ? hi - lo : 255) << "matrix " << i;
      }
    }
  }
#endif
}

// The forward pass reads nothing of a device-made model on the host (its matrices are not readable there: a
// read would fault) and computes what it computes on the host-made one: prefill, then decode steps.
TEST(CudaSynthFill, ADeviceMadeModelRunsLikeTheHostMadeOne) {
  DSV4_REQUIRE_GPU();
#if DSV4_HAVE_CUDA
  const std::vector<int32_t> prompt = {5, 99, 310, 7, 64, 901, 2, 18, 444};
  std::vector<std::vector<float>> runs;
  for (const SynthPlace place : {SynthPlace::kHost, SynthPlace::kDevice}) {
    const auto model = synth_model(small_synth(), place);
    const auto ops = make_backend("cuda", *model);
    DeepseekV4 forward(*model, *ops, Numerics::kFast, /*max_context=*/64);
    const int64_t V = model->config.vocab_size;
    std::vector<float> logits(size_t(prompt.size() + 3) * size_t(V));
    forward.step(prompt.data(), int64_t(prompt.size()), logits.data(), /*all_rows=*/true);
    for (int i = 0; i < 3; ++i) {
      const int32_t token = int32_t(100 + 37 * i);
      forward.step(&token, 1, logits.data() + (prompt.size() + size_t(i)) * size_t(V), /*all_rows=*/false);
    }
    for (float v : logits) ASSERT_TRUE(std::isfinite(v));
    runs.push_back(std::move(logits));
  }
  for (size_t i = 0; i < runs[0].size(); ++i)
    ASSERT_NEAR(runs[1][i], runs[0][i], 1e-4f * (1 + std::fabs(runs[0][i]))) << "logit " << i;
#endif
}

}  // namespace
}  // namespace dsv4::test
