// A synthesised checkpoint's tensors made in GPU memory (loader/synth_fill.h): the CUDA backend's upload of a
// generated tensor, or of a rank's slice of one, without its bytes ever existing on the host.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "loader/synth_fill.h"

namespace dsv4::cuda {

struct SynthFillParams {
  uint8_t* dst = nullptr;  // [rows, row_bytes] device, rows dst_pitch bytes apart
  int64_t rows = 0, row_bytes = 0, dst_pitch = 0;
  uint64_t first = 0;      // offset in the tensor of the slice's first byte
  int64_t src_stride = 0;  // tensor bytes between the slice's rows
  SynthFill fill;          // table in device memory (kSynthTableEntries × entry_bytes)
};

// Validates the parameters (DSV4_CHECK) and launches on `stream`.
void synth_fill(const SynthFillParams& p, cudaStream_t stream);

}  // namespace dsv4::cuda
