// GPU token selection over device logits: RowDraw's (src/sampler/sampler.h) edits, grammar mask, temperature,
// top-k, top-p and min-p and seeded draw, the same token as the CPU's sample_row (the draw's arithmetic is
// shared: sampler/draw.h). One launch, one block per row, nothing allocated, no host sync.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "sampler/sampler.h"

namespace dsv4::cuda {

// One row's draw on the device: sampler.h's RowDraw with its host pointers turned into offsets in the call's
// buffers.
struct DrawRow {
  float temperature = 0.0f, top_p = 1.0f, min_p = 0.0f, repetition_penalty = 1.0f;
  int64_t top_k = 0;
  uint64_t seed = 0, step = 0;
  int64_t mask = -1;                     // first word of its mask in SampleParams::masks; −1: every token
  int64_t edit_begin = 0, edit_end = 0;  // its edits in SampleParams::edits
};

struct SampleParams {
  const float* logits = nullptr;  // [rows, vocab] device
  int64_t rows = 0, vocab = 0;
  const DrawRow* draws = nullptr;      // [rows] device
  const uint32_t* masks = nullptr;     // device: the grammars' masks, [ceil(vocab / 32)] words each
  const LogitEdit* edits = nullptr;    // device: one token id at most once per row
  float* work = nullptr;               // [rows, vocab] device: a row with edits is copied here and edited
  int32_t* tokens = nullptr;           // [rows] device: the drawn ids
};

// Validates the parameters (DSV4_CHECK, naming the field) and launches on `stream`.
void sample_tokens(const SampleParams& p, cudaStream_t stream);

// The raw log-probabilities of chosen tokens (sampler.h's token_logprobs, before the host sorts the top ones):
// for each listed row its normaliser log Z = max + log Σ e^(l − max) (in double), the chosen token's logit, and
// the `top` best (id, logit) in no particular order (ties at the boundary: lower ids).
struct LogprobParams {
  const float* logits = nullptr;  // [·, vocab] device
  int64_t vocab = 0;
  const int64_t* rows = nullptr;  // [count] device: the rows
  int64_t count = 0;
  const int32_t* tokens = nullptr;  // device, indexed by row: the chosen tokens
  int64_t top = 0;                  // ≤ kLogprobsLimit (sampler.h), ≤ vocab
  double* log_z = nullptr;          // [count] device
  float* chosen = nullptr;          // [count] device
  int2* best = nullptr;             // [count, top] device: (id, logit bits)
};
void token_logprobs(const LogprobParams& p, cudaStream_t stream);

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
