// The bytes of a synthesised tensor (loader/synth.h) as a pure function of (key, byte offset), shared by the
// host writer and the CUDA backend, which makes a synthesised checkpoint's large matrices straight in GPU memory
// (any slice of them, for a rank's shard) instead of reading them from host memory.
//
// Word w (bytes 8w .. 8w+7) is 8 / entry_bytes entries of a 65536-entry table, each picked by 16 random bits:
//   1-byte entries (FP8 codes, packed FP4 pairs, E8M0 scales): random words 2w and 2w+1, 16 bits per entry;
//   2-byte entries (BF16): random word w, four 16-bit chunks; 4-byte entries (F32): word w, its low two chunks.
// The tables hold the value distribution (a normal's mid-quantiles rounded to the storage format, a uniform, a
// constant), so the generator itself is format-blind.
#pragma once

#include <cstdint>

#include "core/random.h"

#if defined(__CUDACC__)
#define DSV4_SYNTH_HD __host__ __device__
#else
#define DSV4_SYNTH_HD
#endif

namespace dsv4 {

constexpr int kSynthTableEntries = 65536;

struct SynthFill {
  uint64_t key = 0;             // of the tensor: from the seed and its name
  const void* table = nullptr;  // kSynthTableEntries entries of entry_bytes (host or device memory)
  int entry_bytes = 1;          // 1, 2 or 4
};

DSV4_SYNTH_HD inline uint64_t synth_random_word(uint64_t key, uint64_t i) {
  return splitmix64_mix(key + (i + 1) * kSplitMixGamma);
}

// Bytes 8w .. 8w+7 of the tensor, little-endian.
DSV4_SYNTH_HD inline uint64_t synth_word(const SynthFill& f, uint64_t w) {
  uint64_t out = 0;
  if (f.entry_bytes == 1) {
    const auto* t = static_cast<const uint8_t*>(f.table);
    const uint64_t r[2] = {synth_random_word(f.key, 2 * w), synth_random_word(f.key, 2 * w + 1)};
    for (int i = 0; i < 8; ++i) out |= uint64_t(t[(r[i >> 2] >> (16 * (i & 3))) & 0xFFFF]) << (8 * i);
  } else if (f.entry_bytes == 2) {
    const auto* t = static_cast<const uint16_t*>(f.table);
    const uint64_t r = synth_random_word(f.key, w);
    for (int i = 0; i < 4; ++i) out |= uint64_t(t[(r >> (16 * i)) & 0xFFFF]) << (16 * i);
  } else {
    const auto* t = static_cast<const uint32_t*>(f.table);
    const uint64_t r = synth_random_word(f.key, w);
    for (int i = 0; i < 2; ++i) out |= uint64_t(t[(r >> (16 * i)) & 0xFFFF]) << (32 * i);
  }
  return out;
}

// A tensor of a checkpoint held in memory whose bytes are left to be generated where they are needed
// (Checkpoint::generated): its place in the checkpoint's address range, never readable on the host.
struct GeneratedTensor {
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;
  SynthFill fill;  // table in host memory
};

}  // namespace dsv4
