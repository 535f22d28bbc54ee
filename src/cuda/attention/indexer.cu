// attention family: lightning indexer top-k (CUDA)
#include "core/error.h"
#include "cuda/cuda_ops.h"

namespace dsv4 {

void CudaOps::indexer_topk(const IndexerParams&) {
  fail("CUDA backend: indexer_topk is not implemented yet");
}

}  // namespace dsv4
