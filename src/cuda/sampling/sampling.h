// GPU token selection over device logits: greedy, temperature, top-k, top-p and min-p with seeded Philox draws,
// the same filters in the same order as the CPU sampler (src/sampler/sampler.h); penalties stay with the
// caller (apply them to the logits first). One launch, one block per row, nothing allocated, no host sync.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dsv4::cuda {

struct SampleParams {
  const float* logits = nullptr;    // [rows, ld] device; row r at logits + r·ld (ld 0: every row draws from row 0)
  int64_t rows = 0, vocab = 0, ld = 0;
  float temperature = 1.0f;         // 0 = greedy: the lowest id among the maxima
  int64_t top_k = 0;                // keep the k largest logits (ties: lower id first); 0 = off
  float top_p = 1.0f;               // keep the shortest prefix whose mass (over the top-k) reaches top_p; 1 = off
  float min_p = 0.0f;               // drop tokens with p < min_p · p(max); 0 = off
  const uint64_t* seeds = nullptr;  // [rows] device: the Philox key of each row (unused when greedy)
  uint64_t offset = 0;              // Philox counter offset: pass the step number so every step draws anew
  int32_t* tokens = nullptr;        // [rows] device: the selected ids
};

// Validates the parameters (DSV4_CHECK, naming the field) and launches on `stream`.
void sample_tokens(const SampleParams& p, cudaStream_t stream);

}  // namespace dsv4::cuda
