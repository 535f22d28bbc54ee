// The batched per-sequence kernels (attention family: attention, query_kv_finish, compressor, indexer) carry
// their launch's sequences as a table in their parameters (≤ 4 KB, __grid_constant__: indexing it reads the
// constant bank, not a local copy). Sequence i owns the launch's units (rows, blocks or entries) from its
// `first` on; a block finds its sequence as the last one whose first unit is ≤ its own.
#pragma once

#include <cstdint>

namespace dsv4::cuda {

// Binary search over seq[0, count), sorted by `first`; uniform across the block. Sequences without units share
// their first with the next one, which comes after them, so the search lands on the one that owns `at`.
template <int N, class Seq, class T>
__device__ __forceinline__ const Seq& sequence_at(const Seq (&seq)[N], int count, int64_t at, T Seq::*first) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (int64_t(seq[mid].*first) <= at) lo = mid;
    else hi = mid - 1;
  }
  return seq[lo];
}

}  // namespace dsv4::cuda
