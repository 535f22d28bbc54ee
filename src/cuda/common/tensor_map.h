// TMA tensor maps (host side): the descriptors that cp.async.bulk.tensor reads (tc_ptx.cuh's tma_load_2d), built
// through the CUDA driver's cuTensorMapEncodeTiled.
#pragma once

#include <cuda.h>  // CUtensorMap and its enums (a plain 128-byte struct; no driver library is linked for it)

#include <cstdint>

namespace dsv4::cuda {

// A 2-D map over [outer, inner] elements whose rows lie row_bytes apart (a multiple of 16), copied in boxes of
// box_outer × box_inner elements (elements past either end read as zeros); `what` names the array in the error.
CUtensorMap tensor_map_2d(const void* base, CUtensorMapDataType type, int64_t outer, int64_t inner, int64_t row_bytes,
                          int box_outer, int box_inner, CUtensorMapSwizzle swizzle, CUtensorMapL2promotion promotion,
                          const char* what);

// A K-major wgmma operand [rows, cols] (cols contiguous, compact rows) in boxes of box_rows rows × one 128-byte
// swizzle row (128 / element_bytes columns), landing as smem_descriptor_sw128 (tc_ptx.cuh) reads it.
CUtensorMap operand_map(const void* base, CUtensorMapDataType type, int element_bytes, int64_t rows, int64_t cols,
                        int box_rows);

}  // namespace dsv4::cuda
