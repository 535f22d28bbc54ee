// moe family (CUDA): the state CudaOps::moe keeps between calls, opaque to the rest of the backend: per MoE layer
// the resolved weights and formats, and the device table of its experts' pointers (defined in moe.cu). Each
// CudaOps owns one Tables, made in its constructor and destroyed with it.
#pragma once

#include <memory>

namespace dsv4::cuda::moe {

struct Tables;

struct TablesDeleter {
  void operator()(Tables* tables) const;
};

using TablesPtr = std::unique_ptr<Tables, TablesDeleter>;

TablesPtr make_tables();

}  // namespace dsv4::cuda::moe
