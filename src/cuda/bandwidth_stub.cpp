// CPU-only build: no device to measure.
#include "core/error.h"
#include "cuda/bandwidth.h"

namespace dsv4 {

double measure_copy_bandwidth(int) { fail("copy bandwidth: dsv4 was built without CUDA"); }

bool device_memory_used(size_t*, size_t*, int) { return false; }

}  // namespace dsv4
