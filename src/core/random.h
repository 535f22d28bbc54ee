// SplitMix64 (Steele, Lea & Flood 2014): a tiny, well-mixed 64-bit generator. The synth checkpoints, the kernel
// tests and the benches fill gigabytes of weights with it, where std::mt19937_64 per byte would take minutes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace dsv4 {

constexpr uint64_t kSplitMixGamma = 0x9E3779B97F4A7C15ull;  // the stream's increment (2^64 / golden ratio)

// The output mix: a bijection of 64-bit words that spreads every input bit over the output.
constexpr uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The sequential generator: word i of seed s is splitmix64_mix(s + (i + 1)·gamma).
struct SplitMix64 {
  uint64_t state;
  uint64_t next() { return splitmix64_mix(state += kSplitMixGamma); }
  void fill(uint8_t* p, size_t n) {
    for (size_t i = 0; i < n; i += 8) {
      const uint64_t v = next();
      std::memcpy(p + i, &v, std::min<size_t>(8, n - i));
    }
  }
};

}  // namespace dsv4
