// Device measurements for the benchmarks: achievable copy bandwidth (the yardstick of every HBM floor) and
// memory in use. CPU-only builds link stubs that report no device.
#pragma once

#include <cstddef>

namespace dsv4 {

// Bytes per second (read + written) of a 2 GiB device-to-device copy on `device`, best of several after a
// warm-up. Needs 4 GiB free on the device; throws a dsv4::Error naming the problem otherwise (or without CUDA).
double measure_copy_bandwidth(int device = 0);

// Memory in use on `device` (total − free, all processes) and its size; false without CUDA or a device.
bool device_memory_used(size_t* used, size_t* total, int device = 0);

}  // namespace dsv4
