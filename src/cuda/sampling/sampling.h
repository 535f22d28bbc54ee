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

// Greedy selection alone, for the decode loop: a row's argmax spread over `greedy_slices(vocab)` blocks (one
// block per row, as above, has too few loads in flight for a 0.5 MB row); each block reduces a contiguous slice, and
// the last block of the row to arrive (an arrival counter per row) reduces the slices' winners. Same answer as
// sample_tokens with temperature 0 and as the CPU's argmax (the lowest id among the maxima): the (value, id)
// order is total, so the reduction order does not matter.
struct GreedyParams {
  const float* logits = nullptr;  // [rows, ld] device
  int64_t rows = 0, vocab = 0, ld = 0;
  int32_t* tokens = nullptr;      // [rows] device
  float* values = nullptr;        // [rows] device, the maximum of each row; nullptr: not wanted
  int2* partials = nullptr;       // [rows, greedy_slices(vocab)] (value bits, id) of each slice's winner
  unsigned* arrivals = nullptr;   // [rows], zero between calls (the last block of a row resets its counter)
};
int greedy_slices(int64_t vocab);
// Validates and launches on `stream` (programmatic dependent launch when `pdl`: it waits for the logits' writer).
void greedy_tokens(const GreedyParams& p, cudaStream_t stream, bool pdl);

}  // namespace dsv4::cuda
