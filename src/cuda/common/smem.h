// Dynamic shared memory above the default 48 KB is an attribute of a kernel on one device: a process that
// drives several GPUs (model/parallel.h) must raise it on each, so a once-per-process flag is wrong.
#pragma once

namespace dsv4::cuda {

// Raises `kernel`'s dynamic shared memory limit to at least `bytes` on the current device; each
// (kernel, device) is set once, and never lowered.
void allow_dynamic_smem(const void* kernel, int bytes);

}  // namespace dsv4::cuda
