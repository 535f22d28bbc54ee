// elementwise family (CUDA): fill, embed, broadcast_streams, add, scale, ring_store.
// Pure data movement: one launch per op, grid-stride loops over 16-byte packs when every pointer involved is
// 16-byte aligned (row lengths a multiple of 4), else over single floats. Results are bit-identical to
// src/cpu/backend.cpp (a copy, one fp32 add or one fp32 multiply per element; in fast numerics embed, add and
// scale round their results to bf16).
#include <algorithm>

#include "cuda/common/check.h"
#include "cuda/common/fp_grid.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/attention/kv_cache.cuh"
#include "cuda/cuda_ops.h"
#include "cuda/elementwise/pack.cuh"

namespace dsv4 {

namespace {

using cuda::Pack;

constexpr int kThreads = 256;

// Grid for a grid-stride loop over `items`: enough blocks to fill the GPU a few times over, no more.
unsigned grid_for(int64_t items, const cudaDeviceProp& props) {
  const int64_t cap = int64_t(props.multiProcessorCount) * 8;
  return unsigned(std::clamp<int64_t>(cuda::ceil_div(items, kThreads), 1, cap));
}

__device__ __forceinline__ int64_t global_thread() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t grid_threads() { return int64_t(gridDim.x) * blockDim.x; }

// ---- fill / add / scale over `count` floats: packs of N, then the < N tail element by element.

struct FillParams {
  float* x;  // [count]
  int64_t count;
  float value;
};

template <int N>
__global__ void fill_kernel(FillParams p) {
  cuda::pdl_wait();
  const int64_t packs = p.count / N;
  Pack<N> v;
#pragma unroll
  for (int i = 0; i < N; ++i) v.v[i] = p.value;
  for (int64_t i = global_thread(); i < packs; i += grid_threads()) cuda::store_pack<N>(p.x + i * N, v);
  for (int64_t i = packs * N + global_thread(); i < p.count; i += grid_threads()) p.x[i] = p.value;
}

struct AddParams {
  const float* a;  // [count]
  const float* b;  // [count]
  float* out;      // [count], may alias a or b
  int64_t count;
  bool bf16;
};

template <int N>
__global__ void add_kernel(AddParams p) {
  cuda::pdl_wait();
  const int64_t packs = p.count / N;
  for (int64_t i = global_thread(); i < packs; i += grid_threads()) {
    const Pack<N> a = cuda::load_pack<N>(p.a + i * N), b = cuda::load_pack<N>(p.b + i * N);
    Pack<N> r;
#pragma unroll
    for (int k = 0; k < N; ++k) r.v[k] = cuda::round_bf16_if(p.bf16, a.v[k] + b.v[k]);
    cuda::store_pack<N>(p.out + i * N, r);
  }
  for (int64_t i = packs * N + global_thread(); i < p.count; i += grid_threads())
    p.out[i] = cuda::round_bf16_if(p.bf16, p.a[i] + p.b[i]);
}

struct ScaleParams {
  float* x;  // [count], in place
  int64_t count;
  float factor;
  bool bf16;
};

template <int N>
__global__ void scale_kernel(ScaleParams p) {
  cuda::pdl_wait();
  const int64_t packs = p.count / N;
  for (int64_t i = global_thread(); i < packs; i += grid_threads()) {
    Pack<N> v = cuda::load_pack<N>(p.x + i * N);
#pragma unroll
    for (int k = 0; k < N; ++k) v.v[k] = cuda::round_bf16_if(p.bf16, v.v[k] * p.factor);
    cuda::store_pack<N>(p.x + i * N, v);
  }
  for (int64_t i = packs * N + global_thread(); i < p.count; i += grid_threads())
    p.x[i] = cuda::round_bf16_if(p.bf16, p.x[i] * p.factor);
}

// ---- row ops: N divides the row length, so a pack never straddles two rows.

struct EmbedParams {
  cuda::DeviceWeight table;  // [V, D]
  const int32_t* tokens;     // [n], device
  int64_t n;
  float* out;                // [n, D]
  bool bf16;
};

// A token outside [0, V) cannot be reported from here (no host sync in ops): its row is written as NaN so
// the fault is visible downstream instead of reading out of bounds. The host validates tokens before a step.
template <int N>
__global__ void embed_kernel(EmbedParams p) {
  cuda::pdl_wait();
  const int64_t D = p.table.cols, row_packs = D / N;
  for (int64_t i = global_thread(); i < p.n * row_packs; i += grid_threads()) {
    const int64_t t = i / row_packs, c = (i % row_packs) * N;
    const int32_t token = p.tokens[t];
    Pack<N> v;
    if (token >= 0 && token < p.table.rows) {
      v = cuda::weight_pack<N>(p.table, token, c);
#pragma unroll
      for (int k = 0; k < N; ++k) v.v[k] = cuda::round_bf16_if(p.bf16, v.v[k]);
    } else {
#pragma unroll
      for (int k = 0; k < N; ++k) v.v[k] = __int_as_float(0x7fc00000);
    }
    cuda::store_pack<N>(p.out + t * D + c, v);
  }
}

struct BroadcastParams {
  const float* x;  // [n, D]
  int64_t n, hc, D;
  float* X;        // [n, hc, D]
};

template <int N>
__global__ void broadcast_streams_kernel(BroadcastParams p) {
  cuda::pdl_wait();
  const int64_t row_packs = p.D / N;
  for (int64_t i = global_thread(); i < p.n * row_packs; i += grid_threads()) {
    const int64_t t = i / row_packs, c = (i % row_packs) * N;
    const Pack<N> v = cuda::load_pack<N>(p.x + t * p.D + c);
    for (int64_t j = 0; j < p.hc; ++j) cuda::store_pack<N>(p.X + (t * p.hc + j) * p.D + c, v);
  }
}

struct RingStoreParams {
  const float* x;  // [n, cols]
  int64_t n, cols, pos0, slots;
  int64_t first;   // first row that survives: rows before n − slots are overwritten within the same call
  float* ring;     // [slots, cols]
};

template <int N>
__global__ void ring_store_kernel(RingStoreParams p) {
  cuda::pdl_wait();
  const int64_t row_packs = p.cols / N, rows = p.n - p.first;
  for (int64_t i = global_thread(); i < rows * row_packs; i += grid_threads()) {
    const int64_t r = p.first + i / row_packs, c = (i % row_packs) * N;
    const int64_t slot = (p.pos0 + r) % p.slots;
    cuda::store_pack<N>(p.ring + slot * p.cols + c, cuda::load_pack<N>(p.x + r * p.cols + c));
  }
}

}  // namespace

void CudaOps::fill(float* x, size_t count, float value) {
  if (count == 0) return;
  DSV4_CHECK(x != nullptr, "fill: null buffer for ", count, " floats");
  const FillParams p{x, int64_t(count), value};
  if (cuda::aligned16(x)) cuda::launch_pdl(fill_kernel<4>, dim3(grid_for(p.count / 4, props_)), dim3(kThreads), 0, stream_, pdl(), p);
  else cuda::launch_pdl(fill_kernel<1>, dim3(grid_for(p.count, props_)), dim3(kThreads), 0, stream_, pdl(), p);
}

void CudaOps::embed(const Weight& table, const int32_t* tokens, int64_t n, float* out) {
  DSV4_CHECK(n >= 0, "embed: negative token count ", n);
  if (n == 0) return;
  const EmbedParams p{dev(table), tokens, n, out, fast()};
  const int64_t D = p.table.cols;
  if (D % 4 == 0 && cuda::aligned16(out)) cuda::launch_pdl(embed_kernel<4>, dim3(grid_for(n * D / 4, props_)), dim3(kThreads), 0, stream_, pdl(), p);
  else cuda::launch_pdl(embed_kernel<1>, dim3(grid_for(n * D, props_)), dim3(kThreads), 0, stream_, pdl(), p);
}

void CudaOps::broadcast_streams(const float* x, int64_t n, int64_t hc, int64_t dim, float* X) {
  DSV4_CHECK(n >= 0 && hc >= 1 && dim >= 1, "broadcast_streams: bad shape n=", n, " hc=", hc, " dim=", dim);
  if (n == 0) return;
  const BroadcastParams p{x, n, hc, dim, X};
  if (dim % 4 == 0 && cuda::aligned16(x) && cuda::aligned16(X))
    cuda::launch_pdl(broadcast_streams_kernel<4>, dim3(grid_for(n * dim / 4, props_)), dim3(kThreads), 0, stream_, pdl(), p);
  else
    cuda::launch_pdl(broadcast_streams_kernel<1>, dim3(grid_for(n * dim, props_)), dim3(kThreads), 0, stream_, pdl(), p);
}

void CudaOps::add(const float* a, const float* b, size_t count, float* out) {
  if (count == 0) return;
  const AddParams p{a, b, out, int64_t(count), fast()};
  if (cuda::aligned16(a) && cuda::aligned16(b) && cuda::aligned16(out))
    cuda::launch_pdl(add_kernel<4>, dim3(grid_for(p.count / 4, props_)), dim3(kThreads), 0, stream_, pdl(), p);
  else
    cuda::launch_pdl(add_kernel<1>, dim3(grid_for(p.count, props_)), dim3(kThreads), 0, stream_, pdl(), p);
}

void CudaOps::scale(float* x, size_t count, float factor) {
  if (count == 0) return;
  const ScaleParams p{x, int64_t(count), factor, fast()};
  if (cuda::aligned16(x)) cuda::launch_pdl(scale_kernel<4>, dim3(grid_for(p.count / 4, props_)), dim3(kThreads), 0, stream_, pdl(), p);
  else cuda::launch_pdl(scale_kernel<1>, dim3(grid_for(p.count, props_)), dim3(kThreads), 0, stream_, pdl(), p);
}

void CudaOps::ring_store(const float* x, int64_t n, int64_t cols, int64_t pos0, int64_t slots, float* ring) {
  DSV4_CHECK(n >= 0 && cols >= 1 && pos0 >= 0 && slots >= 1, "ring_store: bad arguments n=", n, " cols=", cols,
             " pos0=", pos0, " slots=", slots);
  if (n == 0) return;
  // Rows i and i + slots share a slot; the CPU's sequential loop leaves the later one, so only the last
  // `slots` rows are written (no two threads store to the same slot).
  const int64_t first = std::max<int64_t>(0, n - slots);
  if (const cuda::CacheLayout* layout = compact_cache(ring)) {
    DSV4_CHECK(layout->dim == cols && slots <= layout->rows, "ring_store: ", slots, " slots of ", cols,
               " into a compact ring of ", layout->rows, " rows of ", layout->dim);
    return cuda::cache_store(*this, *layout, ring, x + first * cols, cols, n - first, pos0 + first, slots);
  }
  const RingStoreParams p{x, n, cols, pos0, slots, first, ring};
  const int64_t elements = (n - p.first) * cols;
  if (cols % 4 == 0 && cuda::aligned16(x) && cuda::aligned16(ring))
    cuda::launch_pdl(ring_store_kernel<4>, dim3(grid_for(elements / 4, props_)), dim3(kThreads), 0, stream_, pdl(), p);
  else
    cuda::launch_pdl(ring_store_kernel<1>, dim3(grid_for(elements, props_)), dim3(kThreads), 0, stream_, pdl(), p);
}

}  // namespace dsv4
