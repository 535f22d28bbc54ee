// TMA tensor maps (tensor_map.h).
#include "cuda/common/tensor_map.h"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include "cuda/common/check.h"

namespace dsv4::cuda {

namespace {

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  // Through the runtime's driver entry point: the static runtime links no libcuda.
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    DSV4_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    DSV4_CHECK(found == cudaDriverEntryPointSuccess && fn != nullptr,
               "the CUDA driver has no cuTensorMapEncodeTiled (TMA needs driver 12.0 or newer)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

}  // namespace

CUtensorMap tensor_map_2d(const void* base, CUtensorMapDataType type, int64_t outer, int64_t inner, int64_t row_bytes,
                          int box_outer, int box_inner, CUtensorMapSwizzle swizzle, CUtensorMapL2promotion promotion,
                          const char* what) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {cuuint64_t(inner), cuuint64_t(outer)};
  const cuuint64_t strides[1] = {cuuint64_t(row_bytes)};
  const cuuint32_t box[2] = {cuuint32_t(box_inner), cuuint32_t(box_outer)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(&map, type, 2, const_cast<void*>(base), dims, strides, box, element_strides,
                                          CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, promotion,
                                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  DSV4_CHECK(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled returned ", int(r), " for a [", outer, ", ", inner, "] ", what);
  return map;
}

CUtensorMap operand_map(const void* base, CUtensorMapDataType type, int element_bytes, int64_t rows, int64_t cols,
                        int box_rows) {
  constexpr int kSwizzleBytes = 128;
  return tensor_map_2d(base, type, rows, cols, cols * element_bytes, box_rows, kSwizzleBytes / element_bytes,
                       CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, "operand");
}

}  // namespace dsv4::cuda
